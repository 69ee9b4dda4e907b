//! The `DatabaseBackup` controller: runs one backup Job per `DatabaseBackup`, one at a time per
//! Database (the oldest waiting one first), and copies the agent's result from the pod's
//! termination message into the status. Events for start, success and failure.
//!
//! observe (reads: the backup, its Database, its siblings, its Job and pods, the S3 Secret)
//! → `decide` (pure: facts and `now` in, the next status and whether to create the Job out)
//! → act (create the Job, patch status only when it changed, publish Events).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::Event;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource};
use serde::Deserialize;
use serde_json::json;
use tracing::{info, instrument, warn};

use super::job::{BACKUP_CONTAINER, JobProblem, backup_job, job_name};
use crate::FIELD_MANAGER;
use crate::api::{
    BackupPhase, BackupReason, Database, DatabaseBackup, DatabaseBackupStatus, Phase,
    S3CredentialsRef,
};
use crate::controller::{Context, backoff};
use crate::error::{Error, Result};
use crate::reconcile::events::EventSpec;
use crate::resources::MANAGED_SELECTOR;

/// How often a queued backup looks whether its turn has come (a finished sibling does not wake
/// it through a watch).
pub const REQUEUE_QUEUED: Duration = Duration::from_secs(10);
/// A running backup is woken by its Job's events; this is a safety net.
pub const REQUEUE_RUNNING: Duration = Duration::from_secs(60);
/// The most of a message copied into status or an Event.
const MAX_MESSAGE: usize = 1024;

/// What the agent reports in the termination message (the fields dbop uses; see
/// `agent/src/result.rs`, whose field names are the contract).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentResult {
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub backup_id: Option<String>,
    #[serde(default)]
    pub bucket: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub size_bytes: Option<u64>,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub engine_version: Option<String>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub completed_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub message: Option<String>,
}

/// The agent's result from a termination message: its last line that is a JSON result. With
/// `FallbackToLogsOnError` the message may be a log tail instead; then None.
pub fn parse_agent_result(message: &str) -> Option<AgentResult> {
    message
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str::<AgentResult>(l).ok())
        .filter(|r| r.outcome.is_some())
}

/// The backup Job's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    /// The Job failed for good: its condition's reason and message.
    Failed(String),
}

/// Everything the decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupFacts {
    pub now: DateTime<Utc>,
    /// The Database, if it exists.
    pub database: Option<DatabaseFacts>,
    /// Unfinished backups of the same Database that go first: (name, running).
    pub ahead: Vec<(String, bool)>,
    pub job: Option<JobFacts>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseFacts {
    pub phase: Option<Phase>,
    pub has_backup_spec: bool,
    pub has_run: bool,
    /// What is wrong with the S3 credentials Secret, in words that say what to fix.
    pub s3_problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobFacts {
    pub state: JobState,
    pub start_time: Option<DateTime<Utc>>,
    pub completion_time: Option<DateTime<Utc>>,
    /// The backup container's termination message (the newest pod's).
    pub termination_message: Option<String>,
}

/// The outcome of `decide`.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupDecision {
    pub status: DatabaseBackupStatus,
    pub create_job: bool,
    pub requeue_after: Option<Duration>,
}

