//! Observe, for the `DatabaseBackup` controller: read the backup's Database, its siblings, its
//! Job and that Job's pods, and the S3 credentials Secret (the only reads of a pass), and reduce
//! them to the `BackupFacts` its `decide` needs. The reads are here; the reductions are pure.
//!
//! The Database, the siblings and the Job come from the watch caches (`context::caches`); the
//! pods of a finished Job (read once, to record its result) and the user's S3 Secret and CA
//! source from the API server.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::core::DeserializeGuard;
use kube::{Api, Client};

use super::job::{BACKUP_CONTAINER, job_name};
use super::s3_secret::{S3SecretProblem, s3_secret_problem};
use super::settings::BackupSettings;
use crate::api::{BackupPhase, BackupReason, Database, DatabaseBackup, Phase};
use crate::context::Context;
use crate::context::caches::{get, list};
use crate::error::Result;
use crate::kube_io::{JobState, job_state};

/// Everything the decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupFacts {
    pub now: DateTime<Utc>,
    /// The Database, if it exists.
    pub database: Option<DatabaseFacts>,
    /// Unfinished backups of the same Database that go first: (name, running).
    pub ahead: Vec<(String, bool)>,
    pub job: Option<JobFacts>,
    /// A Job of this name exists but belongs to an earlier `DatabaseBackup` of the same name
    /// (deleted and made again, e.g. to retry a final backup): wait until it is collected.
    pub stale_job: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseFacts {
    pub phase: Option<Phase>,
    pub has_backup_spec: bool,
    /// What does not parse in `spec.backup` (the message names the field).
    pub spec_problem: Option<String>,
    pub has_run: bool,
    /// What is wrong with the S3 credentials Secret.
    pub s3_problem: Option<S3SecretProblem>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobFacts {
    pub state: JobState,
    pub start_time: Option<DateTime<Utc>>,
    pub completion_time: Option<DateTime<Utc>>,
    /// The backup container's termination message (the newest pod's).
    pub termination_message: Option<String>,
}

/// What was read, kept for `act` (the Database the Job is built from) and `decide`.
pub struct Observed {
    pub facts: BackupFacts,
    pub database: Option<Database>,
}

/// Reads the facts of one backup. Reads only.
pub async fn observe(
    ctx: &Context,
    backup: &DatabaseBackup,
    now: DateTime<Utc>,
) -> Result<Observed> {
    ctx.caches.wait_until_synced().await;
    let (client, caches) = (&ctx.client, &ctx.caches);
    let ns = backup.metadata.namespace.clone().unwrap_or_default();
    let database = match get(&caches.databases, &ns, &backup.spec.database) {
        Some(DeserializeGuard(Ok(db))) => Some(db),
        Some(DeserializeGuard(Err(invalid))) => return Err(unreadable(invalid.error)),
        None => None,
    };
    let job = get(&caches.jobs, &ns, &job_name(&name_of(backup)));
    let stale_job = job.as_ref().is_some_and(|j| !owned_by(j, backup));
    let job = match job.filter(|j| owned_by(j, backup)) {
        Some(job) => Some(observe_job(client, &ns, &job).await?),
        None => None,
    };
    let finished = backup
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(BackupPhase::is_finished);
    let (ahead, database_facts) = match (&database, finished || job.is_some()) {
        (Some(db), false) => observe_queue(ctx, &ns, backup, db).await?,
        (db, _) => (vec![], db.as_ref().map(|d| database_facts(d, None))),
    };
    let facts = BackupFacts {
        now,
        database: database_facts,
        ahead,
        job,
        stale_job,
    };
    Ok(Observed { facts, database })
}

/// A Database the cache holds but cannot read: the same error a GET of it would give.
fn unreadable(message: String) -> crate::error::Error {
    let error = <serde_json::Error as serde::de::Error>::custom(message);
    crate::error::Error::Kube(kube::Error::SerdeError(error))
}

/// Whether the Job belongs to this very `DatabaseBackup` (its owner's uid), not to an earlier
/// one of the same name.
fn owned_by(job: &Job, backup: &DatabaseBackup) -> bool {
    let uid = backup.metadata.uid.as_deref();
    job.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DatabaseBackup" && Some(o.uid.as_str()) == uid)
}

/// The Job's state, times and (once it ended) its pod's termination message.
async fn observe_job(client: &Client, ns: &str, job: &Job) -> Result<JobFacts> {
    let state = job_state(job);
    let pods = if state == JobState::Running {
        vec![]
    } else {
        let selector = format!(
            "batch.kubernetes.io/job-name={}",
            job.metadata.name.clone().unwrap_or_default()
        );
        Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
    };
    Ok(job_facts(job, state, &pods))
}

/// The backups ahead in the queue and the Database's facts, with its S3 credentials checked.
async fn observe_queue(
    ctx: &Context,
    ns: &str,
    backup: &DatabaseBackup,
    db: &Database,
) -> Result<(Vec<(String, bool)>, Option<DatabaseFacts>)> {
    let client = &ctx.client;
    let siblings = list(&ctx.caches.backups, ns, |b| {
        b.spec.database == backup.spec.database
    });
    let s3_problem = match &db.spec.backup {
        Some(spec) => {
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(&spec.s3.credentials.secret_name)
                .await?;
            match s3_secret_problem(&spec.s3.credentials, secret.as_ref()) {
                Some(problem) => Some(problem),
                None => super::ca::read_problem(client, ns, spec)
                    .await?
                    .map(S3SecretProblem::CaSource),
            }
        }
        None => None,
    };
    Ok((
        queue_ahead(backup, &siblings),
        Some(database_facts(db, s3_problem)),
    ))
}

fn job_facts(job: &Job, state: JobState, pods: &[Pod]) -> JobFacts {
    let status = job.status.clone().unwrap_or_default();
    JobFacts {
        state,
        start_time: status.start_time.as_ref().map(to_chrono),
        completion_time: finished_at(job),
        termination_message: termination_message(pods),
    }
}

/// When a Job ended: its completion time, or when it was marked Failed.
pub(crate) fn finished_at(job: &Job) -> Option<DateTime<Utc>> {
    let status = job.status.as_ref()?;
    status.completion_time.as_ref().map(to_chrono).or_else(|| {
        status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "Failed" && c.status == "True")
            .find_map(|c| c.last_transition_time.as_ref().map(to_chrono))
    })
}

