//! The init SQL's decision: whether `spec.init` ran, runs, must wait for the server, or cannot
//! run (its ConfigMap is missing), and the `Initialized` condition that says so. A restore of
//! `spec.bootstrap.fromBackup` takes its place (`restore`), and a volume kept from an earlier
//! Database is never initialised again.
//!
//! Pure: the Database, the facts and whether the server has run in.

use crate::api::conditions::{self, ConditionStatus, ConditionType::Initialized};
use crate::api::{BootstrapStatus, Database};
use crate::objects::JobState;
use crate::resources::Names;

use super::facts::{Facts, InitSourceFact};
use super::restore::{self, RestoreDecision, RestoreOutcome};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum InitOutcome {
    /// Nothing left to run (ran, or no init SQL).
    Done,
    /// Waiting for the server, or the Job is running.
    Pending,
    /// The init SQL's ConfigMap is missing: the user must act.
    Blocked {
        reason: &'static str,
        message: String,
    },
    /// The Job failed for good; `reason` is the `Ready` condition's.
    Failed {
        reason: &'static str,
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InitDecision {
    pub(super) outcome: InitOutcome,
    pub(super) condition: ConditionStatus,
    pub(super) create_job: bool,
    /// Set when a restore of `spec.bootstrap.fromBackup` just succeeded.
    pub(super) restored: Option<BootstrapStatus>,
}

impl InitDecision {
    fn done(reason: &str, message: impl Into<String>) -> InitDecision {
        InitDecision {
            outcome: InitOutcome::Done,
            condition: ConditionStatus::new(Initialized, true, reason, message),
            create_job: false,
            restored: None,
        }
    }

    fn pending(reason: &str, message: String, create_job: bool) -> InitDecision {
        InitDecision {
            outcome: InitOutcome::Pending,
            condition: ConditionStatus::new(Initialized, false, reason, message),
            create_job,
            restored: None,
        }
    }

    fn waiting_for_server() -> InitDecision {
        Self::pending(
            "WaitingForServer",
            "waiting for the server to start".into(),
            false,
        )
    }

    fn blocked(reason: &'static str, message: String) -> InitDecision {
        InitDecision {
            outcome: InitOutcome::Blocked {
                reason,
                message: message.clone(),
            },
            condition: ConditionStatus::new(Initialized, false, reason, message),
            create_job: false,
            restored: None,
        }
    }

    /// The restore of `spec.bootstrap.fromBackup`, in the init's place.
    fn restore(d: RestoreDecision) -> InitDecision {
        InitDecision {
            outcome: match d.outcome {
                RestoreOutcome::Done => InitOutcome::Done,
                RestoreOutcome::Pending => InitOutcome::Pending,
                RestoreOutcome::Blocked { reason, message } => {
                    InitOutcome::Blocked { reason, message }
                }
                RestoreOutcome::Failed { message } => InitOutcome::Failed {
                    reason: "RestoreFailed",
                    message,
                },
            },
            condition: d.condition,
            create_job: d.create_job,
            restored: d.status,
        }
    }
}

/// The init SQL: whether it ran, runs, must wait, or cannot run.
pub(super) fn decide_init(db: &Database, facts: &Facts, server_up: bool) -> InitDecision {
    let previous = db
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, Initialized))
        .filter(|c| c.status == "True");
    if let Some(c) = previous {
        return InitDecision::done(&c.reason, c.message.clone());
    }
    if let Some(fact) = &facts.bootstrap {
        let predates = facts.volume.as_ref().is_some_and(|v| v.predates_database);
        return InitDecision::restore(restore::decide_restore(db, fact, server_up, predates));
    }
    if db.spec.init.is_none() {
        return if server_up {
            InitDecision::done("NoInitSql", "no init SQL to run")
        } else {
            InitDecision::waiting_for_server()
        };
    }
    if facts.volume.as_ref().is_some_and(|v| v.predates_database) && facts.init_job.is_none() {
        return InitDecision::done(
            "ExistingData",
            "the data volume predates this Database (kept by an earlier one with deletionPolicy Retain): the init SQL is not run on existing data",
        );
    }
    let names = Names::of(db);
    match &facts.init_job {
        Some(job) => init_from_job(job, &names),
        None if !server_up => InitDecision::waiting_for_server(),
        None => init_from_source(&facts.init_source, &names),
    }
}

/// The init Job exists: its state is the init's.
fn init_from_job(job: &JobState, names: &Names) -> InitDecision {
    match job {
        JobState::Succeeded => InitDecision::done("Completed", "the init SQL ran successfully"),
        JobState::Running => InitDecision::pending(
            "Running",
            format!("init Job {} is running the init SQL", names.init_job()),
            false,
        ),
        JobState::Failed { reason, detail } => {
            let message = format!(
                "init Job {} failed ({}): check its pod's logs, fix the SQL, then delete the Job to run it again",
                names.init_job(),
                JobState::failure_text(reason, detail)
            );
            InitDecision {
                outcome: InitOutcome::Failed {
                    reason: "InitFailed",
                    message: message.clone(),
                },
                condition: ConditionStatus::new(Initialized, false, "Failed", message),
                create_job: false,
                restored: None,
            }
        }
    }
}

/// No Job yet and the server is up: start it, unless its SQL's source is missing.
fn init_from_source(source: &InitSourceFact, names: &Names) -> InitDecision {
    match source {
        InitSourceFact::Available => InitDecision::pending(
            "Running",
            format!("starting init Job {}", names.init_job()),
            true,
        ),
        InitSourceFact::ConfigMapNotFound { name } => InitDecision::blocked(
            "InitConfigMapNotFound",
            format!(
                "ConfigMap {name} (spec.init.configMapRef) does not exist: create it with the init SQL"
            ),
        ),
        InitSourceFact::KeyNotFound { name, key } => InitDecision::blocked(
            "InitConfigMapKeyNotFound",
            format!("ConfigMap {name} has no key {key:?} (spec.init.configMapRef.key): add it"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_steps_table() {
        let names = Names::new("orders");
        let source = [
            (InitSourceFact::Available, "Running", true),
            (
                InitSourceFact::ConfigMapNotFound { name: "s".into() },
                "InitConfigMapNotFound",
                false,
            ),
            (
                InitSourceFact::KeyNotFound {
                    name: "s".into(),
                    key: "k".into(),
                },
                "InitConfigMapKeyNotFound",
                false,
            ),
        ];
        for (fact, reason, create) in source {
            let d = init_from_source(&fact, &names);
            assert_eq!(
                (d.condition.reason.as_str(), d.create_job),
                (reason, create)
            );
            let blocked = matches!(d.outcome, InitOutcome::Blocked { .. });
            assert_eq!(blocked, !create, "{fact:?}");
        }
        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "limit".into(),
        };
        let job = [
            (JobState::Succeeded, "Completed", true),
            (JobState::Running, "Running", false),
            (failed, "Failed", false),
        ];
        for (state, reason, status) in job {
            let d = init_from_job(&state, &names);
            assert_eq!(
                (d.condition.reason.as_str(), d.condition.status),
                (reason, status)
            );
            assert!(!d.create_job);
        }
        let d = init_from_job(
            &JobState::Failed {
                reason: "BackoffLimitExceeded".into(),
                detail: "limit".into(),
            },
            &names,
        );
        assert!(
            d.condition
                .message
                .contains("(BackoffLimitExceeded: limit)"),
            "{}",
            d.condition.message
        );
    }
}
