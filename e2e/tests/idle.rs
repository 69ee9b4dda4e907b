//! Idle: once Ready, the operator sends zero write requests, even when it is woken up. Each
//! wake-up is shown to have been reconciled to the end (kube-runtime's reconcile spans, recorded
//! in the test process), so a hung operator cannot pass; the writes are counted from the API
//! server's own audit log by the operator's user agent.

use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::{TestBed, WAIT, database_manifest, reconciles, testbed, wait_until};
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// Wake-ups sent while idle.
const WAKE_UPS: usize = 3;
/// How long the audit log must stay unchanged, with no reconcile running, to call the way to
/// Ready settled.
const SETTLE: Duration = Duration::from_secs(3);
/// The quiet part of the idle window, after the wake-ups: long enough for a reconcile's write,
/// its watch event, the next reconcile and its write (a hot loop) to show.
const QUIET: Duration = Duration::from_secs(10);

/// Waits until the operator has settled: no reconcile of the Database running and no new write
/// in the audit log for `quiet`. Returns the number of writes so far.
async fn wait_settled(bed: &TestBed, ns: &str, name: &str, quiet: Duration) -> usize {
    let mut last: Option<(usize, Instant)> = None;
    wait_until(
        &format!("the operator to settle (no write for {quiet:?}, no reconcile running)"),
        WAIT,
        || {
            let count = bed.operator_writes(ns).len();
            if last.is_none_or(|(n, _)| n != count) {
                last = Some((count, Instant::now()));
            }
            let running = reconciles::of_database(ns, name)
                .iter()
                .any(|r| r.finished.is_none());
            let quiet = last.is_some_and(|(_, since)| since.elapsed() >= quiet) && !running;
            async move { quiet.then_some(count) }
        },
    )
    .await
}

/// Changes an annotation of the Database (a watch event, nothing to do) and waits until a
/// reconcile that started after the change has finished.
async fn wake_up_and_wait_for_the_reconcile(bed: &TestBed, ns: &str, name: &str, i: usize) {
    let before = reconciles::of_database(ns, name).len();
    let patch = json!({"metadata": {"annotations": {"e2e.dbop.dev/poke": i.to_string()}}});
    bed.databases(ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let done = wait_until(
        &format!("wake-up {i} to be reconciled to the end"),
        WAIT,
        || async {
            reconciles::of_database(ns, name)
                .get(before..)?
                .iter()
                .find(|r| r.finished.is_some())
                .cloned()
        },
    )
    .await;
    let took = done.finished.unwrap() - done.started;
    println!("e2e: wake-up {i} reconciled ({}) in {took:?}", done.reason);
}

#[tokio::test]
async fn a_ready_database_costs_no_writes() {
    let bed = testbed().await;
    let ns = bed.namespace("idle").await;
    let _operator = bed.operator_in_process(&ns).await;
    // With every kind of owned object dbop applies, the optional NetworkPolicy included (the
    // API server's own defaults must not look like drift).
    let network_policy = json!({
        "allowFrom": [
            {"podSelector": {"matchLabels": {"app": "api"}}},
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["bi"]}]},
             "podSelector": {}},
            {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
        ],
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    });
    bed.apply_database(
        &ns,
        database_manifest(
            "quiet",
            json!({"init": {"sql": "select 1"}, "networkPolicy": network_policy}),
        ),
    )
    .await;
    bed.wait_for_phase(&ns, "quiet", Phase::Ready, WAIT).await;
    let to_ready = wait_settled(&bed, &ns, "quiet", SETTLE).await;
    assert!(
        to_ready > 0,
        "the audit log shows the operator's writes on the way to Ready"
    );
    let reconciles_before = reconciles::of_database(&ns, "quiet").len();
    assert!(
        reconciles_before > 0,
        "the test process records the operator's reconciles"
    );

    let idle_since = Instant::now();
    for i in 0..WAKE_UPS {
        wake_up_and_wait_for_the_reconcile(&bed, &ns, "quiet", i).await;
    }
    // Anything a wake-up set off (a write, its watch event, the next reconcile) is over.
    let total = wait_settled(&bed, &ns, "quiet", QUIET).await;
    let idle_reconciles = reconciles::of_database(&ns, "quiet").len() - reconciles_before;
    let new = bed.operator_writes(&ns)[to_ready..].to_vec();
    println!(
        "e2e: operator writes to reach Ready: {to_ready}; while idle for {:?}: {} writes, {idle_reconciles} reconciles ({WAKE_UPS} wake-ups)",
        idle_since.elapsed(),
        total - to_ready
    );
    assert!(idle_reconciles >= WAKE_UPS);
    assert!(new.is_empty(), "writes while idle: {new:#?}");
}
