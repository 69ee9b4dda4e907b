//! A node's loss, on the test bed's two real nodes, with the locally built images: a 3-instance
//! Database with synchronous replication (any 1 of 2 standbys confirms a commit) spreads over
//! both nodes, its primary on the second node (the only instance there: the node has one
//! volume), while a writer in a client pod on the first node commits through `-rw` with its own
//! log of acknowledged commits. The second node is then lost at once: its kubelet, its container
//! runtime and every process of its pods are killed with `kill -9`, and the API server goes on
//! calling it Ready (the node controller's grace has not run out). A standby on the first node
//! must be promoted, writes through `-rw` resume, and every acknowledged commit is on the new
//! primary. When the node comes back, its old primary rejoins as a standby with every row.
//!
//! Then the primary moves back to the second node, and the node is drained with `kubectl drain`
//! while the writer goes on: the eviction of the primary is refused until it has handed over to
//! a standby on the first node, then it is evicted, and the drain completes. Uncordoned, the
//! node gets its instance back as a standby; every acknowledged commit of the whole run is on
//! the last primary.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::failover::{
    FAILOVER_WAIT, every_acknowledged_commit_is_on, more_acknowledged, new_primary,
    start_acked_writer,
};
use dbop_e2e::instances::{REPLICATION_WAIT, real_node_database};
use dbop_e2e::node::{REAL_NODE, SECOND_NODE, two_real_nodes_placement};
use dbop_e2e::{TestBed, testbed, wait_until};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

/// A primary's initdb and two clones, one after the other, on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(420);

/// The node each instance of Database `name` runs on, by pod name.
async fn nodes_of(bed: &TestBed, ns: &str, name: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let selector =
        format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=database");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .expect("listing the instances")
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
        .collect()
}

/// The instances prefer different nodes and the second node has one volume: exactly one
/// instance runs there, of three.
fn the_one_on_the_second_node(nodes: &BTreeMap<String, String>) -> String {
    let far_away: Vec<&String> = nodes
        .iter()
        .filter(|(_, node)| node.as_str() == SECOND_NODE)
        .map(|(pod, _)| pod)
        .collect();
    assert_eq!(
        far_away.len(),
        1,
        "not one instance on {SECOND_NODE}: {nodes:?}"
    );
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    far_away[0].clone()
}

