//! Backup verification's reads, for the Database controller: a Database's verify Jobs (and,
//! once the latest one ended, its pod's termination message: the agent's result). The decision
//! is `backup::verify`'s; the Job it asks for is built by `build` and created by `apply`.

use chrono::{DateTime, Utc};
use dbop_contract::parse_termination_message;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;

use crate::api::{BackupPhase, Database, Phase};
use crate::backup::verify::{VerifyFacts, VerifyJobFact};
use crate::context::Context;
use crate::error::Result;
use crate::kube_io::job_pods;
use crate::objects::{JobState, finished_at, job_state, termination_message, to_chrono};
use crate::resources::backup_job::BACKUP_CONTAINER;
use crate::resources::{LABEL_COMPONENT, LABEL_INSTANCE};

/// Reads the verify Jobs of `db` and its succeeded backups (from `records`, read by the
/// Database's observe). Reads nothing when `spec.backup.verify` is absent.
pub async fn observe_verification(
    ctx: &Context,
    db: &Database,
    phase: Phase,
    succeeded: Vec<(String, DateTime<Utc>)>,
    now: DateTime<Utc>,
) -> Result<Option<VerifyFacts>> {
    if db.spec.backup.as_ref().is_none_or(|b| b.verify.is_none()) {
        return Ok(None);
    }
    let ns = db.namespace_or_default();
    let selector = format!("{LABEL_INSTANCE}={},{LABEL_COMPONENT}=verify", db.name());
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let latest = db
        .status
        .as_ref()
        .and_then(|s| s.verification.as_ref())
        .and_then(|v| v.job.clone());
    let mut facts = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let state = job_state(job);
        let name = job.metadata.name.clone().unwrap_or_default();
        // Only the latest trigger's outcome is read, and only once it ended.
        let result = if state != JobState::Running && latest.as_deref() == Some(name.as_str()) {
            let pods = job_pods(&ctx.client, &ns, &name).await?;
            termination_message(&pods, BACKUP_CONTAINER).and_then(|m| parse_termination_message(&m))
        } else {
            None
        };
        facts.push(VerifyJobFact {
            finished: finished_at(job),
            name,
            state,
            result,
        });
    }
    Ok(Some(VerifyFacts {
        now,
        phase,
        created: db
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or(now),
        succeeded,
        jobs: facts,
    }))
}

/// The succeeded backups among a Database's records: (name, completion time).
pub fn succeeded_backups(
    records: &[crate::backup::schedule::BackupRecord],
) -> Vec<(String, DateTime<Utc>)> {
    records
        .iter()
        .filter(|r| r.phase == Some(BackupPhase::Succeeded))
        .map(|r| (r.name.clone(), r.completed.unwrap_or(r.created)))
        .collect()
}
