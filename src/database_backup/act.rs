//! Act, for the `DatabaseBackup` controller: create the backup Job (from the Database observe
//! read), write the status only when it changed, and publish the Events of the change on the
//! backup and on its Database. All writes go through `kube_io`.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::controller::Action;
use kube::{Api, Resource};

use super::decide::{BackupDecision, REQUEUE_QUEUED, backup_events};
use crate::api::{Database, DatabaseBackup};
use crate::backup::job::{JobProblem, backup_job};
use crate::context::Context;
use crate::error::Result;
use crate::kube_io::{self, create_once, patch_status};
use crate::objects::{EventSpec, to_chrono};

/// Carries out the decision. Returns early (look again soon) when the Job cannot be built
/// because the Database changed since it was read.
pub async fn act(
    ctx: &Context,
    backup: &DatabaseBackup,
    database: Option<&Database>,
    decision: &BackupDecision,
    now: DateTime<Utc>,
) -> Result<Option<Action>> {
    let ns = backup.metadata.namespace.clone().unwrap_or_default();
    if decision.create_job {
        let created = backup
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or(now);
        let job = match database.map(|db| backup_job(db, backup, created, &ctx.settings)) {
            Some(Ok(job)) => job,
            Some(Err(
                JobProblem::NoBackupSpec
                | JobProblem::NoRunningVersion
                | JobProblem::InvalidSpec(_),
            ))
            | None => {
                // The Database changed between its read and the decision: look again.
                return Ok(Some(Action::requeue(REQUEUE_QUEUED)));
            }
        };
        create_once(&Api::<Job>::namespaced(ctx.client.clone(), &ns), &job).await?;
    }
    let previous = backup.status.clone().unwrap_or_default();
    if previous != decision.status {
        let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &ns);
        let name = backup.metadata.name.clone().unwrap_or_default();
        patch_status(&api, &name, &decision.status).await?;
        for event in backup_events(backup, &previous, &decision.status) {
            publish(ctx, backup, &event).await;
        }
    }
    Ok(None)
}

/// Publishes an Event on the backup and on its Database.
async fn publish(ctx: &Context, backup: &DatabaseBackup, event: &EventSpec) {
    let mut db_ref = backup.object_ref(&());
    db_ref.kind = Some(Database::kind(&()).into());
    db_ref.name = Some(backup.spec.database.clone());
    db_ref.resource_version = None;
    // The Database's uid: from its owner reference when it has one.
    db_ref.uid = backup
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Database")
        .map(|owner| owner.uid.clone());
    kube_io::publish(ctx, &[backup.object_ref(&()), db_ref], "Backup", event).await;
}
