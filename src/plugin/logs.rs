//! `kubectl dbop logs`: which pod's log (a Database's instance, its primary by default, or the
//! operator's) and the `kubectl logs` command line. Pure.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;

use super::psql::{CONTAINER, primary_pod};
use crate::api::Database;
use crate::resources::replication::ROLE_LABEL;
use crate::resources::{Names, selector_labels};

/// The labels the chart gives the operator's pods (`charts/dbop/templates/_helpers.tpl`).
pub const OPERATOR_SELECTOR: &str =
    "app.kubernetes.io/name=dbop,app.kubernetes.io/component=operator";
/// The operator's container in the chart's Deployment.
pub const OPERATOR_CONTAINER: &str = "dbop";

/// The label selector of the Database's instance pods.
pub fn instance_selector(db: &Database) -> String {
    selector_labels(&db.name())
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The instance pod whose log to show: `instance` when given (it must be one of the
/// Database's, `<name>-<ordinal>`), else the pod labelled `dbop.dev/role=primary`, else the
/// primary the status names (or the first instance).
pub fn instance_pod(db: &Database, pods: &[Pod], instance: Option<&str>) -> Result<String, String> {
    if let Some(instance) = instance {
        let names = Names::of(db);
        let instances = db.spec.instances.max(1);
        return match (0..instances).map(|i| names.pod(i)).find(|p| p == instance) {
            Some(pod) => Ok(pod),
            None => Err(format!(
                "{instance} is not an instance of Database {}: it has {} ({})",
                db.name(),
                instances,
                (0..instances)
                    .map(|i| names.pod(i))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
    }
    let labelled = pods.iter().find(|p| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ROLE_LABEL))
            .is_some_and(|r| r == "primary")
    });
    Ok(labelled
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_else(|| primary_pod(db)))
}

/// The operator pod whose log to show, as (namespace, name): the leader (the holder of a
/// Lease in its namespace: the chart's pods hold it under their own name), else the first
/// running one by name, else the first. Operators in several namespaces (two installations)
/// are not guessed between: the error names them, for `-n`.
pub fn operator_pod(pods: &[Pod], leases: &[Lease]) -> Result<(String, String), String> {
    let mut namespaces: Vec<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.namespace.as_deref())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    if namespaces.len() > 1 {
        return Err(format!(
            "operator pods in several namespaces ({}): name one with -n",
            namespaces.join(", ")
        ));
    }
    let key = |p: &Pod| {
        (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    let mut pods: Vec<&Pod> = pods.iter().collect();
    pods.sort_by_key(|p| key(p));
    let leader = pods.iter().find(|p| {
        leases.iter().any(|l| {
            l.metadata.namespace == p.metadata.namespace
                && l.spec.as_ref().and_then(|s| s.holder_identity.as_ref())
                    == p.metadata.name.as_ref()
        })
    });
    let running = pods
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
    leader
        .or(running)
        .or(pods.first())
        .map(|p| key(p))
        .ok_or_else(|| format!("no operator pod found (pods labelled {OPERATOR_SELECTOR})"))
}

/// The arguments after `kubectl` (and its global flags): `logs` of the container, following
/// with `follow`, the last `tail` lines when given.
pub fn logs_args(
    ns: &str,
    pod: &str,
    container: &str,
    follow: bool,
    tail: Option<u32>,
) -> Vec<String> {
    let mut args: Vec<String> = ["logs", "-n", ns, pod, "-c", container]
        .map(String::from)
        .to_vec();
    if follow {
        args.push("-f".into());
    }
    if let Some(tail) = tail {
        args.push(format!("--tail={tail}"));
    }
    args
}

/// The container of an instance pod that runs the server.
pub const INSTANCE_CONTAINER: &str = CONTAINER;

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, labels: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn three_instances() -> Database {
        let mut db = crate::resources::testing::minimal();
        db.spec.instances = 3;
        db
    }

    #[test]
    fn the_primary_is_the_pod_labelled_primary_not_the_first_or_the_status_s() {
        let mut db = three_instances();
        db.status = Some(crate::api::DatabaseStatus {
            primary: Some("orders-0".into()),
            ..Default::default()
        });
        let pods = [
            pod(
                "shop",
                "orders-0",
                serde_json::json!({"dbop.dev/role": "standby"}),
                "Running",
            ),
            pod(
                "shop",
                "orders-2",
                serde_json::json!({"dbop.dev/role": "primary"}),
                "Running",
            ),
        ];
        assert_eq!(instance_pod(&db, &pods, None).unwrap(), "orders-2");
        // No pod labelled yet: the status's primary.
        assert_eq!(instance_pod(&db, &pods[..1], None).unwrap(), "orders-0");
        assert_eq!(
            instance_pod(&db, &pods, Some("orders-1")).unwrap(),
            "orders-1"
        );
        let err = instance_pod(&db, &pods, Some("orders-3")).unwrap_err();
        assert_eq!(
            err,
            "orders-3 is not an instance of Database orders: it has 3 (orders-0, orders-1, orders-2)"
        );
    }

    #[test]
    fn the_operator_pod_is_the_lease_holder_else_a_running_one() {
        let op = serde_json::json!({"app.kubernetes.io/name": "dbop"});
        let pods = [
            pod("dbop-system", "dbop-a", op.clone(), "Pending"),
            pod("dbop-system", "dbop-b", op.clone(), "Running"),
            pod("dbop-system", "dbop-c", op.clone(), "Running"),
        ];
        let lease = |ns: &str, holder: &str| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "dbop-leader", "namespace": ns},
                "spec": {"holderIdentity": holder}
            }))
            .unwrap()
        };
        let at = |name: &str| Ok(("dbop-system".to_string(), name.to_string()));
        assert_eq!(
            operator_pod(&pods, &[lease("dbop-system", "dbop-c")]),
            at("dbop-c")
        );
        // A holder of that name in another namespace is not ours.
        assert_eq!(
            operator_pod(&pods, &[lease("elsewhere", "dbop-c")]),
            at("dbop-b")
        );
        assert_eq!(operator_pod(&pods[..1], &[]), at("dbop-a"));
        assert!(
            operator_pod(&[], &[])
                .unwrap_err()
                .contains("no operator pod found")
        );
        let two = [pods[1].clone(), pod("team-b", "dbop-x", op, "Running")];
        assert_eq!(
            operator_pod(&two, &[]).unwrap_err(),
            "operator pods in several namespaces (dbop-system, team-b): name one with -n"
        );
    }

    #[test]
    fn logs_args_name_the_container_follow_and_tail() {
        assert_eq!(
            logs_args("shop", "orders-2", INSTANCE_CONTAINER, true, Some(100)).join(" "),
            "logs -n shop orders-2 -c postgres -f --tail=100"
        );
        assert_eq!(
            logs_args("dbop-system", "dbop-b", OPERATOR_CONTAINER, false, None).join(" "),
            "logs -n dbop-system dbop-b -c dbop"
        );
    }

    #[test]
    fn the_instance_selector_is_the_database_s_pods() {
        assert_eq!(
            instance_selector(&three_instances()),
            "app.kubernetes.io/instance=orders,app.kubernetes.io/managed-by=dbop,app.kubernetes.io/name=postgresql"
        );
    }
}
