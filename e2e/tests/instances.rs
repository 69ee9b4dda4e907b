//! Several instances on a real control plane (kwok plays the kubelets, so no server runs: this
//! is the control flow, and the test renews the primary Lease as the managers would): a
//! 3-instance Database reaches Ready with its primary recorded in the status and on the pods, the standbys labelled so, `-rw`, `-ro` and `-r` selecting by those
//! labels, the replication Secret made, the topology published to the instances; a role label
//! removed by hand comes back; PodDisruptionBudgets let a drain take one standby at a time and
//! never the primary; scaling down drops the instance from the status and topology, and at one
//! instance the budgets; `spec.replicas` is refused with a message that names `spec.instances`.
//! A drain: the primary's node cordoned, its eviction refused until it has handed over to a
//! standby on another node (a DrainSwitchover Event), then allowed.

use std::collections::BTreeMap;

use dbop::api::{InstanceRole, Phase};
use dbop_contract::topology::Topology;
use dbop_e2e::primary_lease::Renewing;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
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

    // One standby at a time, never the primary.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(bed.client.clone(), &ns);
    let budget = budgets
        .get("ha")
        .await
        .expect("the standbys' disruption budget");
    assert_eq!(
        budget.spec.unwrap().min_available,
        Some(IntOrString::Int(1))
    );
    let budget = budgets
        .get("ha-primary")
        .await
        .expect("the primary's disruption budget");
    assert_eq!(
        budget.spec.unwrap().min_available,
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
    wait_until("the disruption budgets deleted", WAIT, || async {
        let standbys = budgets.get_opt("ha").await.ok()?;
        let primary = budgets.get_opt("ha-primary").await.ok()?;
        (standbys.is_none() && primary.is_none()).then_some(())
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

/// Three fake nodes of this test's own (kwok manages them): only its Database tolerates their
/// taint and selects their label, and cordoning one disturbs no other suite. Deleted on drop.
struct OwnNodes {
    nodes: Api<Node>,
    names: Vec<String>,
}

impl OwnNodes {
    async fn create(bed: &dbop_e2e::TestBed, ns: &str) -> OwnNodes {
        let nodes: Api<Node> = Api::all(bed.client.clone());
        let names: Vec<String> = (0..3).map(|i| format!("{ns}-{i}")).collect();
        for name in &names {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"dbop.dev/e2e-drain": ns,
                                                      "kubernetes.io/hostname": name},
                             "annotations": {"kwok.x-k8s.io/node": "fake"}},
                "spec": {"taints": [{"key": "dbop.dev/e2e-drain", "value": ns,
                                     "effect": "NoSchedule"}]},
            }))
            .unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
        }
        OwnNodes { nodes, names }
    }

    /// The Database's placement on them.
    fn placement(ns: &str) -> serde_json::Value {
        json!({
            "nodeSelector": {"dbop.dev/e2e-drain": ns},
            "tolerations": [{"key": "dbop.dev/e2e-drain", "operator": "Exists",
                             "effect": "NoSchedule"}],
        })
    }
}

impl Drop for OwnNodes {
    fn drop(&mut self) {
        let (nodes, names) = (self.nodes.clone(), self.names.clone());
        // Deleted in the background: a drop cannot wait, and the bed goes down after the suite.
        tokio::spawn(async move {
            for name in names {
                let _ = nodes.delete(&name, &DeleteParams::default()).await;
            }
        });
    }
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// The pods of `ns` through a client that does not retry a 429 (kube's does, for minutes): a
/// refused eviction is an answer here, as it is to `kubectl drain`.
async fn pods_without_retries(bed: &dbop_e2e::TestBed, ns: &str) -> Api<Pod> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&bed.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.default_retry = false;
    Api::namespaced(kube::Client::try_from(config).unwrap(), ns)
}

/// Evicts `pod`: Ok, or the API server's refusal (its HTTP code).
async fn evict(pods: &Api<Pod>, pod: &str) -> Result<(), u16> {
    match pods.evict(pod, &EvictParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.code),
        Err(other) => panic!("evicting {pod}: {other}"),
    }
}

#[tokio::test]
async fn a_drain_waits_for_the_primary_to_hand_over_then_evicts_it_as_a_standby() {
    let bed = testbed().await;
    let ns = bed.namespace("drain").await;
    let own = OwnNodes::create(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let _managers = Renewing::as_managers(&bed, &ns, "dr");
    let spec = json!({"instances": 3, "placement": OwnNodes::placement(&ns)});
    bed.apply_database(&ns, database_manifest("dr", spec)).await;
    let db = bed.wait_for_phase(&ns, "dr", Phase::Ready, WAIT).await;
    assert_eq!(db.status.unwrap().primary.as_deref(), Some("dr-0"));
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let primary_node = node_of(&pods.get("dr-0").await.unwrap()).unwrap();
    assert!(own.names.contains(&primary_node), "{primary_node}");
    let mut elsewhere = vec![];
    for standby in ["dr-1", "dr-2"] {
        if node_of(&pods.get(standby).await.unwrap()).as_ref() != Some(&primary_node) {
            elsewhere.push(standby);
        }
    }
    assert!(!elsewhere.is_empty(), "every instance on {primary_node}");

    // The primary's budget refuses its eviction (once the disruption controller has counted).
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the budgets counted", WAIT, || async {
        let allowed =
            |b: PodDisruptionBudget| b.status.and_then(|s| s.disruptions_allowed).unwrap_or(-1);
        let standbys = allowed(budgets.get("dr").await.ok()?);
        let primary = allowed(budgets.get("dr-primary").await.ok()?);
        (standbys == 1 && primary == 0).then_some(())
    })
    .await;
    let evictions = pods_without_retries(&bed, &ns).await;
    assert_eq!(
        evict(&evictions, "dr-0").await,
        Err(429),
        "the primary evicted"
    );

    // `kubectl drain` cordons first: the primary hands over to a standby on another node.
    let nodes: Api<Node> = Api::all(bed.client.clone());
    let cordon = json!({"spec": {"unschedulable": true}});
    nodes
        .patch(
            &primary_node,
            &PatchParams::default(),
            &Patch::Merge(&cordon),
        )
        .await
        .unwrap();
    let databases = bed.databases(&ns);
    let primary = wait_until("a primary on another node", WAIT, || async {
        let primary = databases.get("dr").await.ok()?.status?.primary?;
        (primary != "dr-0").then_some(primary)
    })
    .await;
    assert_eq!(primary, elsewhere[0], "the lowest ready standby elsewhere");
    let events = bed.event_messages(&ns, "DrainSwitchover");
    let expected =
        format!("from dr-0 to {primary} before the drain of its cordoned node evicts dr-0");
    assert!(events.contains(&expected), "{events:?}");

    // Now a standby: the drain's next try evicts it.
    wait_until("dr-0 evicted as a standby", WAIT, || async {
        evict(&evictions, "dr-0").await.ok()
    })
    .await;
    let failovers = bed.event_messages(&ns, "FailedOver");
    assert!(failovers.trim().is_empty(), "a failover: {failovers}");
    // (The drop's deletion is a fallback for a failed test: a runtime ending may not run it.)
    for name in &own.names {
        own.nodes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
}
