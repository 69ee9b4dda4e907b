//! The Services of a Database: a headless one for the pods' stable DNS names (the instances
//! reach each other through it), and three for clients, by the role label dbop sets on each pod
//! (`replication::ROLE_LABEL`): `-rw` the primary, `-ro` the ready standbys, `-r` any ready
//! instance.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::replication::role_selector;
use super::{Names, POSTGRES_PORT, owned_meta, selector_labels};
use crate::api::{Database, InstanceRole};

fn port() -> ServicePort {
    ServicePort {
        name: Some("postgresql".into()),
        port: POSTGRES_PORT,
        target_port: Some(IntOrString::String("postgresql".into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// The headless Service the StatefulSet is governed by.
pub fn headless(db: &Database) -> Service {
    let names = Names::of(db);
    Service {
        metadata: owned_meta(db, names.headless_service(), "database"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            // Peers (future replicas) must resolve each other before they are ready.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(names.database())),
            ports: Some(vec![port()]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The read-write client Service: the primary only.
pub fn read_write(db: &Database) -> Service {
    let names = Names::of(db);
    client_service(
        db,
        names.rw_service(),
        role_selector(names.database(), InstanceRole::Primary),
    )
}

/// The read-only client Service: the ready standbys only (none while there are no standbys).
pub fn read_only(db: &Database) -> Service {
    let names = Names::of(db);
    client_service(
        db,
        names.ro_service(),
        role_selector(names.database(), InstanceRole::Standby),
    )
}

/// The Service of any ready instance (reads that accept a standby's lag).
pub fn any_ready(db: &Database) -> Service {
    let names = Names::of(db);
    client_service(db, names.r_service(), selector_labels(names.database()))
}

/// Every Service of the Database, in the order they are applied.
pub fn all(db: &Database) -> Vec<Service> {
    vec![headless(db), read_write(db), read_only(db), any_ready(db)]
}

fn client_service(
    db: &Database,
    name: String,
    selector: std::collections::BTreeMap<String, String>,
) -> Service {
    Service {
        metadata: owned_meta(db, name, "database"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![port()]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn headless_service_selects_every_pod() {
        let s = headless(&testing::minimal());
        let spec = s.spec.unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("orders-hl"));
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert!(
            !spec
                .selector
                .unwrap()
                .contains_key("statefulset.kubernetes.io/pod-name")
        );
    }

    #[test]
    fn rw_service_selects_the_primary_only() {
        let s = read_write(&testing::minimal());
        let spec = s.spec.unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("orders-rw"));
        let selector = spec.selector.unwrap();
        assert_eq!(selector["dbop.dev/role"], "primary");
        assert!(!selector.contains_key("statefulset.kubernetes.io/pod-name"));
        assert_eq!(spec.ports.unwrap()[0].port, 5432);
    }

    #[test]
    fn ro_selects_standbys_and_r_every_instance() {
        let db = testing::minimal();
        let ro = read_only(&db).spec.unwrap().selector.unwrap();
        assert_eq!(ro["dbop.dev/role"], "standby");
        let r = any_ready(&db);
        assert_eq!(r.metadata.name.as_deref(), Some("orders-r"));
        let selector = r.spec.unwrap().selector.unwrap();
        assert!(!selector.contains_key("dbop.dev/role"));
        assert_eq!(selector["app.kubernetes.io/instance"], "orders");
        let names: Vec<_> = all(&db)
            .into_iter()
            .map(|s| s.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["orders-hl", "orders-rw", "orders-ro", "orders-r"]);
    }
}
