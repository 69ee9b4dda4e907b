//! Backup verification, decided: when a verify Job starts (`spec.backup.verify`: a schedule,
//! or after every Nth successful backup), what its outcome makes of `status.verification`, the
//! `BackupVerified` condition, and `BackupHealthy` when verification fails.
//!
//! Pure: the Database, its succeeded backups, its verify Jobs and `now` in, a plan out. The
//! status is the memory (a finished Job may be gone); a trigger's Job has a deterministic name,
//! so a restarted operator finds the Job it made instead of making a second one.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use dbop_contract::BackupResult;

use super::schedule::{BackupSchedule, DEFAULT_KEEP_LAST};
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{BackupSpec, Database, Phase, VerificationStatus};
use crate::objects::{JobState, MAX_MESSAGE, truncate};
use crate::resources::backup_job::job_name;

/// A scheduled trigger older than this is not looked for (bounds the walk over the schedule).
const LOOKBACK: TimeDelta = TimeDelta::days(8);
/// Outcome words in `status.verification.outcome`.
pub const SUCCEEDED: &str = "Succeeded";
pub const FAILED: &str = "Failed";

/// One verify Job of the Database, as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyJobFact {
    pub name: String,
    pub state: JobState,
    pub finished: Option<DateTime<Utc>>,
    /// The agent's result from the pod's termination message.
    pub result: Option<BackupResult>,
}

/// What the verification decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyFacts {
    pub now: DateTime<Utc>,
    pub phase: Phase,
    /// When the Database was created (no scheduled trigger before).
    pub created: DateTime<Utc>,
    /// Succeeded backups: (name, completion time).
    pub succeeded: Vec<(String, DateTime<Utc>)>,
    pub jobs: Vec<VerifyJobFact>,
}

/// The verification part of a Database's reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyPlan {
    /// The verify Job to create (its name).
    pub create: Option<String>,
    pub status: Option<VerificationStatus>,
    /// `BackupVerified`; None before any verification finished and without `verify`.
    pub condition: Option<ConditionStatus>,
    /// `BackupHealthy` False while the latest verification failed (applied over a True one).
    pub unhealthy: Option<ConditionStatus>,
    pub requeue_after: Option<Duration>,
}

/// A trigger: the verify Job's name and the trigger's time.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Trigger {
    job: String,
    at: DateTime<Utc>,
}

/// Decides the verification plan of a Database.
pub fn plan_verification(db: &Database, facts: &VerifyFacts) -> VerifyPlan {
    let Some(spec) = db.spec.backup.as_ref().filter(|b| b.verify.is_some()) else {
        return VerifyPlan {
            create: None,
            status: None,
            condition: None,
            unhealthy: None,
            requeue_after: None,
        };
    };
    let previous = db
        .status
        .as_ref()
        .and_then(|s| s.verification.clone())
        .unwrap_or_default();
    let mut status = record_outcome(previous, &facts.jobs);
    let (trigger, requeue_after) = match next_trigger(db, spec, &status, facts) {
        Ok(found) => found,
        Err(problem) => return invalid(status, problem),
    };
    let running = facts.jobs.iter().any(|j| j.state == JobState::Running);
    let create = trigger.filter(|_| !running && facts.phase == Phase::Ready);
    if let Some(t) = &create {
        status.job = Some(t.job.clone());
        status.last_trigger_time = Some(t.at);
    }
    VerifyPlan {
        create: create.map(|t| t.job),
        condition: condition(&status),
        unhealthy: unhealthy(&status),
        status: Some(status),
        requeue_after,
    }
}

/// `verify.schedule` that does not parse: say so in `BackupVerified`.
fn invalid(status: VerificationStatus, problem: String) -> VerifyPlan {
    VerifyPlan {
        create: None,
        condition: Some(ConditionStatus::new(
            ConditionType::BackupVerified,
            false,
            "InvalidVerifySpec",
            problem,
        )),
        unhealthy: None,
        status: Some(status),
        requeue_after: None,
    }
}

