//! Decide, for the `DatabaseBackup` controller: from the backup and its facts, the next status,
//! whether its Job starts now, and the Events of the change. Pure: the facts carry `now`.
//!
//! A backup that has not started is either refused (it can never run), kept waiting (for a
//! reason that names what it waits on) or started; one whose Job exists follows the Job.

use std::time::Duration;

use chrono::{DateTime, Utc};
use dbop_contract::{BackupResult, parse_termination_message};

use super::facts::{BackupFacts, DatabaseFacts, JobFacts, name_of};
use crate::api::{
    BackupMethod, BackupPhase, BackupReason, DatabaseBackup, DatabaseBackupStatus, Phase,
};
use crate::backup::s3_secret::S3SecretProblem;
use crate::objects::{EventSpec, JobState, MAX_MESSAGE, truncate};
use crate::resources::backup_job::job_name;

/// How often a queued backup looks whether its turn has come (a finished sibling does not wake
/// it through a watch).
pub const REQUEUE_QUEUED: Duration = Duration::from_secs(10);
/// A running backup is woken by its Job's events; this is a safety net.
pub const REQUEUE_RUNNING: Duration = Duration::from_secs(60);

/// The outcome of `decide`.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupDecision {
    pub status: DatabaseBackupStatus,
    pub create_job: bool,
    pub requeue_after: Option<Duration>,
}

/// Why a backup that has not started can never run.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    NoDatabase,
    NoBackupSpec,
    /// A physical backup of a Database that does not archive its WAL could not be restored.
    NoWalArchiving,
}

/// What a backup that has not started waits for.
#[derive(Clone, Debug, PartialEq)]
pub enum Wait {
    DatabaseNotStarted,
    UpgradeRollout,
    /// Behind another unfinished backup of the same Database.
    Queued {
        first: String,
        running: bool,
    },
    S3Credentials(S3SecretProblem),
    /// `spec.backup` has a value that does not parse: the backup waits until it is fixed.
    InvalidSpec(String),
}

/// Where a backup without a Job stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Start {
    Refused(Refusal),
    Waiting(Wait),
    Now,
}

/// Decides the next status of a backup and whether its Job starts now.
pub fn decide(backup: &DatabaseBackup, facts: &BackupFacts) -> BackupDecision {
    let previous = backup.status.clone().unwrap_or_default();
    if previous.phase.is_some_and(BackupPhase::is_finished) {
        return BackupDecision {
            status: previous,
            create_job: false,
            requeue_after: None,
        };
    }
    if let Some(job) = &facts.job {
        return follow_job(backup, previous, job, facts.now);
    }
    if facts.stale_job {
        return stale_job_wait(backup, previous);
    }
    let database = &backup.spec.database;
    match start(backup, facts.database.as_ref(), &facts.ahead) {
        Start::Refused(refusal) => failed(previous, refusal_message(&refusal, database), facts.now),
        Start::Waiting(wait) => BackupDecision {
            status: DatabaseBackupStatus {
                phase: Some(BackupPhase::Pending),
                message: Some(wait_message(&wait, database)),
                ..previous
            },
            create_job: false,
            requeue_after: Some(REQUEUE_QUEUED),
        },
        Start::Now => running(backup, previous, Some(facts.now), true),
    }
}

/// A Job of this name is left by an earlier `DatabaseBackup` of the same name: its outcome is
/// not this backup's, so wait until garbage collection removes it.
fn stale_job_wait(backup: &DatabaseBackup, previous: DatabaseBackupStatus) -> BackupDecision {
    BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Pending),
            message: Some(format!(
                "waiting for Job {} of an earlier DatabaseBackup of this name to be deleted",
                job_name(&name_of(backup))
            )),
            ..previous
        },
        create_job: false,
        requeue_after: Some(REQUEUE_QUEUED),
    }
}

/// Whether a backup without a Job can start now, and if not, why.
pub fn start(
    backup: &DatabaseBackup,
    db: Option<&DatabaseFacts>,
    ahead: &[(String, bool)],
) -> Start {
    let Some(db) = db else {
        return Start::Refused(Refusal::NoDatabase);
    };
    if !db.has_backup_spec {
        return Start::Refused(Refusal::NoBackupSpec);
    }
    if backup.spec.method == BackupMethod::Physical && !db.archives_wal {
        return Start::Refused(Refusal::NoWalArchiving);
    }
    let wait = if let Some(problem) = &db.spec_problem {
        Some(Wait::InvalidSpec(problem.clone()))
    } else if !db.has_run {
        Some(Wait::DatabaseNotStarted)
    } else if db.phase == Some(Phase::Upgrading) && backup.spec.reason != BackupReason::PreUpgrade {
        Some(Wait::UpgradeRollout)
    } else if let Some((first, running)) = ahead.first() {
        Some(Wait::Queued {
            first: first.clone(),
            running: *running,
        })
    } else {
        db.s3_problem.clone().map(Wait::S3Credentials)
    };
    wait.map_or(Start::Now, Start::Waiting)
}

