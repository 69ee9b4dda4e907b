//! The NetworkPolicy of a Database with `spec.networkPolicy` (docs/security.md, "NetworkPolicy"):
//! over the database pods (the StatefulSet's selector), ingress only. PostgreSQL's port admits
//! the Database's own instances (replication, a standby's clone and rewind), dbop's Jobs for
//! it (every pod dbop runs for the Database that is not an instance: init, backup, verify,
//! restore, preflight) and the spec's `allowFrom`; the metrics port only `metricsFrom`, and
//! only while the endpoint is served; the status port (a Database with standbys, WAL archiving
//! or `storage.autoGrow`: each instance's WAL position, the primary's archiver, the volume,
//! which the operator reads) only dbop's operator pods, in any namespace. The pods serve nothing else. Egress is not restricted.
//!
//! Pure: a function of the Database, no client.

use dbop_contract::instance::METRICS_PORT;
use dbop_contract::position::STATUS_PORT;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::primary_lease::has_standbys;
use super::{
    LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY, Names, POSTGRES_PORT,
    owned_meta, selector_labels,
};
use crate::api::network_policy::{NetworkPeer, NetworkPolicySpec as Spec};
use crate::api::{Database, MonitoringSpec};

/// The NetworkPolicy the Database asks for, or None (absent or `enabled: false`: a policy dbop
/// made before is deleted).
pub fn network_policy(db: &Database) -> Option<NetworkPolicy> {
    let spec = db.spec.network_policy.as_ref();
    if !Spec::enabled(spec) {
        return None;
    }
    let spec = spec.cloned().unwrap_or_default();
    let name = db.name();
    let mut postgres_from = vec![instances_peer(&name), jobs_peer(&name)];
    postgres_from.extend(spec.allow_from.iter().map(peer));
    let mut ingress = vec![rule(POSTGRES_PORT, postgres_from)];
    // An empty `from` admits everyone: no metrics rule at all when nobody is named.
    if MonitoringSpec::enabled(db.spec.monitoring.as_ref()) && !spec.metrics_from.is_empty() {
        let from = spec.metrics_from.iter().map(peer).collect();
        ingress.push(rule(i32::from(METRICS_PORT), from));
    }
    if operator_reads_status(db) {
        ingress.push(rule(i32::from(STATUS_PORT), vec![operator_peer()]));
    }
    Some(NetworkPolicy {
        metadata: owned_meta(db, Names::of(db).statefulset(), "database"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            egress: None,
        }),
    })
}

/// Whether the operator reads the instances' status port: their WAL positions (standbys), the
/// primary's archiver (`walArchiving`), the volumes (`storage.autoGrow`).
fn operator_reads_status(db: &Database) -> bool {
    has_standbys(db)
        || super::wal_archiving::enabled(db).is_some()
        || db.spec.storage.auto_grow.is_some()
}

/// The Database's instances: the StatefulSet's selector (in the policy's namespace).
fn instances_peer(database: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(database)),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// dbop's Jobs for the Database: its pods (`job_pod_labels`: the Database's instance label,
/// dbop's, a component) that are not instances. A new kind of Job is admitted without a change.
fn jobs_peer(database: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                [
                    (LABEL_INSTANCE.to_string(), database.to_string()),
                    (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
                ]
                .into(),
            ),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: LABEL_COMPONENT.into(),
                operator: "NotIn".into(),
                values: Some(vec!["database".into()]),
            }]),
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// dbop's operator, as its chart labels its pods, in whichever namespace it runs: it reads
/// the instances' WAL positions (`database::positions`), and nothing there is secret.
fn operator_peer() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                [
                    ("app.kubernetes.io/name".to_string(), "dbop".to_string()),
                    (LABEL_COMPONENT.to_string(), "operator".to_string()),
                ]
                .into(),
            ),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// A peer of the spec, as Kubernetes spells it.
