//! The backup part of a Database's reconcile, decided: the scheduled run to create (if any),
//! the `DatabaseBackup` objects to delete, `status.backup`, the `BackupHealthy` condition and
//! when to look again.
//!
//! Pure: the Database, the observed backups and `now` in, a plan out.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::s3_secret::S3SecretProblem;
use super::schedule::{
    BackupRecord, HealthFacts, Hold, Run, ScheduleFacts, SchedulePlan, backup_health,
    backups_to_prune, plan_schedule,
};
use super::settings::BackupSettings;
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{BackupPhase, BackupStatus, Database, Phase};
use crate::objects::EventSpec;

/// What the Database's reconcile observed about its backups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupHistory {
    pub now: DateTime<Utc>,
    /// This Database's `DatabaseBackup` objects.
    pub records: Vec<BackupRecord>,
    /// What is wrong with the S3 credentials Secret.
    pub s3_problem: Option<S3SecretProblem>,
}

impl Default for BackupHistory {
    fn default() -> Self {
        Self {
            now: DateTime::UNIX_EPOCH,
            records: vec![],
            s3_problem: None,
        }
    }
}

/// A scheduled run to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewBackup {
    pub name: String,
    pub scheduled_at: DateTime<Utc>,
}

/// The backup part of a Database's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupPlan {
    /// `BackupHealthy`; None without `spec.backup`: the condition is then absent (a Database
    /// that never asked for backups is not unhealthy, and alerts on False stay quiet).
    pub condition: Option<ConditionStatus>,
    pub status: Option<BackupStatus>,
    pub create: Option<NewBackup>,
    pub prune: Vec<String>,
    /// Events that are not condition transitions (a skipped run).
    pub events: Vec<EventSpec>,
    pub requeue_after: Option<Duration>,
}

/// Decides the backup plan. `phase` is the phase decided for this pass.
pub fn plan_backups(db: &Database, fact: &BackupHistory, phase: Phase) -> BackupPlan {
    let previous = db
        .status
        .as_ref()
        .and_then(|s| s.backup.clone())
        .unwrap_or_default();
    let outcomes = outcomes(&previous, &fact.records);
    let Some(spec) = &db.spec.backup else {
        return not_configured(outcomes);
    };
    let settings = match BackupSettings::parse(spec) {
        Ok(s) => s,
        Err(message) => return invalid_spec(message, &previous, outcomes),
    };
    let schedule = plan_schedule(
        &settings.schedule,
        &schedule_facts(db, fact, phase, &settings, &previous),
    );
    let (condition, health_requeue) = health(fact, &settings, &outcomes, &schedule);
    BackupPlan {
        condition: Some(condition),
        events: skipped_event(&schedule, &previous).into_iter().collect(),
        create: match &schedule.run {
            Run::Start { at, name } => Some(NewBackup {
                name: name.clone(),
                scheduled_at: *at,
            }),
            _ => None,
        },
        prune: backups_to_prune(&fact.records, &settings.history, fact.now),
        status: Some(BackupStatus {
            last_schedule_time: schedule.last_schedule_time,
            next_schedule_time: schedule.next_schedule_time,
            ..outcomes
        }),
        requeue_after: [schedule.requeue_after, health_requeue]
            .into_iter()
            .flatten()
            .min(),
    }
}

/// No `spec.backup`: no `BackupHealthy` condition, and only the outcomes of earlier backups
/// are kept in the status.
fn not_configured(outcomes: BackupStatus) -> BackupPlan {
    let status = BackupStatus {
        last_schedule_time: None,
        next_schedule_time: None,
        ..outcomes
    };
    BackupPlan {
        condition: None,
        status: (status != BackupStatus::default()).then_some(status),
        create: None,
        prune: vec![],
        events: vec![],
        requeue_after: None,
    }
}

/// A `spec.backup` that cannot be read: nothing is scheduled until it is fixed.
fn invalid_spec(message: String, previous: &BackupStatus, outcomes: BackupStatus) -> BackupPlan {
    BackupPlan {
        condition: Some(ConditionStatus::new(
            ConditionType::BackupHealthy,
            false,
            "InvalidBackupSpec",
            message,
        )),
        status: Some(BackupStatus {
            next_schedule_time: None,
            last_schedule_time: previous.last_schedule_time,
            ..outcomes
        }),
        create: None,
        prune: vec![],
        events: vec![],
        requeue_after: None,
    }
}

