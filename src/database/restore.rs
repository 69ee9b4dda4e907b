//! `spec.bootstrap.fromBackup`: where the backup to restore is, and whether the restore ran,
//! runs, must wait or failed. The restore takes the place of the init SQL: `decide` asks this
//! module instead of running init, and `build` builds the Job from [`source`].
//!
//! Pure: `RestoreObjects` is what `observe` read; everything here is a function of it, the
//! Database and the facts. No client, no clock. Must not import `observe`, `decide`, `build` or `apply`.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};

use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{
    BackupMethod, BackupPhase, BootstrapStatus, Database, DatabaseBackup, FromBackupSpec, S3Spec,
};
use crate::backup::s3_secret::{S3SecretProblem, s3_secret_problem};
use crate::objects::{JobState, job_state, termination_message};
use crate::resources::Names;
use crate::resources::restore_job::{RESTORE_CONTAINER, RestoreSource, storage_prefix};
use dbop_contract::layout::Layout;
use dbop_contract::{BackupResult, Outcome, parse_termination_message};

/// What `observe` read for a Database that restores from a backup and is not initialised yet.
#[derive(Clone, Debug, Default)]
pub struct RestoreObjects {
    /// The restore Job.
    pub job: Option<Job>,
    /// Its pods, once it finished (for the agent's result).
    pub pods: Vec<Pod>,
    /// The `DatabaseBackup` named by `fromBackup.databaseBackup`.
    pub backup: Option<DatabaseBackup>,
    /// That backup's Database (its `spec.backup.s3` says where the dump is).
    pub source_database: Option<Database>,
    /// The S3 credentials Secret of the source (only its keys are looked at).
    pub s3_secret: Option<Secret>,
    /// What is wrong with the source's `s3.ca`, if anything.
    pub ca_problem: Option<String>,
}

/// Why the backup cannot be restored yet (or at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceProblem {
    BackupNotFound {
        name: String,
    },
    BackupNotReady {
        name: String,
        phase: String,
    },
    BackupFailed {
        name: String,
    },
    SourceGone {
        name: String,
        database: String,
    },
    /// A physical base backup named without a recovery target, or a dump with one.
    MethodMismatch {
        name: String,
        physical: bool,
    },
    S3(S3SecretProblem),
}

impl SourceProblem {
    fn reason(&self) -> &'static str {
        match self {
            SourceProblem::BackupNotFound { .. } => "BackupNotFound",
            SourceProblem::BackupNotReady { .. } => "BackupNotReady",
            SourceProblem::BackupFailed { .. } => "BackupFailed",
            SourceProblem::SourceGone { .. } => "BackupSourceNotFound",
            SourceProblem::MethodMismatch { .. } => "BackupMethodMismatch",
            SourceProblem::S3(p) => p.reason(),
        }
    }

    fn message(&self) -> String {
        match self {
            SourceProblem::BackupNotFound { name } => format!(
                "DatabaseBackup {name} (spec.bootstrap.fromBackup.databaseBackup) does not exist in this namespace: create it or restore another backup"
            ),
            SourceProblem::BackupNotReady { name, phase } => {
                format!("waiting for DatabaseBackup {name} to succeed (phase {phase})")
            }
            SourceProblem::BackupFailed { name } => format!(
                "DatabaseBackup {name} failed and cannot be restored: create this Database again from a backup that succeeded"
            ),
            SourceProblem::SourceGone { name, database } => format!(
                "Database {database} of DatabaseBackup {name} no longer exists or has no spec.backup, which says where the dump is: create this Database again with spec.bootstrap.fromBackup.s3 and the backup's id"
            ),
            SourceProblem::MethodMismatch {
                name,
                physical: true,
            } => format!(
                "DatabaseBackup {name} is a physical base backup, which is recovered to a point in time: create this Database again with spec.bootstrap.fromBackup.recoveryTarget (latest: true for the newest point archived)"
            ),
            SourceProblem::MethodMismatch {
                name,
                physical: false,
            } => format!(
                "DatabaseBackup {name} is a logical dump, restored as of when it was taken: create this Database again without recoveryTarget, or name a physical backup"
            ),
            SourceProblem::S3(p) => format!("restoring from backup: {p}"),
        }
    }
}

/// What `decide` needs to know about the restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapFact {
    /// A short description of the backup (for messages), or why it cannot be restored.
    pub source: Result<String, SourceProblem>,
    pub job: Option<RestoreJobFact>,
}

