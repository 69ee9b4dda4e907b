//! The Database's instances and their roles: which instance is the primary (recorded in the
//! primary Lease and the status, never assumed from an ordinal afterwards), when it is lost
//! and which standby takes its place (failover), the role label each database pod must carry
//! (the Services select by it), whether the replication Secret must be made, and each
//! instance's line in the status.
//!
//! Pure: facts in (the database pods as the watch cache has them, their WAL positions, the
//! primary Lease), a plan out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use dbop_contract::position::{Lsn, Position, lag_bytes};
use dbop_contract::topology::Topology;
use kube::ResourceExt;

use crate::api::{Database, InstanceRole, InstanceStatus, WhenTooFew};
use crate::resources::Names;
use crate::resources::primary_lease::{LeaseFact, PROMOTE_ANNOTATION, has_standbys};
use crate::resources::replication::{needs_replication_secret, role_of};

use super::instances::TakeOver;
pub use super::instances::{
    PodFact, RolesFact, SECRETS_SEEN_ANNOTATION, VersionUpgrade, mounted_secrets,
};

/// A failover: the primary lost, the standby that takes its place, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    pub from: String,
    pub to: String,
    pub why: String,
    /// Why `to`: the WAL each candidate had received, or that none reported it.
    pub chosen: String,
    /// The lost primary's last renewal (or release) of its Lease, Unix milliseconds: what
    /// identifies this failover across operator restarts until the Lease designates `to`.
    pub since_ms: i64,
}

/// How often the instances' WAL positions are written to the status when nothing else about
/// the instances changed (they move with every write: a busy Database would otherwise have its
/// status rewritten, and be reconciled again, at every pass).
pub const POSITIONS_EVERY: Duration = Duration::from_secs(10);

/// When a Database with standbys is looked at again while its primary is not ready (its Lease
/// is released or runs out within seconds).
pub const LOOK_WHILE_PRIMARY_UNREADY: Duration = Duration::from_secs(1);
/// The longest wait between two looks at a Database with standbys: the primary's Lease is not
/// watched (its renewals would wake the operator every two seconds), it is looked at.
pub const LOOK_AT_LEASE_EVERY: Duration = Duration::from_secs(10);

/// The roles of one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolesPlan {
    /// The instance that runs as the primary.
    pub primary: String,
    /// Pods whose role label must be set, with the role.
    pub label_pods: Vec<(String, InstanceRole)>,
    /// Pods to tell about changed Secrets (`SECRETS_SEEN_ANNOTATION`), with the new versions.
    pub refresh_pods: Vec<(String, String)>,
    /// Make the replication Secret (the Database has standbys and none exists).
    pub create_replication_secret: bool,
    /// Every instance of the spec, in ordinal order.
    pub instances: Vec<InstanceStatus>,
    /// The primary was lost and `primary` is its replacement.
    pub failover: Option<Failover>,
    /// When to look again for the primary's Lease (`None`: no Lease to watch).
    pub look_again: Option<Duration>,
    /// The answer to a request to promote an instance (`PROMOTE_ANNOTATION`), which is then
    /// removed.
    pub promotion: Option<Promotion>,
    /// A switchover dbop starts itself: fewer instances would remove the primary, or a
    /// rollout has replaced every pod above it.
    pub handover: Option<Handover>,
    /// The StatefulSet partition that keeps the primary's pod for last in a rollout that is not
    /// a version upgrade (the primary's ordinal + 1: the pods above it go first), to be used
    /// while a rollout is under way or a new template is applied; `None`: every pod may go (a
    /// single instance, a primary already replaced, one that does not hold its Lease).
    pub primary_last_partition: Option<i32>,
    /// The StatefulSet's replicas: the spec's instances, or more while the primary that holds
    /// the Lease sits above them (a scale-down waits for its switchover).
    pub statefulset_replicas: i32,
    /// When the WAL positions in `instances` were read (`None`: no instance reported one).
    pub positions_read_at: Option<DateTime<Utc>>,
    /// The primary is lost but no standby is promoted yet, and why (synchronous replication
    /// that waits: not enough standbys' positions known to be sure none loses a commit).
    pub failover_waits: Option<String>,
}

/// A switchover dbop starts itself: `from`, the primary, hands over to `to`, a ready standby.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    pub from: String,
    pub to: String,
    pub why: HandoverWhy,
}

/// Why dbop switches over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandoverWhy {
    /// The new instance count removes the primary's ordinal.
    ScaleDown,
    /// A rollout replaced every pod above the primary; the primary's is next.
    Rollout,
    /// A version upgrade moved every pod above the primary to the new version; the primary's
    /// is next.
    Upgrade,
    /// The primary's node is cordoned: a drain is evicting its pods.
    NodeDrain,
}

/// The answer to `kubectl dbop promote`: a switchover to `to`, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    /// The instance that becomes the primary (`None`: refused, or it already is).
    pub to: Option<String>,
    /// What the Event says.
    pub note: String,
    /// Refused: a Warning Event.
    pub refused: bool,
}

/// The primary: the one the status records, else the first instance (a new Database).
pub fn primary(db: &Database) -> String {
    db.status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| Names::of(db).pod(0))
}

/// The primary the Lease designates, when it names one of the spec's instances: the Lease is
/// written before the status, so it wins when the two differ.
fn designated(db: &Database, lease: Option<&LeaseFact>) -> Option<String> {
    let topology = Topology::parse(lease?.topology.as_deref()?).ok()?;
    let names = Names::of(db);
    (0..db.spec.instances.max(1))
        .any(|o| names.pod(o) == topology.primary)
        .then_some(topology.primary)
}

/// The primary is lost (it released its Lease, or has not held it for the Lease's duration)
/// and a ready standby of the spec can take its place: the one that received the most WAL.
/// Only a primary whose manager follows the Lease (its pod runs as the instances' account) is
/// ever replaced: one started before the Lease existed would not fence itself.
fn failover(db: &Database, fact: &RolesFact, current: &str) -> Option<Result<Failover, String>> {
    let lease = fact.lease.as_ref().filter(|_| has_standbys(db))?;
    let names = Names::of(db);
    let account = names.instance_account();
    let fenced = |p: &PodFact| p.service_account.as_deref() == Some(account.as_str());
    // A primary pod that is gone (deleted, its node lost) no longer runs a manager either.
    if fact.pods.iter().any(|p| p.name == current && !fenced(p)) {
        return None;
    }
    let released = lease
        .state
        .released_by(current, lease.released_by.as_deref());
    if !released && !lease.state.lost(current, fact.now_ms) {
        return None;
    }
    let candidates: Vec<String> = (0..db.spec.instances)
        .map(|o| names.pod(o))
        .filter(|name| {
            name != current
                && fact
                    .pods
                    .iter()
                    .any(|p| &p.name == name && p.ready && fenced(p))
        })
        .collect();
    let on_cordoned_node: BTreeSet<String> = candidates
        .iter()
        .filter(|name| {
            fact.pods.iter().any(|p| {
                &p.name == *name
                    && p.node
                        .as_ref()
                        .is_some_and(|n| fact.cordoned_nodes.contains(n))
            })
        })
        .cloned()
        .collect();
    let (to, chosen) = most_advanced(&candidates, &fact.positions, &on_cordoned_node)?;
    if let Some(wait) = synchronous_quorum(db, fact, current, &to) {
        return Some(Err(wait));
    }
    let why = if released {
        format!("{current} released the primary Lease (its server stopped)")
    } else {
        format!(
            "{current} has not held the primary Lease for {} s (its node, pod or server is gone, or it cannot reach the API server)",
            lease.state.duration_ms / 1000
        )
    };
    Some(Ok(Failover {
        from: current.to_string(),
        to,
        why,
        chosen,
        since_ms: lease.state.renewed_ms.unwrap_or_default(),
    }))
}