/// Decides the next status of a backup and whether its Job starts now.
pub fn decide(backup: &DatabaseBackup, facts: &BackupFacts) -> BackupDecision {
    let previous = backup.status.clone().unwrap_or_default();
    let database = &backup.spec.database;
    let keep = |requeue_after| BackupDecision {
        status: previous.clone(),
        create_job: false,
        requeue_after,
    };
    if previous.phase.is_some_and(BackupPhase::is_finished) {
        return keep(None);
    }
    let pending = |message: String| BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Pending),
            message: Some(message),
            ..previous.clone()
        },
        create_job: false,
        requeue_after: Some(REQUEUE_QUEUED),
    };
    let failed = |message: String, completed: DateTime<Utc>| BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Failed),
            completed_at: Some(completed),
            message: Some(truncate(&message, MAX_MESSAGE)),
            ..previous.clone()
        },
        create_job: false,
        requeue_after: None,
    };

    if let Some(job) = &facts.job {
        let result = job
            .termination_message
            .as_deref()
            .and_then(parse_agent_result);
        let started = previous.started_at.or(job.start_time).or(Some(facts.now));
        return match &job.state {
            JobState::Running => BackupDecision {
                status: DatabaseBackupStatus {
                    phase: Some(BackupPhase::Running),
                    started_at: started,
                    message: Some(format!(
                        "backup Job {} is running",
                        job_name(&name_of(backup))
                    )),
                    ..previous.clone()
                },
                create_job: false,
                requeue_after: Some(REQUEUE_RUNNING),
            },
            JobState::Succeeded => {
                let r = result.unwrap_or_default();
                let completed = r.completed_at.or(job.completion_time).unwrap_or(facts.now);
                BackupDecision {
                    status: DatabaseBackupStatus {
                        phase: Some(BackupPhase::Succeeded),
                        started_at: started,
                        completed_at: Some(completed),
                        backup_id: r.backup_id,
                        bucket: r.bucket,
                        key: r.key,
                        size_bytes: r.size_bytes.and_then(|s| i64::try_from(s).ok()),
                        sha256: r.sha256,
                        engine_version: r.engine_version,
                        message: Some(truncate(
                            r.message.as_deref().unwrap_or("the backup succeeded"),
                            MAX_MESSAGE,
                        )),
                    },
                    create_job: false,
                    requeue_after: None,
                }
            }
            JobState::Failed(job_reason) => {
                let message = match (&result, job.termination_message.as_deref()) {
                    (Some(r), _) => r
                        .message
                        .clone()
                        .unwrap_or_else(|| "the agent reported a failure".into()),
                    (None, Some(text)) if !text.trim().is_empty() => {
                        format!("{job_reason}; last output: {}", last_line(text))
                    }
                    _ => job_reason.clone(),
                };
                let mut d = failed(message, job.completion_time.unwrap_or(facts.now));
                d.status.started_at = started;
                if let Some(r) = result {
                    d.status.backup_id = r.backup_id;
                    d.status.bucket = r.bucket;
                    d.status.engine_version = r.engine_version;
                }
                d
            }
        };
    }

    let Some(db) = &facts.database else {
        return failed(
            format!("Database {database} does not exist in this namespace"),
            facts.now,
        );
    };
    if !db.has_backup_spec {
        return failed(
            format!(
                "Database {database} has no spec.backup: set spec.backup.s3 to say where backups go"
            ),
            facts.now,
        );
    }
    if !db.has_run {
        return pending(format!("waiting for Database {database} to start"));
    }
    if db.phase == Some(Phase::Upgrading) && backup.spec.reason != BackupReason::PreUpgrade {
        return pending(format!(
            "waiting for the upgrade rollout of Database {database} to end"
        ));
    }
    if let Some((first, running)) = facts.ahead.first() {
        let state = if *running { "running" } else { "waiting" };
        return pending(format!(
            "queued behind backup {first} ({state}): one backup at a time per Database"
        ));
    }
    if let Some(problem) = &db.s3_problem {
        return pending(format!("waiting for the S3 credentials: {problem}"));
    }
    BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Running),
            started_at: Some(facts.now),
            message: Some(format!(
                "backup Job {} is running",
                job_name(&name_of(backup))
            )),
            ..previous.clone()
        },
        create_job: true,
        requeue_after: Some(REQUEUE_RUNNING),
    }
}