/// Why a due run must wait, if it must: unusable S3 credentials, an upgrade rollout, or a
/// Database that never ran.
fn hold(db: &Database, fact: &BackupHistory, phase: Phase) -> Option<Hold> {
    let has_run = db
        .status
        .as_ref()
        .is_some_and(|s| s.current_version.is_some());
    if fact.s3_problem.is_some() {
        Some(Hold::Misconfigured)
    } else if phase == Phase::Upgrading {
        Some(Hold::Upgrading)
    } else if !has_run || phase == Phase::Initializing {
        // The server may run before its init SQL did: a backup then would hold none of it.
        Some(Hold::DatabaseNotReady)
    } else {
        None
    }
}

fn schedule_facts(
    db: &Database,
    fact: &BackupHistory,
    phase: Phase,
    settings: &BackupSettings,
    previous: &BackupStatus,
) -> ScheduleFacts {
    let mut unfinished: Vec<&BackupRecord> =
        fact.records.iter().filter(|r| !r.is_finished()).collect();
    unfinished.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)));
    ScheduleFacts {
        database: db.name(),
        now: fact.now,
        last_schedule_time: previous.last_schedule_time,
        next_schedule_time: previous.next_schedule_time,
        suspended: db.spec.backup.as_ref().is_some_and(|b| b.suspend),
        starting_deadline: settings.starting_deadline,
        hold: hold(db, fact, phase),
        active_backup: unfinished.first().map(|r| r.name.clone()),
        existing: fact.records.iter().map(|r| r.name.clone()).collect(),
    }
}

/// A Warning when a run was missed by more than the starting deadline (once per miss).
fn skipped_event(schedule: &SchedulePlan, previous: &BackupStatus) -> Option<EventSpec> {
    let Run::Skipped { latest_missed } = &schedule.run else {
        return None;
    };
    if previous.next_schedule_time == schedule.next_schedule_time {
        return None;
    }
    Some(EventSpec {
        warning: true,
        reason: "ScheduledBackupSkipped".into(),
        note: format!(
            "the backup scheduled at {} was missed by more than the starting deadline; the \
             next one is at {}",
            rfc3339(*latest_missed),
            schedule
                .next_schedule_time
                .map(rfc3339)
                .unwrap_or_else(|| "never".into())
        ),
    })
}

/// `BackupHealthy`: False while the S3 credentials are unusable, else from the outcomes, the
/// recovery point objective and the schedule.
fn health(
    fact: &BackupHistory,
    settings: &BackupSettings,
    outcomes: &BackupStatus,
    schedule: &SchedulePlan,
) -> (ConditionStatus, Option<Duration>) {
    if let Some(problem) = &fact.s3_problem {
        let condition = ConditionStatus::new(
            ConditionType::BackupHealthy,
            false,
            problem.reason(),
            problem.to_string(),
        );
        return (condition, None);
    }
    let mut finished: Vec<&BackupRecord> =
        fact.records.iter().filter(|r| r.is_finished()).collect();
    finished.sort_by_key(|r| (r.completed.unwrap_or(r.created), r.name.clone()));
    let last_success = outcomes
        .last_successful
        .clone()
        .zip(outcomes.last_successful_time);
    let rpo = settings.rpo.unwrap_or_else(|| {
        let from = last_success.as_ref().map(|s| s.1).unwrap_or(fact.now);
        settings
            .schedule
            .longest_interval(from)
            .map(|i| i * 2)
            .unwrap_or(Duration::from_secs(2 * 86_400))
    });
    backup_health(&HealthFacts {
        now: fact.now,
        last_success,
        latest_finished: finished.last().map(|r| (*r).clone()),
        a_run_was_due: schedule.last_schedule_time.is_some()
            || matches!(schedule.run, Run::Skipped { .. } | Run::Wait { .. })
            || !finished.is_empty(),
        first_due: schedule.next_schedule_time,
        rpo,
    })
}

