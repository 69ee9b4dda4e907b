//! What a Database's instances need to replicate: the topology dbop publishes to them (which
//! instance is the primary, where each is reached: `dbop_contract::topology`), the replication
//! role's Secret `<name>-replication` and its volume, the role label on the pods that the
//! Services select by, and the anti-affinity that spreads the instances over nodes.
//!
//! Pure: plain functions of the Database and the primary's name (which the Database's
//! `decide` chooses); the password comes in, made by the caller.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, Secret,
    WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::pod::mount_optional_secret;
use super::{Names, POSTGRES_PORT, owned_meta, selector_labels};
use crate::api::{Database, InstanceRole, WhenTooFew};
use dbop_contract::topology::{
    Member, REPLICATION_DIR, REPLICATION_PASSWORD_FILE, Synchronous, Topology,
};

/// The pod label that says an instance's role (`primary`, `standby`); `<name>-rw` and
/// `<name>-ro` select by it. Set on each pod by dbop, never in the pod template.
pub const ROLE_LABEL: &str = "dbop.dev/role";
/// The volume of the replication Secret in the database pod.
const REPLICATION_VOLUME: &str = "replication";

impl Names {
    /// The Secret with the replication role's password.
    pub fn replication_secret(&self) -> String {
        format!("{}-replication", self.database())
    }
    /// The Service of the ready standbys (read-only).
    pub fn ro_service(&self) -> String {
        format!("{}-ro", self.database())
    }
    /// The Service of every ready instance.
    pub fn r_service(&self) -> String {
        format!("{}-r", self.database())
    }
    /// The name instance `ordinal`'s peers reach it at (through the headless Service).
    pub fn pod_host(&self, ordinal: i32, namespace: &str) -> String {
        format!(
            "{}.{}.{namespace}.svc",
            self.pod(ordinal),
            self.headless_service()
        )
    }
}

/// The topology for `primary`: every instance of the spec, in ordinal order.
pub fn topology(db: &Database, primary: &str) -> Topology {
    topology_of(db, primary, db.spec.instances)
}

/// The topology with `members` instances (ordinals 0 to `members - 1`): more than the spec's
/// while a scale-down keeps the primary's pod for its switchover (`RolesPlan`'s
/// `statefulset_replicas`), so that the primary still finds itself in it.
pub fn topology_of(db: &Database, primary: &str, members: i32) -> Topology {
    let names = Names::of(db);
    let ns = db.namespace_or_default();
    Topology {
        primary: primary.to_string(),
        members: (0..members.max(1))
            .map(|ordinal| Member {
                name: names.pod(ordinal),
                host: names.pod_host(ordinal, &ns),
                port: POSTGRES_PORT as u16,
            })
            .collect(),
        synchronous: synchronous(db),
    }
}

/// Synchronous replication as the primary applies it (`spec.synchronous`), for a Database with
/// standbys.
fn synchronous(db: &Database) -> Option<Synchronous> {
    let spec = db
        .spec
        .synchronous
        .as_ref()
        .filter(|_| db.spec.instances > 1)?;
    Some(Synchronous {
        standbys: spec.standbys.max(1) as u32,
        wait: spec.when_too_few == WhenTooFew::Wait,
    })
}