/// The Events of a status change.
pub fn backup_events(
    backup: &DatabaseBackup,
    old: &DatabaseBackupStatus,
    new: &DatabaseBackupStatus,
) -> Vec<EventSpec> {
    if old.phase == new.phase {
        return vec![];
    }
    let name = name_of(backup);
    let message = new.message.clone().unwrap_or_default();
    match new.phase {
        Some(BackupPhase::Running) => vec![EventSpec {
            warning: false,
            reason: "BackupStarted".into(),
            note: format!("backup {name} started: {message}"),
        }],
        Some(BackupPhase::Succeeded) => vec![EventSpec {
            warning: false,
            reason: "BackupSucceeded".into(),
            note: format!(
                "backup {name} succeeded: {} bytes at {}",
                new.size_bytes.unwrap_or_default(),
                new.key.as_deref().unwrap_or("?")
            ),
        }],
        Some(BackupPhase::Failed) => vec![EventSpec {
            warning: true,
            reason: "BackupFailed".into(),
            note: format!("backup {name} failed: {message}"),
        }],
        Some(BackupPhase::Pending) | None => vec![],
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

fn name_of(b: &DatabaseBackup) -> String {
    b.metadata.name.clone().unwrap_or_default()
}

fn last_line(text: &str) -> String {
    truncate(
        text.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default()
            .trim(),
        512,
    )
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What is wrong with the S3 credentials Secret, if anything, in words that say what to fix.
/// Only key names are looked at, never values.
pub fn s3_secret_problem(reference: &S3CredentialsRef, secret: Option<&Secret>) -> Option<String> {
    let Some(secret) = secret else {
        return Some(format!(
            "Secret {} (spec.backup.s3.credentials.secretName) does not exist: create it with the \
             keys {} and {}",
            reference.secret_name,
            reference.access_key_id_key(),
            reference.secret_access_key_key()
        ));
    };
    let has = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_some_and(|v| !v.0.is_empty())
            || secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .is_some_and(|v| !v.is_empty())
    };
    let missing: Vec<&str> = [
        reference.access_key_id_key(),
        reference.secret_access_key_key(),
    ]
    .into_iter()
    .filter(|k| !has(k))
    .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "Secret {} has no non-empty key {}: add it (or set spec.backup.s3.credentials.{})",
            reference.secret_name,
            missing.join(" nor "),
            if missing[0] == reference.access_key_id_key() {
                "accessKeyIdKey"
            } else {
                "secretAccessKeyKey"
            }
        )
    })
}

fn job_state(job: &Job) -> JobState {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let holds = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    if holds("Complete").is_some() || holds("SuccessCriteriaMet").is_some() {
        JobState::Succeeded
    } else if let Some(c) = holds("Failed").or_else(|| holds("FailureTarget")) {
        let reason = c.reason.clone().unwrap_or_else(|| "Failed".into());
        let detail = c.message.clone().unwrap_or_default();
        JobState::Failed(
            format!("backup Job failed ({reason}): {detail}")
                .trim_end_matches([':', ' '])
                .to_string(),
        )
    } else {
        JobState::Running
    }
}

fn to_chrono(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default()
}

/// The backup container's termination message in the newest of the Job's pods.
fn termination_message(pods: &[Pod]) -> Option<String> {
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

/// Reads the facts of one backup. Reads only.
pub async fn observe(
    client: &Client,
    backup: &DatabaseBackup,
    now: DateTime<Utc>,
) -> Result<BackupFacts> {
    let ns = backup.metadata.namespace.clone().unwrap_or_default();
    let databases: Api<Database> = Api::namespaced(client.clone(), &ns);
    let database = databases.get_opt(&backup.spec.database).await?;
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get_opt(&job_name(&name_of(backup)))
        .await?;
    let job = match job {
        None => None,
        Some(job) => {
            let state = job_state(&job);
            let pods = if state == JobState::Running {
                vec![]
            } else {
                let selector = format!(
                    "batch.kubernetes.io/job-name={}",
                    job.metadata.name.clone().unwrap_or_default()
                );
                Api::<Pod>::namespaced(client.clone(), &ns)
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
            };
            let status = job.status.clone().unwrap_or_default();
            Some(JobFacts {
                state,
                start_time: status.start_time.as_ref().map(to_chrono),
                completion_time: status.completion_time.as_ref().map(to_chrono).or_else(|| {
                    status
                        .conditions
                        .iter()
                        .flatten()
                        .filter(|c| c.type_ == "Failed" && c.status == "True")
                        .find_map(|c| c.last_transition_time.as_ref().map(to_chrono))
                }),
                termination_message: termination_message(&pods),
            })
        }
    };
    let finished = backup
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(BackupPhase::is_finished);
    let (ahead, database) = match (&database, finished || job.is_some()) {
        (Some(db), false) => {
            let siblings = Api::<DatabaseBackup>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await?
                .items;
            let s3_problem = match &db.spec.backup {
                Some(spec) => {
                    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
                        .get_opt(&spec.s3.credentials.secret_name)
                        .await?;
                    s3_secret_problem(&spec.s3.credentials, secret.as_ref())
                }
                None => None,
            };
            (
                queue_ahead(backup, &siblings),
                Some(database_facts(db, s3_problem)),
            )
        }
        (db, _) => (vec![], db.as_ref().map(|d| database_facts(d, None))),
    };
    Ok(BackupFacts {
        now,
        database,
        ahead,
        job,
    })
}

fn database_facts(db: &Database, s3_problem: Option<String>) -> DatabaseFacts {
    let status = db.status.clone().unwrap_or_default();
    DatabaseFacts {
        phase: status.phase,
        has_backup_spec: db.spec.backup.is_some(),
        has_run: status.current_version.is_some(),
        s3_problem,
    }
}

/// Runs the `DatabaseBackup` controller until SIGTERM/SIGINT.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    let (backups, jobs): (Api<DatabaseBackup>, Api<Job>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let owned_jobs = watcher::Config::default()
        .labels(&format!(
            "{MANAGED_SELECTOR},app.kubernetes.io/component=backup"
        ))
        .any_semantic();
    Controller::new(backups, watcher::Config::default().any_semantic())
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(200)))
        .owns(jobs, owned_jobs)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "backup reconcile error (handled by the error policy)");
            }
        })
        .await;
    info!("DatabaseBackup controller stopped");
}