fn refusal_message(refusal: &Refusal, database: &str) -> String {
    match refusal {
        Refusal::NoDatabase => format!("Database {database} does not exist in this namespace"),
        Refusal::NoBackupSpec => format!(
            "Database {database} has no spec.backup: set spec.backup.s3 to say where backups go"
        ),
        Refusal::NoWalArchiving => format!(
            "a physical backup needs the WAL archived from its start on, and Database {database} has no spec.backup.walArchiving: set it, then create this backup again (or use method Logical)"
        ),
    }
}

fn wait_message(wait: &Wait, database: &str) -> String {
    match wait {
        Wait::DatabaseNotStarted => format!("waiting for Database {database} to start"),
        Wait::UpgradeRollout => {
            format!("waiting for the upgrade rollout of Database {database} to end")
        }
        Wait::Queued { first, running } => {
            let state = if *running { "running" } else { "waiting" };
            format!("queued behind backup {first} ({state}): one backup at a time per Database")
        }
        Wait::S3Credentials(problem) => format!("waiting for the S3 credentials: {problem}"),
        Wait::InvalidSpec(problem) => {
            format!("waiting for Database {database}'s spec.backup to be fixed: {problem}")
        }
    }
}

/// The status that follows the backup's Job.
fn follow_job(
    backup: &DatabaseBackup,
    previous: DatabaseBackupStatus,
    job: &JobFacts,
    now: DateTime<Utc>,
) -> BackupDecision {
    let result = job
        .termination_message
        .as_deref()
        .and_then(parse_termination_message);
    let started = previous.started_at.or(job.start_time).or(Some(now));
    match &job.state {
        JobState::Running => running(backup, previous, started, false),
        JobState::Succeeded => succeeded(started, result, job, now),
        JobState::Failed { reason, detail } => {
            let job_reason =
                JobState::failure_text(&format!("backup Job failed ({reason})"), detail);
            let message = failure_message(
                result.as_ref(),
                job.termination_message.as_deref(),
                job_reason,
            );
            let mut d = failed(previous, message, job.completion_time.unwrap_or(now));
            d.status.started_at = started;
            if let Some(r) = result {
                d.status.backup_id = r.backup_id;
                d.status.bucket = r.bucket;
                d.status.engine_version = r.engine_version;
            }
            d
        }
    }
}

fn running(
    backup: &DatabaseBackup,
    previous: DatabaseBackupStatus,
    started: Option<DateTime<Utc>>,
    create_job: bool,
) -> BackupDecision {
    BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Running),
            started_at: started,
            message: Some(format!(
                "backup Job {} is running",
                job_name(&name_of(backup))
            )),
            ..previous
        },
        create_job,
        requeue_after: Some(REQUEUE_RUNNING),
    }
}

/// The agent's result fills the status.
fn succeeded(
    started: Option<DateTime<Utc>>,
    result: Option<BackupResult>,
    job: &JobFacts,
    now: DateTime<Utc>,
) -> BackupDecision {
    let r = result.unwrap_or_default();
    let completed = r.completed_at.or(job.completion_time).unwrap_or(now);
    let message = truncate(
        agent_message(&r).unwrap_or("the backup succeeded"),
        MAX_MESSAGE,
    );
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
            message: Some(message),
        },
        create_job: false,
        requeue_after: None,
    }
}

/// The agent's own message, else the Job's reason with the last line of the pod's output.
fn failure_message(
    result: Option<&BackupResult>,
    termination_message: Option<&str>,
    job_reason: String,
) -> String {
    match (result, termination_message) {
        (Some(r), _) => agent_message(r)
            .unwrap_or("the agent reported a failure")
            .to_string(),
        (None, Some(text)) if !text.trim().is_empty() => {
            format!("{job_reason}; last output: {}", last_line(text))
        }
        _ => job_reason,
    }
}

/// The agent's message, unless it is blank (a status message must say something).
fn agent_message(result: &BackupResult) -> Option<&str> {
    result.message.as_deref().filter(|m| !m.trim().is_empty())
}

