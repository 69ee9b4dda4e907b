//! The primary Lease of a Database with standbys (`dbop_contract::lease`: the fencing rules)
//! and the access its instances get to it: a ServiceAccount `<name>-instance` whose Role may
//! read and update that one Lease and nothing else. The operator designates the primary in the
//! Lease's annotations; the instances take, renew and release it.
//!
//! Pure: plain functions of the Database, the topology and the Lease as observed.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{PodTemplateSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::{Names, owned_meta};
use crate::api::Database;
use dbop_contract::instance::lease_args;
use dbop_contract::lease::{
    DESIGNATED_AT_ANNOTATION, DURATION_SECONDS, LeaseState, RELEASED_BY_ANNOTATION,
    TOPOLOGY_ANNOTATION, lease_name,
};
use dbop_contract::topology::Topology;

const COMPONENT: &str = "primary-lease";

/// The Database annotation that asks for a switchover to the instance it names
/// (`kubectl dbop promote NAME INSTANCE`); the operator removes it once it has answered.
pub const PROMOTE_ANNOTATION: &str = "dbop.dev/promote";

impl Names {
    /// The primary Lease.
    pub fn primary_lease(&self) -> String {
        lease_name(self.database())
    }
    /// The instances' ServiceAccount, Role and RoleBinding.
    pub fn instance_account(&self) -> String {
        format!("{}-instance", self.database())
    }
}

/// A Database with standbys fails over and fences by its Lease. Every Database has the Lease
/// and the instances' account, so that scaling one instance up changes no pod template (its
/// primary keeps running); a single instance's manager needs no hold to write.
pub fn has_standbys(db: &Database) -> bool {
    db.spec.instances > 1
}

/// The Lease as the rules read it, and who released it last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseFact {
    pub state: LeaseState,
    pub released_by: Option<String>,
    /// The topology it designates (its annotation's text).
    pub topology: Option<String>,
}

impl LeaseFact {
    pub fn of(lease: &Lease) -> LeaseFact {
        let spec = lease.spec.clone().unwrap_or_default();
        let annotation = |key: &str| {
            lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .cloned()
        };
        LeaseFact {
            state: LeaseState {
                holder: spec.holder_identity.filter(|h| !h.is_empty()),
                renewed_ms: spec.renew_time.map(|t| t.0.as_millisecond()),
                duration_ms: i64::from(spec.lease_duration_seconds.unwrap_or(0)) * 1000,
                designated_ms: annotation(DESIGNATED_AT_ANNOTATION).and_then(|v| v.parse().ok()),
            },
            released_by: annotation(RELEASED_BY_ANNOTATION),
            topology: annotation(TOPOLOGY_ANNOTATION),
        }
    }
}

/// The Lease to write so that it designates `topology`: a new one when none exists, else the
/// observed one with the new annotations (its `resourceVersion` kept: a compare-and-swap with
/// the instances' renewals), or `None` when it already designates it. `now_ms`: the moment of
/// the designation.
pub fn designate(
    db: &Database,
    observed: Option<&Lease>,
    topology: &Topology,
    now_ms: i64,
) -> Option<Lease> {
    let text = topology.render();
    let Some(observed) = observed else {
        let mut meta = owned_meta(db, Names::of(db).primary_lease(), COMPONENT);
        meta.annotations = Some(annotations(&text, now_ms));
        return Some(Lease {
            metadata: meta,
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(DURATION_SECONDS),
                ..LeaseSpec::default()
            }),
        });
    };
    let fact = LeaseFact::of(observed);
    if fact.topology.as_deref() == Some(text.as_str()) {
        return None;
    }
    // Stamped anew at every change: a primary that does not hold the Lease yet (a single
    // instance just scaled up) has a holder's validity from now to take it
    // (`lease::designation_grace`) before the operator may judge it lost.
    let mut lease = observed.clone();
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(annotations(&text, now_ms));
    Some(lease)
}

/// A designation that lost its compare-and-swap (`planned`, made on `observed`) carried onto
/// the Lease as it is now (`fresh`), when all that happened in between is a renewal by the same
/// holder: its holder, designation and release unchanged. A switchover, or a designation that
/// only changes the members, stands on a holder that renews — under load the instance renews
/// (every 2 s) faster than a pass reads the Lease and writes it, and the designation never got
/// through. A failover must not be carried over: it stands on a holder that stopped renewing,
/// and a renewal proves it wrong. `None`: something else changed; the pass is tried again.
pub fn carried_over(observed: &Lease, planned: &Lease, fresh: &Lease) -> Option<Lease> {
    let (before, now) = (LeaseFact::of(observed), LeaseFact::of(fresh));
    let unchanged = before.state.holder.is_some()
        && before.state.holder == now.state.holder
        && before.state.designated_ms == now.state.designated_ms
        && before.topology == now.topology
        && before.released_by == now.released_by;
    if !unchanged {
        return None;
    }
    let wanted = LeaseFact::of(planned);
    let mut lease = fresh.clone();
    let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.extend(self::annotations(
        wanted.topology.as_deref().unwrap_or_default(),
        wanted.state.designated_ms.unwrap_or_default(),
    ));
    Some(lease)
}

fn annotations(topology: &str, designated_ms: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TOPOLOGY_ANNOTATION.to_string(), topology.to_string()),
        (
            DESIGNATED_AT_ANNOTATION.to_string(),
            designated_ms.to_string(),
        ),
    ])
}

