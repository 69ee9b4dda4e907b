//! The Database's instances and their roles: which instance is the primary (recorded in the
//! primary Lease and the status, never assumed from an ordinal afterwards), when it is lost
//! and which standby takes its place (failover), the role label each database pod must carry
//! (the Services select by it), whether the replication Secret must be made, and each
//! instance's line in the status.
//!
//! Pure: facts in (the database pods as the watch cache has them, the primary Lease), a plan out.

use std::time::Duration;

use dbop_contract::topology::Topology;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::api::{Database, InstanceRole, InstanceStatus};
use crate::resources::Names;
use crate::resources::primary_lease::{LeaseFact, PROMOTE_ANNOTATION, has_standbys};
use crate::resources::replication::{ROLE_LABEL, needs_replication_secret, role_of};

/// One database pod, as far as roles go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFact {
    pub name: String,
    /// Its role label now (`None`: none yet, as for every new pod).
    pub role_label: Option<String>,
    /// Ready and not being deleted.
    pub ready: bool,
    pub node: Option<String>,
    /// The pod's service account (the instances' one: its manager follows the primary Lease).
    pub service_account: Option<String>,
    /// The versions of the mounted Secrets it was last told about (`SECRETS_SEEN_ANNOTATION`).
    pub secrets_seen: Option<String>,
}

/// On a database pod: the versions of the Secrets it mounts, as dbop last saw them. Changing it
/// updates the pod, and the kubelet re-syncs a pod's Secret volumes when the pod changes: a new
/// password or certificate reaches the instance manager in seconds, not at the kubelet's next
/// periodic sync (a minute or more).
pub const SECRETS_SEEN_ANNOTATION: &str = "dbop.dev/secrets-seen";

impl PodFact {
    /// What a cached database pod says.
    pub fn of(pod: &Pod) -> PodFact {
        let ready = pod.metadata.deletion_timestamp.is_none()
            && pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        PodFact {
            name: pod.metadata.name.clone().unwrap_or_default(),
            role_label: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLE_LABEL))
                .cloned(),
            ready,
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone()),
            secrets_seen: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SECRETS_SEEN_ANNOTATION))
                .cloned(),
        }
    }
}

/// What the roles are decided from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolesFact {
    /// The Database's database pods.
    pub pods: Vec<PodFact>,
    /// The replication Secret exists.
    pub replication_secret: bool,
    /// The primary Lease (`None`: none exists, or the Database has one instance).
    pub lease: Option<LeaseFact>,
    /// The pass's `now`, Unix milliseconds.
    pub now_ms: i64,
    /// The versions of the Secrets the database pods mount (`mounted_secrets`; empty: none yet).
    pub mounted_secrets: String,
}

/// The versions of the Secrets database pods mount, `name=resourceVersion` joined by `,`:
/// changes whenever one of them is written.
pub fn mounted_secrets(secrets: &[Option<&k8s_openapi::api::core::v1::Secret>]) -> String {
    secrets
        .iter()
        .flatten()
        .filter_map(|s| {
            let name = s.metadata.name.as_deref()?;
            let version = s.metadata.resource_version.as_deref()?;
            Some(format!("{name}={version}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A failover: the primary lost, the standby that takes its place, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    pub from: String,
    pub to: String,
    pub why: String,
}

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
/// and a ready standby of the spec can take its place: the lowest ordinal. Only a primary whose
/// manager follows the Lease (its pod runs as the instances' account) is ever replaced: one
/// started before the Lease existed would not fence itself.
fn failover(db: &Database, fact: &RolesFact, current: &str) -> Option<Failover> {
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
    let to = (0..db.spec.instances).map(|o| names.pod(o)).find(|name| {
        name != current
            && fact
                .pods
                .iter()
                .any(|p| &p.name == name && p.ready && fenced(p))
    })?;
    let why = if released {
        format!("{current} released the primary Lease (its server stopped)")
    } else {
        format!(
            "{current} has not held the primary Lease for {} s (its node, pod or server is gone, or it cannot reach the API server)",
            lease.state.duration_ms / 1000
        )
    };
    Some(Failover {
        from: current.to_string(),
        to,
        why,
    })
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
    let failover = failover(db, fact, &current);
    let promotion = promotion(db, fact, &current);
    let switched = promotion
        .as_ref()
        .and_then(|p| p.to.clone())
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
    let names = Names::of(db);
    let instances = (0..db.spec.instances.max(1))
        .map(|ordinal| {
            let name = names.pod(ordinal);
            let pod = fact.pods.iter().find(|p| p.name == name);
            InstanceStatus {
                role: role_of(&name, &primary),
                ready: pod.is_some_and(|p| p.ready),
                node: pod.and_then(|p| p.node.clone()),
                name,
            }
        })
        .collect();
    RolesPlan {
        create_replication_secret: needs_replication_secret(db) && !fact.replication_secret,
        label_pods,
        refresh_pods,
        instances,
        look_again: look_again(db, fact, &primary),
        failover,
        promotion,
        primary,
    }
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

    fn pod(name: &str, label: Option<&str>, ready: bool) -> PodFact {
        PodFact {
            name: name.into(),
            role_label: label.map(Into::into),
            ready,
            node: Some("node-a".into()),
            service_account: Some("orders-instance".into()),
            secrets_seen: None,
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
            mounted_secrets: String::new(),
        }
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
}
