//! The operator's Prometheus metrics: what the controllers record (reconciles, errors and their
//! duration per controller; the work-queue depth per controller; each Database's phase,
//! conditions and last successful backup, kept by `database_series`), whether this process runs
//! the controllers and is ready, and their encoding in the text exposition format. No I/O: the
//! HTTP server (`ops::server`) serves `encode()`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::database_series::DatabaseSeries;
use crate::api::conditions::ConditionType;
use crate::api::{Phase, UpgradeStage, UpgradeStatus};

pub use super::database_series::DatabaseKey;

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

/// Every metric dbop exports, registered once.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Family<ControllerLabels, Histogram>,
    workqueue_depth: Family<ControllerLabels, Gauge>,
    /// 1 once the controllers run in this process (they take their work-queue gauge as they
    /// start), 0 while it is a standby waiting for the Lease.
    controllers_running: Gauge,
    /// The answer of `/readyz`, as of the last scrape.
    ready: Gauge,
    /// Each Database's series and the count per phase (`database_series`).
    databases: Arc<DatabaseSeries>,
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
            workqueue_depth: Family::default(),
            controllers_running: Gauge::default(),
            ready: Gauge::default(),
            databases: Arc::default(),
        };
        metrics.register_process_metrics();
        metrics.register_reconcile_metrics();
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

    /// The reconciles and work queues per controller, then the series of each Database.
    fn register_reconcile_metrics(&mut self) {
        self.registry.register(
            "workqueue_depth",
            "Objects a trigger woke whose reconcile has not started yet, by controller \
             (a requeue timer is a delay, not queued)",
            self.workqueue_depth.clone(),
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
            .register_collector(Box::new(Arc::clone(&self.databases)));
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

    /// A Database is now in `phase`; `None` when it is gone (and so are all its series).
    pub fn database_phase(&self, key: DatabaseKey, phase: Option<Phase>) {
        match phase {
            Some(phase) => self.databases.update(key, |d| d.phase = Some(phase)),
            None => self.databases.remove(&key),
        }
    }

    /// The answer `/readyz` gives now (the server sets it before each scrape).
    pub fn ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Whether a Database's latest upgrade stopped and still waits for a change of the spec:
    /// stage RolledBack or Failed, not abandoned (the spec set back) nor superseded.
    pub fn upgrade_stopped(&self, key: DatabaseKey, upgrade: Option<&UpgradeStatus>) {
        let stopped = upgrade.filter(|u| {
            matches!(u.stage, UpgradeStage::RolledBack | UpgradeStage::Failed)
                && !u.reason.as_deref().is_some_and(|r| GIVEN_UP.contains(&r))
        });
        let stage = stopped.map(|u| u.stage);
        self.databases.update(key, |d| d.upgrade_stopped = stage);
    }

    /// The stage of a Database's latest upgrade (None: it has none).
    pub fn upgrade_stage(&self, key: DatabaseKey, stage: Option<UpgradeStage>) {
        self.databases.update(key, |d| d.upgrade_stage = stage);
    }

    /// A Database's conditions as written to its status, and whether backups are scheduled.
    pub fn database_conditions(&self, key: DatabaseKey, conditions: &[Condition], scheduled: bool) {
        let statuses = ConditionType::ALL.map(|type_| {
            let condition = conditions.iter().find(|c| c.type_ == type_.label());
            condition.map(|c| c.status == "True")
        });
        self.databases.update(key, |d| {
            d.conditions = statuses;
            d.backup_scheduled = Some(scheduled);
        });
    }

    /// A backup of a Database succeeded at `completed` (Unix seconds), `size_bytes` long.
    pub fn backup_succeeded(&self, key: DatabaseKey, completed: f64, size_bytes: Option<i64>) {
        // Backups are reconciled in any order: keep the newest. The same time again may bring
        // the size (the Database's status has the time only).
        self.databases.update(key, |d| {
            if completed >= d.backup_time.unwrap_or(0.0) {
                d.backup_time = Some(completed);
                d.backup_size = size_bytes.or(d.backup_size);
            }
        });
    }

    /// A verification of a Database's latest backup succeeded at `verified` (Unix seconds).
    pub fn backup_verified(&self, key: DatabaseKey, verified: f64) {
        self.databases
            .update(key, |d| d.backup_verified = Some(verified));
    }

    /// The earliest moment a point-in-time recovery of a Database can reach (Unix seconds);
    /// `None`: it cannot (no WAL archiving, or no base backup yet).
    pub fn restorable_since(&self, key: DatabaseKey, since: Option<f64>) {
        self.databases.update(key, |d| d.restorable_since = since);
    }

    /// dbop asked every data claim of a Database for more room (`spec.storage.autoGrow`).
    pub fn volume_grown(&self, key: DatabaseKey) {
        self.databases
            .update(key, |d| *d.volume_growths.get_or_insert(0) += 1);
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