fn key_of(b: &DatabaseBackup) -> (String, String) {
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
    let now = Utc::now();
    let facts = observe(&ctx.client, &backup, now).await?;
    let decision = decide(&backup, &facts);
    let ns = backup.metadata.namespace.clone().unwrap_or_default();
    if decision.create_job {
        let db = Api::<Database>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&backup.spec.database)
            .await?;
        let created = backup
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or(now);
        let job = match db
            .as_ref()
            .map(|db| backup_job(db, &backup, created, &ctx.settings))
        {
            Some(Ok(job)) => job,
            Some(Err(JobProblem::NoBackupSpec | JobProblem::NoRunningVersion)) | None => {
                // The Database changed between observe and now: look again.
                return Ok(Action::requeue(REQUEUE_QUEUED));
            }
        };
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => info!(job = %job_name(&name_of(&backup)), "created the backup Job"),
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let previous = backup.status.clone().unwrap_or_default();
    if previous != decision.status {
        let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &ns);
        let body = json!({
            "apiVersion": DatabaseBackup::api_version(&()),
            "kind": DatabaseBackup::kind(&()),
            "status": decision.status,
        });
        api.patch_status(
            &name_of(&backup),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        for event in backup_events(&backup, &previous, &decision.status) {
            publish(&ctx, &backup, &event).await;
        }
    }
    ctx.reset_failures(&key_of(&backup));
    Ok(match decision.requeue_after {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    })
}

/// Publishes an Event on the backup and on its Database.
async fn publish(ctx: &Context, backup: &DatabaseBackup, event: &EventSpec) {
    let event_of = || Event {
        type_: event.event_type(),
        reason: event.reason.clone(),
        note: Some(truncate(&event.note, MAX_MESSAGE)),
        action: "Backup".into(),
        secondary: None,
    };
    let mut references = vec![backup.object_ref(&())];
    let mut db_ref = backup.object_ref(&());
    db_ref.kind = Some(Database::kind(&()).into());
    db_ref.name = Some(backup.spec.database.clone());
    db_ref.uid = None;
    db_ref.resource_version = None;
    // The Database's uid: from its owner reference when it has one.
    if let Some(owner) = backup
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Database")
    {
        db_ref.uid = Some(owner.uid.clone());
    }
    references.push(db_ref);
    for reference in references {
        if let Err(error) = ctx.recorder.publish(&event_of(), &reference).await {
            warn!(%error, reason = %event.reason, "could not publish an Event");
        }
    }
}

