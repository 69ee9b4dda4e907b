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

/// The read-write client Service: the primary only, ready or not. Only the designated
/// primary wears the label, and its manager fences it whenever it may not write, so a
/// readiness gate has nowhere else to send a client: it only delays the route to a new primary
/// by up to a readiness period (10 s) when that instance's probe failed a moment before (a
/// standby rejoining a new timeline as it is named the primary). `bench-ha` saw a 10.3 s
/// switchover for that reason, where the others took 0.7-1.8 s.
pub fn read_write(db: &Database) -> Service {
    let names = Names::of(db);
    let mut service = client_service(
        db,
        names.rw_service(),
        role_selector(names.database(), InstanceRole::Primary),
    );
    if let Some(spec) = service.spec.as_mut() {
        spec.publish_not_ready_addresses = Some(true);
    }
    service
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
    fn rw_service_selects_the_primary_only_ready_or_not() {
        let s = read_write(&testing::minimal());
        let spec = s.spec.unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("orders-rw"));
        let selector = spec.selector.unwrap();
        assert_eq!(selector["dbop.dev/role"], "primary");
        assert!(!selector.contains_key("statefulset.kubernetes.io/pod-name"));
        assert_eq!(spec.ports.unwrap()[0].port, 5432);
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
    }

    #[test]
    fn ro_selects_standbys_and_r_every_instance() {
        let db = testing::minimal();
        let ro = read_only(&db).spec.unwrap();
        assert_eq!(ro.selector.unwrap()["dbop.dev/role"], "standby");
        // Reads go to ready instances only: there are others to send them to.
        assert_eq!(ro.publish_not_ready_addresses, None);
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
