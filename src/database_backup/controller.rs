//! The `DatabaseBackup` controller: runs one backup Job per `DatabaseBackup`, one at a time per
//! Database (the oldest waiting one first), and copies the agent's result from the pod's
//! termination message into the status. Events for start, success and failure.
//!
//! The runtime only: the watches (the backups and the Jobs they own) and one pass of
//! `observe` (reads) → `decide` (pure) → `act` (writes through `kube_io`), and a metric per
//! reconcile and per successful backup, and its work-queue depth (`context::work_queue`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::core::PartialObjectMeta;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use tracing::{info, instrument};

use super::act::act;
use super::decide::decide;
use super::facts::name_of;
use super::observe::observe;
use crate::api::{BackupPhase, DatabaseBackup};
use crate::context::caches::Trigger;
use crate::context::work_queue::{WorkQueue, forget_if_gone};
use crate::context::{Context, FailureKey};
use crate::error::{During, Error, Result, Step};
use crate::ops::metrics::{BACKUP_CONTROLLER, DatabaseKey};

/// Runs the `DatabaseBackup` controller until SIGTERM/SIGINT, woken by `backups` (its own
/// objects, read from the cache in `ctx`) and `jobs` (the Jobs they own).
pub async fn run(
    ctx: Arc<Context>,
    backups: Trigger<DatabaseBackup>,
    jobs: Trigger<PartialObjectMeta<Job>>,
) {
    let queue = WorkQueue::new(ctx.metrics.workqueue_depth(BACKUP_CONTROLLER));
    let backups = queue.own(backups);
    let jobs = queue.owned::<DatabaseBackup, _>(jobs);
    Controller::for_stream(backups, ctx.caches.backups.clone())
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(200)))
        .owns_stream(jobs)
        .shutdown_on_signal()
        .run(queue.starting(reconcile), error_policy, ctx)
        .for_each(move |result| {
            forget_if_gone(&queue, &result);
            async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "backup reconcile error (handled by the error policy)");
                }
            }
        })
        .await;
    info!("DatabaseBackup controller stopped");
}

fn key_of(b: &DatabaseBackup) -> FailureKey {
    (
        format!(
            "backup/{}",
            b.metadata.namespace.clone().unwrap_or_default()
        ),
        name_of(b),
    )
}

#[instrument(skip_all, fields(namespace = ?backup.metadata.namespace, backup = %name_of(&backup)))]
async fn reconcile(backup: Arc<DatabaseBackup>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let result = reconcile_once(&backup, &ctx).await;
    let error = result.as_ref().err().map(Error::label);
    ctx.metrics
        .reconciled(BACKUP_CONTROLLER, started.elapsed(), error);
    result
}

/// A succeeded backup of a Database that exists sets that Database's last-success metrics (the
/// newest one wins); a backup kept by retention after its Database was deleted sets nothing, or
/// its series would come back after the Database's were removed.
fn success_to_record(
    backup: &DatabaseBackup,
    database_exists: bool,
) -> Option<(DatabaseKey, f64, Option<i64>)> {
    let status = backup.status.as_ref().filter(|_| database_exists)?;
    let (Some(BackupPhase::Succeeded), Some(completed)) = (status.phase, status.completed_at)
    else {
        return None;
    };
    let namespace = backup.metadata.namespace.clone().unwrap_or_default();
    let key = (namespace, backup.spec.database.clone());
    let seconds = completed.timestamp_millis() as f64 / 1000.0;
    Some((key, seconds, status.size_bytes))
}

async fn reconcile_once(backup: &DatabaseBackup, ctx: &Context) -> Result<Action> {
    let observed = observe(ctx, backup, Utc::now())
        .await
        .during(Step::Observe)?;
    if let Some((key, seconds, size)) = success_to_record(backup, observed.database.is_some()) {
        ctx.metrics.backup_succeeded(key, seconds, size);
    }
    let decision = decide(backup, &observed.facts);
    let database = observed.database.as_ref();
    let early = act(ctx, backup, database, &decision, observed.facts.now)
        .await
        .during(Step::Apply)?;
    if let Some(early) = early {
        return Ok(early);
    }
    ctx.reset_failures(&key_of(backup));
    Ok(match decision.requeue_after {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

fn error_policy(backup: Arc<DatabaseBackup>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.retry_after_failure(key_of(&backup), error, "backup")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BackupReason;
    use crate::database_backup::testing::{backup, now};

    #[test]
    fn a_succeeded_backup_sets_the_metrics_of_its_database_only_while_it_exists() {
        let mut done = backup("b1", BackupReason::Manual, Some(BackupPhase::Succeeded), 60);
        if let Some(status) = done.status.as_mut() {
            status.completed_at = Some(now());
            status.size_bytes = Some(4096);
        }
        let key = ("shop".to_string(), "orders".to_string());
        let seconds = now().timestamp() as f64;
        assert_eq!(
            success_to_record(&done, true),
            Some((key, seconds, Some(4096)))
        );
        assert_eq!(success_to_record(&done, false), None, "kept by retention");
        let running = backup("b2", BackupReason::Manual, Some(BackupPhase::Running), 60);
        assert_eq!(success_to_record(&running, true), None);
    }
}