/// The last successful and failed backups: the newest observed, or the previous status's when
/// that is newer (its object may have been deleted).
fn outcomes(previous: &BackupStatus, records: &[BackupRecord]) -> BackupStatus {
    let newest = |phase: BackupPhase| {
        records
            .iter()
            .filter(|r| r.phase == Some(phase))
            .map(|r| (r.completed.unwrap_or(r.created), r.name.clone()))
            .max()
    };
    let pick = |observed: Option<(DateTime<Utc>, String)>,
                name: &Option<String>,
                time: &Option<DateTime<Utc>>| {
        let kept = name.clone().zip(*time).map(|(n, t)| (t, n));
        match (observed, kept) {
            (Some(o), Some(k)) => Some(o.max(k)),
            (o, k) => o.or(k),
        }
    };
    let success = pick(
        newest(BackupPhase::Succeeded),
        &previous.last_successful,
        &previous.last_successful_time,
    );
    let failure = pick(
        newest(BackupPhase::Failed),
        &previous.last_failure,
        &previous.last_failure_time,
    );
    BackupStatus {
        last_schedule_time: None,
        next_schedule_time: None,
        last_successful: success.as_ref().map(|s| s.1.clone()),
        last_successful_time: success.map(|s| s.0),
        last_failure: failure.as_ref().map(|f| f.1.clone()),
        last_failure_time: failure.map(|f| f.0),
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The Events of a `BackupHealthy` change: a Warning whenever it turns False or is False for a
/// new reason (the backup controller reports individual failures itself).
/// `BackupNotConfigured` is the reason earlier versions wrote without `spec.backup`: no Event.
pub fn health_events(old: Option<&ConditionStatus>, new: &ConditionStatus) -> Vec<EventSpec> {
    let changed = old.is_none_or(|o| o.status != new.status || o.reason != new.reason);
    if !changed || new.reason == "BackupNotConfigured" {
        return vec![];
    }
    if new.status {
        // Recovered: say so once.
        return match old {
            Some(o) if !o.status && o.reason != "BackupNotConfigured" => vec![EventSpec {
                warning: false,
                reason: "BackupHealthy".into(),
                note: new.message.clone(),
            }],
            _ => vec![],
        };
    }
    if new.reason == "LastBackupFailed" {
        return vec![];
    }
    vec![EventSpec {
        warning: true,
        reason: new.reason.clone(),
        note: new.message.clone(),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::backup::job::tests::with_backup;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 30).unwrap()
    }

    fn fact() -> BackupHistory {
        BackupHistory {
            now: now(),
            records: vec![],
            s3_problem: None,
        }
    }

    fn scheduled(db: &mut Database, last: Option<DateTime<Utc>>, next: Option<DateTime<Utc>>) {
        let status = db.status.get_or_insert_with(DatabaseStatus::default);
        status.backup = Some(BackupStatus {
            last_schedule_time: last,
            next_schedule_time: next,
            ..BackupStatus::default()
        });
    }

    #[test]
    fn a_due_run_is_created_on_a_ready_database() {
        let mut db = with_backup(serde_json::json!({}));
        scheduled(
            &mut db,
            None,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()),
        );
        let plan = plan_backups(&db, &fact(), Phase::Ready);
        let condition = plan.condition.clone().unwrap();
        assert_eq!(plan.create.as_ref().unwrap().name, "orders-202505010200");
        let status = plan.status.unwrap();
        assert_eq!(
            status.last_schedule_time,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap())
        );
        assert_eq!(
            status.next_schedule_time,
            Some(Utc.with_ymd_and_hms(2025, 5, 2, 2, 0, 0).unwrap())
        );
        // No success yet although a run was due.
        assert_eq!(condition.reason, "NoSuccessfulBackup");
    }

    #[test]
    fn unusable_s3_credentials_hold_runs_and_say_what_to_fix() {
        let mut db = with_backup(serde_json::json!({}));
        scheduled(
            &mut db,
            None,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()),
        );
        let f = BackupHistory {
            s3_problem: Some(S3SecretProblem::NotFound {
                secret: "s3-creds".into(),
                access_key_id_key: "AWS_ACCESS_KEY_ID".into(),
                secret_access_key_key: "AWS_SECRET_ACCESS_KEY".into(),
            }),
            ..fact()
        };
        let plan = plan_backups(&db, &f, Phase::Ready);
        assert!(plan.create.is_none());
        let condition = plan.condition.unwrap();
        assert!(!condition.status);
        assert_eq!(condition.reason, "S3CredentialsSecretNotFound");
        let events = health_events(None, &condition);
        assert!(events[0].warning && events[0].reason == "S3CredentialsSecretNotFound");
    }

    #[test]
    fn an_unusable_encryption_secret_holds_runs_and_says_what_to_fix() {
        let mut db = with_backup(serde_json::json!({
            "encryption": {"secretName": "backup-keys", "keyName": "k2"}
        }));
        scheduled(
            &mut db,
            None,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()),
        );
        let enc = db.spec.backup.as_ref().unwrap().encryption.clone().unwrap();
        let f = BackupHistory {
            s3_problem: crate::backup::encryption::problem(&enc, None)
                .map(S3SecretProblem::EncryptionKey),
            ..fact()
        };
        let plan = plan_backups(&db, &f, Phase::Ready);
        assert!(plan.create.is_none(), "no Job waits for a missing volume");
        let condition = plan.condition.unwrap();
        assert!(!condition.status);
        assert_eq!(condition.reason, "EncryptionKeySecretInvalid");
        assert!(
            condition.message.contains("Secret backup-keys")
                && condition.message.contains("openssl rand -base64 32"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn no_run_during_an_upgrade_and_none_before_the_first_start() {
        let mut db = with_backup(serde_json::json!({}));
        scheduled(
            &mut db,
            None,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()),
        );
        assert!(
            plan_backups(&db, &fact(), Phase::Upgrading)
                .create
                .is_none()
        );
        // Running, but its init SQL has not: nothing worth a backup yet.
        assert!(
            plan_backups(&db, &fact(), Phase::Initializing)
                .create
                .is_none()
        );
        assert!(plan_backups(&db, &fact(), Phase::Ready).create.is_some());
        db.status.as_mut().unwrap().current_version = None;
        assert!(
            plan_backups(&db, &fact(), Phase::Provisioning)
                .create
                .is_none()
        );
    }

    #[test]
    fn an_invalid_spec_is_a_condition_and_a_missing_one_none() {
        let db = with_backup(serde_json::json!({"schedule": "0 2 1 * 1"}));
        let condition = plan_backups(&db, &fact(), Phase::Ready).condition.unwrap();
        assert_eq!(condition.reason, "InvalidBackupSpec");
        assert!(condition.message.contains("set one of them to *"));
        let db = with_backup(serde_json::json!({"timeZone": "Nowhere/Land"}));
        assert!(
            plan_backups(&db, &fact(), Phase::Ready)
                .condition
                .unwrap()
                .message
                .contains("timeZone")
        );
        // Without spec.backup there is no BackupHealthy at all (not False: nothing to alert on).
        let plan = plan_backups(&crate::resources::testing::minimal(), &fact(), Phase::Ready);
        assert_eq!(plan.condition, None);
        assert_eq!(plan.status, None);
    }

    #[test]
    fn the_last_outcomes_come_from_the_backups() {
        let mut db = with_backup(serde_json::json!({"retention": {"keepLast": 1}}));
        scheduled(
            &mut db,
            Some(Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()),
            None,
        );
        let at = |h| Utc.with_ymd_and_hms(2025, 5, 1, h, 0, 0).unwrap();
        let record = |name: &str, phase, h| BackupRecord {
            name: name.into(),
            phase: Some(phase),
            created: at(h),
            completed: Some(at(h)),
            message: None,
        };
        let f = BackupHistory {
            records: vec![
                record("a", BackupPhase::Succeeded, 0),
                record("b", BackupPhase::Succeeded, 1),
                record("c", BackupPhase::Failed, 0),
            ],
            ..fact()
        };
        let plan = plan_backups(&db, &f, Phase::Ready);
        let status = plan.status.clone().unwrap();
        assert_eq!(status.last_successful.as_deref(), Some("b"));
        assert_eq!(status.last_successful_time, Some(at(1)));
        assert_eq!(status.last_failure.as_deref(), Some("c"));
        assert_eq!(plan.condition.as_ref().unwrap().reason, "BackupSucceeded");
        assert_eq!(plan.prune, vec!["a".to_string()]);
        // The same world gives the same plan: a second pass writes nothing.
        db.status.as_mut().unwrap().backup = plan.status.clone();
        assert_eq!(plan_backups(&db, &f, Phase::Ready).status, plan.status);
    }

    #[test]
    fn health_events_only_on_change() {
        let bad = ConditionStatus::new(ConditionType::BackupHealthy, false, "BackupTooOld", "old");
        let good =
            ConditionStatus::new(ConditionType::BackupHealthy, true, "BackupSucceeded", "ok");
        assert_eq!(health_events(Some(&bad), &bad), vec![]);
        assert_eq!(health_events(Some(&good), &bad)[0].reason, "BackupTooOld");
        assert_eq!(health_events(Some(&bad), &good)[0].reason, "BackupHealthy");
        assert_eq!(health_events(None, &good), vec![]);
    }
}
