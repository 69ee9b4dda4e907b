//! The series dbop exports for each Database (its phase, conditions, backups, volume growths,
//! restorable window and upgrade) and the count of Databases per phase: one small record per
//! Database, encoded as series only when Prometheus scrapes. A metric family per series kept a
//! label set of owned strings and a gauge for each of the ~30 series of every Database: about
//! 3 KiB per Database, megabytes at a thousand. No I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use crate::api::conditions::ConditionType;
use crate::api::{Phase, UpgradeStage};

/// A Database as the metrics' labels name it: (namespace, name).
pub type DatabaseKey = (String, String);

/// What is known of one Database's series; `None`: that series is absent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Record {
    pub phase: Option<Phase>,
    /// By `ConditionType::ALL`'s order: Some(status is True) for a condition that is set.
    pub conditions: [Option<bool>; ConditionType::ALL.len()],
    pub backup_scheduled: Option<bool>,
    /// The last successful backup: when it completed (Unix seconds) and its size.
    pub backup_time: Option<f64>,
    pub backup_size: Option<i64>,
    pub backup_verified: Option<f64>,
    pub restorable_since: Option<f64>,
    pub volume_growths: Option<u64>,
    pub upgrade_stage: Option<UpgradeStage>,
    /// The stage (RolledBack or Failed) of an upgrade that stopped and still waits.
    pub upgrade_stopped: Option<UpgradeStage>,
}

/// Every Database's record, in label order (what a scrape shows).
#[derive(Debug, Default)]
pub struct DatabaseSeries(Mutex<BTreeMap<DatabaseKey, Record>>);

impl DatabaseSeries {
    /// Changes the record of `key` (made empty the first time).
    pub fn update(&self, key: DatabaseKey, change: impl FnOnce(&mut Record)) {
        change(self.records().entry(key).or_default());
    }