/// The restore Job's state and, once it ended, the agent's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreJobFact {
    pub state: JobState,
    pub result: Option<BackupResult>,
    /// The end of the termination message when it holds no result (the container's log
    /// tail, e.g. a usage error), for the failure message.
    pub output: Option<String>,
}

/// The facts of a Database with `spec.bootstrap`; `None` without one.
pub fn fact(db: &Database, snap: &RestoreObjects) -> Option<BootstrapFact> {
    db.spec.bootstrap.as_ref()?;
    Some(BootstrapFact {
        source: source(db, snap).map(|s| describe(&s)),
        job: snap.job.as_ref().map(|job| {
            let message = termination_message(&snap.pods, RESTORE_CONTAINER);
            let result = message.as_deref().and_then(parse_termination_message);
            RestoreJobFact {
                state: job_state(job),
                output: message.filter(|_| result.is_none()).map(|m| tail(&m)),
                result,
            }
        }),
    })
}

fn describe(source: &RestoreSource) -> String {
    let id = if source.backup == "latest" {
        "the latest backup".to_string()
    } else {
        format!("backup {}", source.backup)
    };
    format!(
        "{id} under {}/{} in bucket {}",
        source.prefix,
        source
            .source_database
            .as_deref()
            .unwrap_or("<application database>"),
        source.s3.bucket
    )
}

/// The S3 location `fromBackup` points at: its own `s3`, or the `DatabaseBackup`'s Database's.
pub fn source_s3<'a>(from: &'a FromBackupSpec, snap: &'a RestoreObjects) -> Option<&'a S3Spec> {
    match &from.s3 {
        Some(s3) => Some(s3),
        None => Some(&snap.source_database.as_ref()?.spec.backup.as_ref()?.s3),
    }
}

/// Where the backup is, resolved; or why it cannot be restored (now).
pub fn source(db: &Database, snap: &RestoreObjects) -> Result<RestoreSource, SourceProblem> {
    let from = &db
        .spec
        .bootstrap
        .as_ref()
        .ok_or_else(|| SourceProblem::BackupNotFound {
            name: String::new(),
        })?
        .from_backup;
    let mut resolved = match &from.database_backup {
        Some(name) => from_database_backup(name, from, snap)?,
        None => from_location(db, from),
    };
    if let Some(keys) = &from.encryption {
        resolved.encryption_secret = Some(keys.secret_name.clone());
    }
    check_credentials(&resolved.s3, snap)?;
    Ok(resolved)
}

/// `fromBackup.s3`: the prefix of the named (or this) Database in the named (or this) namespace.
fn from_location(db: &Database, from: &FromBackupSpec) -> RestoreSource {
    let s3 = from.s3.clone().unwrap_or_else(|| unreachable_s3(db));
    let namespace = from
        .namespace
        .clone()
        .unwrap_or_else(|| db.namespace_or_default());
    let database = from.database.clone().unwrap_or_else(|| db.name());
    RestoreSource {
        prefix: storage_prefix(&s3, &namespace, &database),
        s3,
        backup: from.backup_id.clone().unwrap_or_else(|| "latest".into()),
        source_database: None,
        encryption_secret: from.encryption.as_ref().map(|e| e.secret_name.clone()),
        target: from.recovery_target.clone(),
        streams: from.restore_streams,
    }
}

/// The schema allows `fromBackup` only with `databaseBackup` or `s3`; an object that slipped
/// past it gets an S3 spec that names no bucket, which the credentials check reports.
fn unreachable_s3(db: &Database) -> S3Spec {
    S3Spec {
        endpoint: None,
        bucket: String::new(),
        prefix: None,
        region: None,
        force_path_style: false,
        credentials: Some(crate::api::S3CredentialsRef {
            secret_name: format!("{}-missing-s3-spec", db.name()),
            access_key_id_key: None,
            secret_access_key_key: None,
            session_token_key: None,
        }),
        service_account_name: None,
        server_side_encryption: None,
        ca: None,
    }
}

