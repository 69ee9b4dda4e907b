//! The finalizer's I/O: read what a deletion depends on (the final backup), carry out the
//! deletion policy decided in `deletion`, and say where it stands in the status and Events.
//!
//! Idempotent, and safe when provisioning never finished or the spec is odd: it only lists by
//! label, gets by deterministic name, and deletes or releases what it finds.
//! - `await_final_backup` runs before kube's finalizer helper: while pods change version (an
//!   upgrade's safe point, `wait_for_safe_point`), or while a `Snapshot` deletion waits
//!   for (or is held by) its final backup, the finalizer must stay, so the pass ends there;
//! - `cleanup` is the finalizer's Cleanup: it applies the policy once the Database may go.
//!
//! The Database's `DatabaseBackup`s and its generated credentials Secret are released (their
//! owner reference removed) when they must outlive it; the final backup is never owned by it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::info;

use chrono::{DateTime, Utc};

use super::apply::{publish, update_status};
use super::deletion::{
    DeletionFacts, DeletionPlan, FinalBackupFact, Finish, Step, decide_deletion, deletion_events,
    final_backup_name,
};
use crate::FINALIZER;
use crate::api::conditions::{ConditionStatus, ConditionType, find, merge};
use crate::api::{Database, DatabaseBackup, DatabaseStatus, DeletionPolicy, Phase};
use crate::backup::settings::BackupSettings;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kube_io::{create_once, delete_if_exists, merge_patch, merge_patch_if_exists};
use crate::objects::{EventSpec, owned_by, to_chrono};
use crate::resources::Names;
use crate::resources::credentials::is_generated;
use crate::resources::database_backup::final_backup;
use crate::resources::{LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY};
use crate::upgrade::deletion_gate::{DeletionGate, deletion_gate};

/// The label selector of a Database's data claims.
pub fn claims_selector(database: &str) -> String {
    format!("{LABEL_INSTANCE}={database},{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// The shortest wait for a final backup: a backup Job's deadline is never under a minute.
const MIN_FINAL_BACKUP_BOUND: Duration = Duration::from_secs(60);

/// Before the finalizer helper: a Database being deleted whose policy must still wait (the
/// final backup runs or failed) is handled here and the pass ends (`Some`); `None` lets the
/// finalizer's Cleanup apply the policy.
pub async fn await_final_backup(ctx: &Context, db: &Database) -> Result<Option<Action>> {
    let ours = db.finalizers().iter().any(|f| f == FINALIZER);
    if db.metadata.deletion_timestamp.is_none() || !ours {
        return Ok(None);
    }
    // Pods changing version: the upgrade reaches a safe point first (bounded).
    if let Some(waiting) = wait_for_safe_point(ctx, db).await? {
        return Ok(Some(waiting));
    }
    let plan = decide_deletion(&observe(ctx, db).await?);
    if let Step::Finish(_) = plan.step {
        return Ok(None);
    }
    if let Step::AwaitFinalBackup { create: true } = plan.step {
        create_final_backup(ctx, db).await?;
    }
    write_status(ctx, db, &plan).await?;
    Ok(Some(match plan.requeue_after {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }))
}

/// The finalizer's Cleanup: applies the deletion policy. Fails (the finalizer stays) when the
/// policy still waits for its final backup.
pub async fn cleanup(ctx: &Context, db: &Database) -> Result<Action> {
    let plan = decide_deletion(&observe(ctx, db).await?);
    let Step::Finish(finish) = &plan.step else {
        return Err(Error::DeletionWaiting(plan.ready.message.clone()));
    };
    write_status(ctx, db, &plan).await?;
    apply_finish(ctx, db, finish).await?;
    publish(ctx, db, &finish.event).await;
    Ok(Action::await_change())
}

/// Reads what the deletion decision needs (the final backup only under `Snapshot`).
async fn observe(ctx: &Context, db: &Database) -> Result<DeletionFacts> {
    let final_name = final_backup_name(&db.name(), db.metadata.uid.as_deref().unwrap_or(""));
    let final_backup = match db.spec.deletion_policy {
        DeletionPolicy::Snapshot => {
            let api: Api<DatabaseBackup> =
                Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
            api.get_opt(&final_name).await?.map(|b| final_fact(&b))
        }
        DeletionPolicy::Retain | DeletionPolicy::Delete => None,
    };
    Ok(DeletionFacts {
        now: Utc::now(),
        policy: db.spec.deletion_policy,
        has_run: db
            .status
            .as_ref()
            .is_some_and(|s| s.current_version.is_some()),
        backup_bound: backup_bound(db),
        final_name,
        final_backup,
    })
}

/// How long the final backup may take: `spec.backup.timeout` (at least a minute), or why
/// there can be no final backup.
fn backup_bound(db: &Database) -> Result<Duration, String> {
    let spec = db
        .spec
        .backup
        .as_ref()
        .ok_or_else(|| "spec.backup is not set, so there is nowhere to store it".to_string())?;
    let settings = BackupSettings::parse(spec)?;
    Ok(settings.timeout.max(MIN_FINAL_BACKUP_BOUND))
}

fn final_fact(backup: &DatabaseBackup) -> FinalBackupFact {
    let status = backup.status.clone().unwrap_or_default();
    FinalBackupFact {
        name: backup.metadata.name.clone().unwrap_or_default(),
        created: backup
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or_else(Utc::now),
        phase: status.phase,
        message: status.message,
    }
}

/// The final `DatabaseBackup`: reason `Final`, not owned by the Database (it must outlive it).
async fn create_final_backup(ctx: &Context, db: &Database) -> Result<()> {
    let name = final_backup_name(&db.name(), db.metadata.uid.as_deref().unwrap_or(""));
    let backup = final_backup(db, &name);
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    create_once(&api, &backup).await
}

/// The Deleting status with the plan's `Ready`, and the Events of the step (each once).
async fn write_status(ctx: &Context, db: &Database, plan: &DeletionPlan) -> Result<()> {
    let previous = db
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, ConditionType::Ready))
        .map(|c| c.reason.clone());
    update_status(ctx, db, deleting_status(db, &plan.ready, Utc::now())).await?;
    for event in deletion_events(previous.as_deref(), plan) {
        publish(ctx, db, &event).await;
    }
    Ok(())
}

