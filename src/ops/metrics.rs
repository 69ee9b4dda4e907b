//! The operator's Prometheus metrics: what the controllers record (reconciles, errors and their
//! duration per controller; the work-queue depth per controller; each Database's phase,
//! conditions and last successful backup), whether this process runs the controllers and is
//! ready, and their encoding in the text exposition format. No I/O: the HTTP server
//! (`ops::server`) serves `encode()`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::conditions::ConditionType;
use crate::api::{Phase, UpgradeStage, UpgradeStatus};

/// The reasons of a stopped upgrade the spec gave up on (`upgrade::plan::ABANDONED`,
/// `SUPERSEDED`; spelled here, a test keeps them equal, so that metrics need not import the
/// upgrade planner).
const GIVEN_UP: [&str; 2] = ["Abandoned", "Superseded"];

/// The controllers, as the `controller` label names them.
pub const DATABASE_CONTROLLER: &str = "database";
pub const BACKUP_CONTROLLER: &str = "backup";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DatabaseLabels {
    namespace: String,
    database: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    namespace: String,
    database: String,
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DatabasePhaseLabels {
    namespace: String,
    database: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    namespace: String,
    database: String,
    stage: String,
}

/// A Database's key: (namespace, name).
pub type DatabaseKey = (String, String);

/// Every metric dbop exports, registered once.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<ControllerLabels, Histogram>,
    databases: Family<PhaseLabels, Gauge>,
    backup_time: Family<DatabaseLabels, Gauge<f64, AtomicU64>>,
    backup_size: Family<DatabaseLabels, Gauge>,
    backup_scheduled: Family<DatabaseLabels, Gauge>,
    backup_verified: Family<DatabaseLabels, Gauge<f64, AtomicU64>>,
    volume_growths: Family<DatabaseLabels, Counter>,
    restorable_since: Family<DatabaseLabels, Gauge<f64, AtomicU64>>,
    conditions: Family<ConditionLabels, Gauge>,
    upgrade_stage: Family<StageLabels, Gauge>,
    upgrade_stopped: Family<StageLabels, Gauge>,
    database_phase: Family<DatabasePhaseLabels, Gauge>,
    workqueue_depth: Family<ControllerLabels, Gauge>,
    /// 1 once the controllers run in this process (they take their work-queue gauge as they
    /// start), 0 while it is a standby waiting for the Lease.
    controllers_running: Gauge,
    /// The answer of `/readyz`, as of the last scrape.
    ready: Gauge,
    /// The last phase seen per Database, from which `databases` is counted.
    phases: Mutex<HashMap<DatabaseKey, Phase>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("dbop"),
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
            }),
            databases: Family::default(),
            backup_time: Family::default(),
            backup_size: Family::default(),
            backup_scheduled: Family::default(),
            backup_verified: Family::default(),
            volume_growths: Family::default(),
            restorable_since: Family::default(),
            conditions: Family::default(),
            upgrade_stage: Family::default(),
            upgrade_stopped: Family::default(),
            database_phase: Family::default(),
            workqueue_depth: Family::default(),
            controllers_running: Gauge::default(),
            ready: Gauge::default(),
            phases: Mutex::new(HashMap::new()),
        };
        metrics.register_process_metrics();
        metrics.register_database_metrics();
        metrics.count_phases(&HashMap::new());
        for controller in [DATABASE_CONTROLLER, BACKUP_CONTROLLER] {
            metrics.queue_gauge(controller);
        }
        metrics
    }

    /// The process's own state: whether it runs the controllers and answers ready.
    fn register_process_metrics(&mut self) {
        self.registry.register(
            "controllers_running",
            "1 while this process runs the controllers (it holds the leader Lease, or runs \
             without election), 0 while it waits as a standby",
            self.controllers_running.clone(),
        );
        self.registry.register(
            "ready",
            "1 when /readyz answers ready (the controllers list what they watch, or a standby \
             waits for the Lease), 0 when not",
            self.ready.clone(),
        );
    }

    /// The Databases, their backups and upgrades, and the reconciles (in exposition order).
    fn register_database_metrics(&mut self) {
        self.registry.register(
            "database_phase",
            "A Database's phase: 1 for the phase it is in, 0 for the others",
            self.database_phase.clone(),
        );
        self.registry.register(
            "database_upgrade_stopped",
            "1 while a Database's latest upgrade stopped (stage RolledBack or Failed) and the spec \
             still asks for its version (absent: none stopped, or it was abandoned)",
            self.upgrade_stopped.clone(),
        );
        self.registry.register(
            "workqueue_depth",
            "Objects a trigger woke whose reconcile has not started yet, by controller \
             (a requeue timer is a delay, not queued)",
            self.workqueue_depth.clone(),
        );
        self.registry.register(
            "database_upgrade_stage",
            "The stage of a Database's latest upgrade: 1 for the stage it is in, 0 for the others",
            self.upgrade_stage.clone(),
        );
        self.registry.register(
            "database_condition",
            "A Database's condition: 1 True, 0 False (absent: not set)",
            self.conditions.clone(),
        );
        self.registry.register(
            "database_backup_scheduled",
            "1 when a Database has a backup schedule that is not suspended",
            self.backup_scheduled.clone(),
        );
        self.registry.register(
            "reconciles",
            "Reconciles run, by controller",
            self.reconciles.clone(),
        );
        self.registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and error reason",
            self.errors.clone(),
        );
        self.registry.register_with_unit(
            "reconcile_duration",
            "How long a reconcile took, by controller",
            Unit::Seconds,
            self.duration.clone(),
        );
        self.registry
            .register("databases", "Databases per phase", self.databases.clone());
        self.register_backup_metrics();
    }

    /// The backups' and the storage's metrics of each Database.
    fn register_backup_metrics(&mut self) {
        self.registry.register_with_unit(
            "backup_last_success_timestamp",
            "When the last successful backup of a Database completed (Unix time)",
            Unit::Seconds,
            self.backup_time.clone(),
        );
        self.registry.register_with_unit(
            "backup_last_success_size",
            "The size of the last successful backup of a Database",
            Unit::Bytes,
            self.backup_size.clone(),
        );
        self.registry.register_with_unit(
            "backup_last_verified_timestamp",
            "When the latest backup verification of a Database succeeded (Unix time)",
            Unit::Seconds,
            self.backup_verified.clone(),
        );
        self.registry.register_with_unit(
            "database_restorable_since_timestamp",
            "The earliest moment a point-in-time recovery of a Database can reach: the end of its \
             oldest succeeded base backup (Unix time; absent without WAL archiving or before the \
             first base backup)",
            Unit::Seconds,
            self.restorable_since.clone(),
        );
        self.registry.register(
            "database_volume_growths",
            "Growths of a Database's data volumes dbop asked for (spec.storage.autoGrow)",
            self.volume_growths.clone(),
        );
    }

    /// One reconcile of `controller` ended after `elapsed`, failed with `error` (a label) or not.
    pub fn reconciled(&self, controller: &str, elapsed: Duration, error: Option<&str>) {
        let labels = ControllerLabels {
            controller: controller.into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(reason) = error {
            let labels = ErrorLabels {
                controller: controller.into(),
                reason: reason.into(),
            };
            self.errors.get_or_create(&labels).inc();
        }
    }

    /// The gauge of `controller`'s work-queue depth (set by `context::work_queue`). A controller
    /// takes it as it starts, which marks this process as the one running the controllers
    /// (`dbop_controllers_running`).
    pub fn workqueue_depth(&self, controller: &str) -> Gauge {
        self.controllers_running.set(1);
        self.queue_gauge(controller)
    }

    fn queue_gauge(&self, controller: &str) -> Gauge {
        let labels = ControllerLabels {
            controller: controller.into(),
        };
        self.workqueue_depth.get_or_create(&labels).clone()
    }

    /// A Database is now in `phase`; `None` when it is gone.
    pub fn database_phase(&self, key: DatabaseKey, phase: Option<Phase>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        match phase {
            Some(phase) => phases.insert(key.clone(), phase),
            None => phases.remove(&key),
        };
        self.count_phases(&phases);
        for p in Phase::ALL {
            let labels = DatabasePhaseLabels {
                namespace: key.0.clone(),
                database: key.1.clone(),
                phase: p.label().into(),
            };
            match phase {
                Some(current) => {
                    self.database_phase
                        .get_or_create(&labels)
                        .set(i64::from(current == p));
                }
                None => {
                    self.database_phase.remove(&labels);
                }
            }
        }
        if phase.is_none() {
            let labels = database_labels(key.clone());
            self.backup_time.remove(&labels);
            self.backup_size.remove(&labels);
            self.backup_scheduled.remove(&labels);
            self.backup_verified.remove(&labels);
            self.volume_growths.remove(&labels);
            self.restorable_since.remove(&labels);
            for type_ in ConditionType::ALL {
                self.conditions
                    .remove(&condition_labels(&labels, type_.label()));
            }
            self.upgrade_stage(key.clone(), None);
            self.upgrade_stopped(key, None);
        }
    }

    /// The answer `/readyz` gives now (the server sets it before each scrape).
    pub fn ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Whether a Database's latest upgrade stopped and still waits for a change of the spec:
    /// stage RolledBack or Failed, not abandoned (the spec set back) nor superseded.
    pub fn upgrade_stopped(
        &self,
        (namespace, database): DatabaseKey,
        upgrade: Option<&UpgradeStatus>,
    ) {
        let stopped = upgrade.filter(|u| {
            matches!(u.stage, UpgradeStage::RolledBack | UpgradeStage::Failed)
                && !u.reason.as_deref().is_some_and(|r| GIVEN_UP.contains(&r))
        });
        for s in [UpgradeStage::RolledBack, UpgradeStage::Failed] {
            let labels = StageLabels {
                namespace: namespace.clone(),
                database: database.clone(),
                stage: s.label().into(),
            };
            if stopped.is_some_and(|u| u.stage == s) {
                self.upgrade_stopped.get_or_create(&labels).set(1);
            } else {
                self.upgrade_stopped.remove(&labels);
            }
        }
    }

    /// The stage of a Database's latest upgrade (None: it has none, or it is gone).
    pub fn upgrade_stage(&self, (namespace, database): DatabaseKey, stage: Option<UpgradeStage>) {
        for s in UpgradeStage::ALL {
            let labels = StageLabels {
                namespace: namespace.clone(),
                database: database.clone(),
                stage: s.label().into(),
            };
            match stage {
                Some(current) => {
                    let value = i64::from(current == s);
                    self.upgrade_stage.get_or_create(&labels).set(value);
                }
                None => {
                    self.upgrade_stage.remove(&labels);
                }
            }
        }
    }

    /// A Database's conditions as written to its status, and whether backups are scheduled.
    pub fn database_conditions(&self, key: DatabaseKey, conditions: &[Condition], scheduled: bool) {
        let labels = database_labels(key);
        self.backup_scheduled
            .get_or_create(&labels)
            .set(i64::from(scheduled));
        for type_ in ConditionType::ALL {
            let condition = condition_labels(&labels, type_.label());
            match conditions.iter().find(|c| c.type_ == type_.label()) {
                Some(c) => {
                    let value = i64::from(c.status == "True");
                    self.conditions.get_or_create(&condition).set(value);
                }
                None => {
                    self.conditions.remove(&condition);
                }
            }
        }
    }

    fn count_phases(&self, phases: &HashMap<DatabaseKey, Phase>) {
        for phase in Phase::ALL {
            let n = phases.values().filter(|p| **p == phase).count();
            let labels = PhaseLabels {
                phase: phase.label().into(),
            };
            self.databases
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A backup of a Database succeeded at `completed` (Unix seconds), `size_bytes` long.
    pub fn backup_succeeded(&self, key: DatabaseKey, completed: f64, size_bytes: Option<i64>) {
        let labels = database_labels(key);
        let time = self.backup_time.get_or_create(&labels);
        // Backups are reconciled in any order: keep the newest. The same time again may bring
        // the size (the Database's status has the time only).
        if completed >= time.get() {
            time.set(completed);
            if let Some(size) = size_bytes {
                self.backup_size.get_or_create(&labels).set(size);
            }
        }
    }

    /// A verification of a Database's latest backup succeeded at `verified` (Unix seconds).
    pub fn backup_verified(&self, key: DatabaseKey, verified: f64) {
        self.backup_verified
            .get_or_create(&database_labels(key))
            .set(verified);
    }

    /// The earliest moment a point-in-time recovery of a Database can reach (Unix seconds);
    /// `None`: it cannot (no WAL archiving, or no base backup yet).
    pub fn restorable_since(&self, key: DatabaseKey, since: Option<f64>) {
        let labels = database_labels(key);
        match since {
            Some(seconds) => {
                self.restorable_since.get_or_create(&labels).set(seconds);
            }
            None => {
                self.restorable_since.remove(&labels);
            }
        }
    }

    /// dbop asked every data claim of a Database for more room (`spec.storage.autoGrow`).
    pub fn volume_grown(&self, key: DatabaseKey) {
        self.volume_growths
            .get_or_create(&database_labels(key))
            .inc();
    }

    /// The metrics in the text exposition format (OpenMetrics 1.0, which Prometheus reads).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The content type of `Metrics::encode`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn database_labels((namespace, database): DatabaseKey) -> DatabaseLabels {
    DatabaseLabels {
        namespace,
        database,
    }
}

fn condition_labels(database: &DatabaseLabels, condition: &str) -> ConditionLabels {
    ConditionLabels {
        namespace: database.namespace.clone(),
        database: database.database.clone(),
        condition: condition.into(),
    }
}

#[cfg(test)]
mod upgrade_stage_tests {
    use super::*;

    #[test]
    fn the_upgrade_stage_gauge_marks_one_stage_and_goes_with_the_database() {
        let m = Metrics::new();
        let key = ("shop".to_string(), "orders".to_string());
        m.upgrade_stage(key.clone(), Some(UpgradeStage::RollingOut));
        let text = m.encode();
        let line = |stage: &str, v: u8| {
            format!(
                "dbop_database_upgrade_stage{{namespace=\"shop\",database=\"orders\",stage=\"{stage}\"}} {v}"
            )
        };
        assert!(text.contains(&line("RollingOut", 1)), "{text}");
        assert!(text.contains(&line("Preflight", 0)), "{text}");
        m.database_phase(key, None);
        assert!(!m.encode().contains("stage=\"RollingOut\""));
    }
}

#[cfg(test)]
mod workqueue_tests {
    use super::*;

    #[test]
    fn both_work_queues_are_exported_from_the_start_and_follow_their_gauge() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(
            text.contains("dbop_workqueue_depth{controller=\"database\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("dbop_workqueue_depth{controller=\"backup\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("a requeue timer is a delay, not queued"),
            "{text}"
        );
        m.workqueue_depth(DATABASE_CONTROLLER).set(3);
        assert!(
            m.encode()
                .contains("dbop_workqueue_depth{controller=\"database\"} 3")
        );
    }
}

#[cfg(test)]
mod alert_series_tests {
    use super::*;
    use crate::upgrade::plan::{ABANDONED, SUPERSEDED};

    #[test]
    fn the_given_up_reasons_are_the_planner_s() {
        assert_eq!(GIVEN_UP, [ABANDONED, SUPERSEDED]);
    }

    fn upgrade(stage: UpgradeStage, reason: Option<&str>) -> UpgradeStatus {
        serde_json::from_value(serde_json::json!({
            "from": "15.18", "to": "15.20", "fromImage": "a", "toImage": "b",
            "stage": stage.label(), "startedAt": "2026-12-01T00:00:00Z",
            "reason": reason,
        }))
        .unwrap()
    }

    #[test]
    fn a_standby_does_not_run_the_controllers_until_one_takes_its_queue() {
        let m = Metrics::new();
        m.ready(true);
        let text = m.encode();
        assert!(
            text.lines().any(|l| l == "dbop_controllers_running 0"),
            "{text}"
        );
        assert!(text.lines().any(|l| l == "dbop_ready 1"), "{text}");
        m.workqueue_depth(DATABASE_CONTROLLER);
        m.ready(false);
        let text = m.encode();
        assert!(
            text.lines().any(|l| l == "dbop_controllers_running 1"),
            "{text}"
        );
        assert!(text.lines().any(|l| l == "dbop_ready 0"), "{text}");
    }

    #[test]
    fn each_database_s_phase_is_a_series_that_goes_with_the_database() {
        let m = Metrics::new();
        let key = ("shop".to_string(), "orders".to_string());
        m.database_phase(key.clone(), Some(Phase::Degraded));
        let text = m.encode();
        let line = |phase: &str, v: u8| {
            format!(
                "dbop_database_phase{{namespace=\"shop\",database=\"orders\",phase=\"{phase}\"}} {v}"
            )
        };
        assert!(text.contains(&line("Degraded", 1)), "{text}");
        assert!(text.contains(&line("Ready", 0)), "{text}");
        m.database_phase(key, None);
        assert!(!m.encode().contains("dbop_database_phase{"));
    }

    #[test]
    fn volume_growths_are_counted_per_database_and_go_with_it() {
        let m = Metrics::new();
        let key = ("shop".to_string(), "orders".to_string());
        assert!(!m.encode().contains("dbop_database_volume_growths_total{"));
        m.database_phase(key.clone(), Some(Phase::Ready));
        m.volume_grown(key.clone());
        m.volume_grown(key.clone());
        let text = m.encode();
        let line = "dbop_database_volume_growths_total{namespace=\"shop\",database=\"orders\"} 2";
        assert!(text.contains(line), "{text}");
        m.database_phase(key, None);
        assert!(!m.encode().contains("dbop_database_volume_growths_total{"));
    }

    #[test]
    fn the_restorable_window_start_is_exported_while_there_is_one() {
        let m = Metrics::new();
        let key = ("shop".to_string(), "orders".to_string());
        let name = "dbop_database_restorable_since_timestamp_seconds{";
        m.database_phase(key.clone(), Some(Phase::Ready));
        m.restorable_since(key.clone(), None);
        assert!(!m.encode().contains(name));
        m.restorable_since(key.clone(), Some(1_764_900_000.5));
        let text = m.encode();
        let line = "dbop_database_restorable_since_timestamp_seconds\
                    {namespace=\"shop\",database=\"orders\"} 1764900000.5";
        assert!(text.contains(line), "{text}");
        // Archiving turned off: no window any more.
        m.restorable_since(key.clone(), None);
        assert!(!m.encode().contains(name));
        m.restorable_since(key.clone(), Some(1_764_900_000.5));
        m.database_phase(key, None);
        assert!(!m.encode().contains(name));
    }

    #[test]
    fn a_stopped_upgrade_is_exported_until_it_is_abandoned() {
        let m = Metrics::new();
        let key = ("shop".to_string(), "orders".to_string());
        let series = "dbop_database_upgrade_stopped{namespace=\"shop\",database=\"orders\",stage=\"RolledBack\"} 1";
        m.upgrade_stopped(
            key.clone(),
            Some(&upgrade(UpgradeStage::RolledBack, Some("PodNotReady"))),
        );
        assert!(m.encode().contains(series), "{}", m.encode());
        m.upgrade_stopped(
            key.clone(),
            Some(&upgrade(UpgradeStage::RolledBack, Some(ABANDONED))),
        );
        assert!(!m.encode().contains("dbop_database_upgrade_stopped{"));
        m.upgrade_stopped(key.clone(), Some(&upgrade(UpgradeStage::Failed, None)));
        assert!(m.encode().contains("stage=\"Failed\"} 1"));
        m.upgrade_stopped(key.clone(), Some(&upgrade(UpgradeStage::RollingOut, None)));
        assert!(!m.encode().contains("dbop_database_upgrade_stopped{"));
        m.upgrade_stopped(key.clone(), Some(&upgrade(UpgradeStage::Failed, None)));
        m.database_phase(key, None);
        assert!(!m.encode().contains("dbop_database_upgrade_stopped{"));
    }
}