/// `fromBackup.databaseBackup`: a backup that succeeded, of a Database that still says where,
/// of the method the restore asks for (a recovery target needs a physical one).
fn from_database_backup(
    name: &str,
    from: &FromBackupSpec,
    snap: &RestoreObjects,
) -> Result<RestoreSource, SourceProblem> {
    let backup = snap
        .backup
        .as_ref()
        .ok_or_else(|| SourceProblem::BackupNotFound { name: name.into() })?;
    let status = backup.status.clone().unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Succeeded) => {}
        Some(BackupPhase::Failed) => return Err(SourceProblem::BackupFailed { name: name.into() }),
        phase => {
            return Err(SourceProblem::BackupNotReady {
                name: name.into(),
                phase: phase.map_or("Pending", BackupPhase::label).into(),
            });
        }
    }
    let physical = backup.spec.method == BackupMethod::Physical;
    if physical != from.recovery_target.is_some() {
        return Err(SourceProblem::MethodMismatch {
            name: name.into(),
            physical,
        });
    }
    let gone = || SourceProblem::SourceGone {
        name: name.into(),
        database: backup.spec.database.clone(),
    };
    let source_db = snap.source_database.as_ref().ok_or_else(gone)?;
    let source_backup = source_db.spec.backup.as_ref().ok_or_else(gone)?;
    let s3 = source_backup.s3.clone();
    let encryption_secret = source_backup
        .encryption
        .as_ref()
        .map(|e| e.secret_name.clone());
    let prefix = storage_prefix(&s3, &source_db.namespace_or_default(), &source_db.name());
    // The key names the application database the dump was taken of.
    let parsed = status
        .key
        .as_deref()
        .and_then(|key| Layout::new(&prefix).parse_key(key));
    Ok(RestoreSource {
        backup: status
            .backup_id
            .or_else(|| parsed.as_ref().map(|p| p.backup_id.clone()))
            .unwrap_or_else(|| "latest".into()),
        source_database: parsed.map(|p| p.database),
        prefix,
        s3,
        encryption_secret,
        target: from.recovery_target.clone(),
        streams: from.restore_streams,
    })
}

fn check_credentials(s3: &S3Spec, snap: &RestoreObjects) -> Result<(), SourceProblem> {
    if let Some(problem) = s3_secret_problem(s3.credentials.as_ref(), snap.s3_secret.as_ref()) {
        return Err(SourceProblem::S3(problem));
    }
    match &snap.ca_problem {
        Some(problem) => Err(SourceProblem::S3(S3SecretProblem::CaSource(
            problem.clone(),
        ))),
        None => Ok(()),
    }
}

/// The last 300 bytes of a text, on one line.
fn tail(text: &str) -> String {
    let text = text.trim();
    let mut start = text.len().saturating_sub(300);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].replace('\n', " | ")
}

/// Where the restore stands, for `decide`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// Restored (or nothing to restore into: the data predates the Database).
    Done,
    /// Waiting for the server, or the Job is running.
    Pending,
    /// Waiting for something the user must fix (a Secret, the DatabaseBackup).
    Blocked {
        reason: &'static str,
        message: String,
    },
    /// The restore failed: the Database is not initialised.
    Failed { message: String },
}

/// The restore's outcome, its `Initialized` condition, whether to start the Job, and what to
/// record in `status.bootstrap`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreDecision {
    pub outcome: RestoreOutcome,
    pub condition: ConditionStatus,
    pub create_job: bool,
    pub status: Option<BootstrapStatus>,
}

impl RestoreDecision {
    fn new(outcome: RestoreOutcome, condition: ConditionStatus) -> Self {
        RestoreDecision {
            outcome,
            condition,
            create_job: false,
            status: None,
        }
    }

    fn pending(reason: &str, message: String) -> Self {
        let c = ConditionStatus::new(ConditionType::Initialized, false, reason, message);
        Self::new(RestoreOutcome::Pending, c)
    }
}

/// Whether the Database recovers a physical backup to a point in time: a Job fills the data
/// volume before the server first starts, so the StatefulSet waits for it.
pub fn is_physical(db: &Database) -> bool {
    db.spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.from_backup.recovery_target.is_some())
}

/// Decides the restore of a Database that is not initialised yet. `server_up`: the server has
/// served on the desired spec; `data_predates`: the volume was kept by an earlier Database.
///
/// A physical recovery runs before the server and never over a kept volume's data: its agent
/// refuses a data directory it did not make, saying so, rather than this guessing from the
/// claim's age whether the volume holds data.
pub fn decide_restore(
    db: &Database,
    fact: &BootstrapFact,
    server_up: bool,
    data_predates: bool,
) -> RestoreDecision {
    let job = Names::of(db).restore_job();
    let physical = is_physical(db);
    let server_up = server_up || physical;
    if data_predates && fact.job.is_none() && !physical {
        let c = ConditionStatus::new(
            ConditionType::Initialized,
            true,
            "ExistingData",
            "the data volume predates this Database (kept by an earlier one with deletionPolicy Retain): the backup is not restored over existing data",
        );
        return RestoreDecision::new(RestoreOutcome::Done, c);
    }
    match (&fact.job, &fact.source) {
        (Some(j), _) if physical => from_recovery_job(db, &job, j),
        (Some(j), _) => from_job(&job, j),
        (None, _) if !server_up => {
            RestoreDecision::pending("WaitingForServer", "waiting for the server to start".into())
        }
        (None, Err(problem)) => blocked(problem),
        (None, Ok(what)) if physical => RestoreDecision {
            create_job: true,
            ..RestoreDecision::pending(
                "Recovering",
                format!("starting recovery Job {job} from {what}"),
            )
        },
        (None, Ok(what)) => RestoreDecision {
            create_job: true,
            ..RestoreDecision::pending("Restoring", format!("starting restore Job {job} of {what}"))
        },
    }
}

