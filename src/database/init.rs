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

use super::facts::{Facts, InitJobFact, InitSourceFact};
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

/// A failed init Job whose SQL the spec has changed since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedInitJob {
    /// Its uid: the delete's precondition, so that a pass reading a cache that still holds it
    /// cannot delete the Job made in its place.
    pub uid: String,
    /// The ConfigMap of its inline SQL, when dbop made it.
    pub config_map: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InitDecision {
    pub(super) outcome: InitOutcome,
    pub(super) condition: ConditionStatus,
    pub(super) create_job: bool,
    /// The failed init Job to delete (with the ConfigMap of its SQL), so that the SQL as the
    /// spec has it now runs in a new one.
    pub(super) replace_job: Option<FailedInitJob>,
    /// Set when a restore of `spec.bootstrap.fromBackup` just succeeded.
    pub(super) restored: Option<BootstrapStatus>,
}

impl InitDecision {
    fn done(reason: &str, message: impl Into<String>) -> InitDecision {
        InitDecision {
            outcome: InitOutcome::Done,
            condition: ConditionStatus::new(Initialized, true, reason, message),
            create_job: false,
            replace_job: None,
            restored: None,
        }
    }

    fn pending(reason: &str, message: String, create_job: bool) -> InitDecision {
        InitDecision {
            outcome: InitOutcome::Pending,
            condition: ConditionStatus::new(Initialized, false, reason, message),
            create_job,
            replace_job: None,
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
            replace_job: None,
            restored: None,
        }
    }

    /// The init SQL changed since its Job failed: that Job goes, and a new one runs it.
    fn rerun(failed: FailedInitJob, names: &Names) -> InitDecision {
        InitDecision {
            replace_job: Some(failed),
            ..Self::pending(
                "Retrying",
                format!(
                    "the init SQL changed since init Job {} failed: running it again",
                    names.init_job()
                ),
                false,
            )
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
            replace_job: None,
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
        Some(job) => match changed_since(db, job, facts.init_sql.as_deref(), &names) {
            Some(failed) => InitDecision::rerun(failed, &names),
            None => init_from_job(&job.state, &names),
        },
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
                "init Job {} failed ({}): check its pod's logs and fix the SQL (spec.init): it runs again once it changed; to run it unchanged, delete the Job",
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
                replace_job: None,
                restored: None,
            }
        }
    }
}

/// The failed init Job, when the SQL the spec names now is not the one it ran, and the
/// Database is not older than the one the Job was made from (a pass reading a cache that is
/// behind). A Job made by a release before digests counts as changed: it runs once more.
fn changed_since(
    db: &Database,
    job: &InitJobFact,
    sql_now: Option<&str>,
    names: &Names,
) -> Option<FailedInitJob> {
    let JobState::Failed { .. } = job.state else {
        return None;
    };
    let sql_now = sql_now?;
    let newer_job = job.generation > Some(db.metadata.generation.unwrap_or_default());
    if newer_job || job.sql_digest.as_deref() == Some(sql_now) {
        return None;
    }
    Some(FailedInitJob {
        uid: job.uid.clone(),
        config_map: (job.config_map.clone()).filter(|name| names.is_init_sql_config_map(name)),
    })
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
    use crate::objects::JobState;

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

    #[test]
    fn a_failed_init_runs_again_once_its_sql_changed() {
        let names = Names::new("orders");
        let mut db = crate::resources::testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"}, "init": {"sql": "SELEC 1"}
        }));
        db.metadata.generation = Some(2);
        let failed = InitJobFact {
            state: JobState::Failed {
                reason: "BackoffLimitExceeded".into(),
                detail: String::new(),
            },
            uid: "uid-1".into(),
            sql_digest: Some("aaaa".into()),
            generation: Some(1),
            config_map: Some("orders-init-sql-00000000aa".into()),
        };
        let rerun = |job: &InitJobFact, now: Option<&str>| changed_since(&db, job, now, &names);
        // The spec's SQL is the one that failed: nothing to run again (nor while unread).
        assert_eq!(rerun(&failed, Some("aaaa")), None);
        assert_eq!(rerun(&failed, None), None);
        // Changed: the Job goes (its uid the precondition), with the ConfigMap dbop made.
        assert_eq!(
            rerun(&failed, Some("bbbb")),
            Some(FailedInitJob {
                uid: "uid-1".into(),
                config_map: Some("orders-init-sql-00000000aa".into()),
            })
        );
        // A user's ConfigMap is the user's: never deleted.
        let users = InitJobFact {
            config_map: Some("schema".into()),
            ..failed.clone()
        };
        assert_eq!(rerun(&users, Some("bbbb")).unwrap().config_map, None);
        // A pass reading a Database older than the Job's leaves the Job alone.
        let newer = InitJobFact {
            generation: Some(3),
            ..failed.clone()
        };
        assert_eq!(rerun(&newer, Some("bbbb")), None);
        // A Job made before digests runs once more; a running one is never replaced.
        let legacy = InitJobFact {
            sql_digest: None,
            generation: None,
            ..failed.clone()
        };
        assert!(rerun(&legacy, Some("bbbb")).is_some());
        let running = InitJobFact {
            state: JobState::Running,
            ..failed.clone()
        };
        assert_eq!(rerun(&running, Some("bbbb")), None);

        let facts = Facts {
            init_job: Some(failed.clone()),
            init_sql: Some("bbbb".into()),
            ..Facts::nothing_made_yet()
        };
        let d = decide_init(&db, &facts, true);
        assert_eq!(d.outcome, InitOutcome::Pending);
        assert_eq!(d.condition.reason, "Retrying");
        assert!(!d.create_job, "the failed Job goes first");
        assert_eq!(d.replace_job.map(|f| f.uid).as_deref(), Some("uid-1"));
    }
}
