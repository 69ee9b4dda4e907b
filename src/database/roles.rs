//! The Database's instances and their roles: which instance is the primary (recorded in the
//! status when the Database is first provisioned, never assumed from an ordinal afterwards),
//! the role label each database pod must carry (the Services select by it), whether the
//! replication Secret must be made, and each instance's line in the status.
//!
//! Pure: facts in (the database pods as the watch cache has them), a plan out.

use k8s_openapi::api::core::v1::Pod;

use crate::api::{Database, InstanceRole, InstanceStatus};
use crate::resources::Names;
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
}

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
}

/// The roles of one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolesPlan {
    /// The instance that runs as the primary.
    pub primary: String,
    /// Pods whose role label must be set, with the role.
    pub label_pods: Vec<(String, InstanceRole)>,
    /// Make the replication Secret (the Database has standbys and none exists).
    pub create_replication_secret: bool,
    /// Every instance of the spec, in ordinal order.
    pub instances: Vec<InstanceStatus>,
}

/// The primary: the one the status records, else the first instance (a new Database).
pub fn primary(db: &Database) -> String {
    db.status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| Names::of(db).pod(0))
}

/// The roles for `db` given its pods.
pub fn plan(db: &Database, fact: &RolesFact) -> RolesPlan {
    let primary = primary(db);
    let label_pods = fact
        .pods
        .iter()
        .map(|p| (p, role_of(&p.name, &primary)))
        .filter(|(p, role)| p.role_label.as_deref() != Some(role.label()))
        .map(|(p, role)| (p.name.clone(), role))
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
        instances,
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
}