fn blocked(problem: &SourceProblem) -> RestoreDecision {
    let (reason, message) = (problem.reason(), problem.message());
    let condition = ConditionStatus::new(ConditionType::Initialized, false, reason, &message);
    let outcome = match problem {
        SourceProblem::BackupFailed { .. } | SourceProblem::MethodMismatch { .. } => {
            RestoreOutcome::Failed { message }
        }
        _ => RestoreOutcome::Blocked { reason, message },
    };
    RestoreDecision::new(outcome, condition)
}

/// The restore Job exists: its state (and the agent's result) is the restore's.
fn from_job(job: &str, fact: &RestoreJobFact) -> RestoreDecision {
    let result = fact.result.as_ref();
    match &fact.state {
        JobState::Running => RestoreDecision::pending(
            "Restoring",
            format!("restore Job {job} is restoring the backup"),
        ),
        JobState::Succeeded => {
            let id = result.and_then(|r| r.backup_id.clone());
            // The agent says how: the roles, the databases, in one transaction or in steps.
            let said = result.and_then(|r| r.message.as_deref());
            let message = match (&id, said) {
                (Some(id), Some(said)) => format!("restored backup {id}: {said}"),
                (Some(id), None) => format!("restored backup {id}"),
                (None, _) => format!("restore Job {job} succeeded"),
            };
            let c = ConditionStatus::new(
                ConditionType::Initialized,
                true,
                "RestoredFromBackup",
                message,
            );
            RestoreDecision {
                status: Some(BootstrapStatus {
                    restored_backup_id: id,
                    restored_key: result.and_then(|r| r.key.clone()),
                    restored_at: result.and_then(|r| r.completed_at),
                    ..BootstrapStatus::default()
                }),
                ..RestoreDecision::new(RestoreOutcome::Done, c)
            }
        }
        JobState::Failed { reason, detail } => {
            let failed = result.filter(|r| r.outcome == Outcome::Failed);
            let why = match (failed.and_then(|r| r.message.clone()), &fact.output) {
                (Some(message), _) => message,
                (None, Some(output)) => {
                    format!("{} ({output})", JobState::failure_text(reason, detail))
                }
                (None, None) => JobState::failure_text(reason, detail),
            };
            let reason = failure_reason(failed.and_then(|r| r.failure_kind.as_deref()));
            let what_to_do = if reason.starts_with("RecoveryTarget") {
                "spec.bootstrap cannot change: create the Database again with a recoveryTarget inside the restorable window".to_string()
            } else {
                format!("fix the cause, then delete the Job {job} to restore again")
            };
            let message = format!(
                "restore Job {job} failed: {why}. The data was not restored and the Database is not initialised; {what_to_do}"
            );
            let c = ConditionStatus::new(ConditionType::Initialized, false, reason, &message);
            RestoreDecision::new(RestoreOutcome::Failed { message }, c)
        }
    }
}

/// The recovery Job exists: while it runs the Database waits; once it succeeded the data
/// volume holds a promoted server and `status.bootstrap` says which point it reached; a
/// failure is the restore's (the agent's message names the restorable window).
fn from_recovery_job(db: &Database, job: &str, fact: &RestoreJobFact) -> RestoreDecision {
    let target = db
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.from_backup.recovery_target.as_ref())
        .map(|t| t.describe())
        .unwrap_or_default();
    match (&fact.state, fact.result.as_ref()) {
        (JobState::Running, Some(r)) if r.outcome == Outcome::Failed => RestoreDecision::pending(
            "Recovering",
            format!(
                "recovery Job {job} is retrying after a failed attempt (it stops at once on what no retry can fix): {}",
                r.message.as_deref().unwrap_or("no message")
            ),
        ),
        (JobState::Running, _) => RestoreDecision::pending(
            "Recovering",
            format!("recovery Job {job} is replaying archived WAL to {target}"),
        ),
        (JobState::Succeeded, Some(result)) => recovered(target, result),
        (JobState::Succeeded, None) => RestoreDecision::pending(
            "Recovering",
            format!("recovery Job {job} succeeded; reading its result"),
        ),
        (JobState::Failed { .. }, _) => from_job(job, fact),
    }
}