/// The instances' identity: no other permission than its Role's.
pub fn service_account(db: &Database) -> ServiceAccount {
    ServiceAccount {
        metadata: owned_meta(db, Names::of(db).instance_account(), COMPONENT),
        ..ServiceAccount::default()
    }
}

/// Read and update the Database's own primary Lease, by name: no list, no watch, no create,
/// no other object.
pub fn role(db: &Database) -> Role {
    let names = Names::of(db);
    Role {
        metadata: owned_meta(db, names.instance_account(), COMPONENT),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(vec![names.primary_lease()]),
            verbs: vec!["get".into(), "update".into()],
            ..PolicyRule::default()
        }]),
    }
}

pub fn role_binding(db: &Database) -> RoleBinding {
    let name = Names::of(db).instance_account();
    RoleBinding {
        metadata: owned_meta(db, name.clone(), COMPONENT),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: db.metadata.namespace.clone(),
            ..Subject::default()
        }]),
    }
}

/// The database pods run as the instances' ServiceAccount, with its token, and their managers
/// follow the Lease.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    let names = Names::of(db);
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    pod.service_account_name = Some(names.instance_account());
    pod.automount_service_account_token = Some(true);
    if let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") {
        postgres
            .command
            .get_or_insert_with(Vec::new)
            .extend(lease_args(&names.primary_lease()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::replication::topology;
    use crate::resources::testing;

    fn three() -> Database {
        let mut db = testing::minimal();
        db.spec.instances = 3;
        db.metadata.namespace = Some("shop".into());
        db
    }

    #[test]
    fn a_new_lease_designates_the_topology_and_every_change_is_stamped_anew() {
        let db = three();
        let first = designate(&db, None, &topology(&db, "orders-0"), 1_000).expect("made");
        assert_eq!(first.metadata.name.as_deref(), Some("orders-primary"));
        let fact = LeaseFact::of(&first);
        assert_eq!(fact.state.designated_ms, Some(1_000));
        assert_eq!(fact.state.duration_ms, 10_000);
        assert_eq!(fact.state.holder, None);
        assert!(fact.topology.unwrap().contains("primary=orders-0"));
        // Designating it again writes nothing.
        assert_eq!(
            designate(&db, Some(&first), &topology(&db, "orders-0"), 9_000),
            None
        );
        let moved = designate(&db, Some(&first), &topology(&db, "orders-2"), 9_000).unwrap();
        assert_eq!(LeaseFact::of(&moved).state.designated_ms, Some(9_000));
        let mut four = db.clone();
        four.spec.instances = 4;
        let grown = designate(&four, Some(&first), &topology(&four, "orders-0"), 9_500).unwrap();
        assert_eq!(LeaseFact::of(&grown).state.designated_ms, Some(9_500));
    }

    /// A held Lease as `holder` renewed it at `renewed_ms`, resource version `version`.
    fn held(db: &Database, holder: &str, renewed_ms: i64, version: &str) -> Lease {
        let mut lease = designate(db, None, &topology(db, "orders-0"), 1_000).unwrap();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.into());
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::from_millisecond(renewed_ms).unwrap(),
        ));
        lease.metadata.resource_version = Some(version.into());
        lease
    }

    #[test]
    fn a_designation_is_carried_over_a_renewal_and_nothing_else() {
        let db = three();
        let observed = held(&db, "orders-0", 2_000, "7");
        let planned = designate(&db, Some(&observed), &topology(&db, "orders-1"), 3_000).unwrap();
        // Renewed meanwhile: the designation goes onto the renewed Lease, its version kept.
        let renewed = held(&db, "orders-0", 4_000, "8");
        let carried = carried_over(&observed, &planned, &renewed).expect("carried over");
        assert_eq!(carried.metadata.resource_version.as_deref(), Some("8"));
        let fact = LeaseFact::of(&carried);
        assert!(fact.topology.unwrap().contains("primary=orders-1"));
        assert_eq!(fact.state.designated_ms, Some(3_000));
        assert_eq!(fact.state.renewed_ms, Some(4_000));
        // Another holder, a release, or another designation meanwhile: not carried over.
        let taken = held(&db, "orders-2", 4_000, "8");
        assert_eq!(carried_over(&observed, &planned, &taken), None);
        let mut released = renewed.clone();
        released.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(carried_over(&observed, &planned, &released), None);
        let other = designate(&db, Some(&renewed), &topology(&db, "orders-2"), 3_500).unwrap();
        assert_eq!(carried_over(&observed, &planned, &other), None);
        // Nobody held it when the pass looked: nothing to carry over.
        let free = designate(&db, None, &topology(&db, "orders-0"), 1_000).unwrap();
        assert_eq!(carried_over(&free, &planned, &renewed), None);
    }

    #[test]
    fn the_instances_may_only_read_and_update_their_own_lease() {
        let db = three();
        let role = role(&db);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, ["get", "update"]);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["orders-primary".to_string()][..])
        );
        let binding = role_binding(&db);
        assert_eq!(binding.role_ref.name, "orders-instance");
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            ("orders-instance", Some("shop"))
        );
    }

    #[test]
    fn the_pods_run_as_the_instance_account_and_follow_the_lease() {
        let mut template = PodTemplateSpec {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "postgres".into(),
                    command: Some(vec!["/dbop/dbop-instance".into(), "run".into()]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..PodTemplateSpec::default()
        };
        add_to_pod_template(&mut template, &three());
        let pod = template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("orders-instance"));
        assert_eq!(pod.automount_service_account_token, Some(true));
        let command = pod.containers[0].command.clone().unwrap();
        assert!(command.contains(&"--primary-lease=orders-primary".to_string()));
    }
}
