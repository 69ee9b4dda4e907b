//! A namespace with a ResourceQuota on cpu and memory (requests and limits) and no LimitRange:
//! the API server refuses every container without requests and limits, so a Database without
//! `spec.resources` is admitted only because every container dbop creates carries them — the
//! database pod's (the default resources), its copying init container, the init Job's.
//! kwok is enough: the quota admission is the API server's.

use dbop::api::Phase;
use dbop_e2e::{WAIT, database_manifest, testbed};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

/// The containers of a pod, init containers included, that lack a request or a limit of cpu
/// or memory.
fn unbounded(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref().expect("pod spec");
    let init = spec.init_containers.iter().flatten();
    let bounded = |c: &Container| {
        let r = c.resources.as_ref();
        ["cpu", "memory"].iter().all(|k| {
            r.and_then(|r| r.requests.as_ref())
                .is_some_and(|m| m.contains_key(*k))
                && r.and_then(|r| r.limits.as_ref())
                    .is_some_and(|m| m.contains_key(*k))
        })
    };
    init.chain(&spec.containers)
        .filter(|c| !bounded(c))
        .map(|c| c.name.clone())
        .collect()
}

#[tokio::test]
async fn under_a_resource_quota_a_database_without_resources_reaches_ready() {
    let bed = testbed().await;
    let ns = bed.namespace("quota").await;
    bed.compute_quota(&ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        database_manifest(
            "ledger",
            json!({"init": {"sql": "CREATE TABLE t (id int);"}}),
        ),
    )
    .await;
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, WAIT).await;
    let pods = Api::<Pod>::namespaced(bed.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("pods");
    let names: Vec<_> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "ledger-0"), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("ledger-init")),
        "the init Job's pod: {names:?}"
    );
    for pod in &pods {
        let missing = unbounded(pod);
        assert!(
            missing.is_empty(),
            "pod {:?}: containers without requests and limits: {missing:?}",
            pod.metadata.name
        );
    }
    bed.assert_quota_counted(&ns).await;
}
