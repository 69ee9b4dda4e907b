//! Decide: from the Database and the observed facts, the next phase, the conditions and the
//! steps to take. This is where every phase transition is decided.
//!
//! Pure: no client, no clock (time is not needed yet; scheduled work will take `now`), no I/O.

use std::time::Duration;

use crate::api::Database;
use crate::api::Phase;
use crate::api::conditions::{self, ConditionStatus, ConditionType};
use crate::resources::credentials::{SecretProblem, secret_name};
use crate::resources::{Names, SUPPORTED_MAJORS, Settings, VersionProblem, check_version, image};

use crate::backup::plan::{BackupPlan, plan_backups};

use super::observe::{CredentialsFact, Facts, InitSourceFact, JobFact, StatefulSetFact};
use super::quantity;

/// What to do to the world. Every step is idempotent; `act` skips writes that change nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Create the generated credentials Secret (it does not exist).
    pub create_secret: bool,
    /// Put our owner reference on a retained generated Secret.
    pub adopt_secret: bool,
    /// Apply the headless and read-write Services.
    pub apply_services: bool,
    /// Apply the StatefulSet.
    pub apply_statefulset: bool,
    /// Grow the data claims to this size.
    pub expand_volumes: Option<String>,
    /// Create the init Job.
    pub create_init_job: bool,
}

/// The outcome of `decide`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub phase: Phase,
    /// One entry for each condition this controller owns.
    pub conditions: Vec<ConditionStatus>,
    pub steps: Steps,
    /// The version every instance runs, once known.
    pub current_version: Option<String>,
    /// When to look again if nothing else happens first.
    pub requeue_after: Duration,
    /// Scheduled backups, history and `BackupHealthy` (None while the Database is blocked:
    /// then backups are left as they are).
    pub backup: Option<BackupPlan>,
}

impl Decision {
    /// Replaces the decided condition of the same type: what act learned while acting (a
    /// refused volume expansion) overrides what decide expected.
    pub fn override_condition(&mut self, condition: ConditionStatus) {
        self.conditions.retain(|c| c.type_ != condition.type_);
        self.conditions.push(condition);
    }
}

/// Nothing is watched that would wake us (a user's Secret or ConfigMap): look again soon.
pub const REQUEUE_WAITING_ON_USER: Duration = Duration::from_secs(30);
/// Something we watch is moving: its events wake us; this is only a safety net.
pub const REQUEUE_IN_PROGRESS: Duration = Duration::from_secs(60);
/// Steady state: an occasional look, which writes nothing when nothing drifted.
pub const REQUEUE_STEADY: Duration = Duration::from_secs(300);
/// Only a spec change helps, and a spec change wakes us anyway.
pub const REQUEUE_FAILED: Duration = Duration::from_secs(3600);

use ConditionType::{Initialized, Ready, StorageReady, Upgrading};

