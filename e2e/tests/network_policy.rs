//! `spec.networkPolicy` on a real control plane. The test bed cannot enforce a NetworkPolicy
//! (kwok runs no network at all, and the real node's bridge CNI ignores NetworkPolicy), so this
//! suite checks the object dbop makes and keeps, not the traffic it stops: enabled → a policy
//! over the database pods that admits the spec's peers, the instances and dbop's Jobs on
//! PostgreSQL's port and `metricsFrom` on the metrics port; a spec change → updated; a hand
//! edit or a deletion → put back; what the schema can judge refused at apply time; a peer only
//! the API server's NetworkPolicy validation refuses → `NetworkPolicyReady` False and a Warning
//! Event, the policy in place kept; disabled → deleted and the condition gone; the Database
//! deleted → the policy collected with it.

use dbop::api::Phase;
use dbop_e2e::{WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

fn spec(allow_from: Value) -> Value {
    json!({"networkPolicy": {
        "allowFrom": allow_from,
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    }})
}

fn api_peer() -> Value {
    json!({"podSelector": {"matchLabels": {"app": "orders-api"}}})
}

fn reporting_peer() -> Value {
    json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "reporting"}}})
}

/// The policy's `from` peers on `port`, as JSON.
fn peers_on(policy: &NetworkPolicy, port: i64) -> Vec<Value> {
    let policy = serde_json::to_value(policy).unwrap();
    policy["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rule| rule["ports"][0]["port"] == port)
        .flat_map(|rule| rule["from"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The peers every policy of Database `orders` starts with: its instances and dbop's Jobs.
fn own_peers() -> [Value; 2] {
    let instance =
        json!({"app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "dbop"});
    let mut instances = instance.clone();
    instances["app.kubernetes.io/name"] = json!("postgresql");
    [
        json!({"podSelector": {"matchLabels": instances}}),
        json!({"podSelector": {
            "matchLabels": instance,
            "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["database"]}]
        }}),
    ]
}

async fn policy_gone(policies: &Api<NetworkPolicy>, what: &str) {
    wait_until(what, WAIT, || async {
        policies
            .get_opt("orders")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

async fn policy_with(policies: &Api<NetworkPolicy>, what: &str, want: &[Value]) -> NetworkPolicy {
    wait_until(what, WAIT, || async {
        let policy = policies.get_opt("orders").await.ok()??;
        (peers_on(&policy, 5432) == want).then_some(policy)
    })
    .await
}

#[tokio::test]
async fn a_network_policy_is_made_kept_in_shape_and_deleted() {
    let bed = testbed().await;
    let ns = bed.namespace("netpol").await;
    let _operator = bed.operator_in_process(&ns).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(bed.client.clone(), &ns);

    // Enabled: the instances, dbop's Jobs and the spec's peers on 5432; Prometheus on 9187.
    let first = spec(json!([api_peer(), reporting_peer()]));
    bed.apply_database(&ns, database_manifest("orders", first.clone()))
        .await;
    let db = bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let [instances, jobs] = own_peers();
    let want = [instances, jobs, api_peer(), reporting_peer()];
    let policy = policy_with(&policies, "the NetworkPolicy", &want).await;
    let owner = &policy.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Database", Some(true))
    );
    assert_eq!(Some(&owner.uid), db.metadata.uid.as_ref());
    let body = serde_json::to_value(&policy).unwrap();
    assert_eq!(body["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        body["spec"]["podSelector"],
        json!({"matchLabels": {"app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/managed-by": "dbop", "app.kubernetes.io/name": "postgresql"}})
    );
    assert_eq!(
        peers_on(&policy, 9187),
        [
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
        ]
    );
    let ready = wait_until("NetworkPolicyReady", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        condition(&db, "NetworkPolicyReady")
    })
    .await;
    assert_eq!(ready, ("True".to_string(), "Applied".to_string()));

    // A spec change: the policy follows.
    let vpn = json!({"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}});
    let second = spec(json!([api_peer(), vpn.clone()]));
    bed.apply_database(&ns, database_manifest("orders", second.clone()))
        .await;
    let mut want = want.to_vec();
    want[3] = vpn;
    policy_with(&policies, "the policy with the new peers", &want).await;

    // A hand edit that opens PostgreSQL to every pod: put back.
    let open = json!({"spec": {"ingress": [{"from": [{"podSelector": {}}]}]}});
    policies
        .patch("orders", &PatchParams::default(), &Patch::Merge(&open))
        .await
        .unwrap();
    policy_with(&policies, "the hand edit undone", &want).await;
    // Deleted by hand: made again.
    policies
        .delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    policy_with(&policies, "the deleted policy made again", &want).await;

    // What the schema can judge is refused at apply time, naming the problem.
    let refused = [
        (
            json!([{}]),
            "a peer names podSelector, namespaceSelector or ipBlock",
        ),
        (
            json!([{"ipBlock": {"cidr": "10.0.0.0/33"}}]),
            "ipBlock.cidr must be a CIDR",
        ),
        (
            json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]),
            "strictly inside ipBlock.cidr",
        ),
        (
            json!([{"ipBlock": {"cidr": "10.0.0.0/16"}, "podSelector": {}}]),
            "ipBlock cannot be combined",
        ),
    ];
    for (allow_from, message) in refused {
        let error = bed
            .try_apply_database(&ns, database_manifest("orders", spec(allow_from.clone())))
            .await
            .expect_err(&format!("{allow_from} admitted"));
        assert!(error.contains(message), "{allow_from}: {error}");
    }

    // What only the API server's NetworkPolicy validation judges (an In without values):
    // NetworkPolicyReady False and a Warning Event naming spec.networkPolicy; the policy in place
    // stays as it was.
    let bad = json!([{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}]);
    bed.apply_database(&ns, database_manifest("orders", spec(bad)))
        .await;
    let message = wait_until("NetworkPolicyReady False", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        let c = db
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "NetworkPolicyReady")?;
        (c.status == "False" && c.reason == "NetworkPolicyRefused").then_some(c.message)
    })
    .await;
    assert!(message.contains("spec.networkPolicy"), "{message}");
    assert!(message.contains("values"), "{message}");
    let events: Api<Event> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the NetworkPolicyRefused Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=NetworkPolicyRefused"))
            .await
            .ok()?;
        (list
            .items
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")))
        .then_some(())
    })
    .await;
    let kept = policies.get("orders").await.unwrap();
    assert_eq!(peers_on(&kept, 5432), want, "the policy in place is kept");
    // Fixed: True again.
    bed.apply_database(&ns, database_manifest("orders", second))
        .await;
    wait_until("NetworkPolicyReady True again", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        (condition(&db, "NetworkPolicyReady")?.0 == "True").then_some(())
    })
    .await;

    // Disabled: the policy is deleted and the condition goes with it.
    let mut off = spec(json!([api_peer()]));
    off["networkPolicy"]["enabled"] = json!(false);
    bed.apply_database(&ns, database_manifest("orders", off))
        .await;
    policy_gone(&policies, "the policy deleted").await;
    wait_until("NetworkPolicyReady gone", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        condition(&db, "NetworkPolicyReady").is_none().then_some(())
    })
    .await;

    // On again, then the Database deleted: the policy goes with it (its owner reference).
    bed.apply_database(&ns, database_manifest("orders", spec(json!([api_peer()]))))
        .await;
    wait_until("the policy made again", WAIT, || async {
        policies.get_opt("orders").await.ok()?.map(|_| ())
    })
    .await;
    bed.databases(&ns)
        .delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    policy_gone(&policies, "the policy collected with its Database").await;
}

/// Without `spec.networkPolicy` (every Database before it existed) there is no policy and no
/// condition.
#[tokio::test]
async fn a_database_without_the_field_gets_no_policy() {
    let bed = testbed().await;
    let ns = bed.namespace("netpol-off").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("orders", json!({})))
        .await;
    let db = bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    assert_eq!(condition(&db, "NetworkPolicyReady"), None);
    let policies: Api<NetworkPolicy> = Api::namespaced(bed.client.clone(), &ns);
    assert!(
        policies
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