fn peer(peer: &NetworkPeer) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: peer.pod_selector.clone(),
        namespace_selector: peer.namespace_selector.clone(),
        ip_block: peer.ip_block.as_ref().map(|block| IPBlock {
            cidr: block.cidr.clone(),
            except: Some(block.except.clone()).filter(|e| !e.is_empty()),
        }),
    }
}

/// Ingress on one TCP port from `from` (never empty: the callers name at least one peer).
fn rule(port: i32, from: Vec<NetworkPolicyPeer>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(vec![NetworkPolicyPort {
            protocol: Some("TCP".into()),
            port: Some(IntOrString::Int(port)),
            end_port: None,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::resources::init_job::init_job;
    use crate::resources::statefulset::statefulset;
    use crate::resources::testing;
    use crate::settings::Settings;
    use serde_json::json;

    fn with(network_policy: serde_json::Value) -> Database {
        testing::database(json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "init": {"sql": "select 1"},
            "networkPolicy": network_policy,
        }))
    }

    /// Whether `selector` selects a pod labelled `labels` (matchLabels, In, NotIn).
    fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        let exact = selector
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let expressions = selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                other => panic!("operator {other}"),
            }
        });
        exact && expressions
    }

    fn admitted(policy: &NetworkPolicy, port: i32, labels: &BTreeMap<String, String>) -> bool {
        let spec = policy.spec.as_ref().unwrap();
        spec.ingress.iter().flatten().any(|rule| {
            rule.ports
                .iter()
                .flatten()
                .any(|p| p.port == Some(IntOrString::Int(port)))
                && rule.from.iter().flatten().any(|peer| {
                    peer.namespace_selector.is_none()
                        && peer
                            .pod_selector
                            .as_ref()
                            .is_some_and(|s| selects(s, labels))
                })
        })
    }

    #[test]
    fn none_unless_the_spec_asks() {
        assert!(network_policy(&testing::minimal()).is_none());
        assert!(network_policy(&with(json!({"enabled": false}))).is_none());
        assert!(network_policy(&with(json!({}))).is_some());
    }

    #[test]
    fn it_selects_the_instances_and_is_owned_by_the_database() {
        let db = with(json!({}));
        let policy = network_policy(&db).unwrap();
        assert_eq!(policy.metadata.name.as_deref(), Some("orders"));
        assert_eq!(policy.metadata.namespace.as_deref(), Some("shop"));
        let owner = &policy.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Database", Some(true))
        );
        let labels = policy.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_MANAGED_BY], "dbop");
        let spec = policy.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert_eq!(spec.egress, None, "egress is not restricted");
        let pods = statefulset(&db, &Settings::default(), None)
            .spec
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert!(selects(spec.pod_selector.as_ref().unwrap(), &pods));
    }

    #[test]
    fn postgresql_admits_the_instances_and_dbops_jobs_but_no_other_pod() {
        let db = with(json!({}));
        let policy = network_policy(&db).unwrap();
        let settings = Settings::default();
        let instance = statefulset(&db, &settings, None).spec.template;
        let instance = instance.metadata.unwrap().labels.unwrap();
        assert!(admitted(&policy, 5432, &instance), "replication");
        let init = init_job(&db, &settings, None)
            .unwrap()
            .spec
            .unwrap()
            .template;
        let init = init.metadata.unwrap().labels.unwrap();
        assert!(admitted(&policy, 5432, &init), "the init Job");
        for component in ["backup", "verify", "restore", "preflight"] {
            let labels = crate::resources::job_pod_labels(&db, component);
            assert!(admitted(&policy, 5432, &labels), "{component}");
        }
        // Another Database's Job, a pod with the user's labels only: refused.
        let other = crate::resources::job_pod_labels(
            &testing::database(json!({
            "version": "16.4", "storage": {"size": "1Gi"}})),
            "backup",
        );
        let mut other = other;
        other.insert(LABEL_INSTANCE.into(), "invoices".into());
        assert!(!admitted(&policy, 5432, &other));
        let app = BTreeMap::from([("app".to_string(), "orders-api".to_string())]);
        assert!(!admitted(&policy, 5432, &app));
        // Nobody may scrape unless named: no metrics rule at all.
        let spec = policy.spec.unwrap();
        assert_eq!(spec.ingress.as_ref().unwrap().len(), 1);
        assert!(!admitted_anywhere(&spec, 9187));
    }

    fn admitted_anywhere(spec: &NetworkPolicySpec, port: i32) -> bool {
        spec.ingress.iter().flatten().any(|r| {
            r.ports
                .iter()
                .flatten()
                .any(|p| p.port == Some(IntOrString::Int(port)))
        })
    }

    #[test]
    fn the_spec_peers_go_in_as_kubernetes_spells_them() {
        let db = with(json!({
            "allowFrom": [
                {"podSelector": {"matchLabels": {"app": "orders-api"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "reporting"}},
                 "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["bi"]}]}},
                {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
            ],
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
            ]
        }));
        let policy = serde_json::to_value(network_policy(&db).unwrap()).unwrap();
        let ingress = &policy["spec"]["ingress"];
        assert_eq!(ingress.as_array().unwrap().len(), 2);
        assert_eq!(
            ingress[0]["ports"],
            json!([{"protocol": "TCP", "port": 5432}])
        );
        let from = ingress[0]["from"].as_array().unwrap();
        assert_eq!(
            from.len(),
            5,
            "instances, Jobs and the three peers: {from:?}"
        );
        assert_eq!(
            from[2],
            json!({"podSelector": {"matchLabels": {"app": "orders-api"}}})
        );
        assert_eq!(
            from[3],
            json!({
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "reporting"}},
                "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["bi"]}]}
            })
        );
        assert_eq!(
            from[4],
            json!({"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}})
        );
        assert_eq!(
            ingress[1]["ports"],
            json!([{"protocol": "TCP", "port": 9187}])
        );
        assert_eq!(
            ingress[1]["from"],
            json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
        );
    }

    #[test]
    fn no_metrics_rule_while_the_endpoint_is_off() {
        let mut db = with(json!({"metricsFrom": [{"namespaceSelector": {}}]}));
        assert_eq!(
            network_policy(&db)
                .unwrap()
                .spec
                .unwrap()
                .ingress
                .unwrap()
                .len(),
            2
        );
        db.spec.monitoring = Some(MonitoringSpec {
            enabled: Some(false),
            ..MonitoringSpec::default()
        });
        let spec = network_policy(&db).unwrap().spec.unwrap();
        assert!(!admitted_anywhere(&spec, 9187));
    }

    #[test]
    fn the_status_port_admits_only_the_operator_and_only_when_it_reads_it() {
        let mut db = with(json!({}));
        assert!(!admitted_anywhere(
            &network_policy(&db).unwrap().spec.unwrap(),
            8008
        ));
        let mut growing = db.clone();
        growing.spec.storage.auto_grow =
            serde_json::from_value(json!({"maximum": "10Gi"})).unwrap();
        let spec = network_policy(&growing).unwrap().spec.unwrap();
        assert!(admitted_anywhere(&spec, 8008));
        db.spec.instances = 3;
        let policy = serde_json::to_value(network_policy(&db).unwrap()).unwrap();
        let status = &policy["spec"]["ingress"][1];
        assert_eq!(status["ports"], json!([{"protocol": "TCP", "port": 8008}]));
        assert_eq!(
            status["from"],
            json!([{"namespaceSelector": {}, "podSelector": {"matchLabels": {
                "app.kubernetes.io/component": "operator", "app.kubernetes.io/name": "dbop"}}}])
        );
    }

    #[test]
    fn no_rule_ever_has_an_empty_from() {
        for spec in [json!({}), json!({"allowFrom": [], "metricsFrom": []})] {
            let policy = network_policy(&with(spec)).unwrap();
            for rule in policy.spec.unwrap().ingress.unwrap() {
                assert!(
                    !rule.from.unwrap_or_default().is_empty(),
                    "an empty from admits everyone"
                );
            }
        }
    }
}