/// Decides the next step of a Database that is not being deleted.
pub fn decide(db: &Database, facts: &Facts, settings: &Settings) -> Decision {
    let names = Names::of(db);
    let previous = db.status.clone().unwrap_or_default();
    let current_version = previous.current_version.clone();
    let was_ready_once = current_version.is_some();

    // A version dbop cannot run: stop before touching anything that runs.
    if let Err(problem) = check_version(&db.spec.version) {
        let message = match problem {
            VersionProblem::Malformed => format!(
                "version {:?} is not of the form MAJOR.MINOR",
                db.spec.version
            ),
            VersionProblem::UnsupportedMajor(major) => format!(
                "PostgreSQL {major} is not supported: use a version with a major of {} to {}",
                SUPPORTED_MAJORS.start(),
                SUPPORTED_MAJORS.end()
            ),
        };
        return blocked(
            Phase::Failed,
            "UnsupportedVersion",
            message,
            current_version,
            REQUEUE_FAILED,
        );
    }

    // Credentials: the server cannot start without them.
    let mut steps = Steps::default();
    match &facts.credentials {
        CredentialsFact::Usable => {}
        CredentialsFact::GeneratedMissing => steps.create_secret = true,
        CredentialsFact::GeneratedOrphaned => steps.adopt_secret = true,
        CredentialsFact::UserSecretProblem(problem) => {
            let secret = secret_name(db);
            let (reason, message) = match problem {
                SecretProblem::NotFound => (
                    "CredentialsSecretNotFound",
                    format!(
                        "Secret {secret} (spec.credentials.secretName) does not exist: create it with a \
                         `password` key (and optionally `username`)"
                    ),
                ),
                SecretProblem::MissingPassword => (
                    "CredentialsSecretInvalid",
                    format!("Secret {secret} has no non-empty `password` key: add one"),
                ),
            };
            return blocked(
                Phase::Pending,
                reason,
                message,
                current_version,
                REQUEUE_WAITING_ON_USER,
            );
        }
    }
    steps.apply_services = true;
    steps.apply_statefulset = true;

    let storage = storage_condition(db, facts);
    if let Some(size) = volume_to_expand(db, facts) {
        steps.expand_volumes = Some(size);
    }

    let desired_image = image(db, settings);
    let sts = facts.statefulset.as_ref();
    let serving = sts.is_some_and(|s| s.ready_replicas >= db.spec.replicas);
    let rolled_out = sts.is_some_and(|s| is_rolled_out(s, &desired_image));
    let settled = serving && rolled_out;
    let new_version = settled
        .then(|| db.spec.version.clone())
        .or(current_version.clone());
    let version_changed =
        was_ready_once && current_version.as_deref() != Some(db.spec.version.as_str());
    // Once it has served, any rollout (a new version, new resources, a hand edit being undone)
    // is an upgrade of the running database, not a first provisioning.
    let upgrading = version_changed || (was_ready_once && sts.is_some() && !rolled_out);

    // Init runs once, after the first time the server is serving on the desired spec.
    let already_initialized = db
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, Initialized));
    let init = decide_init(
        db,
        facts,
        settled || already_initialized || was_ready_once,
        &names,
    );
    steps.create_init_job = init.create_job;

    let rollout_message = if version_changed {
        format!(
            "rolling out version {} (from {})",
            db.spec.version,
            current_version.as_deref().unwrap_or("?")
        )
    } else {
        "rolling out a change of the pod template".to_string()
    };
    let upgrading_condition = if upgrading && !settled {
        ConditionStatus::new(Upgrading, true, "RollingOut", rollout_message.clone())
    } else {
        ConditionStatus::new(
            Upgrading,
            false,
            "NoUpgrade",
            "running the requested version",
        )
    };

    let endpoint = format!(
        "{}:{}",
        names.endpoint(&db.namespace_or_default()),
        crate::resources::POSTGRES_PORT
    );
    let (phase, ready, requeue_after) = match (&init.outcome, serving, settled) {
        (InitOutcome::Blocked { reason, message }, _, _) => (
            Phase::Pending,
            ConditionStatus::new(Ready, false, reason, message.clone()),
            REQUEUE_WAITING_ON_USER,
        ),
        (InitOutcome::Failed { message }, _, _) => (
            Phase::Failed,
            ConditionStatus::new(Ready, false, "InitFailed", message.clone()),
            REQUEUE_FAILED,
        ),
        (_, _, false) if upgrading => (
            Phase::Upgrading,
            ConditionStatus::new(Ready, false, "RollingOut", rollout_message.clone()),
            REQUEUE_IN_PROGRESS,
        ),
        (_, false, _) if was_ready_once => (
            Phase::Degraded,
            ConditionStatus::new(Ready, false, "NotServing", degraded_message(db, sts)),
            REQUEUE_IN_PROGRESS,
        ),
        (_, false, _) | (_, true, false) => (
            Phase::Provisioning,
            ConditionStatus::new(
                Ready,
                false,
                "Provisioning",
                provisioning_message(&names, sts),
            ),
            REQUEUE_IN_PROGRESS,
        ),
        (InitOutcome::Pending, true, true) => (
            Phase::Initializing,
            ConditionStatus::new(
                Ready,
                false,
                "Initializing",
                format!("init Job {} is running the init SQL", names.init_job()),
            ),
            REQUEUE_IN_PROGRESS,
        ),
        (InitOutcome::Done, true, true) => (
            Phase::Ready,
            ConditionStatus::new(
                Ready,
                true,
                "DatabaseReady",
                format!("accepting connections at {endpoint}"),
            ),
            REQUEUE_STEADY,
        ),
    };

    // Backups: the due run, the history and BackupHealthy; a run waits while the phase says
    // the database is being rolled out.
    let backup = plan_backups(db, &facts.backups, phase);
    let requeue_after = backup
        .requeue_after
        .map_or(requeue_after, |b| b.min(requeue_after));
    Decision {
        phase,
        conditions: vec![
            ready,
            storage,
            init.condition,
            upgrading_condition,
            backup.condition.clone(),
        ],
        steps,
        current_version: new_version,
        requeue_after,
        backup: Some(backup),
    }
}