/// Milliseconds as seconds to a tenth, as `status.verification.recoveryTime` reads (`72.3s`).
fn seconds(ms: u64) -> String {
    format!("{}.{}s", ms / 1000, ms % 1000 / 100)
}

/// The outcome of the latest trigger's Job, once it finished, written into the status.
fn record_outcome(mut status: VerificationStatus, jobs: &[VerifyJobFact]) -> VerificationStatus {
    let Some(job) = status
        .job
        .as_ref()
        .and_then(|name| jobs.iter().find(|j| &j.name == name))
    else {
        return status;
    };
    let result = job.result.clone().unwrap_or_default();
    let at = result.completed_at.or(job.finished);
    let message = result.message.clone().filter(|m| !m.trim().is_empty());
    match &job.state {
        JobState::Running => {}
        JobState::Succeeded => {
            status.outcome = Some(SUCCEEDED.into());
            status.last_verified_time = at;
            status.last_verified_backup_id = result.backup_id;
            status.recovery_time = result.recovery_millis.map(seconds);
            status.message = Some(truncate(
                &message.unwrap_or_else(|| "the backup restored".into()),
                MAX_MESSAGE,
            ));
        }
        JobState::Failed { reason, detail } => {
            status.outcome = Some(FAILED.into());
            status.last_failure_time = at;
            let job_reason = JobState::failure_text(reason, detail);
            status.message = Some(truncate(
                &message
                    .unwrap_or_else(|| format!("verify Job {} failed ({job_reason})", job.name)),
                MAX_MESSAGE,
            ));
        }
    }
    status
}

/// The trigger due now (if any) and when to look again for the next one.
fn next_trigger(
    db: &Database,
    spec: &BackupSpec,
    status: &VerificationStatus,
    facts: &VerifyFacts,
) -> Result<(Option<Trigger>, Option<Duration>), String> {
    let verify = spec.verify.as_ref().expect("checked by the caller");
    if let Some(expression) = &verify.schedule {
        let schedule = BackupSchedule::parse(expression, spec.time_zone.as_deref())
            .map_err(|e| e.replace("spec.backup.schedule", "spec.backup.verify.schedule"))?;
        return Ok(scheduled_trigger(db, &schedule, status, facts));
    }
    let nth = verify.every_nth_backup.unwrap_or(1);
    let keep_last = spec
        .retention
        .as_ref()
        .and_then(|r| r.keep_last)
        .unwrap_or(DEFAULT_KEEP_LAST)
        .max(1);
    Ok((nth_trigger(nth.min(keep_last), status, facts), None))
}

