//! The runtime of both controllers: the watches (`watches`: one per kind and watched namespace,
//! filling the caches observe reads and triggering the controllers), the work-queue depth
//! (`queue`), the Database controller's triggers (Databases
//! and everything they own, so a deleted or edited child is repaired from its watch event;
//! `DatabaseBackup`s, which wake their Database), its finalizer and its Events for errors, and
//! the start of the `DatabaseBackup` controller beside it, the readiness once both kinds can be
//! listed and a metric per reconcile. The shared `Context` and backoff live in `context`.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::FINALIZER;
use crate::api::{Database, DatabaseBackup};
use crate::context::caches::caches;
use crate::context::{Context, FailureKey};
use crate::error::{Error, Result};
use crate::kube_io::{EventSpec, initial_list};
use crate::ops::metrics::{DATABASE_CONTROLLER, Metrics};
use crate::ops::server::Readiness;
use crate::reconcile::{act, cleanup, reconcile_database};
use crate::resources::{LABEL_INSTANCE, Settings};

pub mod watches;

use self::watches::{InitialList, Meta, Triggers};
use crate::context::work_queue::{self, WorkQueue};

fn key_of(guard: &DeserializeGuard<Database>) -> FailureKey {
    let meta = guard.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// `K`s in each watched namespace, or in all (no namespaces).
fn owned<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    if namespaces.is_empty() {
        return vec![Api::all(client.clone())];
    }
    namespaces
        .iter()
        .map(|ns| Api::namespaced(client.clone(), ns))
        .collect()
}

/// Runs the controller until SIGTERM/SIGINT. `namespace` limits it to one namespace.
pub async fn run(client: Client, settings: Settings, namespace: Option<String>) {
    let (metrics, ready) = (Arc::new(Metrics::new()), Arc::new(Readiness::default()));
    let concurrency = DEFAULT_RECONCILE_CONCURRENCY;
    let namespaces: Vec<String> = namespace.into_iter().collect();
    run_observed(client, settings, &namespaces, concurrency, metrics, ready).await;
}

/// `run`, recording into `metrics`; `ready` turns true once both watched kinds can be listed.
/// `namespaces` are the watched namespaces (none: all). `concurrency` bounds the Database
/// reconciles at once (0: unbounded).
pub async fn run_observed(
    client: Client,
    settings: Settings,
    namespaces: &[String],
    concurrency: u16,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
) {
    let (caches, writers) = caches();
    let probe = owned::<Database>(&client, namespaces).swap_remove(0);
    let initial = if initial_list::server_streams_initial_lists(&probe).await {
        InitialList::Streamed
    } else {
        InitialList::Listed
    };
    // One watch per kind and namespace, shared by both controllers; stopped when this returns.
    let (triggers, _watches) = watches::start(&client, namespaces, initial, writers);
    let ctx = Arc::new(Context::new(client.clone(), settings, caches).with_metrics(metrics));
    let watched = if namespaces.is_empty() {
        "<all>".into()
    } else {
        namespaces.join(",")
    };
    info!(namespaces = %watched, ?initial, "dbop controller starting");
    let Triggers {
        databases,
        statefulsets,
        services,
        secrets,
        claims,
        jobs: [jobs, backup_jobs],
        backups: [backups, backups_self],
    } = triggers;
    // Both controllers stop on SIGTERM/SIGINT (each has `shutdown_on_signal`).
    let backup_controller = crate::backup::controller::run(ctx.clone(), backups_self, backup_jobs);
    let queue = WorkQueue::new(ctx.metrics.workqueue_depth(DATABASE_CONTROLLER));
    // No debounce: a deleted or edited child is repaired from its watch event at once.
    let database_controller =
        Controller::for_stream(queue.own(databases), ctx.caches.databases.clone())
            .with_config(ControllerConfig::default().concurrency(concurrency))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(statefulsets))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(services))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(secrets))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(jobs))
            // Claims are made by the StatefulSet controller and carry our labels, not an owner.
            .watches_stream(
                claims,
                queue.mapping(|pvc: Meta<PersistentVolumeClaim>| {
                    let name = pvc.metadata.labels.as_ref()?.get(LABEL_INSTANCE)?.clone();
                    let ns = pvc.metadata.namespace.clone()?;
                    Some(ObjectRef::new(&name).within(&ns))
                }),
            )
            // A backup that finishes, or one a user applies, wakes its Database (history,
            // BackupHealthy, the next scheduled run).
            .watches_stream(
                backups,
                queue.mapping(|backup: DatabaseBackup| {
                    let ns = backup.metadata.namespace.clone()?;
                    Some(ObjectRef::new(&backup.spec.database).within(&ns))
                }),
            );
    tokio::spawn(mark_ready_once_listed(
        client.clone(),
        namespaces.to_vec(),
        ready,
    ));
    let database_controller = run_database_controller(database_controller, queue, ctx);
    futures::join!(database_controller, backup_controller);
    info!("dbop controller stopped");
}

/// Runs the Database controller until SIGTERM/SIGINT; an object leaves `queue` when its
/// reconcile starts, or when the controller finds it gone from the store.
async fn run_database_controller(
    controller: Controller<DeserializeGuard<Database>>,
    queue: Arc<WorkQueue>,
    ctx: Arc<Context>,
) {
    controller
        .shutdown_on_signal()
        .run(queue.starting(reconcile), error_policy, ctx)
        .for_each(move |result| {
            work_queue::forget_if_gone(&queue, &result);
            async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "reconcile error (handled by the error policy)");
                }
            }
        })
        .await;
}