fn failed(
    previous: DatabaseBackupStatus,
    message: String,
    completed: DateTime<Utc>,
) -> BackupDecision {
    BackupDecision {
        status: DatabaseBackupStatus {
            phase: Some(BackupPhase::Failed),
            completed_at: Some(completed),
            message: Some(truncate(&message, MAX_MESSAGE)),
            ..previous
        },
        create_job: false,
        requeue_after: None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database_backup::testing::{backup, now};
    use chrono::TimeZone;

    fn ready_db() -> DatabaseFacts {
        DatabaseFacts {
            phase: Some(Phase::Ready),
            has_backup_spec: true,
            archives_wal: false,
            spec_problem: None,
            has_run: true,
            s3_problem: None,
        }
    }

    /// A physical backup needs the WAL from its start on: without walArchiving it is refused
    /// (failed, saying what to set); with it, it starts like a dump.
    #[test]
    fn a_physical_backup_needs_wal_archiving() {
        let mut b = backup("orders-manual", BackupReason::Manual, None, 0);
        b.spec.method = BackupMethod::Physical;
        let d = decide(&b, &facts(Some(ready_db()), None));
        assert_eq!(d.status.phase, Some(BackupPhase::Failed));
        assert!(!d.create_job);
        let message = d.status.message.unwrap_or_default();
        assert!(message.contains("spec.backup.walArchiving"), "{message}");
        let archiving = DatabaseFacts {
            archives_wal: true,
            ..ready_db()
        };
        let d = decide(&b, &facts(Some(archiving), None));
        assert!(d.create_job);
        assert_eq!(d.status.phase, Some(BackupPhase::Running));
    }

    fn facts(database: Option<DatabaseFacts>, job: Option<JobFacts>) -> BackupFacts {
        BackupFacts {
            now: now(),
            database,
            ahead: vec![],
            job,
            stale_job: false,
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
                        s3_problem: Some(S3SecretProblem::NotFound {
                            secret: "s3".into(),
                            access_key_id_key: "AWS_ACCESS_KEY_ID".into(),
                            secret_access_key_key: "AWS_SECRET_ACCESS_KEY".into(),
                        }),
                        ..ready_db()
                    }),
                    None,
                ),
                Pending,
                false,
                "does not exist: create it with the keys",
            ),
            (
                "a Job left by an earlier backup of this name",
                manual.clone(),
                BackupFacts {
                    stale_job: true,
                    ..facts(Some(ready_db()), None)
                },
                Pending,
                false,
                "of an earlier DatabaseBackup of this name",
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
                        JobState::Failed {
                            reason: "BackoffLimitExceeded".into(),
                            detail: String::new(),
                        },
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
                        JobState::Failed {
                            reason: "DeadlineExceeded".into(),
                            detail: String::new(),
                        },
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
    fn start_table() {
        let manual = backup("b", BackupReason::Manual, None, 5);
        let pre = backup("pre", BackupReason::PreUpgrade, None, 5);
        let upgrading = DatabaseFacts {
            phase: Some(Phase::Upgrading),
            ..ready_db()
        };
        let no_spec = DatabaseFacts {
            has_backup_spec: false,
            ..ready_db()
        };
        let never_ran = DatabaseFacts {
            has_run: false,
            ..ready_db()
        };
        let problem = S3SecretProblem::MissingKeys {
            secret: "s3".into(),
            keys: vec!["k".into()],
            field: "accessKeyIdKey",
        };
        let bad_s3 = DatabaseFacts {
            s3_problem: Some(problem.clone()),
            ..ready_db()
        };
        let bad_spec = DatabaseFacts {
            spec_problem: Some("spec.backup.timeout \"soon\" is not a positive duration".into()),
            has_run: false,
            ..ready_db()
        };
        let queued = vec![("older".to_string(), false)];
        let table = [
            (
                "no Database",
                &manual,
                None,
                vec![],
                Start::Refused(Refusal::NoDatabase),
            ),
            (
                "no spec",
                &manual,
                Some(&no_spec),
                vec![],
                Start::Refused(Refusal::NoBackupSpec),
            ),
            (
                "never ran",
                &manual,
                Some(&never_ran),
                vec![],
                Start::Waiting(Wait::DatabaseNotStarted),
            ),
            (
                "upgrading",
                &manual,
                Some(&upgrading),
                vec![],
                Start::Waiting(Wait::UpgradeRollout),
            ),
            (
                "pre-upgrade runs",
                &pre,
                Some(&upgrading),
                vec![],
                Start::Now,
            ),
            (
                "queued",
                &manual,
                Some(&bad_s3),
                queued,
                Start::Waiting(Wait::Queued {
                    first: "older".into(),
                    running: false,
                }),
            ),
            (
                "S3",
                &manual,
                Some(&bad_s3),
                vec![],
                Start::Waiting(Wait::S3Credentials(problem)),
            ),
            (
                "invalid spec, before anything else",
                &manual,
                Some(&bad_spec),
                vec![],
                Start::Waiting(Wait::InvalidSpec(
                    "spec.backup.timeout \"soon\" is not a positive duration".into(),
                )),
            ),
            ("ready", &manual, Some(&ready_db()), vec![], Start::Now),
        ];
        for (name, b, db, ahead, want) in table {
            assert_eq!(start(b, db, &ahead), want, "{name}");
        }
    }
}