/// A Database that cannot proceed: only the Ready condition speaks, nothing is written.
fn blocked(
    phase: Phase,
    reason: &str,
    message: String,
    current_version: Option<String>,
    requeue_after: Duration,
) -> Decision {
    Decision {
        phase,
        conditions: vec![ConditionStatus::new(Ready, false, reason, message)],
        steps: Steps::default(),
        current_version,
        requeue_after,
        backup: None,
    }
}

fn is_rolled_out(sts: &StatefulSetFact, desired_image: &str) -> bool {
    sts.rolled_out && sts.image.as_deref() == Some(desired_image)
}

fn provisioning_message(names: &Names, sts: Option<&StatefulSetFact>) -> String {
    match sts {
        None => format!("creating StatefulSet {}", names.statefulset()),
        Some(s) => format!(
            "waiting for StatefulSet {}: {}/{} ready, {} updated",
            names.statefulset(),
            s.ready_replicas,
            s.replicas,
            s.updated_replicas
        ),
    }
}

fn degraded_message(db: &Database, sts: Option<&StatefulSetFact>) -> String {
    match sts {
        None => format!("StatefulSet {} is missing; recreating it", db.name()),
        Some(s) => format!(
            "{}/{} instances ready; see the pods' events and logs",
            s.ready_replicas, db.spec.replicas
        ),
    }
}

enum InitOutcome {
    /// Nothing left to run (ran, or no init SQL).
    Done,
    /// Waiting for the server, or the Job is running.
    Pending,
    /// The init SQL's ConfigMap is missing: the user must act.
    Blocked {
        reason: &'static str,
        message: String,
    },
    /// The Job failed for good.
    Failed { message: String },
}

struct InitDecision {
    outcome: InitOutcome,
    condition: ConditionStatus,
    create_job: bool,
}

