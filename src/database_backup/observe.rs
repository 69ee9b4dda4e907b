//! Observe, for the `DatabaseBackup` controller: read the backup's Database, its siblings, its
//! Job and that Job's pods, and the S3 credentials Secret (the only reads of a pass), and reduce
//! them to the `BackupFacts` (`facts`) its `decide` needs. The reads are here; the reductions
//! are pure, in `facts`.
//!
//! The Database, the siblings and the Job come from the watch caches (`context::caches`); the
//! pods of a finished Job (read once, to record its result) and the user's S3 Secret and CA
//! source from the API server.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::core::DeserializeGuard;
use kube::{Api, Client};

use super::facts::{
    BackupFacts, DatabaseFacts, JobFacts, database_facts, job_facts, name_of, queue_ahead,
};
use crate::api::{BackupPhase, Database, DatabaseBackup};
use crate::backup::s3_secret::{S3SecretProblem, s3_secret_problem};
use crate::context::Context;
use crate::context::caches::{get, get_unpacked, list};
use crate::error::{Error, Result};
use crate::kube_io::job_pods;
use crate::objects::{JobState, job_state, owned_by};
use crate::resources::backup_job::job_name;

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
        Some(DeserializeGuard(Err(invalid))) => {
            return Err(Error::Unreadable {
                kind: "Database",
                name: format!("{ns}/{}", backup.spec.database),
                message: invalid.error,
            });
        }
        None => None,
    };
    let job = get_unpacked(&caches.jobs, &ns, &job_name(&name_of(backup)));
    let stale_job = job.as_ref().is_some_and(|j| !ours(j, backup));
    let job = match job.filter(|j| ours(j, backup)) {
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

/// Whether the Job belongs to this very `DatabaseBackup` (its owner's uid), not to an earlier
/// one of the same name.
fn ours(job: &Job, backup: &DatabaseBackup) -> bool {
    owned_by(
        &job.metadata,
        Some("DatabaseBackup"),
        backup.metadata.uid.as_deref(),
    )
}

/// The Job's state, times and (once it ended) its pod's termination message.
async fn observe_job(client: &Client, ns: &str, job: &Job) -> Result<JobFacts> {
    let state = job_state(job);
    let pods = if state == JobState::Running {
        vec![]
    } else {
        let name = job.metadata.name.clone().unwrap_or_default();
        job_pods(client, ns, &name).await?
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
            let secret = match &spec.s3.credentials {
                Some(credentials) => {
                    Api::<Secret>::namespaced(client.clone(), ns)
                        .get_opt(&credentials.secret_name)
                        .await?
                }
                None => None,
            };
            match s3_secret_problem(spec.s3.credentials.as_ref(), secret.as_ref()) {
                Some(problem) => Some(problem),
                None => match crate::backup::ca::read_problem(client, ns, spec).await? {
                    Some(ca) => Some(S3SecretProblem::CaSource(ca)),
                    None => crate::backup::encryption::read_problem(
                        client,
                        ns,
                        spec.encryption.as_ref(),
                    )
                    .await?
                    .map(S3SecretProblem::EncryptionKey),
                },
            }
        }
        None => None,
    };
    Ok((
        queue_ahead(backup, &siblings),
        Some(database_facts(db, s3_problem)),
    ))
}