/// With synchronous replication that waits (`spec.synchronous`, `Wait`), why promoting `to`
/// could lose an acknowledged commit, if it could. A commit was acknowledged once `n` of the
/// `m` standbys had it, so of any `m - n + 1` standbys at least one has it: the operator must
/// have heard the position of that many, and `to` must have received at least as much WAL as
/// every one of them (one that is not ready but further ahead is waited for, not skipped).
fn synchronous_quorum(db: &Database, fact: &RolesFact, current: &str, to: &str) -> Option<String> {
    let sync = db
        .spec
        .synchronous
        .as_ref()
        .filter(|s| s.when_too_few == WhenTooFew::Wait)?;
    let names = Names::of(db);
    let standbys: Vec<String> = (0..db.spec.instances)
        .map(|o| names.pod(o))
        .filter(|n| n != current)
        .collect();
    let heard: Vec<(&String, Lsn)> = standbys
        .iter()
        .filter_map(|n| {
            let p = fact.positions.get(n).filter(|p| p.standby)?;
            Some((n, p.lsn?))
        })
        .collect();
    let need = (standbys.len() as i32 - sync.standbys + 1).max(1) as usize;
    if heard.len() < need {
        return Some(format!(
            "a failover waits: with synchronous replication (any {} of {} standbys confirm a commit), the WAL positions of {need} standbys are needed to be sure to promote one with every acknowledged commit, and {} answered",
            sync.standbys,
            standbys.len(),
            heard.len()
        ));
    }
    let most = heard.iter().map(|(_, lsn)| *lsn).max()?;
    let at = heard
        .iter()
        .find(|(n, _)| n.as_str() == to)
        .map(|(_, l)| *l);
    if at < Some(most) {
        let ahead = heard
            .iter()
            .find(|(_, l)| *l == most)
            .map(|(n, _)| n.as_str());
        return Some(format!(
            "a failover waits: {} has received more WAL ({most}) than any ready standby; it must be ready to be promoted",
            ahead.unwrap_or_default()
        ));
    }
    None
}