/// The replication role's Secret, with the given password.
pub fn replication_secret(db: &Database, password: &str) -> Secret {
    let names = Names::of(db);
    Secret {
        metadata: owned_meta(db, names.replication_secret(), "replication"),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            REPLICATION_PASSWORD_FILE.to_string(),
            ByteString(password.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

impl Names {
    /// The PodDisruptionBudget of the standbys (the StatefulSet's name: the budget's name
    /// before the primary had one of its own).
    pub fn standby_budget(&self) -> String {
        self.statefulset()
    }
    /// The PodDisruptionBudget of the primary.
    pub fn primary_budget(&self) -> String {
        format!("{}-primary", self.database())
    }
}

/// The PodDisruptionBudgets of a Database, each by name with what it should be (`None`: there
/// should be none). With standbys, two that select apart (the eviction API refuses a pod that
/// two budgets select): `<name>` lets a drain or an eviction take one standby at a time, and
/// `<name>-primary` never lets it take the primary, so a drain of the primary's node waits
/// until the primary has handed over (`database::roles`, a cordoned node) and then evicts it as
/// a standby. A pod without a role label yet (a new one) is in neither. A single instance gets
/// none (it would block every drain of its node). The standbys' budget comes first: an older
/// one selected every instance, and must stop selecting the primary before the primary's is
/// made. Both say `minAvailable`: with `maxUnavailable` the disruption controller counts the
/// StatefulSet's replicas as the pods expected, not the role's, and would allow nothing.
pub fn disruption_budgets(db: &Database) -> [(String, Option<PodDisruptionBudget>); 2] {
    let names = Names::of(db);
    let budget = |name: String, role: InstanceRole, min_available: i32| {
        (db.spec.instances > 1).then(|| PodDisruptionBudget {
            metadata: owned_meta(db, name, "database"),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(min_available)),
                selector: Some(LabelSelector {
                    match_labels: Some(role_selector(&db.name(), role)),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        })
    };
    let (standbys, primary) = (names.standby_budget(), names.primary_budget());
    [
        (
            standbys.clone(),
            budget(standbys, InstanceRole::Standby, db.spec.instances - 2),
        ),
        (primary.clone(), budget(primary, InstanceRole::Primary, 1)),
    ]
}

/// Whether the Database needs the replication Secret: it has standbys, or archives its WAL (its
/// physical backups connect as the replication role).
pub fn needs_replication_secret(db: &Database) -> bool {
    db.spec.instances > 1 || super::wal_archiving::enabled(db).is_some()
}

/// The role label's value a pod should carry.
pub fn role_of(pod: &str, primary: &str) -> InstanceRole {
    if pod == primary {
        InstanceRole::Primary
    } else {
        InstanceRole::Standby
    }
}

/// The selector of the instances of `role`.
pub fn role_selector(database: &str, role: InstanceRole) -> BTreeMap<String, String> {
    let mut selector = selector_labels(database);
    selector.insert(ROLE_LABEL.into(), role.label().into());
    selector
}

/// Puts what replication needs into the database pod template: the replication Secret's
/// volume (optional: a single instance has none, and a later scale-up must not restart the
/// primary to mount it), and a preferred anti-affinity that spreads the instances over nodes
/// unless the spec places the pods itself.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    let secret = Names::of(db).replication_secret();
    mount_optional_secret(pod, REPLICATION_VOLUME, REPLICATION_DIR, secret);
    spread(pod, db);
}

/// Prefers a node without another instance of this Database, when the spec sets no affinity.
fn spread(pod: &mut PodSpec, db: &Database) {
    if pod.affinity.is_some() {
        return;
    }
    pod.affinity = Some(Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels(&db.name())),
                            ..LabelSelector::default()
                        }),
                        topology_key: "kubernetes.io/hostname".into(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn three() -> Database {
        let mut db = testing::minimal();
        db.spec.instances = 3;
        db.metadata.namespace = Some("shop".into());
        db
    }

    #[test]
    fn the_topology_names_every_instance_and_the_primary() {
        let t = topology(&three(), "orders-1");
        assert_eq!(t.primary, "orders-1");
        let names: Vec<_> = t.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["orders-0", "orders-1", "orders-2"]);
        assert_eq!(t.members[2].host, "orders-2.orders-hl.shop.svc");
        assert_eq!(t.members[2].port, 5432);
        assert_eq!(t.standbys(), ["orders-0", "orders-2"]);
        // What the instance manager reads back.
        assert_eq!(
            Topology::parse(&topology(&three(), "orders-1").render()),
            Ok(t)
        );
        // A scale-down to two that keeps orders-2, the primary, for its switchover.
        let mut two = three();
        two.spec.instances = 2;
        assert_eq!(
            topology(&two, "orders-2").standbys(),
            ["orders-0", "orders-1"]
        );
        let kept = topology_of(&two, "orders-2", 3);
        assert_eq!(kept.members.len(), 3);
        assert_eq!(kept.standbys(), ["orders-0", "orders-1"]);
        assert_eq!(kept.synchronous, None, "asynchronous unless asked");
    }

    #[test]
    fn synchronous_replication_reaches_the_topology_of_a_database_with_standbys() {
        let mut db = three();
        db.spec.synchronous = Some(crate::api::SynchronousSpec {
            standbys: 2,
            when_too_few: WhenTooFew::Degrade,
        });
        assert_eq!(
            topology(&db, "orders-0").synchronous,
            Some(Synchronous {
                standbys: 2,
                wait: false
            })
        );
        db.spec.synchronous.as_mut().unwrap().when_too_few = WhenTooFew::Wait;
        assert!(
            topology(&db, "orders-0")
                .render()
                .contains("synchronous=2 wait\n")
        );
        db.spec.instances = 1;
        assert_eq!(
            topology(&db, "orders-0").synchronous,
            None,
            "no standby to wait for"
        );
    }

    #[test]
    fn the_replication_secret_holds_the_password_under_the_contracts_key() {
        let s = replication_secret(&three(), "pw");
        assert_eq!(s.metadata.name.as_deref(), Some("orders-replication"));
        assert_eq!(s.data.unwrap()["password"].0, b"pw");
        assert!(needs_replication_secret(&three()));
        assert!(!needs_replication_secret(&testing::minimal()));
    }

    #[test]
    fn standbys_go_one_at_a_time_the_primary_never_and_a_single_instance_has_no_budget() {
        let [(standbys, standby_budget), (primary, primary_budget)] = disruption_budgets(&three());
        assert_eq!(
            (standbys.as_str(), primary.as_str()),
            ("orders", "orders-primary")
        );
        let spec = |b: Option<PodDisruptionBudget>| {
            let spec = b.unwrap().spec.unwrap();
            (
                spec.max_unavailable,
                spec.min_available,
                spec.selector.unwrap().match_labels.unwrap(),
            )
        };
        // Of the two standbys one stays; the primary always.
        let (max, min, selector) = spec(standby_budget);
        assert_eq!((max, min), (None, Some(IntOrString::Int(1))));
        assert_eq!(selector, role_selector("orders", InstanceRole::Standby));
        let (max, min, selector) = spec(primary_budget);
        assert_eq!((max, min), (None, Some(IntOrString::Int(1))));
        assert_eq!(selector, role_selector("orders", InstanceRole::Primary));
        let single = disruption_budgets(&testing::minimal());
        assert!(single.iter().all(|(_, budget)| budget.is_none()));
    }

    #[test]
    fn roles_and_selectors() {
        assert_eq!(role_of("orders-0", "orders-0"), InstanceRole::Primary);
        assert_eq!(role_of("orders-1", "orders-0"), InstanceRole::Standby);
        let s = role_selector("orders", InstanceRole::Standby);
        assert_eq!(s[ROLE_LABEL], "standby");
        assert_eq!(s["app.kubernetes.io/instance"], "orders");
    }

    #[test]
    fn the_template_mounts_the_optional_secret_and_spreads_unless_placed() {
        let db = three();
        let mut template = PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "postgres".into(),
                    ..Default::default()
                }],
                ..PodSpec::default()
            }),
            ..PodTemplateSpec::default()
        };
        add_to_pod_template(&mut template, &db);
        let pod = template.spec.unwrap();
        let volume = &pod.volumes.unwrap()[0];
        let secret = volume.secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("orders-replication"));
        assert_eq!(secret.optional, Some(true));
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        assert_eq!(mounts[0].mount_path, REPLICATION_DIR);
        let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        let term = &anti
            .preferred_during_scheduling_ignored_during_execution
            .unwrap()[0];
        assert_eq!(
            term.pod_affinity_term.topology_key,
            "kubernetes.io/hostname"
        );

        let mut placed = PodSpec {
            affinity: Some(Affinity::default()),
            ..PodSpec::default()
        };
        spread(&mut placed, &db);
        assert_eq!(placed.affinity, Some(Affinity::default()));
    }
}