/// What a finished recovery reached, as the `Initialized` condition and `status.bootstrap`.
fn recovered(target: String, result: &BackupResult) -> RestoreDecision {
    let base = result.backup_id.clone().unwrap_or_else(|| "?".into());
    let reached = match (&result.recovered_to, &result.recovered_lsn) {
        (Some(time), _) => format!(
            "the last transaction replayed committed at {}",
            time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ),
        (None, Some(lsn)) => format!("no transaction replayed, promoted at {lsn}"),
        (None, None) => "the agent reported no point".into(),
    };
    let timeline = result
        .timeline
        .map(|t| format!(", timeline {t}"))
        .unwrap_or_default();
    let c = ConditionStatus::new(
        ConditionType::Initialized,
        true,
        "RecoveredToTarget",
        format!("recovered base backup {base} with archived WAL to {target}: {reached}{timeline}"),
    );
    RestoreDecision {
        status: Some(BootstrapStatus {
            restored_backup_id: result.backup_id.clone(),
            restored_key: result.key.clone(),
            restored_at: result.completed_at,
            recovery_target: Some(target),
            recovered_to: result.recovered_to,
            recovered_lsn: result.recovered_lsn.clone(),
            timeline: result.timeline,
        }),
        ..RestoreDecision::new(RestoreOutcome::Done, c)
    }
}

