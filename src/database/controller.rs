//! The Database controller: its triggers (Databases and everything they own, so a deleted or
//! edited child is repaired from its watch event; `DatabaseBackup`s, which wake their Database),
//! one pass (`reconcile`: kube's finalizer helper around `reconcile_database` and the deletion
//! policy), a Database this version cannot read, its Events for errors, its error policy and a
//! metric per reconcile. Started by `runtime`, beside the `DatabaseBackup` controller.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource};
use serde_json::json;
use tracing::{instrument, warn};

use super::lanes::{Lane, Lanes, lane_of};
use super::{apply, cleanup, reconcile_database};
use crate::FINALIZER;
use crate::api::{Database, DatabaseBackup};
use crate::context::caches::Trigger;
use crate::context::work_queue::{self, WorkQueue};
use crate::context::{Context, FailureKey};
use crate::error::{During, Error, Result, Step};
use crate::kube_io;
use crate::objects::EventSpec;
use crate::ops::metrics::DATABASE_CONTROLLER;
use crate::resources::LABEL_INSTANCE;

type Meta<K> = PartialObjectMeta<K>;

/// What wakes the Database controller, one trigger per kind.
pub struct Triggers {
    pub databases: Trigger<DeserializeGuard<Database>>,
    pub statefulsets: Trigger<Meta<StatefulSet>>,
    pub services: Trigger<Meta<Service>>,
    pub secrets: Trigger<Meta<PartialObjectMeta<Secret>>>,
    pub claims: Trigger<Meta<PersistentVolumeClaim>>,
    /// The database pods (their role label, their readiness).
    pub pods: Trigger<Meta<Pod>>,
    pub disruption_budgets: Trigger<Meta<PodDisruptionBudget>>,
    /// The NetworkPolicy of `spec.networkPolicy` (a hand edit or deletion is put back).
    pub network_policies: Trigger<Meta<NetworkPolicy>>,
    /// A primary Lease its holder released (its server stopped): a failover at once.
    pub released_leases: Trigger<Meta<Lease>>,
    /// The Jobs a Database owns (init, restore, preflight, verify).
    pub jobs: Trigger<Meta<Job>>,
    /// Backups wake their Database (history, health).
    pub backups: Trigger<DatabaseBackup>,
}

fn key_of(guard: &DeserializeGuard<Database>) -> FailureKey {
    let meta = guard.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Runs the Database controller until SIGTERM/SIGINT: `concurrency` converging Databases at
/// once (0: unbounded), and repairs beside them in their own lane (`lanes`).
pub async fn run(ctx: Arc<Context>, concurrency: u16, triggers: Triggers) {
    let queue = WorkQueue::new(ctx.metrics.workqueue_depth(DATABASE_CONTROLLER));
    // No debounce: a deleted or edited child is repaired from its watch event at once. kube's
    // runner starts every woken pass; the lanes bound how many run.
    let controller =
        Controller::for_stream(queue.own(triggers.databases), ctx.caches.databases.clone())
            .with_config(ControllerConfig::default().concurrency(0))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.statefulsets))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.services))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.secrets))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.jobs))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.disruption_budgets))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.network_policies))
            .owns_stream(queue.owned::<DeserializeGuard<Database>, _>(triggers.released_leases))
            // Claims and pods are made by the StatefulSet controller and carry our labels, not
            // an owner: a new pod gets its role label, a pod that turns (un)ready its status line.
            .watches_stream(
                triggers.claims,
                queue.mapping(|pvc: Meta<PersistentVolumeClaim>| by_instance_label(&pvc.metadata)),
            )
            .watches_stream(
                triggers.pods,
                queue.mapping(|pod: Meta<Pod>| by_instance_label(&pod.metadata)),
            )
            // A backup that finishes, or one a user applies, wakes its Database (history,
            // BackupHealthy, the next scheduled run).
            .watches_stream(
                triggers.backups,
                queue.mapping(|backup: DatabaseBackup| {
                    let ns = backup.metadata.namespace.clone()?;
                    Some(ObjectRef::new(&backup.spec.database).within(&ns))
                }),
            );
    run_database_controller(controller, queue, Arc::new(Lanes::new(concurrency)), ctx).await;
}