/// Whether the API server still calls `node` Ready.
async fn called_ready(bed: &TestBed, node: &str) -> bool {
    let nodes: Api<Node> = Api::all(bed.client.clone());
    nodes
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.conditions)
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_lost_node_fails_over_to_the_other_node_and_loses_no_acknowledged_commit() {
    let bed = testbed().await;
    let second = bed.second_node(1).await;
    let ns = bed.real_node_namespace("node-loss").await;
    let _operator = bed.operator_for_real_node(&ns);
    let mut database = real_node_database("far", "15.20", 3);
    database["spec"]["placement"] = two_real_nodes_placement();
    database["spec"]["synchronous"] = json!({"standbys": 1});
    bed.apply_database(&ns, database).await;
    bed.wait_for_phase(&ns, "far", Phase::Ready, READY_WAIT)
        .await;

    let nodes = nodes_of(&bed, &ns, "far").await;
    let far_away = the_one_on_the_second_node(&nodes);
    bed.local_ok(&ns, "far-0", "create table acked (id int primary key)");
    for standby in ["far-1", "far-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
    bed.psql_client(&ns, "client", "far", "far-credentials")
        .await;
    start_acked_writer(&bed, &ns);
    more_acknowledged(&bed, &ns, 20, READY_WAIT).await;
    // The instance on the second node becomes the primary (a switchover, if it is not already).
    if far_away != "far-0" {
        let patch = json!({"metadata": {"annotations": {"dbop.dev/promote": far_away}}});
        bed.databases(&ns)
            .patch("far", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        assert_eq!(new_primary(&bed, &ns, "far", "far-0").await, far_away);
        more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    }
    for standby in nodes.keys().filter(|p| **p != far_away) {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }

    // The primary's node lost.
    second.lose();
    let lost_at = Instant::now();
    let primary = new_primary(&bed, &ns, "far", &far_away).await;
    assert_eq!(nodes[&primary], REAL_NODE, "{nodes:?}");
    more_acknowledged(&bed, &ns, 10, FAILOVER_WAIT).await;
    eprintln!(
        "writes resumed {:?} after the node's loss; the API server calls it Ready: {}",
        lost_at.elapsed(),
        called_ready(&bed, SECOND_NODE).await
    );
    let failovers = bed.event_messages(&ns, "FailedOver");
    assert!(
        failovers.contains(&format!("{far_away} has not held the primary Lease")),
        "not a failover from the lost primary: {failovers:?}"
    );

    // The node back: its old primary rejoins as a standby of the new one, with every row.
    second.bring_back();
    bed.streaming_standby(&ns, &far_away, READY_WAIT).await;
    more_acknowledged(&bed, &ns, 10, FAILOVER_WAIT).await;
    caught_up(&bed, &ns, &far_away, &primary).await;
    ready_with_every_instance(&bed, &ns).await;

    // The primary back on the second node, which is then drained with `kubectl drain`.
    let promote = json!({"metadata": {"annotations": {"dbop.dev/promote": far_away}}});
    bed.databases(&ns)
        .patch("far", &PatchParams::default(), &Patch::Merge(&promote))
        .await
        .unwrap();
    assert_eq!(new_primary(&bed, &ns, "far", &primary).await, far_away);
    more_acknowledged(&bed, &ns, 10, FAILOVER_WAIT).await;
    let primary = drain_hands_over_first(&bed, &ns, &far_away).await;
    assert_eq!(nodes[&primary], REAL_NODE, "{nodes:?}");
    every_acknowledged_commit_is_on(&bed, &ns, &primary).await;
    let rows = bed.local_ok(&ns, &primary, "select count(*) from acked");
    let rows: u32 = rows.trim().parse().expect("a count");
    bed.rows_on(&ns, &far_away, "acked", rows, REPLICATION_WAIT)
        .await;
    ready_with_every_instance(&bed, &ns).await;
}

/// Waits until `standby` has at least the rows `primary` has now (the writer goes on).
async fn caught_up(bed: &TestBed, ns: &str, standby: &str, primary: &str) {
    let count = |pod: &str| {
        let (ok, out, _) = bed.local_psql(ns, pod, "select count(*) from acked");
        ok.then(|| out.trim().parse::<u32>().ok()).flatten()
    };
    let rows = count(primary).expect("the primary's rows");
    wait_until(
        &format!("{rows} rows or more on {standby}"),
        REPLICATION_WAIT,
        || async { count(standby).filter(|n| *n >= rows).map(|_| ()) },
    )
    .await;
}

/// `kubectl drain` of the second node, whose only instance `far_away` is the primary: the
/// drain's evictions are refused until the primary has handed over to a standby on the first
/// node (a `DrainSwitchover` Event), then it is evicted, and the drain ends; writes go on
/// through `-rw`. Once the node is uncordoned the evicted instance (its volume is there) comes
/// back as a standby with every row. Returns the new primary.
async fn drain_hands_over_first(bed: &TestBed, ns: &str, far_away: &str) -> String {
    for standby in ["far-0", "far-1", "far-2"]
        .into_iter()
        .filter(|p| p != &far_away)
    {
        bed.streaming_standby(ns, standby, READY_WAIT).await;
    }
    let began = Instant::now();
    let (drained, out, err) = bed.kubectl(&[
        "drain",
        SECOND_NODE,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=180s",
    ]);
    assert!(drained, "kubectl drain {SECOND_NODE}: {out}{err}");
    eprintln!("the drain of the primary's node took {:?}", began.elapsed());
    let switchovers = bed.event_messages(ns, "DrainSwitchover");
    assert!(
        switchovers.contains(&format!("from {far_away} to ")),
        "no switchover before the drain: {switchovers:?}\n{out}"
    );
    let primary = new_primary(bed, ns, "far", far_away).await;
    more_acknowledged(bed, ns, 10, FAILOVER_WAIT).await;
    // Its volume is on the cordoned node: the instance waits there until it is uncordoned.
    let (uncordoned, _, err) = bed.kubectl(&["uncordon", SECOND_NODE]);
    assert!(uncordoned, "kubectl uncordon {SECOND_NODE}: {err}");
    bed.streaming_standby(ns, far_away, READY_WAIT).await;
    more_acknowledged(bed, ns, 10, FAILOVER_WAIT).await;
    caught_up(bed, ns, far_away, &primary).await;
    primary
}

async fn ready_with_every_instance(bed: &TestBed, ns: &str) {
    let databases = bed.databases(ns);
    wait_until("Ready with every instance ready", READY_WAIT, || async {
        let s = databases.get("far").await.ok()?.status?;
        (s.phase == Some(Phase::Ready) && s.instances.iter().all(|i| i.ready)).then_some(())
    })
    .await;
}
