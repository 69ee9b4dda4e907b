//! `spec.storage.autoGrow`: whether the data volumes grow now and to what size, which pods
//! stopped on a full volume can start again, and the `StorageAutoGrow` condition.
//!
//! The volumes of a Database stay one size: a standby holds the primary's data and may become
//! the primary, so the fullest instance decides for all. A growth is asked for only when none is
//! under way (every claim has what it asked for, and every filesystem shows it), so a slow
//! resizer is never asked twice. A volume is read from its filesystem (`dbop_contract::volume`),
//! while the server runs or after it stopped on a full volume; a filesystem much larger than its
//! claim (a hostPath, a shared disk) is not grown, since the claim's size would not give it room.
//! The messages name no moving figure, so a steady volume writes no status.
//!
//! Pure.

use std::time::Duration;

use super::facts::{ClassFact, StorageFact};
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{AutoGrowSpec, Database};
use crate::resources::quantity;

/// How often a Database with `autoGrow` has its volumes read: with the threshold's room, a
/// volume must fill faster than this to fill before it grows.
pub const LOOK_AGAIN: Duration = Duration::from_secs(30);

const MIB: u128 = 1024 * 1024;
const GIB: u128 = 1024 * MIB;

/// What `autoGrow` asks of this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub grow: Option<Growth>,
    /// Pods that stopped on a full volume that has grown since: deleted so they start now,
    /// not at the end of their crash back-off.
    pub restart: Vec<String>,
    /// `StorageAutoGrow`; `None`: no autoGrow (the status drops it) or nothing read yet (the
    /// last one stands).
    pub condition: Option<ConditionStatus>,
}

/// Grow every data claim to `size` (a quantity); `note` is the Event's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    pub size: String,
    pub note: String,
}

/// An instance's volume past the threshold (or stopped full), the fullest first.
struct Full<'a> {
    pod: &'a str,
    percent: u64,
}

pub fn plan(db: &Database, storage: &StorageFact) -> Plan {
    let Some(spec) = &db.spec.storage.auto_grow else {
        return Plan::default();
    };
    if let ClassFact::CannotExpand { name, missing } = &storage.class {
        return condition_only(cannot_expand(name, *missing));
    }
    // Every claim bound with a capacity; before that there is nothing to grow.
    let Some(current) = storage.current() else {
        return Plan::default();
    };
    let requested = storage
        .claims
        .iter()
        .filter_map(|c| c.requested)
        .max()
        .unwrap_or(current);
    let volumes = Volumes::read(spec, storage, current);
    if storage.usage.is_empty() && storage.stopped_full.is_empty() {
        return Plan {
            restart: volumes.restart,
            ..Plan::default()
        };
    }
    let (grow, condition) = match (volumes.growing, volumes.full.first(), volumes.oversized) {
        (true, _, _) => (None, growing(&quantity_of(requested))),
        (false, Some(fullest), _) => grow(spec, fullest, current, requested),
        (false, None, Some((pod, size))) => (
            None,
            ConditionStatus::new(
                ConditionType::StorageAutoGrow,
                false,
                "UnsizedVolume",
                unsized_message(pod, size, current),
            ),
        ),
        (false, None, None) => (None, watching(spec, current)),
    };
    Plan {
        grow,
        restart: volumes.restart,
        condition: Some(condition),
    }
}

/// What the instances' volumes say, against the claims' `current` size.
struct Volumes<'a> {
    /// A claim asks for more than it has, or a filesystem is still smaller than its claim.
    growing: bool,
    /// Past the threshold (or stopped full), the fullest first.
    full: Vec<Full<'a>>,
    /// A filesystem far larger than its claim: (pod, its size).
    oversized: Option<(&'a str, u64)>,
    /// Stopped on a full volume that has grown since.
    restart: Vec<String>,
}