fn decide_init(db: &Database, facts: &Facts, server_up: bool, names: &Names) -> InitDecision {
    let already = db
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, Initialized));
    let done = |reason: &str, message: &str| InitDecision {
        outcome: InitOutcome::Done,
        condition: ConditionStatus::new(Initialized, true, reason, message),
        create_job: false,
    };
    let pending = |reason: &str, message: String, create_job: bool| InitDecision {
        outcome: InitOutcome::Pending,
        condition: ConditionStatus::new(Initialized, false, reason, message),
        create_job,
    };
    if already {
        let previous = db
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, Initialized))
            .map(|c| (c.reason.clone(), c.message.clone()))
            .unwrap_or_default();
        return InitDecision {
            outcome: InitOutcome::Done,
            condition: ConditionStatus::new(Initialized, true, &previous.0, previous.1),
            create_job: false,
        };
    }
    if db.spec.init.is_none() {
        return if server_up {
            done("NoInitSql", "no init SQL to run")
        } else {
            pending(
                "WaitingForServer",
                "waiting for the server to start".into(),
                false,
            )
        };
    }
    if facts.volume.as_ref().is_some_and(|v| v.predates_database) && facts.init_job.is_none() {
        return done(
            "ExistingData",
            "the data volume predates this Database (kept by an earlier one with deletionPolicy Retain): the init SQL is not run on existing data",
        );
    }
    match &facts.init_job {
        Some(JobFact::Succeeded) => done("Completed", "the init SQL ran successfully"),
        Some(JobFact::Running) => pending(
            "Running",
            format!("init Job {} is running the init SQL", names.init_job()),
            false,
        ),
        Some(JobFact::Failed { message }) => {
            let message = format!(
                "init Job {} failed ({message}): check its pod's logs, fix the SQL, then delete the Job to run it again",
                names.init_job()
            );
            InitDecision {
                outcome: InitOutcome::Failed {
                    message: message.clone(),
                },
                condition: ConditionStatus::new(Initialized, false, "Failed", message),
                create_job: false,
            }
        }
        None if !server_up => pending(
            "WaitingForServer",
            "waiting for the server to start".into(),
            false,
        ),
        None => match &facts.init_source {
            InitSourceFact::Available => pending(
                "Running",
                format!("starting init Job {}", names.init_job()),
                true,
            ),
            InitSourceFact::ConfigMapNotFound { name } => {
                let message = format!(
                    "ConfigMap {name} (spec.init.configMapRef) does not exist: create it with the init SQL"
                );
                InitDecision {
                    outcome: InitOutcome::Blocked {
                        reason: "InitConfigMapNotFound",
                        message: message.clone(),
                    },
                    condition: ConditionStatus::new(
                        Initialized,
                        false,
                        "InitConfigMapNotFound",
                        message,
                    ),
                    create_job: false,
                }
            }
            InitSourceFact::KeyNotFound { name, key } => {
                let message = format!(
                    "ConfigMap {name} has no key {key:?} (spec.init.configMapRef.key): add it"
                );
                InitDecision {
                    outcome: InitOutcome::Blocked {
                        reason: "InitConfigMapKeyNotFound",
                        message: message.clone(),
                    },
                    condition: ConditionStatus::new(
                        Initialized,
                        false,
                        "InitConfigMapKeyNotFound",
                        message,
                    ),
                    create_job: false,
                }
            }
        },
    }
}

fn storage_condition(db: &Database, facts: &Facts) -> ConditionStatus {
    let claim = Names::of(db).data_pvc(0);
    let Some(volume) = &facts.volume else {
        return ConditionStatus::new(
            StorageReady,
            false,
            "ClaimMissing",
            format!("waiting for PersistentVolumeClaim {claim}"),
        );
    };
    if !volume.bound {
        return ConditionStatus::new(
            StorageReady,
            false,
            "ClaimPending",
            format!(
                "PersistentVolumeClaim {claim} is not bound yet: check that a StorageClass or a free PersistentVolume can serve it"
            ),
        );
    }
    let want = quantity::bytes(&db.spec.storage.size);
    let have = volume.capacity.as_deref().and_then(quantity::bytes);
    match (want, have) {
        (Some(want), Some(have)) if have < want => ConditionStatus::new(
            StorageReady,
            false,
            "Resizing",
            format!(
                "PersistentVolumeClaim {claim} is growing from {} to {} (the StorageClass must allow volume expansion)",
                volume.capacity.as_deref().unwrap_or("?"),
                db.spec.storage.size
            ),
        ),
        _ => ConditionStatus::new(
            StorageReady,
            true,
            "Bound",
            format!("PersistentVolumeClaim {claim} is bound"),
        ),
    }
}