/// The latest scheduled time since the last trigger, once a backup has succeeded.
fn scheduled_trigger(
    db: &Database,
    schedule: &BackupSchedule,
    status: &VerificationStatus,
    facts: &VerifyFacts,
) -> (Option<Trigger>, Option<Duration>) {
    let after = [
        status.last_trigger_time,
        Some(facts.created),
        Some(facts.now - LOOKBACK),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(facts.now);
    let next = schedule
        .next_after(facts.now)
        .and_then(|n| (n - facts.now).to_std().ok());
    let due = schedule
        .latest_between(after, facts.now)
        .filter(|_| !facts.succeeded.is_empty());
    let trigger = due.map(|at| Trigger {
        job: job_name(&format!("{}-verify-{}", db.name(), at.format("%Y%m%d%H%M"))),
        at,
    });
    (trigger, next)
}

/// After the Nth backup that succeeded since the last trigger: the newest of them triggers.
fn nth_trigger(nth: u32, status: &VerificationStatus, facts: &VerifyFacts) -> Option<Trigger> {
    let mut since: Vec<&(String, DateTime<Utc>)> = facts
        .succeeded
        .iter()
        .filter(|(_, at)| status.last_trigger_time.is_none_or(|t| *at > t))
        .collect();
    if since.len() < nth as usize {
        return None;
    }
    since.sort_by_key(|(name, at)| (*at, name.clone()));
    let (backup, at) = since.last()?;
    Some(Trigger {
        job: job_name(&format!("{backup}-verify")),
        at: *at,
    })
}

/// `BackupVerified` from the latest finished verification.
fn condition(status: &VerificationStatus) -> Option<ConditionStatus> {
    let message = status.message.clone().unwrap_or_default();
    match status.outcome.as_deref() {
        Some(SUCCEEDED) => Some(ConditionStatus::new(
            ConditionType::BackupVerified,
            true,
            "Verified",
            format!(
                "backup {} restored into a scratch database at {}: {message}",
                status.last_verified_backup_id.as_deref().unwrap_or("?"),
                status
                    .last_verified_time
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default()
            ),
        )),
        Some(_) => Some(ConditionStatus::new(
            ConditionType::BackupVerified,
            false,
            "VerificationFailed",
            message,
        )),
        None => None,
    }
}

/// `BackupHealthy` False, reason `VerificationFailed`, while the latest verification failed.
fn unhealthy(status: &VerificationStatus) -> Option<ConditionStatus> {
    (status.outcome.as_deref() == Some(FAILED)).then(|| {
        ConditionStatus::new(
            ConditionType::BackupHealthy,
            false,
            "VerificationFailed",
            format!(
                "the latest backup did not verify: {}",
                status.message.as_deref().unwrap_or("no message")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::job::tests::with_backup;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 5, 1, h, m, 0).unwrap()
    }

    fn facts() -> VerifyFacts {
        VerifyFacts {
            now: at(12, 0),
            phase: Phase::Ready,
            created: at(0, 0),
            succeeded: vec![("orders-202505010200".into(), at(2, 1))],
            jobs: vec![],
        }
    }

    fn db(verify: serde_json::Value, previous: Option<VerificationStatus>) -> Database {
        let mut db = with_backup(serde_json::json!({"verify": verify}));
        db.status.as_mut().unwrap().verification = previous;
        db
    }

    fn job(name: &str, state: JobState, result: Option<&str>) -> VerifyJobFact {
        VerifyJobFact {
            name: name.into(),
            state,
            finished: Some(at(12, 0)),
            result: result.and_then(dbop_contract::parse_termination_message),
        }
    }

    const OK: &str = r#"{"outcome":"Succeeded","operation":"verify","backupId":"20250501T020003Z-b","completedAt":"2025-05-01T11:59:00Z","recoveryMillis":72345,"message":"restored; row counts match"}"#;
    const BAD: &str = r#"{"outcome":"Failed","operation":"verify","message":"table public.t: manifest has 100 rows, restored database has 99"}"#;

    #[test]
    fn triggers_table() {
        let daily = serde_json::json!({"schedule": "0 3 * * *"});
        let every2 = serde_json::json!({"everyNthBackup": 2});
        let after = |t| {
            Some(VerificationStatus {
                last_trigger_time: Some(t),
                ..Default::default()
            })
        };
        let two_more = VerifyFacts {
            succeeded: vec![
                ("a".into(), at(2, 0)),
                ("b".into(), at(4, 0)),
                ("c".into(), at(6, 0)),
            ],
            ..facts()
        };
        let table: Vec<(&str, Database, VerifyFacts, Option<&str>)> = vec![
            (
                "the scheduled time passed: verify",
                db(daily.clone(), None),
                facts(),
                Some("orders-verify-202505010300"),
            ),
            (
                "already triggered for that time",
                db(daily.clone(), after(at(3, 0))),
                facts(),
                None,
            ),
            (
                "no successful backup yet",
                db(daily.clone(), None),
                VerifyFacts {
                    succeeded: vec![],
                    ..facts()
                },
                None,
            ),
            (
                "not while the Database is not Ready",
                db(daily.clone(), None),
                VerifyFacts {
                    phase: Phase::Upgrading,
                    ..facts()
                },
                None,
            ),
            (
                "never two at once",
                db(daily, None),
                VerifyFacts {
                    jobs: vec![job("older", JobState::Running, None)],
                    ..facts()
                },
                None,
            ),
            (
                "every 2nd: two since the last trigger, the newest triggers",
                db(every2.clone(), after(at(3, 0))),
                two_more.clone(),
                Some("c-verify"),
            ),
            (
                "every 2nd: only one since the last trigger",
                db(every2.clone(), after(at(5, 0))),
                two_more,
                None,
            ),
            (
                "every backup",
                db(serde_json::json!({"everyNthBackup": 1}), None),
                facts(),
                Some("orders-202505010200-verify"),
            ),
        ];
        for (name, db, f, want) in table {
            let plan = plan_verification(&db, &f);
            assert_eq!(plan.create.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn a_trigger_is_recorded_and_not_repeated() {
        let d = db(serde_json::json!({"schedule": "0 3 * * *"}), None);
        let plan = plan_verification(&d, &facts());
        let status = plan.status.clone().unwrap();
        assert_eq!(status.job.as_deref(), Some("orders-verify-202505010300"));
        assert_eq!(status.last_trigger_time, Some(at(3, 0)));
        // The next pass sees the recorded trigger (and the Job): nothing new, nothing changed.
        let d = db(
            serde_json::json!({"schedule": "0 3 * * *"}),
            Some(status.clone()),
        );
        let f = VerifyFacts {
            jobs: vec![job("orders-verify-202505010300", JobState::Running, None)],
            ..facts()
        };
        let again = plan_verification(&d, &f);
        assert_eq!(again.create, None);
        assert_eq!(again.status, Some(status));
        assert_eq!(again.condition, None);
        // Next look: at the next scheduled time.
        assert_eq!(again.requeue_after, Some(Duration::from_secs(15 * 3600)));
    }

    #[test]
    fn outcomes_set_the_conditions() {
        let running = VerificationStatus {
            job: Some("j".into()),
            last_trigger_time: Some(at(3, 0)),
            ..Default::default()
        };
        let d = db(serde_json::json!({"schedule": "0 3 * * *"}), Some(running));
        let ok = plan_verification(
            &d,
            &VerifyFacts {
                jobs: vec![job("j", JobState::Succeeded, Some(OK))],
                ..facts()
            },
        );
        let c = ok.condition.unwrap();
        assert!(c.status && c.reason == "Verified", "{c:?}");
        assert!(c.message.contains("20250501T020003Z-b"), "{}", c.message);
        let s = ok.status.unwrap();
        assert_eq!(s.last_verified_time, Some(at(11, 59)));
        assert_eq!(s.recovery_time.as_deref(), Some("72.3s"));
        assert_eq!(ok.unhealthy, None);

        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let bad = plan_verification(
            &d,
            &VerifyFacts {
                jobs: vec![job("j", failed, Some(BAD))],
                ..facts()
            },
        );
        let c = bad.condition.unwrap();
        assert!(!c.status && c.reason == "VerificationFailed", "{c:?}");
        assert!(c.message.contains("manifest has 100 rows"), "{}", c.message);
        let h = bad.unhealthy.unwrap();
        assert_eq!((h.status, h.reason.as_str()), (false, "VerificationFailed"));
        assert_eq!(bad.status.unwrap().last_failure_time, Some(at(12, 0)));
    }

    #[test]
    fn without_verify_nothing_and_a_bad_schedule_is_a_condition() {
        let plain = with_backup(serde_json::json!({}));
        let plan = plan_verification(&plain, &facts());
        assert_eq!(
            (plan.create, plan.condition, plan.status),
            (None, None, None)
        );
        let d = db(serde_json::json!({"schedule": "0 0 31 2 *"}), None);
        let c = plan_verification(&d, &facts()).condition.unwrap();
        assert_eq!(c.reason, "InvalidVerifySpec");
        assert!(c.message.contains("verify.schedule"), "{}", c.message);
    }
}
