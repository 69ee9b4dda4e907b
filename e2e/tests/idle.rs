//! Idle: once Ready, the operator sends zero write requests, even when it is woken up (counted
//! from the API server's own audit log by the operator's user agent).

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::{WAIT, database_manifest, testbed};
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn a_ready_database_costs_no_writes() {
    let bed = testbed().await;
    let ns = bed.namespace("idle").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        database_manifest("quiet", json!({"init": {"sql": "select 1"}})),
    )
    .await;
    bed.wait_for_phase(&ns, "quiet", Phase::Ready, WAIT).await;
    // Let the last watch events of the way to Ready drain.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = bed.operator_writes(&ns);
    assert!(
        !before.is_empty(),
        "the audit log shows the operator's writes on the way to Ready"
    );

    // Wake the operator up a few times without changing anything it manages: each annotation
    // change is a watch event and a full reconcile with nothing to do.
    for i in 0..3 {
        let patch = json!({"metadata": {"annotations": {"e2e.dbop.dev/poke": i.to_string()}}});
        bed.databases(&ns)
            .patch("quiet", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = bed.operator_writes(&ns);
    let new: Vec<_> = after[before.len()..].to_vec();
    println!(
        "e2e: operator writes to reach Ready: {}; while idle for 20 s with 3 wake-ups: {}",
        before.len(),
        new.len()
    );
    assert!(new.is_empty(), "writes while idle: {new:#?}");
}
