//! The deletion policy, decided: what the finalizer keeps, deletes and waits for when a
//! Database is deleted, and what its status and Events say meanwhile.
//!
//! Pure: the policy and the observed facts (the final backup, `now`) in, a plan out; the
//! finalizer's I/O is in `cleanup`.
//!
//! | policy | data claims | generated Secret | `DatabaseBackup`s | dumps in S3 |
//! |---|---|---|---|---|
//! | `Retain` | kept | kept (released) | kept (released) | kept |
//! | `Delete` | deleted | deleted | deleted with the Database | kept |
//! | `Snapshot` | deleted once the final backup succeeded, else kept | deleted | kept (released), the final one too | kept |
//!
//! `Snapshot` never deletes a claim without a succeeded final backup of this Database: a final
//! backup that fails or does not finish within `spec.backup.timeout` holds the deletion (the
//! claims stay, the status says why and how to go on) until the user retries it or changes the
//! policy. A Database that never started has nothing to back up: its claims are kept.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{BackupPhase, DeletionPolicy};
use crate::objects::EventSpec;

/// The word that marks a final backup in its `DatabaseBackup` name.
const FINAL_SUFFIX: &str = "final";
/// A final backup in progress is woken by its watch; this is a safety net (and the clock that
/// notices the bound).
pub const REQUEUE_FINAL_BACKUP: Duration = Duration::from_secs(15);

/// The name of the final backup of one Database incarnation: the uid's first 8 characters
/// tell a Database deleted, re-created and deleted again from its predecessor.
pub fn final_backup_name(database: &str, uid: &str) -> String {
    let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    format!("{database}-{FINAL_SUFFIX}-{short}")
}

/// The final backup as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalBackupFact {
    pub name: String,
    pub created: DateTime<Utc>,
    pub phase: Option<BackupPhase>,
    pub message: Option<String>,
}

/// What the deletion decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletionFacts {
    pub now: DateTime<Utc>,
    pub policy: DeletionPolicy,
    /// The server has run once (`status.currentVersion`): there is data to back up.
    pub has_run: bool,
    /// How long the final backup may take (`spec.backup.timeout`), or why `spec.backup`
    /// cannot make one (absent, or a value that does not parse).
    pub backup_bound: Result<Duration, String>,
    /// The name the final backup has (or will have).
    pub final_name: String,
    /// The final backup, when it exists.
    pub final_backup: Option<FinalBackupFact>,
}

/// What the finalizer does with what the Database leaves behind, once it may finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub delete_claims: bool,
    /// Remove the owner reference of the generated credentials Secret (it outlives the Database).
    pub release_secret: bool,
    /// Remove the owner references of the Database's `DatabaseBackup`s (they outlive it).
    pub release_backups: bool,
    /// The Event that closes the deletion.
    pub event: EventSpec,
}

/// The next step of a deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Apply the policy and let the Database go.
    Finish(Finish),
    /// Create the final backup if it does not exist yet, and wait for it.
    AwaitFinalBackup { create: bool },
    /// The final backup failed or took too long: keep everything and wait for the user.
    Hold,
}

/// The deletion decision: the step and the `Ready` condition that says where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletionPlan {
    pub step: Step,
    pub ready: ConditionStatus,
    pub requeue_after: Option<Duration>,
}

/// Decides the next step of a deletion.
pub fn decide_deletion(facts: &DeletionFacts) -> DeletionPlan {
    match facts.policy {
        DeletionPolicy::Retain => finish(facts, retain("deletionPolicy Retain")),
        DeletionPolicy::Delete => finish(facts, delete()),
        DeletionPolicy::Snapshot => snapshot(facts),
    }
}

fn retain(why: &str) -> Finish {
    Finish {
        delete_claims: false,
        release_secret: true,
        release_backups: true,
        event: EventSpec {
            warning: false,
            reason: "CleanedUp".into(),
            note: format!(
                "{why}: the data volumes, the credentials Secret and the DatabaseBackups are kept"
            ),
        },
    }
}

