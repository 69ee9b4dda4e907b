//! Several instances on a real control plane (kwok plays the kubelets, so no server runs: this
//! is the control flow, and the test renews the primary Lease as the managers would): a
//! 3-instance Database reaches Ready with its primary recorded in the status and on the pods, the standbys labelled so, `-rw`, `-ro` and `-r` selecting by those
//! labels, the replication Secret made, the topology published to the instances; a role label
//! removed by hand comes back; a PodDisruptionBudget allows one disruption at a time; scaling
//! down drops the instance from the status and topology, and at one instance the budget;
//! `spec.replicas` is refused with a message that names `spec.instances`.

use std::collections::BTreeMap;

use dbop::api::{InstanceRole, Phase};
use dbop_contract::topology::Topology;
use dbop_e2e::primary_lease::Renewing;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

fn role(pod: &Pod) -> Option<String> {
    pod.metadata.labels.as_ref()?.get("dbop.dev/role").cloned()
}

async fn roles(pods: &Api<Pod>, names: &[&str]) -> Vec<Option<String>> {
    let mut out = vec![];
    for name in names {
        out.push(
            pods.get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|p| role(&p)),
        );
    }
    out
}

/// The pods behind a Service's ready endpoints (its EndpointSlices).
async fn endpoint_pods(slices: &Api<EndpointSlice>, service: &str) -> Vec<String> {
    let selector = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let Ok(list) = slices.list(&selector).await else {
        return vec![];
    };
    let mut pods: Vec<String> = list
        .items
        .into_iter()
        .flat_map(|s| s.endpoints.unwrap_or_default())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .filter_map(|e| e.target_ref.and_then(|r| r.name))
        .collect();
    pods.sort();
    pods
}

#[tokio::test]
async fn three_instances_get_roles_services_status_and_a_topology() {
    let bed = testbed().await;
    let ns = bed.namespace("instances").await;
    let _operator = bed.operator_in_process(&ns).await;
    let _managers = Renewing::as_managers(&bed, &ns, "ha");
    bed.apply_database(&ns, database_manifest("ha", json!({"instances": 3})))
        .await;
    let db = bed.wait_for_phase(&ns, "ha", Phase::Ready, WAIT).await;
    let status = db.status.unwrap();
    assert_eq!(status.primary.as_deref(), Some("ha-0"));
    let lines: Vec<_> = status
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.ready))
        .collect();
    assert_eq!(
        lines,
        [
            ("ha-0", InstanceRole::Primary, true),
            ("ha-1", InstanceRole::Standby, true),
            ("ha-2", InstanceRole::Standby, true),
        ]
    );
    assert!(status.instances.iter().all(|i| i.node.is_some()));

    // The pods carry their roles; the Services select by them.
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let want = |r: &str| Some(r.to_string());
    assert_eq!(
        roles(&pods, &["ha-0", "ha-1", "ha-2"]).await,
        [want("primary"), want("standby"), want("standby")]
    );
    let endpoints: Api<EndpointSlice> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the Services' endpoints", WAIT, || async {
        let rw = endpoint_pods(&endpoints, "ha-rw").await;
        let ro = endpoint_pods(&endpoints, "ha-ro").await;
        let r = endpoint_pods(&endpoints, "ha-r").await;
        (rw == ["ha-0"] && ro == ["ha-1", "ha-2"] && r == ["ha-0", "ha-1", "ha-2"]).then_some(())
    })
    .await;
    let services: Api<Service> = Api::namespaced(bed.client.clone(), &ns);
    let ro = services.get("ha-ro").await.unwrap();
    assert_eq!(
        ro.spec.unwrap().selector.unwrap()["dbop.dev/role"],
        "standby"
    );

    // The replication role's Secret, and the topology every instance reads.
    let secret = Api::<Secret>::namespaced(bed.client.clone(), &ns)
        .get("ha-replication")
        .await
        .expect("the replication Secret");
    assert_eq!(secret.data.unwrap()["password"].0.len(), 32);
    let config = Api::<ConfigMap>::namespaced(bed.client.clone(), &ns)
        .get("ha-config")
        .await
        .unwrap();
    let topology = Topology::parse(&config.data.unwrap()["topology"]).unwrap();
    assert_eq!(topology.primary, "ha-0");
    assert_eq!(topology.standbys(), ["ha-1", "ha-2"]);
    assert_eq!(topology.members[1].host, format!("ha-1.ha-hl.{ns}.svc"));

    // One disruption at a time.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(bed.client.clone(), &ns);
    let budget = budgets.get("ha").await.expect("the disruption budget");
    assert_eq!(
        budget.spec.unwrap().max_unavailable,
        Some(IntOrString::Int(1))
    );

    // A role label taken away by hand comes back.
    let remove = json!({"metadata": {"labels": {"dbop.dev/role": null}}});
    pods.patch("ha-1", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .unwrap();
    wait_until("ha-1's role label back", WAIT, || async {
        let pod = pods.get("ha-1").await.ok()?;
        (role(&pod).as_deref() == Some("standby")).then_some(())
    })
    .await;

    // Down to 2: the status and the topology follow; the primary stays.
    bed.apply_database(&ns, database_manifest("ha", json!({"instances": 2})))
        .await;
    let databases = bed.databases(&ns);
    wait_until("two instances in the status", WAIT, || async {
        let db = databases.get("ha").await.ok()?;
        let s = db.status?;
        let names: Vec<_> = s.instances.iter().map(|i| i.name.clone()).collect();
        (names == ["ha-0", "ha-1"] && s.phase == Some(Phase::Ready)).then_some(())
    })
    .await;
    let configs: Api<ConfigMap> = Api::namespaced(bed.client.clone(), &ns);
    let topology = wait_until("the topology without ha-2", WAIT, || async {
        let data: BTreeMap<String, String> = configs.get("ha-config").await.ok()?.data?;
        let t = Topology::parse(&data["topology"]).ok()?;
        (t.members.len() == 2).then_some(t)
    })
    .await;
    assert_eq!(topology.primary, "ha-0");

    // Down to one: no budget (it would block every drain of the node).
    bed.apply_database(&ns, database_manifest("ha", json!({"instances": 1})))
        .await;
    wait_until("the disruption budget deleted", WAIT, || async {
        budgets.get_opt("ha").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_old_replicas_field_is_refused_with_a_message_naming_instances() {
    let bed = testbed().await;
    let ns = bed.namespace("replicas").await;
    let api = bed.databases(&ns);
    let mut manifest = database_manifest("old", json!({"replicas": 3}));
    manifest["apiVersion"] = "dbop.dev/v1alpha1".into();
    manifest["kind"] = "Database".into();
    let refused = api
        .patch(
            "old",
            &PatchParams::apply("e2e-tests").force(),
            &Patch::Apply(&manifest),
        )
        .await
        .expect_err("spec.replicas: 3 admitted");
    let message = refused.to_string();
    assert!(message.contains("spec.instances"), "{message}");
    // 1 (what an earlier dbop stored by default) is still admitted.
    bed.apply_database(&ns, database_manifest("kept", json!({"replicas": 1})))
        .await;
    for bad in [0, 6] {
        let mut manifest = database_manifest("many", json!({"instances": bad}));
        manifest["apiVersion"] = "dbop.dev/v1alpha1".into();
        manifest["kind"] = "Database".into();
        let refused = api
            .patch(
                "many",
                &PatchParams::apply("e2e-tests").force(),
                &Patch::Apply(&manifest),
            )
            .await
            .expect_err("instances out of range admitted");
        assert!(refused.to_string().contains("spec.instances"), "{refused}");
    }
}