/// The size to grow the data claims to, when the spec asks for more than they request.
fn volume_to_expand(db: &Database, facts: &Facts) -> Option<String> {
    let volume = facts.volume.as_ref()?;
    let want = quantity::bytes(&db.spec.storage.size)?;
    let requested = volume.requested.as_deref().and_then(quantity::bytes)?;
    (volume.bound && requested < want).then(|| db.spec.storage.size.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::api::conditions::merge;
    use crate::resources::testing;
    use chrono::{TimeZone, Utc};

    const IMAGE: &str = "docker.io/library/postgres:16.4";

    fn sts(ready: i32, rolled_out: bool, image: &str) -> StatefulSetFact {
        StatefulSetFact {
            replicas: 1,
            ready_replicas: ready,
            updated_replicas: if rolled_out { 1 } else { 0 },
            observed_current: true,
            rolled_out,
            image: Some(image.into()),
        }
    }

    fn bound(size: &str) -> Option<super::super::observe::VolumeFact> {
        Some(super::super::observe::VolumeFact {
            bound: true,
            predates_database: false,
            requested: Some(size.into()),
            capacity: Some(size.into()),
        })
    }

    fn facts() -> Facts {
        Facts {
            credentials: CredentialsFact::Usable,
            init_source: InitSourceFact::Available,
            statefulset: None,
            volume: None,
            init_job: None,
            backups: Default::default(),
        }
    }

    fn with_status(mut db: Database, current_version: Option<&str>, initialized: bool) -> Database {
        let mut decided = vec![];
        if initialized {
            decided.push(ConditionStatus::new(Initialized, true, "Completed", "ok"));
        }
        db.status = Some(DatabaseStatus {
            current_version: current_version.map(str::to_string),
            conditions: merge(&[], &decided, Some(1), Utc.timestamp_opt(0, 0).unwrap()),
            ..DatabaseStatus::default()
        });
        db
    }

    fn with_init(mut db: Database) -> Database {
        db.spec.init = Some(crate::api::InitSpec {
            sql: Some("select 1".into()),
            config_map_ref: None,
        });
        db
    }

    fn cond(d: &Decision, t: ConditionType) -> &ConditionStatus {
        d.conditions
            .iter()
            .find(|c| c.type_ == t)
            .expect("condition present")
    }

    /// The phase table: (name, database, facts, expected phase, Ready reason).
    #[test]
    fn phase_table() {
        let plain = testing::minimal();
        let init = with_init(testing::minimal());
        let ready_once = with_status(testing::minimal(), Some("16.4"), true);
        let mut upgraded = with_status(testing::minimal(), Some("16.3"), true);
        upgraded.spec.version = "16.4".into();
        let mut user_secret = testing::minimal();
        user_secret.spec.credentials = Some(crate::api::CredentialsSpec {
            secret_name: "admin".into(),
        });
        let mut old_major = testing::minimal();
        old_major.spec.version = "9.6".into();
        let mut cm_init = testing::minimal();
        cm_init.spec.init = Some(crate::api::InitSpec {
            sql: None,
            config_map_ref: Some(crate::api::KeyRef {
                name: "schema".into(),
                key: "init.sql".into(),
            }),
        });

        let f = facts();
        let serving = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let starting = Facts {
            statefulset: Some(sts(0, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let rolling = Facts {
            statefulset: Some(sts(0, false, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let serving_old_image = Facts {
            statefulset: Some(sts(1, true, "docker.io/library/postgres:16.3")),
            volume: bound("1Gi"),
            ..facts()
        };

        let table: Vec<(&str, &Database, Facts, Phase, &str)> = vec![
            (
                "new database",
                &plain,
                f.clone(),
                Phase::Provisioning,
                "Provisioning",
            ),
            (
                "pods starting",
                &plain,
                starting.clone(),
                Phase::Provisioning,
                "Provisioning",
            ),
            (
                "serving, no init",
                &plain,
                serving.clone(),
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "serving, init to run",
                &init,
                serving.clone(),
                Phase::Initializing,
                "Initializing",
            ),
            (
                "init running",
                &init,
                Facts {
                    init_job: Some(JobFact::Running),
                    ..serving.clone()
                },
                Phase::Initializing,
                "Initializing",
            ),
            (
                "init done",
                &init,
                Facts {
                    init_job: Some(JobFact::Succeeded),
                    ..serving.clone()
                },
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "init failed",
                &init,
                Facts {
                    init_job: Some(JobFact::Failed {
                        message: "BackoffLimitExceeded".into(),
                    }),
                    ..serving.clone()
                },
                Phase::Failed,
                "InitFailed",
            ),
            (
                "lost readiness",
                &ready_once,
                starting.clone(),
                Phase::Degraded,
                "NotServing",
            ),
            (
                "statefulset deleted",
                &ready_once,
                f.clone(),
                Phase::Degraded,
                "NotServing",
            ),
            (
                "back again",
                &ready_once,
                serving.clone(),
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "upgrade rolling",
                &upgraded,
                rolling.clone(),
                Phase::Upgrading,
                "RollingOut",
            ),
            (
                "upgrade applied, old pods",
                &upgraded,
                serving_old_image.clone(),
                Phase::Upgrading,
                "RollingOut",
            ),
            (
                "upgrade done",
                &upgraded,
                serving.clone(),
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "user secret missing",
                &user_secret,
                Facts {
                    credentials: CredentialsFact::UserSecretProblem(SecretProblem::NotFound),
                    ..f.clone()
                },
                Phase::Pending,
                "CredentialsSecretNotFound",
            ),
            (
                "user secret without password",
                &user_secret,
                Facts {
                    credentials: CredentialsFact::UserSecretProblem(SecretProblem::MissingPassword),
                    ..f.clone()
                },
                Phase::Pending,
                "CredentialsSecretInvalid",
            ),
            (
                "unsupported major",
                &old_major,
                serving.clone(),
                Phase::Failed,
                "UnsupportedVersion",
            ),
            (
                "init ConfigMap missing",
                &cm_init,
                Facts {
                    init_source: InitSourceFact::ConfigMapNotFound {
                        name: "schema".into(),
                    },
                    ..serving.clone()
                },
                Phase::Pending,
                "InitConfigMapNotFound",
            ),
            (
                "init ConfigMap key missing",
                &cm_init,
                Facts {
                    init_source: InitSourceFact::KeyNotFound {
                        name: "schema".into(),
                        key: "init.sql".into(),
                    },
                    ..serving.clone()
                },
                Phase::Pending,
                "InitConfigMapKeyNotFound",
            ),
        ];
        let mut reached = std::collections::HashSet::new();
        for (name, db, facts, phase, reason) in table {
            let d = decide(db, &facts, &Settings::default());
            assert_eq!(d.phase, phase, "{name}");
            assert_eq!(cond(&d, Ready).reason, reason, "{name}");
            assert_eq!(
                cond(&d, Ready).status,
                phase == Phase::Ready,
                "{name}: Ready status"
            );
            reached.insert(d.phase);
        }
        // Deleting is decided by the finalizer path (cleanup), not here.
        for p in Phase::ALL {
            assert!(
                p == Phase::Deleting || reached.contains(&p),
                "phase {p:?} unreachable"
            );
        }
    }

    #[test]
    fn blocked_databases_write_nothing() {
        let mut db = testing::minimal();
        db.spec.version = "99.0".into();
        let d = decide(&db, &facts(), &Settings::default());
        assert_eq!(d.steps, Steps::default());
        assert!(
            cond(&d, Ready).message.contains("13 to 18"),
            "{}",
            cond(&d, Ready).message
        );
    }

    #[test]
    fn steps_table() {
        let db = testing::minimal();
        let init = with_init(testing::minimal());
        let serving = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };

        let d = decide(
            &db,
            &Facts {
                credentials: CredentialsFact::GeneratedMissing,
                ..facts()
            },
            &Settings::default(),
        );
        assert!(d.steps.create_secret && d.steps.apply_services && d.steps.apply_statefulset);
        assert!(!d.steps.create_init_job);

        let d = decide(
            &db,
            &Facts {
                credentials: CredentialsFact::GeneratedOrphaned,
                ..facts()
            },
            &Settings::default(),
        );
        assert!(d.steps.adopt_secret && !d.steps.create_secret);

        // The init Job starts only once the server serves, and only once.
        assert!(
            !decide(&init, &facts(), &Settings::default())
                .steps
                .create_init_job
        );
        assert!(
            decide(&init, &serving, &Settings::default())
                .steps
                .create_init_job
        );
        let running = Facts {
            init_job: Some(JobFact::Running),
            ..serving.clone()
        };
        assert!(
            !decide(&init, &running, &Settings::default())
                .steps
                .create_init_job
        );
        let initialized = with_status(with_init(testing::minimal()), Some("16.4"), true);
        let d = decide(&initialized, &serving, &Settings::default());
        assert!(
            !d.steps.create_init_job,
            "a deleted init Job is not run again"
        );
        assert_eq!(d.phase, Phase::Ready);
    }

    #[test]
    fn retained_data_is_not_initialised_again() {
        let db = with_init(testing::minimal());
        let mut volume = bound("1Gi");
        volume.as_mut().unwrap().predates_database = true;
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume,
            ..facts()
        };
        let d = decide(&db, &f, &Settings::default());
        assert!(!d.steps.create_init_job);
        assert_eq!(cond(&d, Initialized).reason, "ExistingData");
        assert_eq!(d.phase, Phase::Ready);
    }

    #[test]
    fn act_can_override_a_condition() {
        let mut d = decide(&testing::minimal(), &facts(), &Settings::default());
        d.override_condition(ConditionStatus::new(
            StorageReady,
            false,
            "ExpansionRefused",
            "no",
        ));
        let storage: Vec<_> = d
            .conditions
            .iter()
            .filter(|c| c.type_ == StorageReady)
            .collect();
        assert_eq!(storage.len(), 1);
        assert_eq!(storage[0].reason, "ExpansionRefused");
    }

    #[test]
    fn init_waits_for_a_config_map_without_starting_the_job() {
        let mut db = testing::minimal();
        db.spec.init = Some(crate::api::InitSpec {
            sql: None,
            config_map_ref: Some(crate::api::KeyRef {
                name: "schema".into(),
                key: "init.sql".into(),
            }),
        });
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            init_source: InitSourceFact::ConfigMapNotFound {
                name: "schema".into(),
            },
            ..facts()
        };
        let d = decide(&db, &f, &Settings::default());
        assert!(!d.steps.create_init_job);
        assert_eq!(d.requeue_after, REQUEUE_WAITING_ON_USER);
        assert!(cond(&d, Initialized).message.contains("create it"));
    }

    #[test]
    fn current_version_moves_only_when_rolled_out() {
        let mut db = with_status(testing::minimal(), Some("16.3"), true);
        db.spec.version = "16.4".into();
        let rolling = Facts {
            statefulset: Some(sts(0, false, IMAGE)),
            ..facts()
        };
        let d = decide(&db, &rolling, &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.3"));
        assert!(cond(&d, Upgrading).status);
        let done = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            ..facts()
        };
        let d = decide(&db, &done, &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.4"));
        // The new version is current; the next pass sees no upgrade.
        let db = with_status(testing::minimal(), Some("16.4"), true);
        assert!(!cond(&decide(&db, &done, &Settings::default()), Upgrading).status);
    }

    #[test]
    fn storage_table() {
        let mut db = testing::minimal();
        db.spec.storage.size = "2Gi".into();
        let vol = |bound: bool, requested: &str, capacity: Option<&str>| {
            Some(super::super::observe::VolumeFact {
                bound,
                predates_database: false,
                requested: Some(requested.into()),
                capacity: capacity.map(str::to_string),
            })
        };
        let table = [
            ("no claim", None, false, "ClaimMissing", None),
            (
                "pending",
                vol(false, "2Gi", None),
                false,
                "ClaimPending",
                None,
            ),
            (
                "bound big PV",
                vol(true, "2Gi", Some("100Gi")),
                true,
                "Bound",
                None,
            ),
            (
                "grow requested",
                vol(true, "1Gi", Some("1Gi")),
                false,
                "Resizing",
                Some("2Gi"),
            ),
            (
                "growing",
                vol(true, "2Gi", Some("1Gi")),
                false,
                "Resizing",
                None,
            ),
            ("grown", vol(true, "2Gi", Some("2Gi")), true, "Bound", None),
        ];
        for (name, volume, status, reason, expand) in table {
            let d = decide(&db, &Facts { volume, ..facts() }, &Settings::default());
            let c = cond(&d, StorageReady);
            assert_eq!((c.status, c.reason.as_str()), (status, reason), "{name}");
            assert_eq!(d.steps.expand_volumes.as_deref(), expand, "{name}");
        }
    }

    #[test]
    fn decisions_are_deterministic() {
        let db = testing::minimal();
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        assert_eq!(
            decide(&db, &f, &Settings::default()),
            decide(&db, &f, &Settings::default())
        );
    }
}