/// The condition reason of an agent's failure kind.
pub fn failure_reason(kind: Option<&str>) -> &'static str {
    match kind {
        Some("target-before-backups") => "RecoveryTargetBeforeBackups",
        Some("target-unreachable") => "RecoveryTargetUnreachable",
        Some("not-found") => "BackupNotFound",
        Some("integrity") => "BackupChecksumMismatch",
        Some("incompatible-version") => "BackupFromNewerMajor",
        Some("s3") => "S3RequestFailed",
        Some("encryption-key") => "EncryptionKeyRefused",
        _ => "RestoreFailed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DatabaseBackupSpec, DatabaseBackupStatus};
    use crate::resources::testing;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    fn from_backup(from: serde_json::Value) -> Database {
        testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "bootstrap": {"fromBackup": from}
        }))
    }

    fn s3_json() -> serde_json::Value {
        serde_json::json!({"bucket": "backups", "prefix": "team", "credentials": {"secretName": "s3-creds"}})
    }

    fn secret() -> Secret {
        Secret {
            data: Some(
                [("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "b")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn backup(phase: Option<BackupPhase>) -> DatabaseBackup {
        let mut b = DatabaseBackup::new(
            "ledger-202601010200",
            DatabaseBackupSpec {
                database: "ledger".into(),
                reason: crate::api::BackupReason::Scheduled,
                method: crate::api::BackupMethod::Logical,
            },
        );
        b.status = Some(DatabaseBackupStatus {
            phase,
            backup_id: Some("20260101T020000Z-ledger-202601010200".into()),
            key: Some(
                "team/shop/ledger/postgres/20260101T020000Z-ledger-202601010200/dump.pgc.zst"
                    .into(),
            ),
            ..DatabaseBackupStatus::default()
        });
        b
    }

    fn source_db() -> Database {
        let mut db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "backup": {"schedule": "0 2 * * *", "s3": s3_json()}
        }));
        db.metadata.name = Some("ledger".into());
        db
    }

    fn pod(message: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: RESTORE_CONTAINER.into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            message: Some(message.into()),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn an_s3_location_defaults_to_this_databases_own_prefix_and_latest() {
        let db = from_backup(serde_json::json!({"s3": s3_json()}));
        let snap = RestoreObjects {
            s3_secret: Some(secret()),
            ..RestoreObjects::default()
        };
        let s = source(&db, &snap).unwrap();
        assert_eq!(
            (s.prefix.as_str(), s.backup.as_str()),
            ("team/shop/orders", "latest")
        );
        assert_eq!(s.source_database, None);
        let other = from_backup(serde_json::json!({
            "s3": s3_json(), "backupId": "b1", "database": "ledger", "namespace": "prod"
        }));
        let s = source(&other, &snap).unwrap();
        assert_eq!(
            (s.prefix.as_str(), s.backup.as_str()),
            ("team/prod/ledger", "b1")
        );
    }

    #[test]
    fn a_database_backup_resolves_to_its_databases_bucket_and_id() {
        let db = from_backup(serde_json::json!({"databaseBackup": "ledger-202601010200"}));
        let snap = RestoreObjects {
            backup: Some(backup(Some(BackupPhase::Succeeded))),
            source_database: Some(source_db()),
            s3_secret: Some(secret()),
            ..RestoreObjects::default()
        };
        let s = source(&db, &snap).unwrap();
        assert_eq!(s.prefix, "team/shop/ledger");
        assert_eq!(s.backup, "20260101T020000Z-ledger-202601010200");
        assert_eq!(s.source_database.as_deref(), Some("postgres"));
    }

    /// A physical DatabaseBackup is recovered to a target, from its own base backup; naming
    /// one without a target (or a dump with one) fails, saying what to do.
    #[test]
    fn a_physical_database_backup_needs_a_target_and_a_dump_refuses_one() {
        let mut physical = backup(Some(BackupPhase::Succeeded));
        physical.spec.method = BackupMethod::Physical;
        let snap = |b: DatabaseBackup| RestoreObjects {
            backup: Some(b),
            source_database: Some(source_db()),
            s3_secret: Some(secret()),
            ..RestoreObjects::default()
        };
        let with_target = from_backup(serde_json::json!({
            "databaseBackup": "ledger-202601010200", "recoveryTarget": {"lsn": "0/5000000"}
        }));
        let s = source(&with_target, &snap(physical.clone())).unwrap();
        assert_eq!(s.prefix, "team/shop/ledger");
        assert_eq!(s.backup, "20260101T020000Z-ledger-202601010200");
        assert_eq!(s.target.unwrap().lsn.as_deref(), Some("0/5000000"));
        let without = from_backup(serde_json::json!({"databaseBackup": "ledger-202601010200"}));
        let problem = source(&without, &snap(physical)).unwrap_err();
        assert_eq!(problem.reason(), "BackupMethodMismatch");
        assert!(
            problem.message().contains("recoveryTarget"),
            "{}",
            problem.message()
        );
        let problem =
            source(&with_target, &snap(backup(Some(BackupPhase::Succeeded)))).unwrap_err();
        assert!(
            problem.message().contains("logical dump"),
            "{}",
            problem.message()
        );
        let fact = BootstrapFact {
            source: Err(problem),
            job: None,
        };
        let d = decide_restore(&with_target, &fact, false, false);
        assert!(matches!(d.outcome, RestoreOutcome::Failed { .. }) && !d.create_job);
    }

    #[test]
    fn source_problems_table() {
        let db = from_backup(serde_json::json!({"databaseBackup": "ledger-202601010200"}));
        let good = RestoreObjects {
            backup: Some(backup(Some(BackupPhase::Succeeded))),
            source_database: Some(source_db()),
            s3_secret: Some(secret()),
            ..RestoreObjects::default()
        };
        let table = [
            (
                "missing",
                RestoreObjects {
                    backup: None,
                    ..good.clone()
                },
                "BackupNotFound",
            ),
            (
                "running",
                RestoreObjects {
                    backup: Some(backup(Some(BackupPhase::Running))),
                    ..good.clone()
                },
                "BackupNotReady",
            ),
            (
                "failed",
                RestoreObjects {
                    backup: Some(backup(Some(BackupPhase::Failed))),
                    ..good.clone()
                },
                "BackupFailed",
            ),
            (
                "source gone",
                RestoreObjects {
                    source_database: None,
                    ..good.clone()
                },
                "BackupSourceNotFound",
            ),
            (
                "no secret",
                RestoreObjects {
                    s3_secret: None,
                    ..good.clone()
                },
                "S3CredentialsSecretNotFound",
            ),
            (
                "bad ca",
                RestoreObjects {
                    ca_problem: Some("no ca".into()),
                    ..good.clone()
                },
                "S3CaSourceInvalid",
            ),
        ];
        for (name, snap, reason) in table {
            let problem = source(&db, &snap).expect_err(name);
            assert_eq!(problem.reason(), reason, "{name}");
            let d = decide_restore(&db, &fact(&db, &snap).unwrap(), true, false);
            assert!(!d.create_job, "{name}");
            assert_eq!(d.condition.reason, reason, "{name}");
            assert!(!d.condition.status, "{name}");
        }
    }

    #[test]
    fn decision_table() {
        let db = from_backup(serde_json::json!({"s3": s3_json()}));
        let ok = BootstrapFact {
            source: Ok("b".into()),
            job: None,
        };
        let job = |state: JobState, result: Option<&str>| BootstrapFact {
            job: Some(RestoreJobFact {
                state,
                result: result.and_then(parse_termination_message),
                output: None,
            }),
            ..ok.clone()
        };
        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let table = [
            (
                "server starting",
                ok.clone(),
                false,
                false,
                "WaitingForServer",
                false,
                false,
            ),
            (
                "start the job",
                ok.clone(),
                true,
                false,
                "Restoring",
                false,
                true,
            ),
            (
                "retained data",
                ok.clone(),
                true,
                true,
                "ExistingData",
                true,
                false,
            ),
            (
                "running",
                job(JobState::Running, None),
                true,
                false,
                "Restoring",
                false,
                false,
            ),
            (
                "restored",
                job(
                    JobState::Succeeded,
                    Some(r#"{"outcome":"Succeeded","backupId":"b7","key":"k"}"#),
                ),
                true,
                false,
                "RestoredFromBackup",
                true,
                false,
            ),
            (
                "missing",
                job(
                    failed.clone(),
                    Some(
                        r#"{"outcome":"Failed","failureKind":"not-found","message":"no complete backup"}"#,
                    ),
                ),
                true,
                false,
                "BackupNotFound",
                false,
                false,
            ),
            (
                "checksum",
                job(
                    failed.clone(),
                    Some(r#"{"outcome":"Failed","failureKind":"integrity","message":"sha256"}"#),
                ),
                true,
                false,
                "BackupChecksumMismatch",
                false,
                false,
            ),
            (
                "newer major",
                job(
                    failed.clone(),
                    Some(
                        r#"{"outcome":"Failed","failureKind":"incompatible-version","message":"17"}"#,
                    ),
                ),
                true,
                false,
                "BackupFromNewerMajor",
                false,
                false,
            ),
            (
                "s3 down",
                job(
                    failed.clone(),
                    Some(r#"{"outcome":"Failed","failureKind":"s3","message":"refused"}"#),
                ),
                true,
                false,
                "S3RequestFailed",
                false,
                false,
            ),
            (
                "wrong key",
                job(
                    failed.clone(),
                    Some(
                        r#"{"outcome":"Failed","failureKind":"encryption-key","message":"backup b is encrypted with key \"k1\""}"#,
                    ),
                ),
                true,
                false,
                "EncryptionKeyRefused",
                false,
                false,
            ),
            (
                "no result",
                job(failed.clone(), None),
                true,
                false,
                "RestoreFailed",
                false,
                false,
            ),
        ];
        for (name, fact, up, predates, reason, initialized, create) in table {
            let d = decide_restore(&db, &fact, up, predates);
            assert_eq!(d.condition.reason, reason, "{name}");
            assert_eq!(d.condition.status, initialized, "{name}");
            assert_eq!(d.create_job, create, "{name}");
            let want_failed = [
                "BackupNotFound",
                "BackupChecksumMismatch",
                "BackupFromNewerMajor",
                "S3RequestFailed",
                "EncryptionKeyRefused",
                "RestoreFailed",
            ]
            .contains(&reason);
            let failed = matches!(d.outcome, RestoreOutcome::Failed { .. });
            assert_eq!(failed, want_failed, "{name}");
        }
        let d = decide_restore(
            &db,
            &job(
                JobState::Succeeded,
                Some(r#"{"outcome":"Succeeded","backupId":"b7","key":"k"}"#),
            ),
            true,
            false,
        );
        assert_eq!(d.status.unwrap().restored_backup_id.as_deref(), Some("b7"));
        assert!(d.condition.message.contains("b7"));
        let d = decide_restore(
            &db,
            &job(
                failed,
                Some(r#"{"outcome":"Failed","failureKind":"s3","message":"connection refused"}"#),
            ),
            true,
            false,
        );
        assert!(
            d.condition.message.contains("connection refused")
                && d.condition
                    .message
                    .contains("delete the Job orders-restore"),
            "{}",
            d.condition.message
        );
    }

    #[test]
    fn a_physical_recovery_starts_without_a_server_and_records_the_point_reached() {
        let db = from_backup(serde_json::json!({
            "s3": s3_json(), "recoveryTarget": {"time": "2026-12-04T10:00:00Z"}
        }));
        assert!(is_physical(&db));
        let ok = BootstrapFact {
            source: Ok("b".into()),
            job: None,
        };
        // No server yet, and a claim made for the recovery is not "existing data".
        let start = decide_restore(&db, &ok, false, false);
        assert!(start.create_job);
        assert_eq!(start.condition.reason, "Recovering");
        let kept = decide_restore(&db, &ok, false, true);
        assert!(
            kept.create_job,
            "the agent, not the claim's age, refuses a kept volume"
        );
        let job = |state: JobState, result: &str| BootstrapFact {
            job: Some(RestoreJobFact {
                state,
                result: parse_termination_message(result),
                output: None,
            }),
            ..ok.clone()
        };
        let done = decide_restore(
            &db,
            &job(
                JobState::Succeeded,
                r#"{"outcome":"Succeeded","operation":"recover","backupId":"20261204T090000Z","recoveredTo":"2026-12-04T09:59:58.5Z","recoveredLsn":"0/5000128","timeline":2}"#,
            ),
            false,
            false,
        );
        assert_eq!(done.outcome, RestoreOutcome::Done);
        assert_eq!(done.condition.reason, "RecoveredToTarget");
        assert!(
            done.condition.message.contains("20261204T090000Z")
                && done.condition.message.contains("2026-12-04T09:59:58.500Z")
                && done.condition.message.contains("timeline 2"),
            "{}",
            done.condition.message
        );
        let status = done.status.unwrap();
        assert_eq!(
            status.recovery_target.as_deref(),
            Some("time 2026-12-04T10:00:00Z")
        );
        assert_eq!(status.recovered_lsn.as_deref(), Some("0/5000128"));
        assert_eq!(status.timeline, Some(2));
        // An attempt failed and the Job retries it: still recovering, saying why.
        let retrying = decide_restore(
            &db,
            &job(
                JobState::Running,
                r#"{"outcome":"Failed","operation":"recover","failureKind":"postgres","message":"fetching WAL file 000000010000000000000005 from the archive failed"}"#,
            ),
            false,
            false,
        );
        assert_eq!(retrying.outcome, RestoreOutcome::Pending);
        assert!(
            retrying.condition.message.contains("retrying")
                && retrying.condition.message.contains("fetching WAL file"),
            "{}",
            retrying.condition.message
        );
        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let early = decide_restore(
            &db,
            &job(
                failed,
                r#"{"outcome":"Failed","operation":"recover","failureKind":"target-before-backups","message":"the earliest restorable point is 2026-12-04T09:00:00Z"}"#,
            ),
            false,
            false,
        );
        assert_eq!(early.condition.reason, "RecoveryTargetBeforeBackups");
        assert!(matches!(early.outcome, RestoreOutcome::Failed { .. }));
        assert!(
            early
                .condition
                .message
                .contains("earliest restorable point")
                && early
                    .condition
                    .message
                    .contains("create the Database again"),
            "{}",
            early.condition.message
        );
    }

    #[test]
    fn the_result_or_the_log_tail_comes_from_the_restore_container() {
        let line = r#"{"outcome":"Failed","operation":"restore","backupId":"x","message":"m"}"#;
        let db = from_backup(serde_json::json!({"s3": s3_json()}));
        let failed = Job {
            status: Some(k8s_openapi::api::batch::v1::JobStatus {
                conditions: Some(vec![k8s_openapi::api::batch::v1::JobCondition {
                    type_: "Failed".into(),
                    status: "True".into(),
                    reason: Some("BackoffLimitExceeded".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Job::default()
        };
        let fact_of = |pods: Vec<Pod>| {
            let snap = RestoreObjects {
                job: Some(failed.clone()),
                pods,
                ..RestoreObjects::default()
            };
            fact(&db, &snap).unwrap().job.unwrap()
        };
        let parsed = fact_of(vec![pod(line)]);
        assert_eq!(parsed.result.unwrap().backup_id.as_deref(), Some("x"));
        assert_eq!(parsed.output, None);
        let usage = "error: invalid value 'latest' for '--path-style'\nFor more, try '--help'.";
        let logs = fact_of(vec![pod(usage)]);
        assert_eq!(logs.result, None);
        let message = from_job("copy-restore", &logs).condition.message;
        assert!(
            message.contains("BackoffLimitExceeded") && message.contains("invalid value 'latest'"),
            "{message}"
        );
        assert_eq!(fact_of(vec![]).output, None);
    }
}