/// The Database an object belongs to by its `app.kubernetes.io/instance` label.
fn by_instance_label(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<ObjectRef<DeserializeGuard<Database>>> {
    let name = meta.labels.as_ref()?.get(LABEL_INSTANCE)?.clone();
    let ns = meta.namespace.clone()?;
    Some(ObjectRef::new(&name).within(&ns))
}

/// Runs the Database controller until SIGTERM/SIGINT; an object leaves `queue` when its pass
/// has its lane's permit and starts, or when the controller finds it gone from the store.
async fn run_database_controller(
    controller: Controller<DeserializeGuard<Database>>,
    queue: Arc<WorkQueue>,
    lanes: Arc<Lanes>,
    ctx: Arc<Context>,
) {
    let admitted = {
        let queue = queue.clone();
        move |guard, ctx| admitted(guard, ctx, queue.clone(), lanes.clone())
    };
    controller
        .shutdown_on_signal()
        .run(admitted, error_policy, ctx)
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

/// One pass once its lane (`lanes::lane_of`) lets it run.
async fn admitted(
    guard: Arc<DeserializeGuard<Database>>,
    ctx: Arc<Context>,
    queue: Arc<WorkQueue>,
    lanes: Arc<Lanes>,
) -> Result<Action> {
    let lane = match &guard.0 {
        Ok(db) => lane_of(db),
        Err(_) => Lane::Convergence,
    };
    let _permit = lanes.enter(lane).await;
    queue.started(&key_of(&guard));
    // The Database as it is now, not as it was when the pass was woken: it may have waited
    // for its lane while the Database changed (kube's runner reads the store when it starts a
    // pass, which is now before the wait). Gone from the store: deleted, nothing to do.
    let current = ctx
        .caches
        .databases
        .get(&ObjectRef::from_obj(guard.as_ref()));
    match current {
        // Boxed: a pass's future is tens of KiB, and kube's runner spawns every woken pass at
        // once (a restart wakes them all). Inline, each waiting pass would hold that much
        // while it waits for its lane; boxed, only the running ones do.
        Some(now) => Box::pin(reconcile(now, ctx)).await,
        None => Ok(Action::await_change()),
    }
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
    let result = match cleanup::await_final_backup(ctx, &db)
        .await
        .during(Step::Cleanup)
    {
        Ok(Some(waiting)) => Ok(waiting),
        Ok(None) => apply_or_clean_up(ctx, &api, db.clone(), guard).await,
        Err(error) => Err(error),
    };
    match &result {
        Ok(_) => ctx.reset_failures(&key_of(guard)),
        Err(error) => {
            if let Some(event) = failure_event(error) {
                apply::publish(ctx, &db, &event).await;
            }
        }
    }
    result
}

/// The Warning Event of a failed pass — none for a conflict: the pass ran on a stale copy, is
/// run again from a fresh one within a second, and nothing is for the user to fix.
fn failure_event(error: &Error) -> Option<EventSpec> {
    (!error.is_conflict()).then(|| EventSpec {
        warning: true,
        reason: error.label().into(),
        note: error.to_string(),
    })
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
                let done = cleanup::cleanup(ctx, &db).await.during(Step::Cleanup);
                if done.is_ok() {
                    ctx.metrics.database_phase(key_of(guard), None);
                }
                done
            }
        }
    })
    .await
    .or_else(already_gone)
}

/// The finalizer's removal found the Database gone: this reconcile ran on a cached copy older
/// than that removal (the Database went with its last finalizer, and a child's deletion woke
/// the reconcile again). What the removal wanted is done; neither an error nor a Warning.
fn already_gone(error: kube::runtime::finalizer::Error<Error>) -> Result<Action> {
    use kube::runtime::finalizer::Error::RemoveFinalizer;
    match error {
        RemoveFinalizer(kube::Error::Api(status)) if status.code == 404 => {
            Ok(Action::await_change())
        }
        error => Err(Error::Finalizer(Box::new(error))),
    }
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
    let event = EventSpec {
        warning: true,
        reason: "InvalidSpec".into(),
        note: format!("dbop cannot read this Database: {error}"),
    };
    kube_io::publish(ctx, &[reference], "Reconcile", &event).await;
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    if meta.deletion_timestamp.is_some() && finalizers.iter().any(|f| f == FINALIZER) {
        // Deletion of an unreadable object proceeds as Retain: nothing is destroyed, and the
        // generated credentials are released so they outlive it with the data.
        cleanup::release_for_retain(ctx, &ns, &name, meta.uid.as_deref()).await?;
        let api: Api<Database> = Api::namespaced(ctx.client.clone(), &ns);
        let remaining: Vec<_> = finalizers.into_iter().filter(|f| f != FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": remaining, "resourceVersion": meta.resource_version}});
        kube_io::merge_patch(&api, &name, &patch).await?;
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

#[cfg(test)]
mod tests {
    use kube::core::Status;
    use kube::runtime::finalizer::Error as FinalizerError;

    use super::*;

    fn removal_failed(code: u16) -> FinalizerError<Error> {
        let status = Status::failure("databases.dbop.dev \"a\"", "x").with_code(code);
        FinalizerError::RemoveFinalizer(kube::Error::Api(status.boxed()))
    }

    /// kube's runner spawns every woken pass at once; each waits for its lane holding only
    /// what `admitted` keeps across that wait (the pass itself is boxed once it runs).
    #[tokio::test]
    async fn a_pass_waiting_for_its_lane_holds_little() {
        let (service, _server) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(service, "default");
        let caches = crate::context::caches::caches().0;
        let ctx = Context::new(client, crate::settings::Settings::default(), caches);
        let db: Database = serde_json::from_value(json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "16.4", "storage": {"size": "1Gi"}}
        }))
        .expect("a Database");
        let queue = WorkQueue::new(Default::default());
        let guard = Arc::new(DeserializeGuard(Ok(db)));
        let pass = admitted(guard, Arc::new(ctx), queue, Arc::new(Lanes::new(1)));
        let size = std::mem::size_of_val(&pass);
        assert!(size <= 1024, "a waiting pass holds {size} bytes");
    }

    #[test]
    fn a_finalizer_removal_that_finds_the_database_gone_is_done() {
        assert!(already_gone(removal_failed(404)).is_ok());
        assert!(already_gone(removal_failed(409)).is_err());
        let cleanup = FinalizerError::CleanupFailed(Error::DeletionWaiting("final backup".into()));
        assert!(already_gone(cleanup).is_err());
    }

    #[test]
    fn a_conflict_is_no_warning_and_a_failure_is_one() {
        let conflict = Status::failure("the object has been modified", "Conflict").with_code(409);
        let conflict = Error::Kube(kube::Error::Api(conflict.boxed()));
        assert_eq!(failure_event(&conflict), None);
        let failed = Status::failure("boom", "InternalError").with_code(500);
        let event =
            failure_event(&Error::Kube(kube::Error::Api(failed.boxed()))).expect("a Warning Event");
        assert!(event.warning);
        assert_eq!(event.reason, "KubeApiError");
    }
}