/// Deletes or releases what the policy says.
async fn apply_finish(ctx: &Context, db: &Database, finish: &Finish) -> Result<()> {
    let ns = db.namespace_or_default();
    let uid = db.metadata.uid.as_deref();
    if finish.release_secret && is_generated(db) {
        release_generated_secret(ctx, &ns, &db.name(), uid).await?;
    }
    if finish.release_backups {
        release_backups(ctx, &ns, uid).await?;
    }
    if finish.delete_claims {
        delete_claims(ctx, db, &ns).await?;
    }
    Ok(())
}

/// The status of a Database being deleted: phase Deleting, not Ready (`ready` says why).
pub fn deleting_status(
    db: &Database,
    ready: &ConditionStatus,
    now: DateTime<Utc>,
) -> DatabaseStatus {
    let previous = db.status.clone().unwrap_or_default();
    DatabaseStatus {
        phase: Some(Phase::Deleting),
        conditions: merge(
            &previous.conditions,
            std::slice::from_ref(ready),
            db.metadata.generation,
            now,
        ),
        ..previous
    }
}
/// Removes the Database's owner reference from its generated credentials Secret (if the Secret
/// exists and is owned by the Database with this uid), so garbage collection keeps it.
pub async fn release_generated_secret(
    ctx: &Context,
    ns: &str,
    database: &str,
    uid: Option<&str>,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = Names::new(database).generated_secret();
    let Some(secret) = secrets.get_opt(&name).await? else {
        return Ok(());
    };
    if owned_by(&secret.metadata, None, uid) {
        let patch = json!({"metadata": {"ownerReferences": null}});
        merge_patch(&secrets, &name, &patch).await?;
        info!(secret = %name, "released the credentials Secret so it outlives the Database (Retain)");
    }
    Ok(())
}