fn error_policy(backup: Arc<DatabaseBackup>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.record_failure(key_of(&backup));
    let delay = backoff(failures);
    warn!(%error, label = error.label(), failures, retry_in = ?delay, "backup reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseBackupSpec;
    use chrono::TimeZone;
    use k8s_openapi::ByteString;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 30).unwrap()
    }

    fn backup(
        name: &str,
        reason: BackupReason,
        phase: Option<BackupPhase>,
        age: i64,
    ) -> DatabaseBackup {
        let mut b = DatabaseBackup::new(
            name,
            DatabaseBackupSpec {
                database: "orders".into(),
                reason,
            },
        );
        b.metadata.namespace = Some("shop".into());
        b.metadata.creation_timestamp = Some(crate::api::conditions::to_meta_time(
            now() - chrono::TimeDelta::seconds(age),
        ));
        b.status = phase.map(|p| DatabaseBackupStatus {
            phase: Some(p),
            ..Default::default()
        });
        b
    }

    fn ready_db() -> DatabaseFacts {
        DatabaseFacts {
            phase: Some(Phase::Ready),
            has_backup_spec: true,
            has_run: true,
            s3_problem: None,
        }
    }

    fn facts(database: Option<DatabaseFacts>, job: Option<JobFacts>) -> BackupFacts {
        BackupFacts {
            now: now(),
            database,
            ahead: vec![],
            job,
        }
    }

    const RESULT: &str = r#"{"outcome":"Succeeded","operation":"dump","backupId":"20250501T020003Z-b","database":"postgres","bucket":"backups","key":"p/shop/orders/postgres/20250501T020003Z-b/dump.pgc.zst","manifestKey":"m","sizeBytes":12345,"rawBytes":99999,"sha256":"abab","engineVersion":"16.4","startedAt":"2025-05-01T02:00:05Z","completedAt":"2025-05-01T02:00:25Z","message":"dumped 99999 bytes"}"#;

    fn job(state: JobState, message: Option<&str>) -> Option<JobFacts> {
        Some(JobFacts {
            state,
            start_time: Some(now() - chrono::TimeDelta::seconds(28)),
            completion_time: Some(now() - chrono::TimeDelta::seconds(2)),
            termination_message: message.map(str::to_string),
        })
    }

    #[test]
    fn decisions_table() {
        use BackupPhase::*;
        let manual = backup("b", BackupReason::Manual, None, 5);
        let upgrading = DatabaseFacts {
            phase: Some(Phase::Upgrading),
            ..ready_db()
        };
        let table: Vec<(&str, DatabaseBackup, BackupFacts, BackupPhase, bool, &str)> = vec![
            (
                "ready: the Job starts",
                manual.clone(),
                facts(Some(ready_db()), None),
                Running,
                true,
                "is running",
            ),
            (
                "no Database",
                manual.clone(),
                facts(None, None),
                Failed,
                false,
                "does not exist",
            ),
            (
                "no spec.backup",
                manual.clone(),
                facts(
                    Some(DatabaseFacts {
                        has_backup_spec: false,
                        ..ready_db()
                    }),
                    None,
                ),
                Failed,
                false,
                "has no spec.backup",
            ),
            (
                "never ran",
                manual.clone(),
                facts(
                    Some(DatabaseFacts {
                        has_run: false,
                        ..ready_db()
                    }),
                    None,
                ),
                Pending,
                false,
                "to start",
            ),
            (
                "upgrade rollout",
                manual.clone(),
                facts(Some(upgrading.clone()), None),
                Pending,
                false,
                "upgrade rollout",
            ),
            (
                "a pre-upgrade backup runs during the upgrade",
                backup("pre", BackupReason::PreUpgrade, None, 1),
                facts(Some(upgrading), None),
                Running,
                true,
                "is running",
            ),
            (
                "queued behind a running backup",
                manual.clone(),
                BackupFacts {
                    ahead: vec![("older".into(), true)],
                    ..facts(Some(ready_db()), None)
                },
                Pending,
                false,
                "queued behind backup older (running)",
            ),
            (
                "S3 credentials unusable",
                manual.clone(),
                facts(
                    Some(DatabaseFacts {
                        s3_problem: Some("Secret s3 does not exist".into()),
                        ..ready_db()
                    }),
                    None,
                ),
                Pending,
                false,
                "Secret s3 does not exist",
            ),
            (
                "Job running",
                manual.clone(),
                facts(Some(ready_db()), job(JobState::Running, None)),
                Running,
                false,
                "is running",
            ),
            (
                "Job succeeded: the result fills the status",
                manual.clone(),
                facts(Some(ready_db()), job(JobState::Succeeded, Some(RESULT))),
                Succeeded,
                false,
                "dumped 99999 bytes",
            ),
            (
                "Job failed with an agent result",
                manual.clone(),
                facts(
                    Some(ready_db()),
                    job(
                        JobState::Failed("backup Job failed (BackoffLimitExceeded)".into()),
                        Some(
                            r#"{"outcome":"Failed","operation":"dump","message":"S3 access denied: check AWS_ACCESS_KEY_ID"}"#,
                        ),
                    ),
                ),
                Failed,
                false,
                "S3 access denied",
            ),
            (
                "Job failed with only logs (FallbackToLogsOnError)",
                manual.clone(),
                facts(
                    Some(ready_db()),
                    job(
                        JobState::Failed("backup Job failed (DeadlineExceeded)".into()),
                        Some("some log\nexec format error\n"),
                    ),
                ),
                Failed,
                false,
                "(DeadlineExceeded); last output: exec format error",
            ),
        ];
        for (name, b, f, phase, create, message) in table {
            let d = decide(&b, &f);
            assert_eq!(d.status.phase, Some(phase), "{name}");
            assert_eq!(d.create_job, create, "{name}");
            let text = d.status.message.clone().unwrap_or_default();
            assert!(text.contains(message), "{name}: {text}");
        }
    }

    #[test]
    fn success_copies_the_agents_result() {
        let b = backup("b", BackupReason::Scheduled, Some(BackupPhase::Running), 30);
        let d = decide(
            &b,
            &facts(Some(ready_db()), job(JobState::Succeeded, Some(RESULT))),
        );
        let s = d.status;
        assert_eq!(s.size_bytes, Some(12345));
        assert_eq!(s.sha256.as_deref(), Some("abab"));
        assert_eq!(s.bucket.as_deref(), Some("backups"));
        assert_eq!(s.engine_version.as_deref(), Some("16.4"));
        assert_eq!(s.backup_id.as_deref(), Some("20250501T020003Z-b"));
        assert_eq!(
            s.completed_at,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 25).unwrap())
        );
        assert!(s.key.unwrap().ends_with("dump.pgc.zst"));
        assert_eq!(d.requeue_after, None);
    }

    #[test]
    fn finished_backups_never_change() {
        for phase in [BackupPhase::Succeeded, BackupPhase::Failed] {
            let b = backup("b", BackupReason::Manual, Some(phase), 30);
            let d = decide(&b, &facts(None, job(JobState::Running, None)));
            assert_eq!(Some(d.status), b.status);
            assert!(!d.create_job);
        }
    }

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

    #[test]
    fn events_for_start_success_and_failure() {
        let b = backup("b", BackupReason::Manual, None, 1);
        let status = |p| DatabaseBackupStatus {
            phase: Some(p),
            message: Some("m".into()),
            ..Default::default()
        };
        let reasons = |old: &DatabaseBackupStatus, new: &DatabaseBackupStatus| {
            backup_events(&b, old, new)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect::<Vec<_>>()
        };
        let none = DatabaseBackupStatus::default();
        assert_eq!(
            reasons(&none, &status(BackupPhase::Running)),
            vec![(false, "BackupStarted".to_string())]
        );
        assert_eq!(
            reasons(
                &status(BackupPhase::Running),
                &status(BackupPhase::Succeeded)
            ),
            vec![(false, "BackupSucceeded".to_string())]
        );
        assert_eq!(
            reasons(&status(BackupPhase::Running), &status(BackupPhase::Failed)),
            vec![(true, "BackupFailed".to_string())]
        );
        assert!(reasons(&status(BackupPhase::Running), &status(BackupPhase::Running)).is_empty());
    }

    #[test]
    fn agent_results_parse_and_garbage_does_not() {
        assert_eq!(parse_agent_result(RESULT).unwrap().size_bytes, Some(12345));
        let with_logs = format!("log line\n{RESULT}\n");
        assert!(parse_agent_result(&with_logs).is_some());
        for garbage in ["", "panic", "{not json", "{}", r#"{"sizeBytes": -1}"#] {
            assert_eq!(parse_agent_result(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn s3_secret_checks_name_keys_never_values() {
        let reference = S3CredentialsRef {
            secret_name: "s3".into(),
            access_key_id_key: None,
            secret_access_key_key: Some("secret".into()),
        };
        let missing = s3_secret_problem(&reference, None).unwrap();
        assert!(
            missing.contains("does not exist") && missing.contains("AWS_ACCESS_KEY_ID"),
            "{missing}"
        );
        let secret = |keys: &[(&str, &str)]| Secret {
            data: Some(
                keys.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let lacking = s3_secret_problem(
            &reference,
            Some(&secret(&[("AWS_ACCESS_KEY_ID", "AKIA-VALUE")])),
        )
        .unwrap();
        assert!(lacking.contains("no non-empty key secret"), "{lacking}");
        assert!(!lacking.contains("AKIA-VALUE"));
        assert_eq!(
            s3_secret_problem(
                &reference,
                Some(&secret(&[("AWS_ACCESS_KEY_ID", "a"), ("secret", "b")]))
            ),
            None
        );
    }
}