    /// The Database is gone: none of its series remains.
    pub fn remove(&self, key: &DatabaseKey) {
        self.records().remove(key);
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<DatabaseKey, Record>> {
        // A panic elsewhere while holding it leaves plain numbers: still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A series' extra label beside namespace and database: (name, value).
type Label = (&'static str, &'static str);

/// One metric family as the exposition names and describes it.
struct Descriptor {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    kind: MetricType,
}

const fn gauge(name: &'static str, help: &'static str) -> Descriptor {
    Descriptor {
        name,
        help,
        unit: None,
        kind: MetricType::Gauge,
    }
}

impl Descriptor {
    fn in_(self, unit: Unit) -> Self {
        Self {
            unit: Some(unit),
            ..self
        }
    }

    fn counter(self) -> Self {
        Self {
            kind: MetricType::Counter,
            ..self
        }
    }
}

impl Collector for DatabaseSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let records = self.records();
        let out = &mut encoder;
        let r = &*records;
        encode_counts(out, r)?;
        family(out, &phase(), r, |d| {
            one_of(d.phase, &Phase::ALL, "phase", Phase::label)
        })?;
        family(out, &upgrade_stopped(), r, |d| {
            let stage = d.upgrade_stopped;
            stage.map_or(vec![], |s| vec![(Some(("stage", s.label())), gauge_of(1))])
        })?;
        family(out, &upgrade_stage(), r, |d| {
            one_of(
                d.upgrade_stage,
                &UpgradeStage::ALL,
                "stage",
                UpgradeStage::label,
            )
        })?;
        family(out, &condition(), r, |d| {
            let types = ConditionType::ALL.iter().zip(d.conditions);
            let set = types.filter_map(|(t, s)| Some((t, s?)));
            set.map(|(t, s)| (Some(("condition", t.label())), gauge_of(i64::from(s))))
                .collect()
        })?;
        family(out, &backup_scheduled(), r, |d| {
            alone(d.backup_scheduled.map(|s| gauge_of(i64::from(s))))
        })?;
        encode_backups(out, r)
    }
}

/// `dbop_databases`: how many Databases are in each phase (every phase, 0 too).
fn encode_counts(out: &mut DescriptorEncoder, records: &Records) -> fmt::Result {
    let mut family =
        out.encode_descriptor("databases", "Databases per phase.", None, MetricType::Gauge)?;
    for phase in Phase::ALL {
        let n = records.values().filter(|d| d.phase == Some(phase)).count();
        let value = ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        value.encode(family.encode_family(&[("phase", phase.label())])?)?;
    }
    Ok(())
}

/// The backups' and the storage's series of each Database.
fn encode_backups(out: &mut DescriptorEncoder, r: &Records) -> fmt::Result {
    family(out, &backup_time(), r, |d| {
        alone(d.backup_time.map(ConstGauge::new))
    })?;
    family(out, &backup_size(), r, |d| {
        alone(d.backup_size.map(ConstGauge::new))
    })?;
    family(out, &backup_verified(), r, |d| {
        alone(d.backup_verified.map(ConstGauge::new))
    })?;
    family(out, &restorable_since(), r, |d| {
        alone(d.restorable_since.map(ConstGauge::new))
    })?;
    family(out, &volume_growths(), r, |d| {
        alone(d.volume_growths.map(ConstCounter::new))
    })
}

type Records = BTreeMap<DatabaseKey, Record>;

/// A family with, for each Database, the series `series` gives: (its extra label, its value).
fn family<M: EncodeMetric>(
    out: &mut DescriptorEncoder,
    descriptor: &Descriptor,
    records: &Records,
    series: impl Fn(&Record) -> Vec<(Option<Label>, M)>,
) -> fmt::Result {
    let Descriptor {
        name,
        help,
        unit,
        kind,
    } = descriptor;
    let mut family = out.encode_descriptor(name, help, unit.as_ref(), *kind)?;
    for ((namespace, database), record) in records {
        for (extra, value) in series(record) {
            let mut labels = vec![("namespace", namespace.as_str()), ("database", database)];
            labels.extend(extra);
            value.encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// One series per value of `all` while the Database has a `current` one: 1 for it, 0 for the
/// others.
fn one_of<T: PartialEq + Copy>(
    current: Option<T>,
    all: &[T],
    label: &'static str,
    name: fn(T) -> &'static str,
) -> Vec<(Option<Label>, ConstGauge)> {
    let Some(current) = current else {
        return vec![];
    };
    let each = all
        .iter()
        .map(|&v| (Some((label, name(v))), gauge_of(i64::from(current == v))));
    each.collect()
}

/// At most one series, labelled by the Database alone.
fn alone<M>(value: Option<M>) -> Vec<(Option<Label>, M)> {
    value.map(|v| (None, v)).into_iter().collect()
}

fn gauge_of(value: i64) -> ConstGauge {
    ConstGauge::new(value)
}

fn phase() -> Descriptor {
    gauge(
        "database_phase",
        "A Database's phase: 1 for the phase it is in, 0 for the others.",
    )
}

fn upgrade_stopped() -> Descriptor {
    gauge(
        "database_upgrade_stopped",
        "1 while a Database's latest upgrade stopped (stage RolledBack or Failed) and the spec \
         still asks for its version (absent: none stopped, or it was abandoned).",
    )
}

fn upgrade_stage() -> Descriptor {
    gauge(
        "database_upgrade_stage",
        "The stage of a Database's latest upgrade: 1 for the stage it is in, 0 for the others.",
    )
}

fn condition() -> Descriptor {
    gauge(
        "database_condition",
        "A Database's condition: 1 True, 0 False (absent: not set).",
    )
}

fn backup_scheduled() -> Descriptor {
    gauge(
        "database_backup_scheduled",
        "1 when a Database has a backup schedule that is not suspended.",
    )
}

fn backup_time() -> Descriptor {
    gauge(
        "backup_last_success_timestamp",
        "When the last successful backup of a Database completed (Unix time).",
    )
    .in_(Unit::Seconds)
}

fn backup_size() -> Descriptor {
    gauge(
        "backup_last_success_size",
        "The size of the last successful backup of a Database.",
    )
    .in_(Unit::Bytes)
}

fn backup_verified() -> Descriptor {
    gauge(
        "backup_last_verified_timestamp",
        "When the latest backup verification of a Database succeeded (Unix time).",
    )
    .in_(Unit::Seconds)
}

fn restorable_since() -> Descriptor {
    gauge(
        "database_restorable_since_timestamp",
        "The earliest moment a point-in-time recovery of a Database can reach: the end of its \
         oldest succeeded base backup (Unix time; absent without WAL archiving or before the \
         first base backup).",
    )
    .in_(Unit::Seconds)
}

fn volume_growths() -> Descriptor {
    gauge(
        "database_volume_growths",
        "Growths of a Database's data volumes dbop asked for (spec.storage.autoGrow).",
    )
    .counter()
}