fn delete() -> Finish {
    Finish {
        delete_claims: true,
        release_secret: false,
        release_backups: false,
        event: EventSpec {
            warning: false,
            reason: "CleanedUp".into(),
            note: "deletionPolicy Delete: the data volumes and the DatabaseBackups are being \
                   deleted (the dumps stay in object storage)"
                .into(),
        },
    }
}

fn finish(facts: &DeletionFacts, finish: Finish) -> DeletionPlan {
    DeletionPlan {
        ready: ConditionStatus::new(
            ConditionType::Ready,
            false,
            "Deleting",
            format!("deleting with deletionPolicy {:?}", facts.policy),
        ),
        step: Step::Finish(finish),
        requeue_after: None,
    }
}

/// `Snapshot`: the final backup first; the claims go only once it succeeded.
fn snapshot(facts: &DeletionFacts) -> DeletionPlan {
    if !facts.has_run {
        let why = "deletionPolicy Snapshot, but the database never started so there is no \
                   final backup to make";
        return finish(facts, retain(why));
    }
    let bound = match &facts.backup_bound {
        Ok(bound) => *bound,
        Err(problem) => {
            return hold(
                facts,
                "FinalBackupImpossible",
                format!("no final backup can be made: {problem}"),
            );
        }
    };
    let Some(backup) = &facts.final_backup else {
        return waiting(facts, true, "creating it".into());
    };
    // A timeout past the end of the calendar never expires (and must not overflow).
    let deadline = chrono::TimeDelta::from_std(bound)
        .ok()
        .and_then(|bound| backup.created.checked_add_signed(bound))
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    match backup.phase {
        Some(BackupPhase::Succeeded) => finish(
            facts,
            Finish {
                delete_claims: true,
                release_secret: false,
                release_backups: true,
                event: EventSpec {
                    warning: false,
                    reason: "FinalBackupSucceeded".into(),
                    note: format!(
                        "deletionPolicy Snapshot: final backup {} succeeded; the data volumes \
                         are being deleted, the DatabaseBackups are kept",
                        backup.name
                    ),
                },
            },
        ),
        Some(BackupPhase::Failed) => hold(
            facts,
            "FinalBackupFailed",
            format!(
                "final backup {} failed: {}",
                backup.name,
                backup.message.as_deref().unwrap_or("no message")
            ),
        ),
        Some(BackupPhase::Pending | BackupPhase::Running) | None if facts.now >= deadline => hold(
            facts,
            "FinalBackupTimedOut",
            format!(
                "final backup {} did not finish within spec.backup.timeout ({}s; it is {})",
                backup.name,
                bound.as_secs(),
                backup.message.as_deref().unwrap_or("not started")
            ),
        ),
        Some(BackupPhase::Pending | BackupPhase::Running) | None => {
            // An absolute deadline, not a countdown: the status changes only when the backup's does.
            let state = backup.message.as_deref().unwrap_or("not started yet");
            let until = deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            waiting(
                facts,
                false,
                format!("{state}; waiting until {until} at most"),
            )
        }
    }
}

fn waiting(facts: &DeletionFacts, create: bool, state: String) -> DeletionPlan {
    DeletionPlan {
        step: Step::AwaitFinalBackup { create },
        ready: ConditionStatus::new(
            ConditionType::Ready,
            false,
            "FinalBackupRunning",
            format!(
                "deletionPolicy Snapshot: waiting for the final backup {} ({state}); the data \
                 volumes are deleted once it succeeds",
                facts.final_name
            ),
        ),
        requeue_after: Some(REQUEUE_FINAL_BACKUP),
    }
}

fn hold(facts: &DeletionFacts, reason: &str, what: String) -> DeletionPlan {
    DeletionPlan {
        step: Step::Hold,
        ready: ConditionStatus::new(
            ConditionType::Ready,
            false,
            reason,
            format!(
                "{what}. The data volumes are kept and the Database stays until you decide: \
                 fix the cause and delete DatabaseBackup {} to try again, or set \
                 spec.deletionPolicy to Retain (keep the volumes) or Delete (discard them)",
                facts.final_name
            ),
        ),
        // The user acts by editing the Database or deleting the backup: both wake it.
        requeue_after: None,
    }
}

