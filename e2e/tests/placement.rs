//! `spec.placement` for real: a Database whose placement names the real node runs there, and so
//! does its init Job (Jobs inherit the database's placement) — in a plain namespace, with no
//! admission plugin adding anything; a Database whose placement matches no node stays
//! Provisioning with its pod Pending and the scheduler saying why.

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::node::{REAL_NODE, REAL_NODE_STORAGE_CLASS, REAL_NODE_TAINT, real_node_placement};
use dbop_e2e::{condition, testbed, wait_until};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

const READY_WAIT: Duration = Duration::from_secs(240);

fn database(name: &str, placement: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": placement,
        "init": {"sql": "CREATE TABLE placed (id int);"},
    }})
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

#[tokio::test]
async fn a_database_and_its_init_job_run_where_the_placement_says() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("place").await;
    let namespace = Api::<Namespace>::all(bed.client.clone())
        .get(&ns)
        .await
        .expect("namespace");
    assert_eq!(
        namespace.metadata.annotations.unwrap_or_default().len(),
        0,
        "a plain namespace: nothing places its pods but their own spec"
    );
    let _operator = bed.operator_for_real_node(&ns);
    // The real node's selector and toleration, and a required node affinity to its hostname.
    let mut placement = real_node_placement();
    placement["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [REAL_NODE]}]}]}}});
    bed.apply_database(&ns, database("placed", placement)).await;
    bed.wait_for_phase(&ns, "placed", Phase::Ready, READY_WAIT)
        .await;
    let pods = Api::<Pod>::namespaced(bed.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("pods");
    let on = |prefix: &str| {
        let pod = pods
            .iter()
            .find(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .unwrap_or_else(|| panic!("no pod {prefix}*"));
        let spec = pod.spec.as_ref().unwrap();
        let tolerates = spec
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some(REAL_NODE_TAINT));
        assert!(tolerates, "{prefix}: {:?}", spec.tolerations);
        assert!(spec.affinity.is_some(), "{prefix}: the affinity");
        node_of(pod).map(String::from)
    };
    assert_eq!(
        on("placed-0").as_deref(),
        Some(REAL_NODE),
        "the database pod"
    );
    assert_eq!(
        on("placed-init").as_deref(),
        Some(REAL_NODE),
        "the init Job's pod"
    );
}

#[tokio::test]
async fn a_database_whose_placement_matches_no_node_waits_with_the_scheduler_saying_why() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("place-none").await;
    let _operator = bed.operator_for_real_node(&ns);
    let placement = json!({"nodeSelector": {"e2e.dbop.dev/no-such-pool": "true"}});
    bed.apply_database(&ns, database("nowhere", placement))
        .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let reason = wait_until("the pod's PodScheduled condition", READY_WAIT, || async {
        let pod = pods.get_opt("nowhere-0").await.ok().flatten()?;
        let status = pod.status?;
        let scheduled = status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        (status.phase.as_deref() == Some("Pending")).then_some(scheduled)
    })
    .await;
    assert_eq!(
        reason.reason.as_deref(),
        Some("Unschedulable"),
        "{reason:?}"
    );
    let message = reason.message.unwrap_or_default();
    assert!(
        message.contains("node affinity/selector") || message.contains("selector"),
        "{message}"
    );
    let events = Api::<Event>::namespaced(bed.client.clone(), &ns);
    wait_until("a FailedScheduling Event", READY_WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nowhere-0")
            })
            .then_some(())
    })
    .await;
    // The Database says it waits for its StatefulSet (dbop does not read the pod today).
    let db = bed.databases(&ns).get("nowhere").await.expect("database");
    assert_eq!(
        db.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Provisioning)
    );
    assert_eq!(
        condition(&db, "Ready").map(|c| c.0).as_deref(),
        Some("False")
    );
}
