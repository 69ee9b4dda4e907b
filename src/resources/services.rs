//! The Services of a Database: a headless one for the pods' stable DNS names, and `-rw`, the
//! client endpoint, which selects the primary (ordinal 0) so that it stays right once replicas
//! exist.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Names, POSTGRES_PORT, owned_meta, selector_labels};
use crate::api::Database;

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
    let mut selector = selector_labels(names.database());
    selector.insert("statefulset.kubernetes.io/pod-name".into(), names.pod(0));
    Service {
        metadata: owned_meta(db, names.rw_service(), "database"),
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
        assert_eq!(
            spec.selector.unwrap()["statefulset.kubernetes.io/pod-name"],
            "orders-0"
        );
        assert_eq!(spec.ports.unwrap()[0].port, 5432);
    }
}