/// The Events of a deletion step, from the previous `Ready` reason: one when the final backup
/// starts and one when the deletion is held, each once.
pub fn deletion_events(previous_reason: Option<&str>, plan: &DeletionPlan) -> Vec<EventSpec> {
    if previous_reason == Some(plan.ready.reason.as_str()) {
        return vec![];
    }
    match &plan.step {
        Step::AwaitFinalBackup { .. } => vec![EventSpec {
            warning: false,
            reason: "FinalBackupStarted".into(),
            note: plan.ready.message.clone(),
        }],
        Step::Hold => vec![EventSpec {
            warning: true,
            reason: plan.ready.reason.clone(),
            note: plan.ready.message.clone(),
        }],
        Step::Finish(_) => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 0).unwrap()
    }

    fn facts(policy: DeletionPolicy) -> DeletionFacts {
        DeletionFacts {
            now: now(),
            policy,
            has_run: true,
            backup_bound: Ok(Duration::from_secs(600)),
            final_name: "orders-final-0123abcd".into(),
            final_backup: None,
        }
    }

    fn backup(phase: Option<BackupPhase>, age_secs: i64) -> Option<FinalBackupFact> {
        Some(FinalBackupFact {
            name: "orders-final-0123abcd".into(),
            created: now() - chrono::TimeDelta::seconds(age_secs),
            phase,
            message: Some("backup Job orders-final-0123abcd is running".into()),
        })
    }

    /// What a plan does, in a few words, for the table.
    fn summary(plan: &DeletionPlan) -> String {
        match &plan.step {
            Step::Finish(f) => format!(
                "finish delete_claims={} release_secret={} release_backups={}",
                f.delete_claims, f.release_secret, f.release_backups
            ),
            Step::AwaitFinalBackup { create } => format!("await create={create}"),
            Step::Hold => format!("hold {}", plan.ready.reason),
        }
    }

    #[test]
    fn deletion_table() {
        use BackupPhase::*;
        use DeletionPolicy::*;
        let with = |policy, f: fn(&mut DeletionFacts)| {
            let mut x = facts(policy);
            f(&mut x);
            x
        };
        let table: Vec<(&str, DeletionFacts, &str)> = vec![
            (
                "Retain keeps and releases everything",
                facts(Retain),
                "finish delete_claims=false release_secret=true release_backups=true",
            ),
            (
                "Delete deletes the claims; the backups go with the Database",
                facts(Delete),
                "finish delete_claims=true release_secret=false release_backups=false",
            ),
            (
                "Delete of a Database that never ran",
                with(Delete, |f| f.has_run = false),
                "finish delete_claims=true release_secret=false release_backups=false",
            ),
            (
                "Snapshot starts with the final backup",
                facts(Snapshot),
                "await create=true",
            ),
            (
                "Snapshot waits for a pending final backup",
                with(Snapshot, |f| f.final_backup = backup(Some(Pending), 30)),
                "await create=false",
            ),
            (
                "Snapshot waits for a final backup nobody has looked at yet",
                with(Snapshot, |f| f.final_backup = backup(None, 1)),
                "await create=false",
            ),
            (
                "Snapshot waits for a running final backup",
                with(Snapshot, |f| f.final_backup = backup(Some(Running), 599)),
                "await create=false",
            ),
            (
                "Snapshot deletes the claims after a succeeded final backup",
                with(Snapshot, |f| f.final_backup = backup(Some(Succeeded), 60)),
                "finish delete_claims=true release_secret=false release_backups=true",
            ),
            (
                "a succeeded final backup counts even after the bound",
                with(Snapshot, |f| f.final_backup = backup(Some(Succeeded), 9999)),
                "finish delete_claims=true release_secret=false release_backups=true",
            ),
            (
                "Snapshot holds on a failed final backup",
                with(Snapshot, |f| f.final_backup = backup(Some(Failed), 60)),
                "hold FinalBackupFailed",
            ),
            (
                "Snapshot holds when the final backup takes too long",
                with(Snapshot, |f| f.final_backup = backup(Some(Running), 600)),
                "hold FinalBackupTimedOut",
            ),
            (
                "Snapshot holds when the final backup cannot start before the bound",
                with(Snapshot, |f| f.final_backup = backup(Some(Pending), 601)),
                "hold FinalBackupTimedOut",
            ),
            (
                "Snapshot without a usable spec.backup holds",
                with(Snapshot, |f| {
                    f.backup_bound = Err("spec.backup is not set".into())
                }),
                "hold FinalBackupImpossible",
            ),
            (
                "Snapshot of a Database that never started keeps the claims",
                with(Snapshot, |f| f.has_run = false),
                "finish delete_claims=false release_secret=true release_backups=true",
            ),
        ];
        for (name, f, want) in table {
            assert_eq!(summary(&decide_deletion(&f)), want, "{name}");
        }
    }

    #[test]
    fn a_held_deletion_says_what_failed_and_how_to_go_on() {
        let mut f = facts(DeletionPolicy::Snapshot);
        f.final_backup = backup(Some(BackupPhase::Failed), 60);
        f.final_backup.as_mut().unwrap().message = Some("S3 access denied".into());
        let plan = decide_deletion(&f);
        let m = &plan.ready.message;
        assert!(m.contains("S3 access denied"), "{m}");
        assert!(m.contains("The data volumes are kept"), "{m}");
        assert!(
            m.contains("delete DatabaseBackup orders-final-0123abcd"),
            "{m}"
        );
        assert!(m.contains("Retain") && m.contains("Delete"), "{m}");
        assert!(!plan.ready.status);
    }

    #[test]
    fn waiting_says_the_same_thing_on_every_pass() {
        // A countdown in the message would rewrite the status on every requeue.
        let mut f = facts(DeletionPolicy::Snapshot);
        f.final_backup = backup(Some(BackupPhase::Running), 30);
        let first = decide_deletion(&f);
        f.now += chrono::TimeDelta::seconds(15);
        let later = decide_deletion(&f);
        assert_eq!(first, later);
        assert!(
            first.ready.message.contains("2025-05-01T02:09:30Z"),
            "{}",
            first.ready.message
        );
    }

    #[test]
    fn events_once_per_transition() {
        let mut f = facts(DeletionPolicy::Snapshot);
        let start = decide_deletion(&f);
        let reasons = |prev: Option<&str>, plan: &DeletionPlan| {
            deletion_events(prev, plan)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            reasons(Some("DatabaseReady"), &start),
            vec![(false, "FinalBackupStarted".to_string())]
        );
        assert!(reasons(Some("FinalBackupRunning"), &start).is_empty());
        f.final_backup = backup(Some(BackupPhase::Failed), 60);
        let held = decide_deletion(&f);
        assert_eq!(
            reasons(Some("FinalBackupRunning"), &held),
            vec![(true, "FinalBackupFailed".to_string())]
        );
        assert!(reasons(Some("FinalBackupFailed"), &held).is_empty());
    }

    #[test]
    fn a_final_backup_timeout_past_the_calendar_waits_instead_of_overflowing() {
        let mut f = facts(DeletionPolicy::Snapshot);
        f.backup_bound = Ok(Duration::from_secs(u64::MAX / 2));
        f.final_backup = backup(Some(BackupPhase::Running), 30);
        let plan = decide_deletion(&f);
        assert_eq!(summary(&plan), "await create=false");
    }

    #[test]
    fn final_backup_names_differ_per_incarnation() {
        let a = final_backup_name("orders", "0123abcd-ef01-2345-6789-abcdef012345");
        assert_eq!(a, "orders-final-0123abcd");
        assert_ne!(
            a,
            final_backup_name("orders", "99999999-ef01-2345-6789-abcdef012345")
        );
        // The longest Database name (40) still gives a Job name that fits (63).
        assert!(final_backup_name(&"a".repeat(40), "0123abcd").len() <= 63);
    }
}