/// Of `candidates` (in ordinal order), the one that received the most WAL: a promotion keeps
/// what it received, so any other choice would discard commits a standby has. One that does not
/// report its position ranks below every one that does; among equals, one whose node is not
/// cordoned (a drain would move the new primary again at once), then the lowest ordinal. With
/// the reason, worded for the Event.
fn most_advanced(
    candidates: &[String],
    positions: &BTreeMap<String, Position>,
    on_cordoned_node: &BTreeSet<String>,
) -> Option<(String, String)> {
    let lsn = |name: &String| -> Option<Lsn> {
        positions
            .get(name)
            .filter(|p| p.standby)
            .and_then(|p| p.lsn)
    };
    let to = candidates
        .iter()
        .enumerate()
        .max_by_key(|(i, name)| {
            let schedulable = !on_cordoned_node.contains(*name);
            (lsn(name), schedulable, std::cmp::Reverse(*i))
        })
        .map(|(_, name)| name.clone())?;
    let each = candidates
        .iter()
        .map(|name| match lsn(name) {
            Some(at) => format!("{name} {at}"),
            None => format!("{name} unknown"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut chosen = match lsn(&to) {
        Some(_) if candidates.len() == 1 => "the only ready standby".to_string(),
        Some(_) => format!("the most WAL received ({each})"),
        None => format!("the first ready standby (no standby reported its WAL position: {each})"),
    };
    let passed_over: Vec<&str> = candidates
        .iter()
        .filter(|n| **n != to && lsn(n) == lsn(&to) && on_cordoned_node.contains(*n))
        .map(String::as_str)
        .collect();
    if !passed_over.is_empty() {
        chosen += &format!(
            "; not {}, as much WAL but on a cordoned node",
            passed_over.join(", ")
        );
    }
    Some((to, chosen))
}

/// A request to promote `requested` (`PROMOTE_ANNOTATION`) while `current` is the primary: a
/// switchover when the current primary holds its Lease and `requested` is a ready standby that
/// follows it. The old primary then stops (a fast shutdown sends its standbys all of its WAL)
/// and releases the Lease, which the new one takes before it promotes: no commit is lost and
/// no write is accepted by two servers.
fn promotion(db: &Database, fact: &RolesFact, current: &str) -> Option<Promotion> {
    let requested = db.annotations().get(PROMOTE_ANNOTATION)?.trim().to_string();
    let refuse = |why: String| Promotion {
        to: None,
        note: format!("cannot promote {requested:?}: {why}"),
        refused: true,
    };
    let names = Names::of(db);
    let account = names.instance_account();
    let pod = |name: &str| fact.pods.iter().find(|p| p.name == name);
    let follows = |name: &str| {
        pod(name).is_some_and(|p| p.service_account.as_deref() == Some(account.as_str()))
    };
    let holds = fact.lease.as_ref().is_some_and(|l| {
        l.state.holder.as_deref() == Some(current) && !l.state.lost(current, fact.now_ms)
    });
    Some(if requested == current {
        Promotion {
            to: None,
            note: format!("{requested} is the primary already"),
            refused: false,
        }
    } else if !(0..db.spec.instances).any(|o| names.pod(o) == requested) {
        refuse(format!(
            "it is not one of the {} instances of {}",
            db.spec.instances,
            db.name()
        ))
    } else if !pod(&requested).is_some_and(|p| p.ready) {
        refuse("it is not a ready, streaming standby".into())
    } else if !holds || !follows(current) {
        refuse(format!(
            "the primary {current} does not hold its primary Lease now (a failover is under way, or it runs a manager that predates the Lease)"
        ))
    } else if !follows(&requested) {
        refuse(
            "its pod predates the primary Lease (its template is rebuilt at the next spec change)"
                .into(),
        )
    } else if fact.take_over(&requested, current, &account) == TakeOver::NotYet {
        // Asked again at the next look (soon: `look_again`).
        return None;
    } else if !fact.can_take_over(&requested, current, &account) {
        refuse(format!(
            "its manager does not report it streaming from {current} (a former primary that has not rejoined, or on another timeline; its pod may look ready after its node came back)"
        ))
    } else {
        Promotion {
            to: Some(requested.clone()),
            note: format!(
                "switching over from {current} to {requested}: {current} stops after sending its standbys all of its WAL, then {requested} is promoted"
            ),
            refused: false,
        }
    })
}

/// The primary holds its Lease from an ordinal at or above the spec's instances (a scale-down,
/// after a failover made a high ordinal the primary): it hands over to the lowest ready standby
/// that stays, by a switchover, before the StatefulSet removes its pod. The old primary sends
/// its standbys all of its WAL and releases the Lease; only then does the StatefulSet shrink.
/// Not to a single instance: a lone primary does not wait for a Lease, so the old one must be
/// gone first (the StatefulSet removes it, and the remaining instance is promoted).
fn handover(db: &Database, fact: &RolesFact, current: &str) -> Option<Handover> {
    let names = Names::of(db);
    let stays = |name: &str| (0..db.spec.instances).any(|o| names.pod(o) == name);
    if !has_standbys(db) || stays(current) || !holds_lease(fact, current) {
        return None;
    }
    let account = names.instance_account();
    let to = (0..db.spec.instances)
        .map(|o| names.pod(o))
        .find(|name| fact.can_take_over(name, current, &account))?;
    Some(Handover {
        from: current.to_string(),
        to,
        why: HandoverWhy::ScaleDown,
    })
}

/// The primary holds its Lease on a cordoned node (`kubectl drain` cordons first, then evicts,
/// and the primary's PodDisruptionBudget refuses to let it go): it hands over to the lowest
/// ready standby on a node that is not cordoned, by a switchover, so that the drain's next try
/// evicts it as a standby. With no such standby it stays the primary, and the drain waits.
fn drain_handover(db: &Database, fact: &RolesFact, current: &str) -> Option<Handover> {
    if !has_standbys(db) || !holds_lease(fact, current) {
        return None;
    }
    let names = Names::of(db);
    let account = names.instance_account();
    let pod = |name: &str| fact.pods.iter().find(|p| p.name == name);
    let cordoned = |p: &PodFact| {
        p.node
            .as_ref()
            .is_some_and(|n| fact.cordoned_nodes.contains(n))
    };
    if !pod(current).is_some_and(cordoned) {
        return None;
    }
    let to = (0..db.spec.instances).map(|o| names.pod(o)).find(|name| {
        name != current
            && fact.can_take_over(name, current, &account)
            && pod(name).is_some_and(|p| !cordoned(p))
    })?;
    Some(Handover {
        from: current.to_string(),
        to,
        why: HandoverWhy::NodeDrain,
    })
}

/// A rollout replaces the primary's pod last: the partition holds it while the pods above it
/// move to the new revision; once those are ready, the primary hands over to the lowest of them
/// by a switchover (or, when no pod is above it, to the lowest ready standby, which is then
/// held in its turn), and once the old primary has released its Lease to a primary on the new
/// revision, every other pod may go. A version upgrade's rollout too (its own partition moves
/// down one ordinal at a time; the StatefulSet gets the higher of the two), but not its other
/// stages, which place the pods themselves. Only a Lease holder is held back: a primary that
/// lost or never took its Lease is a failover's business, and the rollout replaces it as the
/// StatefulSet would.
fn primary_last(db: &Database, fact: &RolesFact, current: &str) -> (Option<i32>, Option<Handover>) {
    let names = Names::of(db);
    let holder = fact
        .lease
        .as_ref()
        .and_then(|l| l.state.holder.clone())
        .filter(|h| holds_lease(fact, h));
    let places_pods = fact.version_upgrade == VersionUpgrade::PlacesPods;
    let (Some(holder), true, false) = (holder, has_standbys(db), places_pods) else {
        return (None, None);
    };
    let Some(ordinal) = names.ordinal_of(&holder) else {
        return (None, None);
    };
    let partition = Some(ordinal + 1);
    let Some(target) = fact.rolling_to.as_deref() else {
        return (partition, None);
    };
    let pod = |name: &str| fact.pods.iter().find(|p| p.name == name);
    let updated = |name: &str| pod(name).is_some_and(|p| p.revision.as_deref() == Some(target));
    if updated(&holder) {
        return (None, None);
    }
    if holder != current {
        // A switchover under way: the old primary's pod waits until it has released the Lease.
        return (partition, None);
    }
    let account = names.instance_account();
    let ready_follower = |name: &str| fact.can_take_over(name, current, &account);
    let above: Vec<String> = (ordinal + 1..db.spec.instances)
        .map(|o| names.pod(o))
        .collect();
    if !above.iter().all(|n| updated(n) && ready_follower(n)) {
        return (partition, None);
    }
    let to = above.first().cloned().or_else(|| {
        (0..ordinal)
            .map(|o| names.pod(o))
            .find(|n| ready_follower(n))
    });
    let why = match fact.version_upgrade {
        VersionUpgrade::RollingOut => HandoverWhy::Upgrade,
        VersionUpgrade::None | VersionUpgrade::PlacesPods => HandoverWhy::Rollout,
    };
    let handover = to.map(|to| Handover {
        from: current.to_string(),
        to,
        why,
    });
    (partition, handover)
}

/// `primary` holds the Lease and has renewed it in time.
fn holds_lease(fact: &RolesFact, primary: &str) -> bool {
    fact.lease.as_ref().is_some_and(|l| {
        l.state.holder.as_deref() == Some(primary) && !l.state.lost(primary, fact.now_ms)
    })
}

/// The StatefulSet's replicas: the spec's, or up to the Lease holder's ordinal while it holds
/// the Lease above them, so that the pod of a primary is never removed before it handed over.
fn statefulset_replicas(db: &Database, fact: &RolesFact) -> i32 {
    let names = Names::of(db);
    let holder = fact
        .lease
        .as_ref()
        .and_then(|l| l.state.holder.clone())
        .filter(|h| has_standbys(db) && holds_lease(fact, h));
    let holder_ordinal = holder.and_then(|h| names.ordinal_of(&h));
    holder_ordinal.map_or(db.spec.instances, |o| (o + 1).max(db.spec.instances))
}

/// When to look at the Lease again: soon while the primary is not ready, else when it would
/// be lost if it stopped renewing now.
fn look_again(db: &Database, fact: &RolesFact, primary: &str) -> Option<Duration> {
    let lease = fact.lease.as_ref().filter(|_| has_standbys(db))?;
    let primary_ready = fact.pods.iter().any(|p| p.name == primary && p.ready);
    if !primary_ready {
        return Some(LOOK_WHILE_PRIMARY_UNREADY);
    }
    let until = lease.state.lost_at(primary) - fact.now_ms + 1_000;
    let until = Duration::from_millis(until.max(0) as u64);
    Some(until.clamp(LOOK_WHILE_PRIMARY_UNREADY, LOOK_AT_LEASE_EVERY))
}

/// The roles for `db` given its pods.
pub fn plan(db: &Database, fact: &RolesFact) -> RolesPlan {
    let current = designated(db, fact.lease.as_ref()).unwrap_or_else(|| primary(db));
    let (failover, failover_waits) = match failover(db, fact, &current) {
        Some(Ok(f)) => (Some(f), None),
        Some(Err(wait)) => (None, Some(wait)),
        None => (None, None),
    };
    let promotion = promotion(db, fact, &current);
    let (primary_last_partition, rollout_handover) = primary_last(db, fact, &current);
    let handover = handover(db, fact, &current)
        .or_else(|| drain_handover(db, fact, &current))
        .or(rollout_handover)
        .filter(|_| failover.is_none() && promotion.is_none());
    let switched = promotion
        .as_ref()
        .and_then(|p| p.to.clone())
        .or_else(|| handover.as_ref().map(|h| h.to.clone()))
        .filter(|_| failover.is_none());
    let primary = match (&failover, switched) {
        (Some(f), _) => f.to.clone(),
        (None, Some(to)) => to,
        (None, None) => current,
    };
    let label_pods = fact
        .pods
        .iter()
        .map(|p| (p, role_of(&p.name, &primary)))
        .filter(|(p, role)| p.role_label.as_deref() != Some(role.label()))
        .map(|(p, role)| (p.name.clone(), role))
        .collect();
    let refresh_pods = fact
        .pods
        .iter()
        .filter(|_| !fact.mounted_secrets.is_empty())
        .filter(|p| p.secrets_seen.as_deref() != Some(fact.mounted_secrets.as_str()))
        .map(|p| (p.name.clone(), fact.mounted_secrets.clone()))
        .collect();
    let (instances, positions_read_at) = instances(db, fact, &primary);
    RolesPlan {
        create_replication_secret: needs_replication_secret(db) && !fact.replication_secret,
        label_pods,
        refresh_pods,
        instances,
        look_again: if promotion.is_none() && db.annotations().contains_key(PROMOTE_ANNOTATION) {
            Some(LOOK_WHILE_PRIMARY_UNREADY)
        } else {
            look_again(db, fact, &primary)
        },
        failover,
        promotion,
        handover,
        primary_last_partition,
        statefulset_replicas: statefulset_replicas(db, fact),
        primary,
        positions_read_at,
        failover_waits,
    }
}

/// Every instance's status line, and when the positions in it were read. The positions are
/// this pass's when anything else about the instances changed or the last ones are
/// `POSITIONS_EVERY` old; else the status's own are kept (with their time).
fn instances(
    db: &Database,
    fact: &RolesFact,
    primary: &str,
) -> (Vec<InstanceStatus>, Option<DateTime<Utc>>) {
    let names = Names::of(db);
    let lines: Vec<InstanceStatus> = (0..db.spec.instances.max(1))
        .map(|ordinal| {
            let name = names.pod(ordinal);
            let pod = fact.pods.iter().find(|p| p.name == name);
            InstanceStatus {
                role: role_of(&name, primary),
                ready: pod.is_some_and(|p| p.ready),
                node: pod.and_then(|p| p.node.clone()),
                name,
                ..InstanceStatus::default()
            }
        })
        .collect();
    let status = db.status.clone().unwrap_or_default();
    let without_positions = |l: &InstanceStatus| InstanceStatus {
        name: l.name.clone(),
        role: l.role,
        ready: l.ready,
        node: l.node.clone(),
        ..InstanceStatus::default()
    };
    let unchanged = status
        .instances
        .iter()
        .map(without_positions)
        .eq(lines.iter().cloned());
    let recent = status
        .positions_read_at
        .is_some_and(|at| fact.now_ms - at.timestamp_millis() < POSITIONS_EVERY.as_millis() as i64);
    if unchanged && recent {
        return (status.instances, status.positions_read_at);
    }
    let primary_report = fact.positions.get(primary).filter(|p| !p.standby);
    let primary_at = primary_report.and_then(|p| p.lsn);
    let lines = lines
        .into_iter()
        .map(|line| match fact.positions.get(&line.name) {
            Some(p) => InstanceStatus {
                timeline: p.timeline,
                lsn: p.lsn.map(|l| l.to_string()),
                replayed_lsn: p.replayed.map(|l| l.to_string()),
                lag_bytes: primary_at
                    .zip(p.replayed.filter(|_| p.standby))
                    .map(|(primary, replayed)| lag_bytes(primary, replayed)),
                lag_milliseconds: primary_report
                    .and_then(|r| r.replay_lag_ms.get(&line.name).copied()),
                sync_state: primary_report.and_then(|r| r.sync_states.get(&line.name).cloned()),
                ..line
            },
            None => line,
        })
        .collect();
    let read_at = (!fact.positions.is_empty())
        .then(|| DateTime::from_timestamp_millis(fact.now_ms))
        .flatten();
    (lines, read_at)
}

/// The instances that are not ready, worded for a condition (`orders-1 (standby)`).
pub fn not_ready(plan: &RolesPlan) -> Vec<String> {
    plan.instances
        .iter()
        .filter(|i| !i.ready)
        .map(|i| format!("{} ({})", i.name, i.role.label()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::resources::testing;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str, label: Option<&str>, ready: bool) -> PodFact {
        PodFact {
            name: name.into(),
            role_label: label.map(Into::into),
            ready,
            node: Some("node-a".into()),
            service_account: Some("orders-instance".into()),
            secrets_seen: None,
            revision: None,
        }
    }

    fn three() -> Database {
        let mut db = testing::minimal();
        db.spec.instances = 3;
        db
    }

    #[test]
    fn a_new_database_makes_its_first_instance_primary_and_labels_every_pod() {
        let fact = RolesFact {
            pods: vec![pod("orders-0", None, true), pod("orders-1", None, false)],
            replication_secret: false,
            ..RolesFact::default()
        };
        let plan = plan(&three(), &fact);
        assert_eq!(plan.primary, "orders-0");
        assert_eq!(
            plan.label_pods,
            [
                ("orders-0".to_string(), InstanceRole::Primary),
                ("orders-1".to_string(), InstanceRole::Standby)
            ]
        );
        assert!(plan.create_replication_secret);
        let lines: Vec<_> = plan
            .instances
            .iter()
            .map(|i| (i.name.as_str(), i.role, i.ready))
            .collect();
        assert_eq!(
            lines,
            [
                ("orders-0", InstanceRole::Primary, true),
                ("orders-1", InstanceRole::Standby, false),
                ("orders-2", InstanceRole::Standby, false),
            ]
        );
        assert_eq!(
            not_ready(&plan),
            ["orders-1 (standby)", "orders-2 (standby)"]
        );
    }

    #[test]
    fn the_recorded_primary_wins_over_the_ordinal_and_right_labels_are_left_alone() {
        let mut db = three();
        db.status = Some(DatabaseStatus {
            primary: Some("orders-2".into()),
            ..DatabaseStatus::default()
        });
        let fact = RolesFact {
            pods: vec![
                pod("orders-0", Some("standby"), true),
                pod("orders-1", Some("primary"), true),
                pod("orders-2", Some("standby"), true),
            ],
            replication_secret: true,
            ..RolesFact::default()
        };
        let plan = plan(&db, &fact);
        assert_eq!(plan.primary, "orders-2");
        assert_eq!(
            plan.label_pods,
            [
                ("orders-1".to_string(), InstanceRole::Standby),
                ("orders-2".to_string(), InstanceRole::Primary)
            ]
        );
        assert!(!plan.create_replication_secret);
        assert!(not_ready(&plan).is_empty());
    }

    #[test]
    fn a_single_instance_needs_no_replication_secret_and_a_settled_one_no_write() {
        let fact = RolesFact {
            pods: vec![pod("orders-0", Some("primary"), true)],
            replication_secret: false,
            ..RolesFact::default()
        };
        let plan = plan(&testing::minimal(), &fact);
        assert!(plan.label_pods.is_empty());
        assert!(!plan.create_replication_secret);
        assert_eq!(plan.instances.len(), 1);
    }

    #[test]
    fn a_pod_being_deleted_is_not_ready() {
        let mut p = Pod::default();
        p.metadata.name = Some("orders-0".into());
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(PodFact::of(&p).ready);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!PodFact::of(&p).ready);
    }

    fn leased(
        holder: Option<&str>,
        renewed: i64,
        primary: &str,
        released_by: Option<&str>,
    ) -> LeaseFact {
        let db = three();
        LeaseFact {
            state: dbop_contract::lease::LeaseState {
                holder: holder.map(Into::into),
                renewed_ms: Some(renewed),
                duration_ms: 10_000,
                designated_ms: Some(0),
            },
            released_by: released_by.map(Into::into),
            topology: Some(crate::resources::replication::topology(&db, primary).render()),
        }
    }

    fn with_lease(lease: LeaseFact, now_ms: i64, ready: [bool; 3]) -> RolesFact {
        RolesFact {
            pods: (0..3)
                .map(|n| pod(&format!("orders-{n}"), None, ready[n]))
                .collect(),
            replication_secret: true,
            lease: Some(lease),
            now_ms,
            ..RolesFact::default()
        }
    }

    fn standby_at(lsn: u64) -> Position {
        Position {
            standby: true,
            timeline: Some(1),
            lsn: Some(Lsn(lsn)),
            replayed: Some(Lsn(lsn)),
            ..Position::default()
        }
    }

    #[test]
    fn a_failover_promotes_the_standby_that_received_the_most_wal() {
        // orders-0 released the Lease; orders-1 (the lowest ordinal) fell behind.
        let released = leased(None, 100_000, "orders-0", Some("orders-0"));
        let mut fact = with_lease(released, 100_500, [false, true, true]);
        fact.positions = [
            ("orders-1".to_string(), standby_at(0x3000000)),
            ("orders-2".to_string(), standby_at(0x3000148)),
        ]
        .into();
        let failover = plan(&three(), &fact).failover.expect("a failover");
        assert_eq!(failover.to, "orders-2");
        assert_eq!(
            failover.chosen,
            "the most WAL received (orders-1 0/3000000, orders-2 0/3000148)"
        );
        // Equal: the lowest ordinal. One that does not report ranks below one that does.
        fact.positions
            .insert("orders-1".into(), standby_at(0x3000148));
        assert_eq!(plan(&three(), &fact).failover.unwrap().to, "orders-1");
        fact.positions.remove("orders-1");
        let failover = plan(&three(), &fact).failover.unwrap();
        assert_eq!(failover.to, "orders-2");
        assert!(
            failover.chosen.contains("orders-1 unknown"),
            "{}",
            failover.chosen
        );
        // Equal, but the lowest ordinal's node is cordoned: the other one. More WAL on a
        // cordoned node still wins (a drain then hands over again; commits are not discarded).
        fact.positions
            .insert("orders-1".into(), standby_at(0x3000148));
        fact.pods[1].node = Some("node-cordoned".into());
        fact.cordoned_nodes = ["node-cordoned".to_string()].into();
        let failover = plan(&three(), &fact).failover.unwrap();
        assert_eq!(failover.to, "orders-2");
        assert!(
            failover
                .chosen
                .ends_with("; not orders-1, as much WAL but on a cordoned node"),
            "{}",
            failover.chosen
        );
        fact.positions
            .insert("orders-1".into(), standby_at(0x3000200));
        assert_eq!(plan(&three(), &fact).failover.unwrap().to, "orders-1");
        fact.cordoned_nodes.clear();
        fact.positions.remove("orders-1");
        // A server that says it is no standby (promoted on its own?) is no candidate by WAL.
        fact.positions.insert(
            "orders-2".into(),
            Position {
                standby: false,
                ..standby_at(0x9000000)
            },
        );
        let failover = plan(&three(), &fact).failover.unwrap();
        assert_eq!(failover.to, "orders-1");
        assert!(
            failover.chosen.starts_with("the first ready standby"),
            "{}",
            failover.chosen
        );
        // Not ready: no candidate, however far it got.
        fact.positions = [("orders-2".to_string(), standby_at(0x9000000))].into();
        fact.pods[2].ready = false;
        let failover = plan(&three(), &fact).failover.unwrap();
        assert_eq!(
            (failover.to.as_str(), failover.chosen.as_str()),
            (
                "orders-1",
                "the first ready standby (no standby reported its WAL position: orders-1 unknown)"
            )
        );
    }

    #[test]
    fn a_synchronous_failover_waits_until_it_is_sure_to_keep_every_acknowledged_commit() {
        let mut db = three();
        db.spec.synchronous = Some(crate::api::SynchronousSpec {
            standbys: 1,
            when_too_few: WhenTooFew::Wait,
        });
        let released = leased(None, 100_000, "orders-0", Some("orders-0"));
        let mut fact = with_lease(released, 100_500, [false, true, true]);
        // Any 1 of 2 confirms: both standbys' positions are needed.
        fact.positions = [("orders-2".to_string(), standby_at(0x3000148))].into();
        let waiting = plan(&db, &fact);
        assert_eq!(
            (waiting.failover, waiting.primary.as_str()),
            (None, "orders-0")
        );
        let why = waiting.failover_waits.expect("says why");
        assert!(
            why.contains("the WAL positions of 2 standbys are needed")
                && why.contains("1 answered"),
            "{why}"
        );
        fact.positions
            .insert("orders-1".into(), standby_at(0x3000000));
        let failover = plan(&db, &fact).failover.expect("both heard");
        assert_eq!(failover.to, "orders-2");
        // The one further ahead is not ready: waited for, not skipped.
        fact.positions
            .insert("orders-1".into(), standby_at(0x4000000));
        fact.pods[1].ready = false;
        let waiting = plan(&db, &fact);
        assert_eq!(waiting.failover, None);
        assert!(
            waiting
                .failover_waits
                .unwrap()
                .contains("orders-1 has received more WAL (0/4000000)")
        );
        // Any 2 of 2: each standby has every acknowledged commit, one position is enough.
        db.spec.synchronous.as_mut().unwrap().standbys = 2;
        fact.positions.remove("orders-1");
        assert_eq!(plan(&db, &fact).failover.unwrap().to, "orders-2");
        // Degrade: no promise to keep, no wait.
        db.spec.synchronous = Some(crate::api::SynchronousSpec {
            standbys: 1,
            when_too_few: WhenTooFew::Degrade,
        });
        fact.positions.clear();
        let degraded = plan(&db, &fact);
        assert_eq!(
            (
                degraded.failover.unwrap().to.as_str(),
                degraded.failover_waits
            ),
            ("orders-2", None)
        );
    }

    #[test]
    fn positions_and_lag_reach_the_status_at_most_every_ten_seconds_unless_the_instances_change() {
        let holding = leased(Some("orders-0"), 100_000, "orders-0", None);
        let mut fact = with_lease(holding, 101_000, [true; 3]);
        fact.positions = [
            (
                "orders-0".to_string(),
                Position {
                    standby: false,
                    timeline: Some(2),
                    lsn: Some(Lsn(0x5000000)),
                    replay_lag_ms: [("orders-1".to_string(), 7)].into(),
                    sync_states: [("orders-1".to_string(), "quorum".to_string())].into(),
                    ..Position::default()
                },
            ),
            ("orders-1".to_string(), standby_at(0x4FFFF00)),
        ]
        .into();
        let mut db = three();
        let first = plan(&db, &fact);
        assert_eq!(
            first.positions_read_at.map(|t| t.timestamp_millis()),
            Some(101_000)
        );
        let sync_states: Vec<_> = first
            .instances
            .iter()
            .map(|i| i.sync_state.as_deref())
            .collect();
        assert_eq!(sync_states, [None, Some("quorum"), None]);
        let line = |p: &RolesPlan, i: usize| {
            let l = &p.instances[i];
            (
                l.timeline,
                l.lsn.clone(),
                l.replayed_lsn.clone(),
                l.lag_bytes,
            )
        };
        assert_eq!(
            line(&first, 0),
            (Some(2), Some("0/5000000".into()), None, None)
        );
        assert_eq!(
            line(&first, 1),
            (
                Some(1),
                Some("0/4FFFF00".into()),
                Some("0/4FFFF00".into()),
                Some(0x100)
            )
        );
        assert_eq!(
            line(&first, 2),
            (None, None, None, None),
            "orders-2 did not answer"
        );
        // Written; 5 s later the WAL moved, nothing else did: the status keeps what it has.
        db.status = Some(DatabaseStatus {
            instances: first.instances.clone(),
            positions_read_at: first.positions_read_at,
            ..DatabaseStatus::default()
        });
        fact.now_ms += 5_000;
        fact.positions
            .insert("orders-1".into(), standby_at(0x5000000));
        let quiet = plan(&db, &fact);
        assert_eq!(
            (&quiet.instances, quiet.positions_read_at),
            (&first.instances, first.positions_read_at)
        );
        // A standby's readiness changes: everything is this pass's.
        fact.pods[2].ready = false;
        let changed = plan(&db, &fact);
        assert_eq!(line(&changed, 1).3, Some(0));
        assert!(!changed.instances[2].ready);
        // Or ten seconds pass.
        fact.pods[2].ready = true;
        fact.now_ms += 5_000;
        let later = plan(&db, &fact);
        assert_eq!(line(&later, 1).1, Some("0/5000000".into()));
        assert_eq!(
            later.positions_read_at.map(|t| t.timestamp_millis()),
            Some(111_000)
        );
        // Nobody reports (kwok, older managers): no positions, no time.
        fact.positions.clear();
        let none = plan(&db, &fact);
        assert_eq!(
            (line(&none, 1), none.positions_read_at),
            ((None, None, None, None), None)
        );
    }

    #[test]
    fn pods_are_told_when_a_mounted_secret_changes_and_only_then() {
        let db = three();
        let secret = |name: &str, version: &str| {
            let mut s = k8s_openapi::api::core::v1::Secret::default();
            s.metadata.name = Some(name.into());
            s.metadata.resource_version = Some(version.into());
            s
        };
        let (credentials, accounts) = (
            secret("orders-credentials", "7"),
            secret("orders-accounts", "9"),
        );
        let versions = mounted_secrets(&[Some(&credentials), None, Some(&accounts)]);
        assert_eq!(versions, "orders-credentials=7,orders-accounts=9");
        let mut fact = RolesFact {
            pods: (0..3)
                .map(|n| pod(&format!("orders-{n}"), None, true))
                .collect(),
            mounted_secrets: versions.clone(),
            ..RolesFact::default()
        };
        fact.pods[1].secrets_seen = Some(versions.clone());
        fact.pods[2].secrets_seen = Some("orders-credentials=6,orders-accounts=9".into());
        let told: Vec<_> = plan(&db, &fact).refresh_pods;
        assert_eq!(
            told,
            vec![
                ("orders-0".to_string(), versions.clone()),
                ("orders-2".to_string(), versions.clone())
            ],
            "the pod that never heard and the one that heard of an older password"
        );
        for pod in &mut fact.pods {
            pod.secrets_seen = Some(versions.clone());
        }
        assert!(
            plan(&db, &fact).refresh_pods.is_empty(),
            "nothing changed: no write"
        );
        fact.mounted_secrets = mounted_secrets(&[None]);
        assert!(
            plan(&db, &fact).refresh_pods.is_empty(),
            "no Secret observed yet: nothing to tell"
        );
    }

    /// Three instances whose primary is orders-2 (after a failover), scaled down to `to`.
    fn scaled_down_from_orders_2(to: i32) -> Database {
        let mut db = three();
        db.spec.instances = to;
        db.status = Some(DatabaseStatus {
            primary: Some("orders-2".into()),
            ..DatabaseStatus::default()
        });
        db
    }

    #[test]
    fn a_scale_down_past_the_primary_switches_over_first_and_keeps_its_pod_until_then() {
        let db = scaled_down_from_orders_2(2);
        // orders-2 holds the Lease; orders-0 is not ready, orders-1 is.
        let holding = leased(Some("orders-2"), 100_000, "orders-2", None);
        let fact = with_lease(holding, 104_000, [false, true, true]);
        let plan = plan(&db, &fact);
        assert_eq!(
            plan.handover,
            Some(Handover {
                from: "orders-2".into(),
                to: "orders-1".into(),
                why: HandoverWhy::ScaleDown,
            })
        );
        assert_eq!(plan.primary, "orders-1", "the Lease designates the standby");
        assert_eq!(plan.failover, None);
        assert_eq!(plan.statefulset_replicas, 3, "orders-2's pod stays");

        // Designated: the old primary still holds the Lease until its server has stopped.
        let mut designated = leased(Some("orders-2"), 105_000, "orders-1", None);
        designated.state.designated_ms = Some(104_500);
        let fact = with_lease(designated, 106_000, [false, true, true]);
        let next = super::plan(&db, &fact);
        assert_eq!(next.handover, None, "asked once");
        assert_eq!(next.primary, "orders-1");
        assert_eq!(next.statefulset_replicas, 3);

        // Released: the StatefulSet may remove orders-2.
        let released = leased(None, 107_000, "orders-1", Some("orders-2"));
        let fact = with_lease(released, 107_500, [false, true, true]);
        assert_eq!(super::plan(&db, &fact).statefulset_replicas, 2);
        let taken = leased(Some("orders-1"), 108_000, "orders-1", None);
        let fact = with_lease(taken, 108_500, [false, true, false]);
        assert_eq!(super::plan(&db, &fact).statefulset_replicas, 2);
    }

    /// Three instances whose primary `primary` holds its Lease, the StatefulSet rolling to
    /// `rolling_to`, each pod on the revision given.
    fn rolling(primary: &str, rolling_to: Option<&str>, revisions: [&str; 3]) -> RolesFact {
        let mut fact = with_lease(
            leased(Some(primary), 100_000, primary, None),
            104_000,
            [true; 3],
        );
        for (pod, revision) in fact.pods.iter_mut().zip(revisions) {
            pod.revision = Some(revision.into());
        }
        fact.rolling_to = rolling_to.map(Into::into);
        fact
    }

    #[test]
    fn a_rollout_replaces_the_pods_above_the_primary_then_switches_over_then_the_rest() {
        let db = three();
        let at = |fact: &RolesFact| {
            let plan = plan(&db, fact);
            (
                plan.primary_last_partition,
                plan.handover.map(|h| (h.to, h.why)),
            )
        };
        // Nothing rolling: the partition a new template is applied with.
        assert_eq!(at(&rolling("orders-0", None, ["r1"; 3])), (Some(1), None));
        // Rolling: the pods above the primary first.
        let started = rolling("orders-0", Some("r2"), ["r1", "r1", "r1"]);
        assert_eq!(at(&started), (Some(1), None));
        let mut halfway = rolling("orders-0", Some("r2"), ["r1", "r1", "r2"]);
        assert_eq!(at(&halfway), (Some(1), None));
        // Above it all new but one not ready: wait.
        halfway.pods[1].revision = Some("r2".into());
        halfway.pods[1].ready = false;
        assert_eq!(at(&halfway), (Some(1), None));
        // All new and ready: hand over to the lowest of them.
        let above_done = rolling("orders-0", Some("r2"), ["r1", "r2", "r2"]);
        assert_eq!(
            at(&above_done),
            (
                Some(1),
                Some(("orders-1".to_string(), HandoverWhy::Rollout))
            )
        );
        assert_eq!(plan(&db, &above_done).primary, "orders-1");
        // Designated, but orders-0 still holds the Lease (its server is stopping): its pod waits.
        let mut handing = rolling("orders-0", Some("r2"), ["r1", "r2", "r2"]);
        let lease = handing.lease.as_mut().unwrap();
        lease.topology = Some(crate::resources::replication::topology(&db, "orders-1").render());
        lease.state.designated_ms = Some(103_000);
        assert_eq!(plan(&db, &handing).primary, "orders-1");
        assert_eq!(at(&handing), (Some(1), None));
        // The new primary holds the Lease and runs the new revision: every other pod may go.
        assert_eq!(
            at(&rolling("orders-1", Some("r2"), ["r1", "r2", "r2"])),
            (None, None)
        );
    }

    #[test]
    fn a_primary_at_the_top_hands_over_down_first_and_only_a_held_lease_is_waited_for() {
        let db = three();
        let top = rolling("orders-2", Some("r2"), ["r1", "r1", "r1"]);
        let plan_top = plan(&db, &top);
        assert_eq!(plan_top.primary_last_partition, Some(3), "no pod moves yet");
        assert_eq!(
            plan_top.handover.map(|h| (h.from, h.to)),
            Some(("orders-2".to_string(), "orders-0".to_string()))
        );
        // Then orders-0 is held in its turn, and the pods above it (orders-2 among them) go.
        let next = rolling("orders-0", Some("r2"), ["r1", "r1", "r1"]);
        assert_eq!(plan(&db, &next).primary_last_partition, Some(1));
        // A version upgrade's other stages place the pods themselves.
        let mut upgrading = started_rollout();
        upgrading.version_upgrade = VersionUpgrade::PlacesPods;
        let p = plan(&db, &upgrading);
        assert_eq!((p.primary_last_partition, p.handover), (None, None));
        // A primary that lost its Lease is not held back (it is a failover's business).
        let lost = RolesFact {
            now_ms: 120_000,
            ..started_rollout()
        };
        assert_eq!(plan(&db, &lost).primary_last_partition, None);
        // One instance: nothing to switch over to.
        let single = testing::minimal();
        assert_eq!(
            plan(&single, &started_rollout()).primary_last_partition,
            None
        );
    }

    fn started_rollout() -> RolesFact {
        rolling("orders-0", Some("r2"), ["r1", "r1", "r1"])
    }

    #[test]
    fn a_primary_on_a_cordoned_node_hands_over_to_a_ready_standby_on_another_node() {
        let db = three();
        let on_nodes = |ready: [bool; 3], nodes: [&str; 3], cordoned: &[&str]| {
            let mut fact = with_lease(
                leased(Some("orders-0"), 100_000, "orders-0", None),
                104_000,
                ready,
            );
            for (pod, node) in fact.pods.iter_mut().zip(nodes) {
                pod.node = Some(node.into());
            }
            fact.cordoned_nodes = cordoned.iter().map(|n| n.to_string()).collect();
            fact
        };
        let handover = |fact: &RolesFact| plan(&db, fact).handover.map(|h| (h.to, h.why));
        // Nothing cordoned, or only a standby's node: nothing to do.
        assert_eq!(handover(&on_nodes([true; 3], ["a", "b", "c"], &[])), None);
        assert_eq!(
            handover(&on_nodes([true; 3], ["a", "b", "c"], &["b"])),
            None
        );
        // The primary's node: to the lowest ready standby elsewhere.
        let drained = on_nodes([true; 3], ["a", "b", "c"], &["a"]);
        assert_eq!(
            handover(&drained),
            Some(("orders-1".to_string(), HandoverWhy::NodeDrain))
        );
        assert_eq!(plan(&db, &drained).primary, "orders-1");
        // Not to a standby on a cordoned node too, nor to one that is not ready.
        assert_eq!(
            handover(&on_nodes([true; 3], ["a", "a", "c"], &["a"])),
            Some(("orders-2".to_string(), HandoverWhy::NodeDrain))
        );
        assert_eq!(
            handover(&on_nodes([true, false, true], ["a", "b", "c"], &["a"])),
            Some(("orders-2".to_string(), HandoverWhy::NodeDrain))
        );
        // None left: the primary stays (the drain waits).
        assert_eq!(
            handover(&on_nodes([true; 3], ["a", "a", "a"], &["a"])),
            None
        );
        // A primary that lost its Lease is a failover's business.
        let lost = RolesFact {
            now_ms: 120_000,
            ..on_nodes([true; 3], ["a", "b", "c"], &["a"])
        };
        assert!(plan(&db, &lost).handover.is_none());
    }

    #[test]
    fn a_version_upgrade_rolling_out_holds_the_primary_and_hands_over_to_an_upgraded_standby() {
        let db = three();
        let upgrading = |primary: &str, revisions: [&str; 3]| {
            let mut fact = rolling(primary, Some("r2"), revisions);
            fact.version_upgrade = VersionUpgrade::RollingOut;
            plan(&db, &fact)
        };
        let started = upgrading("orders-0", ["r1", "r1", "r1"]);
        assert_eq!(
            (started.primary_last_partition, started.handover),
            (Some(1), None)
        );
        let above_done = upgrading("orders-0", ["r1", "r2", "r2"]);
        assert_eq!(above_done.primary_last_partition, Some(1));
        assert_eq!(
            above_done.handover.map(|h| (h.from, h.to, h.why)),
            Some((
                "orders-0".to_string(),
                "orders-1".to_string(),
                HandoverWhy::Upgrade
            ))
        );
        assert_eq!(above_done.primary, "orders-1");
        // The new primary runs the new version: the old one's pod may go.
        let switched = upgrading("orders-1", ["r1", "r2", "r2"]);
        assert_eq!(
            (switched.primary_last_partition, switched.handover),
            (None, None)
        );
    }

    #[test]
    fn a_scale_down_waits_for_a_ready_standby_and_never_holds_a_lost_primary() {
        let db = scaled_down_from_orders_2(2);
        let holding = leased(Some("orders-2"), 100_000, "orders-2", None);
        // No standby that stays is ready: no switchover, and the primary's pod stays.
        let fact = with_lease(holding.clone(), 104_000, [false, false, true]);
        let plan = plan(&db, &fact);
        assert_eq!((plan.handover, plan.statefulset_replicas), (None, 3));
        assert_eq!(plan.primary, "orders-2");
        // The primary stopped renewing: nothing to wait for.
        let fact = with_lease(holding.clone(), 110_001, [true, false, false]);
        assert_eq!(super::plan(&db, &fact).statefulset_replicas, 2);
        // Down to one instance: a lone primary does not wait for the Lease, so no switchover
        // (the StatefulSet removes the old primary first).
        let single = scaled_down_from_orders_2(1);
        let fact = with_lease(holding, 104_000, [true, true, true]);
        let plan = super::plan(&single, &fact);
        assert_eq!((plan.handover, plan.statefulset_replicas), (None, 1));
        // A primary that stays: nothing to hand over.
        let fact = with_lease(
            leased(Some("orders-1"), 100_000, "orders-1", None),
            104_000,
            [true; 3],
        );
        let plan = super::plan(&scaled_down_from_orders_2(2), &fact);
        assert_eq!((plan.handover, plan.statefulset_replicas), (None, 2));
    }

    #[test]
    fn a_primary_that_renews_its_lease_stays_and_is_looked_at_when_it_would_expire() {
        let fact = with_lease(
            leased(Some("orders-1"), 100_000, "orders-1", None),
            104_000,
            [true; 3],
        );
        let plan = plan(&three(), &fact);
        // The Lease names the primary even when the status does not (written first).
        assert_eq!(plan.primary, "orders-1");
        assert_eq!(plan.failover, None);
        assert_eq!(plan.look_again, Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_primary_whose_lease_ran_out_is_replaced_by_the_first_ready_standby() {
        let lease = leased(Some("orders-0"), 100_000, "orders-0", None);
        let fact = with_lease(lease.clone(), 110_000, [false, true, true]);
        assert_eq!(plan(&three(), &fact).failover, None, "not yet expired");
        assert_eq!(
            plan(&three(), &fact).look_again,
            Some(LOOK_WHILE_PRIMARY_UNREADY)
        );
        let fact = with_lease(lease, 110_001, [false, false, true]);
        let plan = plan(&three(), &fact);
        assert_eq!(plan.primary, "orders-2");
        let failover = plan.failover.expect("a failover");
        assert_eq!(
            (failover.from.as_str(), failover.to.as_str()),
            ("orders-0", "orders-2")
        );
        assert!(
            failover
                .why
                .contains("has not held the primary Lease for 10 s"),
            "{}",
            failover.why
        );
        assert!(
            plan.label_pods
                .contains(&("orders-2".to_string(), InstanceRole::Primary))
        );
    }

    #[test]
    fn a_released_lease_fails_over_at_once_and_a_lost_primary_without_candidates_stays() {
        let released = leased(None, 100_000, "orders-0", Some("orders-0"));
        let fact = with_lease(released.clone(), 100_500, [false, true, true]);
        let failover = plan(&three(), &fact).failover.expect("a failover");
        assert_eq!(failover.to, "orders-1");
        assert!(failover.why.contains("released"), "{}", failover.why);
        let none_ready = with_lease(released, 200_000, [false, false, false]);
        let plan = plan(&three(), &none_ready);
        assert_eq!((plan.primary.as_str(), plan.failover), ("orders-0", None));
    }

    #[test]
    fn a_primary_that_does_not_follow_the_lease_and_standbys_that_do_not_are_never_failed_over() {
        let lease = leased(None, 0, "orders-0", None);
        let mut fact = with_lease(lease, 500_000, [false, true, true]);
        fact.pods[0].service_account = None;
        assert_eq!(
            plan(&three(), &fact).failover,
            None,
            "an old-template primary"
        );
        fact.pods[0].service_account = Some("orders-instance".into());
        fact.pods[1].service_account = None;
        assert_eq!(
            plan(&three(), &fact).failover.map(|f| f.to),
            Some("orders-2".into())
        );
        // One instance: no Lease is looked at.
        let mut one = with_lease(
            leased(None, 0, "orders-0", None),
            500_000,
            [false, true, true],
        );
        one.pods.truncate(1);
        let plan = plan(&testing::minimal(), &one);
        assert_eq!((plan.failover, plan.look_again), (None, None));
    }

    fn asking(instance: &str) -> Database {
        let mut db = three();
        db.metadata.annotations =
            Some([(PROMOTE_ANNOTATION.to_string(), instance.to_string())].into());
        db
    }

    #[test]
    fn a_promotion_of_a_ready_standby_from_a_primary_holding_its_lease_is_a_switchover() {
        let fact = with_lease(
            leased(Some("orders-0"), 100_000, "orders-0", None),
            101_000,
            [true; 3],
        );
        let plan = plan(&asking("orders-2"), &fact);
        assert_eq!(plan.primary, "orders-2");
        assert_eq!(plan.failover, None);
        let promotion = plan.promotion.expect("answered");
        assert_eq!(
            (promotion.to.as_deref(), promotion.refused),
            (Some("orders-2"), false)
        );
        assert!(
            plan.label_pods
                .contains(&("orders-2".to_string(), InstanceRole::Primary))
        );
        // Without a request, nothing moves.
        assert_eq!(super::plan(&three(), &fact).primary, "orders-0");
    }

    #[test]
    fn a_promotion_is_refused_with_a_reason_and_never_moves_the_primary() {
        let healthy = leased(Some("orders-0"), 100_000, "orders-0", None);
        let cases = [
            (
                "orders-7",
                with_lease(healthy.clone(), 101_000, [true; 3]),
                "not one of the 3 instances",
            ),
            (
                "orders-1",
                with_lease(healthy.clone(), 101_000, [true, false, true]),
                "not a ready",
            ),
            // The primary's Lease ran out: a failover's business, not a switchover's.
            (
                "orders-2",
                with_lease(healthy.clone(), 120_000, [true; 3]),
                "does not hold its primary Lease",
            ),
        ];
        for (instance, fact, why) in cases {
            let plan = plan(&asking(instance), &fact);
            let promotion = plan.promotion.expect("answered");
            assert!(
                promotion.refused && promotion.note.contains(why),
                "{instance}: {}",
                promotion.note
            );
            assert_ne!(plan.primary, instance);
        }
        let mut old = with_lease(healthy.clone(), 101_000, [true; 3]);
        old.pods[2].service_account = None;
        let promotion = plan(&asking("orders-2"), &old).promotion.unwrap();
        assert!(
            promotion.refused && promotion.note.contains("predates"),
            "{}",
            promotion.note
        );
        let same = plan(
            &asking("orders-0"),
            &with_lease(healthy, 101_000, [true; 3]),
        );
        let promotion = same.promotion.unwrap();
        assert!(
            !promotion.refused && promotion.to.is_none(),
            "{promotion:?}"
        );
        assert_eq!(same.primary, "orders-0");
    }

    /// A primary on timeline 2 that reports its position, and each standby's report.
    fn reporting(fact: &mut RolesFact, standbys: [(&str, Option<Position>); 2]) {
        let primary = Position {
            standby: false,
            timeline: Some(2),
            lsn: Some(Lsn(0x5000000)),
            ..Position::default()
        };
        fact.positions = [("orders-0".to_string(), primary)].into();
        for (name, position) in standbys {
            if let Some(position) = position {
                fact.positions.insert(name.to_string(), position);
            }
        }
    }

    fn streaming_on(timeline: u32) -> Position {
        Position {
            streaming: true,
            timeline: Some(timeline),
            ..standby_at(0x5000000)
        }
    }

    #[test]
    fn a_switchover_goes_only_to_a_standby_whose_manager_reports_it_streaming_on_the_primarys_timeline()
     {
        // A Ready pod is not enough: a lost node's pods stay Ready in the API, and one that
        // came back as a former primary (timeline 1, not streaming) must not be promoted.
        let healthy = leased(Some("orders-0"), 100_000, "orders-0", None);
        let not_streaming = Position {
            streaming: false,
            ..streaming_on(2)
        };
        let former_primary = Position {
            standby: false,
            timeline: Some(1),
            ..Position::default()
        };
        // (report, answered now, accepted)
        let cases = [
            (None, false, false),
            (Some(not_streaming), false, false),
            (Some(streaming_on(1)), true, false),
            (Some(former_primary), true, false),
            (Some(streaming_on(2)), true, true),
        ];
        for (report, answered, accepted) in cases {
            let mut fact = with_lease(healthy.clone(), 101_000, [true; 3]);
            reporting(
                &mut fact,
                [
                    ("orders-1", Some(streaming_on(2))),
                    ("orders-2", report.clone()),
                ],
            );
            let plan = plan(&asking("orders-2"), &fact);
            let Some(promotion) = plan.promotion else {
                // Not answered yet: looked at again soon, the primary unchanged.
                assert!(!answered, "{report:?}");
                assert_eq!(plan.look_again, Some(LOOK_WHILE_PRIMARY_UNREADY));
                assert_eq!(plan.primary, "orders-0");
                continue;
            };
            assert!(answered, "{report:?}: {}", promotion.note);
            assert_eq!(
                !promotion.refused, accepted,
                "{report:?}: {}",
                promotion.note
            );
            if !accepted {
                assert!(
                    promotion
                        .note
                        .contains("does not report it streaming from orders-0"),
                    "{}",
                    promotion.note
                );
                assert_eq!(plan.primary, "orders-0");
            }
        }
    }

    #[test]
    fn a_drain_hands_over_to_the_first_standby_that_reports_it_streams() {
        let mut fact = with_lease(
            leased(Some("orders-0"), 100_000, "orders-0", None),
            101_000,
            [true; 3],
        );
        fact.pods[0].node = Some("node-cordoned".into());
        fact.cordoned_nodes = ["node-cordoned".to_string()].into();
        // orders-1 looks Ready but its manager says nothing: orders-2 is the one.
        reporting(
            &mut fact,
            [("orders-1", None), ("orders-2", Some(streaming_on(2)))],
        );
        let handover = drain_handover(&three(), &fact, "orders-0").expect("a handover");
        assert_eq!(handover.to, "orders-2");
        reporting(&mut fact, [("orders-1", None), ("orders-2", None)]);
        assert_eq!(drain_handover(&three(), &fact, "orders-0"), None);
    }
}