/// How many Databases are reconciled at once by default (`--reconcile-concurrency`; 0 is
/// unbounded). Bounded because a thousand Databases created at once otherwise send a thousand
/// first reconciles' writes together, and an API server that times some of them out (a Service's
/// cluster IP allocation is the first to) makes each of those wait out a retry backoff; a
/// bounded queue drains steadily instead (see docs/benchmarks.md).
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 16;

/// Ready once both kinds the controllers watch can be listed in every watched namespace (the
/// API server answers, RBAC allows it). Not the stores' own readiness: kube-runtime's
/// `Store::wait_until_ready` wakes one waiter only, and the controller's runner is already
/// waiting on it.
async fn mark_ready_once_listed(client: Client, namespaces: Vec<String>, ready: Arc<Readiness>) {
    let mut failures = 0;
    loop {
        match list_both_kinds(&client, &namespaces).await {
            Ok(()) => {
                info!("Databases and DatabaseBackups listed: ready");
                ready.set(true);
                return;
            }
            Err(error) => {
                failures += 1;
                warn!(%error, "cannot list Databases or DatabaseBackups yet: not ready");
                tokio::time::sleep(crate::context::backoff(failures)).await;
            }
        }
    }
}

/// Lists one Database and one `DatabaseBackup` in every watched namespace (or in all).
async fn list_both_kinds(client: &Client, namespaces: &[String]) -> Result<(), kube::Error> {
    let one = ListParams::default().limit(1);
    for api in owned::<Database>(client, namespaces) {
        api.list_metadata(&one).await?;
    }
    for api in owned::<DatabaseBackup>(client, namespaces) {
        api.list_metadata(&one).await?;
    }
    Ok(())
}

#[instrument(skip_all, fields(namespace = %key_of(&guard).0, database = %key_of(&guard).1))]
async fn reconcile(guard: Arc<DeserializeGuard<Database>>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = reconcile_guarded(&guard, &ctx).await;
    let error = result.as_ref().err().map(Error::label);
    ctx.metrics
        .reconciled(DATABASE_CONTROLLER, started.elapsed(), error);
    result
}

async fn reconcile_guarded(guard: &DeserializeGuard<Database>, ctx: &Context) -> Result<Action> {
    let db = match &guard.0 {
        Ok(db) => Arc::new(db.clone()),
        Err(invalid) => return handle_invalid(ctx, guard, &invalid.error).await,
    };
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    // A deletion that still waits for its final backup keeps the finalizer: the pass ends
    // before kube's finalizer helper, which would remove it.
    let result = match cleanup::await_final_backup(ctx, &db).await {
        Ok(Some(waiting)) => Ok(waiting),
        Ok(None) => apply_or_clean_up(ctx, &api, db.clone(), guard).await,
        Err(error) => Err(error),
    };
    match &result {
        Ok(_) => ctx.reset_failures(&key_of(guard)),
        Err(error) => {
            let event = EventSpec {
                warning: true,
                reason: error.label().into(),
                note: error.to_string(),
            };
            act::publish(ctx, &db, &event).await;
        }
    }
    result
}

/// kube's finalizer helper: `reconcile_database` while the Database lives, the deletion policy
/// (then the finalizer's removal) once it is deleted.
async fn apply_or_clean_up(
    ctx: &Context,
    api: &Api<Database>,
    db: Arc<Database>,
    guard: &DeserializeGuard<Database>,
) -> Result<Action> {
    finalizer(api, FINALIZER, db, |event| async {
        match event {
            FinalizerEvent::Apply(db) => reconcile_database(ctx, &db).await,
            FinalizerEvent::Cleanup(db) => {
                let done = cleanup::cleanup(ctx, &db).await;
                if done.is_ok() {
                    ctx.metrics.database_phase(key_of(guard), None);
                }
                done
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// A Database this version of dbop cannot read (an edit the schema let through, a newer CRD):
/// say so on the object, never block its deletion, and keep reconciling the others.
async fn handle_invalid(
    ctx: &Context,
    guard: &DeserializeGuard<Database>,
    error: &str,
) -> Result<Action> {
    let meta = guard.meta();
    let (ns, name) = key_of(guard);
    warn!(%error, "cannot read this Database; it is skipped until it is fixed");
    let reference = ObjectReference {
        api_version: Some(Database::api_version(&()).into()),
        kind: Some(Database::kind(&()).into()),
        name: Some(name.clone()),
        namespace: Some(ns.clone()),
        uid: meta.uid.clone(),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "InvalidSpec".into(),
        note: Some(
            format!("dbop cannot read this Database: {error}")
                .chars()
                .take(1000)
                .collect(),
        ),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        warn!(error = %e, "could not publish an Event");
    }
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    if meta.deletion_timestamp.is_some() && finalizers.iter().any(|f| f == FINALIZER) {
        // Deletion of an unreadable object proceeds as Retain: nothing is destroyed, and the
        // generated credentials are released so they outlive it with the data.
        cleanup::release_for_retain(ctx, &ns, &name, meta.uid.as_deref()).await?;
        let api: Api<Database> = Api::namespaced(ctx.client.clone(), &ns);
        let remaining: Vec<_> = finalizers.into_iter().filter(|f| f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": remaining, "resourceVersion": meta.resource_version}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(Action::await_change())
}

fn error_policy(
    guard: Arc<DeserializeGuard<Database>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.retry_after_failure(key_of(&guard), error, "Database")
}