fn database_facts(db: &Database, s3_problem: Option<S3SecretProblem>) -> DatabaseFacts {
    let status = db.status.clone().unwrap_or_default();
    DatabaseFacts {
        phase: status.phase,
        has_backup_spec: db.spec.backup.is_some(),
        spec_problem: db
            .spec
            .backup
            .as_ref()
            .and_then(|spec| BackupSettings::parse(spec).err()),
        has_run: status.current_version.is_some(),
        s3_problem,
    }
}

/// The unfinished backups that go before `backup`: pre-upgrade ones first, then by creation
/// time and name. Running ones always go first.
pub fn queue_ahead(backup: &DatabaseBackup, siblings: &[DatabaseBackup]) -> Vec<(String, bool)> {
    let key = |b: &DatabaseBackup| {
        (
            b.spec.reason != BackupReason::PreUpgrade,
            b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            name_of(b),
        )
    };
    let me = key(backup);
    let mut ahead: Vec<(bool, (bool, Option<_>, String))> = siblings
        .iter()
        .filter(|b| name_of(b) != name_of(backup))
        .filter(|b| b.spec.database == backup.spec.database)
        .filter(|b| {
            !b.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(BackupPhase::is_finished)
        })
        .filter_map(|b| {
            let running = b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running);
            (running || key(b) < me).then(|| (running, key(b)))
        })
        .collect();
    ahead.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    ahead.into_iter().map(|(r, k)| (k.2, r)).collect()
}

pub(super) fn name_of(b: &DatabaseBackup) -> String {
    b.metadata.name.clone().unwrap_or_default()
}

pub(crate) fn to_chrono(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default()
}

/// The backup container's termination message in the newest of the Job's pods.
pub(crate) fn termination_message(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|p| {
            let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
            let terminated = statuses
                .iter()
                .find(|c| c.name == BACKUP_CONTAINER)?
                .state
                .as_ref()?
                .terminated
                .as_ref()?;
            Some((
                terminated.finished_at.as_ref().map(to_chrono),
                terminated.message.clone()?,
            ))
        })
        .max_by_key(|(finished, _)| *finished)
        .map(|(_, message)| message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::testing::backup;

    #[test]
    fn the_queue_runs_the_oldest_first_and_pre_upgrade_before_all() {
        let me = backup("me", BackupReason::Manual, None, 10);
        let siblings = vec![
            backup(
                "older",
                BackupReason::Scheduled,
                Some(BackupPhase::Pending),
                20,
            ),
            backup("newer", BackupReason::Scheduled, None, 5),
            backup(
                "done",
                BackupReason::Scheduled,
                Some(BackupPhase::Succeeded),
                50,
            ),
            backup("pre", BackupReason::PreUpgrade, None, 1),
            me.clone(),
        ];
        let ahead: Vec<String> = queue_ahead(&me, &siblings)
            .into_iter()
            .map(|a| a.0)
            .collect();
        assert_eq!(ahead, vec!["pre", "older"]);
        let running_newer = vec![backup(
            "newer",
            BackupReason::Manual,
            Some(BackupPhase::Running),
            1,
        )];
        assert_eq!(
            queue_ahead(&me, &running_newer),
            vec![("newer".to_string(), true)]
        );
        let mut other_db = backup("x", BackupReason::Manual, None, 99);
        other_db.spec.database = "other".into();
        assert!(queue_ahead(&me, &[other_db]).is_empty());
    }
}