impl<'a> Volumes<'a> {
    fn read(spec: &AutoGrowSpec, storage: &'a StorageFact, current: u128) -> Volumes<'a> {
        let mut volumes = Volumes {
            growing: storage
                .claims
                .iter()
                .any(|c| c.requested.zip(c.capacity).is_some_and(|(r, c)| c < r)),
            full: Vec::new(),
            oversized: None,
            restart: Vec::new(),
        };
        for (pod, usage) in &storage.usage {
            let size = u128::from(usage.size_bytes);
            if StorageFact::oversized(usage, current) {
                volumes.oversized = volumes.oversized.or(Some((pod.as_str(), usage.size_bytes)));
            } else if size * 10 < current.saturating_mul(9) {
                // The claim grew; its filesystem not yet.
                volumes.growing = true;
            } else if usage.used_percent() >= spec.threshold() {
                let percent = usage.used_percent();
                volumes.full.push(Full { pod, percent });
            }
        }
        for (pod, then) in &storage.stopped_full {
            match u128::from(then.size_bytes) * 10 < current.saturating_mul(9) {
                true => volumes.restart.push(pod.clone()),
                false => volumes.full.push(Full { pod, percent: 100 }),
            }
        }
        volumes
            .full
            .sort_by(|a, b| b.percent.cmp(&a.percent).then(a.pod.cmp(b.pod)));
        volumes
    }
}

fn growing(size: &str) -> ConditionStatus {
    ConditionStatus::new(
        ConditionType::StorageAutoGrow,
        true,
        "Growing",
        format!(
            "The data volumes are growing to {size} (spec.storage.autoGrow); the StorageClass's \
             driver resizes them."
        ),
    )
}

fn watching(spec: &AutoGrowSpec, current: u128) -> ConditionStatus {
    ConditionStatus::new(
        ConditionType::StorageAutoGrow,
        true,
        "Watching",
        format!(
            "The data volumes ({} each) grow by {} when one is {}% full, up to {}.",
            quantity_of(current),
            spec.increment,
            spec.threshold_percent,
            spec.maximum
        ),
    )
}

/// The growth for the fullest volume, or `AtMaximum` when there is no room left to give.
fn grow(
    spec: &AutoGrowSpec,
    fullest: &Full,
    current: u128,
    requested: u128,
) -> (Option<Growth>, ConditionStatus) {
    let maximum = quantity::bytes(&spec.maximum).unwrap_or(0);
    let next = round_up(current.saturating_add(increment(&spec.increment, current))).min(maximum);
    if next <= requested.max(current) {
        let message = format!(
            "Pod {}'s data volume is past {}% full and the volumes are at \
             spec.storage.autoGrow.maximum ({}): raise the maximum, or free space.",
            fullest.pod, spec.threshold_percent, spec.maximum
        );
        let condition =
            ConditionStatus::new(ConditionType::StorageAutoGrow, false, "AtMaximum", message);
        return (None, condition);
    }
    let size = match next == maximum {
        true => spec.maximum.clone(),
        false => quantity_of(next),
    };
    let state = match fullest.percent {
        100 => "is full".to_string(),
        p => format!("is {p}% full"),
    };
    let note = format!(
        "Pod {}'s data volume {state} (threshold {}%): growing every data claim from {} to {size} \
         (spec.storage.autoGrow).",
        fullest.pod,
        spec.threshold_percent,
        quantity_of(current)
    );
    let condition = growing(&size);
    (Some(Growth { size, note }), condition)
}

fn condition_only(condition: ConditionStatus) -> Plan {
    Plan {
        condition: Some(condition),
        ..Plan::default()
    }
}

fn cannot_expand(name: &str, missing: bool) -> ConditionStatus {
    let why = match missing {
        true => format!("StorageClass {name} does not exist"),
        false => format!("StorageClass {name} does not allow volume expansion"),
    };
    ConditionStatus::new(
        ConditionType::StorageAutoGrow,
        false,
        "CannotExpand",
        format!(
            "{why}, so spec.storage.autoGrow cannot grow the data volumes. Set \
             allowVolumeExpansion: true on the class (if its driver can expand volumes), or \
             restore into a Database on a class that can."
        ),
    )
}

fn unsized_message(pod: &str, size: u64, current: u128) -> String {
    format!(
        "Pod {pod}'s data volume is a filesystem of {} for a claim of {}: not a volume of its \
         own (a hostPath or a shared disk), which growing the claim would not enlarge, so dbop \
         does not grow it.",
        quantity_of(u128::from(size)),
        quantity_of(current)
    )
}

/// Bytes an increment adds to a volume of `current` bytes (at least 1 MiB).
fn increment(increment: &str, current: u128) -> u128 {
    let bytes = match increment.strip_suffix('%') {
        Some(percent) => current.saturating_mul(percent.parse::<u128>().unwrap_or(0)) / 100,
        None => quantity::bytes(increment).unwrap_or(0),
    };
    bytes.max(MIB)
}

fn round_up(bytes: u128) -> u128 {
    bytes.div_ceil(MIB).saturating_mul(MIB)
}

/// A size as a quantity: whole GiB as `Gi`, whole MiB as `Mi`, else bytes.
pub fn quantity_of(bytes: u128) -> String {
    match bytes {
        b if b > 0 && b % GIB == 0 => format!("{}Gi", b / GIB),
        b if b > 0 && b % MIB == 0 => format!("{}Mi", b / MIB),
        b => b.to_string(),
    }
}

/// When to look again at a Database with `autoGrow`.
pub fn look_again(db: &Database) -> Option<Duration> {
    db.spec.storage.auto_grow.as_ref().map(|_| LOOK_AGAIN)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::database::facts::ClaimSize;
    use crate::resources::testing;
    use dbop_contract::volume::VolumeUsage;

    fn db(threshold: i32, increment: &str, maximum: &str) -> Database {
        let mut db = testing::minimal();
        db.spec.storage.size = "1Gi".into();
        db.spec.storage.auto_grow = Some(AutoGrowSpec {
            threshold_percent: threshold,
            increment: increment.into(),
            maximum: maximum.into(),
        });
        db
    }

    fn claim(ordinal: u8, requested: u128, capacity: Option<u128>) -> ClaimSize {
        ClaimSize {
            name: format!("data-orders-{ordinal}"),
            requested: Some(requested),
            capacity,
        }
    }

    fn usage(size: u128, used_percent: u128) -> VolumeUsage {
        VolumeUsage {
            size_bytes: size as u64,
            free_bytes: (size - size * used_percent / 100) as u64,
        }
    }

    fn storage(claims: Vec<ClaimSize>, usage: &[(&str, VolumeUsage)]) -> StorageFact {
        StorageFact {
            claims,
            usage: usage.iter().map(|(p, u)| (p.to_string(), *u)).collect(),
            stopped_full: BTreeMap::new(),
            class: ClassFact::Expands,
        }
    }

    fn reason(plan: &Plan) -> (bool, &str) {
        let c = plan.condition.as_ref().expect("a condition");
        (c.status, c.reason.as_str())
    }

    #[test]
    fn grows_every_claim_past_the_threshold_by_the_increment() {
        let table = [
            // (increment, maximum, used %, want)
            ("20%", "10Gi", 85, Some("1229Mi")),
            ("512Mi", "10Gi", 80, Some("1536Mi")),
            ("1Gi", "10Gi", 99, Some("2Gi")),
            // Capped at the maximum, written as the spec writes it.
            ("1Gi", "1500Mi", 90, Some("1500Mi")),
            ("20%", "10Gi", 79, None),
        ];
        for (inc, max, used, want) in table {
            let s = storage(
                vec![claim(0, GIB, Some(GIB)), claim(1, GIB, Some(GIB))],
                &[("orders-0", usage(GIB, 10)), ("orders-1", usage(GIB, used))],
            );
            let plan = plan(&db(80, inc, max), &s);
            let grow = plan.grow.as_ref().map(|g| g.size.as_str());
            assert_eq!(grow, want, "{inc} {max} {used}%");
            match want {
                Some(size) => {
                    assert_eq!(reason(&plan), (true, "Growing"));
                    let note = &plan.grow.as_ref().unwrap().note;
                    assert!(
                        note.starts_with(&format!("Pod orders-1's data volume is {used}% full"))
                    );
                    assert!(note.contains(&format!("from 1Gi to {size}")), "{note}");
                }
                None => assert_eq!(reason(&plan), (true, "Watching")),
            }
        }
    }

    #[test]
    fn never_asks_twice_while_a_growth_is_under_way() {
        let full = [("orders-0", usage(GIB, 95))];
        // A claim that asked for more than it has.
        let s = storage(vec![claim(0, 2 * GIB, Some(GIB))], &full);
        let plan = plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!((&plan.grow, reason(&plan)), (&None, (true, "Growing")));
        // The claim has it, its filesystem not yet (the kubelet resizes it later).
        let s = storage(vec![claim(0, 2 * GIB, Some(2 * GIB))], &full);
        let plan = super::plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!((&plan.grow, reason(&plan)), (&None, (true, "Growing")));
        // The filesystem too: the next growth starts from the new size.
        let s = storage(
            vec![claim(0, 2 * GIB, Some(2 * GIB))],
            &[("orders-0", usage(2 * GIB, 95))],
        );
        let plan = super::plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!(plan.grow.unwrap().size, "3Gi");
    }

    #[test]
    fn stops_at_the_maximum_and_says_so() {
        let s = storage(
            vec![claim(0, 2 * GIB, Some(2 * GIB))],
            &[("orders-0", usage(2 * GIB, 90))],
        );
        let plan = plan(&db(80, "1Gi", "2Gi"), &s);
        assert_eq!(plan.grow, None);
        assert_eq!(reason(&plan), (false, "AtMaximum"));
        let message = &plan.condition.unwrap().message;
        assert!(
            message.contains("past 80% full") && message.contains("(2Gi)"),
            "{message}"
        );
    }

    #[test]
    fn a_server_stopped_on_a_full_volume_grows_it_then_restarts() {
        let mut s = storage(vec![claim(0, GIB, Some(GIB))], &[]);
        s.stopped_full.insert("orders-0".into(), usage(GIB, 100));
        let plan = plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!(plan.grow.as_ref().map(|g| g.size.as_str()), Some("2Gi"));
        assert!(plan.grow.unwrap().note.contains("data volume is full"));
        assert!(plan.restart.is_empty());
        // Grown since it stopped: start it now, no second growth.
        s.claims = vec![claim(0, 2 * GIB, Some(2 * GIB))];
        let plan = super::plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!(plan.grow, None);
        assert_eq!(plan.restart, vec!["orders-0".to_string()]);
    }

    #[test]
    fn a_class_that_cannot_expand_is_told_before_anything_fills() {
        for (missing, says) in [
            (false, "does not allow volume expansion"),
            (true, "does not exist"),
        ] {
            let mut s = storage(
                vec![claim(0, GIB, Some(GIB))],
                &[("orders-0", usage(GIB, 5))],
            );
            s.class = ClassFact::CannotExpand {
                name: "standard".into(),
                missing,
            };
            let plan = plan(&db(80, "1Gi", "10Gi"), &s);
            assert_eq!(plan.grow, None);
            assert_eq!(reason(&plan), (false, "CannotExpand"));
            let message = plan.condition.unwrap().message;
            assert!(
                message.contains(&format!("StorageClass standard {says}")),
                "{message}"
            );
        }
    }

    #[test]
    fn a_filesystem_far_larger_than_its_claim_is_not_grown() {
        // A hostPath volume: the node's disk, 90 % full, behind a 1Gi claim.
        let s = storage(
            vec![claim(0, GIB, Some(GIB))],
            &[("orders-0", usage(100 * GIB, 90))],
        );
        let plan = plan(&db(80, "1Gi", "10Gi"), &s);
        assert_eq!(plan.grow, None);
        assert_eq!(reason(&plan), (false, "UnsizedVolume"));
        assert!(
            plan.condition
                .unwrap()
                .message
                .contains("filesystem of 100Gi for a claim of 1Gi")
        );
    }

    #[test]
    fn nothing_to_say_before_the_claims_are_bound_or_read_nor_without_auto_grow() {
        let unbound = storage(vec![claim(0, GIB, None)], &[("orders-0", usage(GIB, 99))]);
        assert_eq!(plan(&db(80, "1Gi", "10Gi"), &unbound), Plan::default());
        let unread = storage(vec![claim(0, GIB, Some(GIB))], &[]);
        assert_eq!(plan(&db(80, "1Gi", "10Gi"), &unread), Plan::default());
        let full = storage(
            vec![claim(0, GIB, Some(GIB))],
            &[("orders-0", usage(GIB, 99))],
        );
        assert_eq!(plan(&testing::minimal(), &full), Plan::default());
    }

    #[test]
    fn a_steady_volume_keeps_one_message() {
        let at = |used| {
            let s = storage(
                vec![claim(0, GIB, Some(GIB))],
                &[("orders-0", usage(GIB, used))],
            );
            plan(&db(80, "20%", "10Gi"), &s).condition.unwrap()
        };
        assert_eq!(at(10), at(70));
        assert_eq!(
            at(10).message,
            "The data volumes (1Gi each) grow by 20% when one is 80% full, up to 10Gi."
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_of(2 * GIB), "2Gi");
        assert_eq!(quantity_of(1536 * MIB), "1536Mi");
        assert_eq!(quantity_of(1000), "1000");
        assert_eq!(increment("25%", 4 * GIB), GIB);
        assert_eq!(increment("1%", MIB), MIB);
        assert_eq!(increment("64Mi", GIB), 64 * MIB);
    }
}