/// Removes the Database's owner reference (by uid) from its `DatabaseBackup`s, so garbage
/// collection keeps them (and their Jobs) when the Database goes.
pub async fn release_backups(ctx: &Context, ns: &str, uid: Option<&str>) -> Result<()> {
    let Some(uid) = uid else { return Ok(()) };
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), ns);
    for backup in api.list_metadata(&ListParams::default()).await? {
        let owners = backup.metadata.owner_references.clone().unwrap_or_default();
        if !owners.iter().any(|o| o.uid == uid) {
            continue;
        }
        let remaining: Vec<_> = owners.into_iter().filter(|o| o.uid != uid).collect();
        let name = backup.metadata.name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"ownerReferences": remaining}});
        if merge_patch_if_exists(&api, &name, &patch).await? {
            info!(backup = %name, "released the DatabaseBackup so it outlives the Database");
        }
    }
    Ok(())
}

/// What `Retain` keeps, released from garbage collection: the generated credentials Secret and
/// the `DatabaseBackup`s (also used for a Database dbop cannot read, which is deleted as Retain).
pub async fn release_for_retain(
    ctx: &Context,
    ns: &str,
    database: &str,
    uid: Option<&str>,
) -> Result<()> {
    release_generated_secret(ctx, ns, database, uid).await?;
    release_backups(ctx, ns, uid).await
}

async fn delete_claims(ctx: &Context, db: &Database, ns: &str) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let list = claims
        .list_metadata(&ListParams::default().labels(&claims_selector(&db.name())))
        .await?;
    for claim in list {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = claim.metadata.name.clone().unwrap_or_default();
        if delete_if_exists(&claims, &name, &DeleteParams::default()).await? {
            info!(claim = %name, "deleted data claim");
        }
    }
    Ok(())
}

/// The finalizer's wait for an upgrade's safe point: while pods change version, a deleted
/// Database keeps reconciling (so the rollout or rollback can end) and says why deletion waits;
/// `upgrade::deletion_gate` decides, bounded.
///
/// `None` when the deletion policy may run now; while it must wait, the `Action` of a pass of
/// the upgrade (which wrote its status), after a `DeletionWaitsForUpgrade` Event. A wait, not
/// an error: no backoff, no Warning.
async fn wait_for_safe_point(ctx: &Context, db: &Database) -> Result<Option<Action>> {
    let now = Utc::now();
    let deleted_at = db
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or(now, to_chrono);
    match deletion_gate(db, deleted_at, now) {
        DeletionGate::Proceed => Ok(None),
        DeletionGate::GiveUp { message } => {
            let event = EventSpec {
                warning: true,
                reason: "DeletionStopsUpgrade".into(),
                note: message,
            };
            publish(ctx, db, &event).await;
            Ok(None)
        }
        DeletionGate::Wait { message } => {
            // Keep the upgrade going; the finalizer stays until the upgrade reaches a safe point.
            let action = super::reconcile_database(ctx, db).await?;
            let event = EventSpec {
                warning: false,
                reason: "DeletionWaitsForUpgrade".into(),
                note: message,
            };
            publish(ctx, db, &event).await;
            Ok(Some(action))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn deleting_status_keeps_the_rest() {
        let mut db = testing::minimal();
        db.status = Some(DatabaseStatus {
            current_version: Some("16.4".into()),
            ..DatabaseStatus::default()
        });
        let ready = ConditionStatus::new(ConditionType::Ready, false, "Deleting", "bye");
        let s = deleting_status(&db, &ready, Utc::now());
        assert_eq!(s.phase, Some(Phase::Deleting));
        assert_eq!(s.current_version.as_deref(), Some("16.4"));
        assert_eq!(s.conditions[0].reason, "Deleting");
        assert_eq!(
            claims_selector("orders"),
            "app.kubernetes.io/instance=orders,app.kubernetes.io/managed-by=dbop"
        );
    }

    #[test]
    fn the_final_backup_waits_at_most_the_backup_timeout() {
        let mut db = crate::backup::job::tests::with_backup(serde_json::json!({"timeout": "2h"}));
        assert_eq!(backup_bound(&db), Ok(Duration::from_secs(7200)));
        db.spec.backup.as_mut().unwrap().timeout = Some("5s".into());
        assert_eq!(backup_bound(&db), Ok(MIN_FINAL_BACKUP_BOUND));
        db.spec.backup.as_mut().unwrap().timeout = Some("soon".into());
        assert!(
            backup_bound(&db)
                .unwrap_err()
                .contains("spec.backup.timeout")
        );
        db.spec.backup = None;
        assert!(
            backup_bound(&db)
                .unwrap_err()
                .contains("spec.backup is not set")
        );
    }
}
