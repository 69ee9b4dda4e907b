//! The controller runtime around the reconcile: watches (Databases and everything they own,
//! so a deleted or edited child is repaired from its watch event), the finalizer, per-object
//! retry backoff, and Events for errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::FINALIZER;
use crate::api::{Database, DatabaseBackup};
use crate::error::{Error, Result};
use crate::reconcile::{act, cleanup, decide, observe};
use crate::resources::{LABEL_INSTANCE, MANAGED_SELECTOR, Settings};

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub recorder: Recorder,
    /// Consecutive failures per Database, for exponential backoff; reset on success.
    failures: Mutex<HashMap<(String, String), u32>>,
}

impl Context {
    pub fn new(client: Client, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: "dbop".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            failures: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn record_failure(&self, key: (String, String)) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn reset_failures(&self, key: &(String, String)) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// The retry delay after `failures` consecutive failures: 5 s doubling, at most 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    Duration::from_secs((5u64 << exponent).min(300))
}

fn key_of(guard: &DeserializeGuard<Database>) -> (String, String) {
    let meta = guard.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Runs the controller until SIGTERM/SIGINT. `namespace` limits it to one namespace.
pub async fn run(client: Client, settings: Settings, namespace: Option<String>) {
    let databases: Api<DeserializeGuard<Database>> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    fn owned<K>(client: &Client, namespace: &Option<String>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let managed = watcher::Config::default()
        .labels(MANAGED_SELECTOR)
        .any_semantic();
    let ctx = Arc::new(Context::new(client.clone(), settings));
    info!(
        namespace = namespace.as_deref().unwrap_or("<all>"),
        "dbop controller starting"
    );
    // Both controllers stop on SIGTERM/SIGINT (each has `shutdown_on_signal`).
    let backups = crate::backup::controller::run(ctx.clone(), namespace.clone());
    let database_controller = Controller::new(databases, watcher::Config::default().any_semantic())
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
        .owns(owned::<StatefulSet>(&client, &namespace), managed.clone())
        .owns(owned::<Service>(&client, &namespace), managed.clone())
        .owns(owned::<Secret>(&client, &namespace), managed.clone())
        .owns(owned::<Job>(&client, &namespace), managed.clone())
        // Claims are made by the StatefulSet controller and carry our labels, not an owner.
        .watches(
            owned::<PersistentVolumeClaim>(&client, &namespace),
            managed,
            |pvc| {
                let name = pvc.metadata.labels.as_ref()?.get(LABEL_INSTANCE)?.clone();
                let ns = pvc.metadata.namespace.clone()?;
                Some(ObjectRef::new(&name).within(&ns))
            },
        )
        // A backup that finishes, or one a user applies, wakes its Database (history,
        // BackupHealthy, the next scheduled run).
        .watches(
            owned::<DatabaseBackup>(&client, &namespace),
            watcher::Config::default().any_semantic(),
            |backup| {
                let ns = backup.metadata.namespace.clone()?;
                Some(ObjectRef::new(&backup.spec.database).within(&ns))
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile error (handled by the error policy)");
            }
        });
    futures::join!(database_controller, backups);
    info!("dbop controller stopped");
}

#[instrument(skip_all, fields(namespace = %key_of(&guard).0, database = %key_of(&guard).1))]
async fn reconcile(guard: Arc<DeserializeGuard<Database>>, ctx: Arc<Context>) -> Result<Action> {
    let db = match &guard.0 {
        Ok(db) => Arc::new(db.clone()),
        Err(invalid) => return handle_invalid(&ctx, &guard, &invalid.error).await,
    };
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let result = finalizer(&api, FINALIZER, db.clone(), |event| async {
        match event {
            FinalizerEvent::Apply(db) => reconcile_database(&ctx, &db).await,
            FinalizerEvent::Cleanup(db) => cleanup::cleanup(&ctx, &db).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    match &result {
        Ok(_) => ctx.reset_failures(&key_of(&guard)),
        Err(error) => {
            let event = crate::reconcile::events::EventSpec {
                warning: true,
                reason: error.label().into(),
                note: error.to_string(),
            };
            act::publish(&ctx, &db, &event).await;
        }
    }
    result
}

/// observe → decide → act for a Database that is not being deleted.
pub async fn reconcile_database(ctx: &Context, db: &Database) -> Result<Action> {
    let snapshot = observe::snapshot(&ctx.client, db).await?;
    let facts = observe::Facts::from_snapshot(db, &snapshot);
    let mut decision = decide::decide(db, &facts, &ctx.settings);
    for condition in act::apply_steps(ctx, db, &snapshot, &decision).await? {
        decision.override_condition(condition);
    }
    act::apply_backups(ctx, db, &decision).await?;
    act::update_status(ctx, db, act::next_status(db, &decision, Utc::now())).await?;
    Ok(Action::requeue(decision.requeue_after))
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
        cleanup::release_generated_secret(ctx, &ns, &name, meta.uid.as_deref()).await?;
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
    let failures = ctx.record_failure(key_of(&guard));
    let delay = backoff(failures);
    warn!(%error, label = error.label(), failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let delays: Vec<_> = (1..=9).map(backoff).collect();
        let secs: Vec<u64> = delays.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(0).as_secs(), 5);
        assert_eq!(backoff(u32::MAX).as_secs(), 300);
    }
}
