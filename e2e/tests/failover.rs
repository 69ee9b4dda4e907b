//! Failover on the test bed's real node, with the locally built images: a 3-instance Database
//! whose primary's postgres is killed (`kill -9` of the postmaster) fails over to a standby,
//! writes through `-rw` resume, and the old primary rejoins as a standby; then the new primary's
//! network is cut (its pod's network namespace drops everything but loopback): it stops
//! accepting writes on its own (its primary Lease ran out), exactly one other instance is
//! promoted, and a writer that tries every instance over its own socket, in turn, never sees
//! the isolated one accept a write after another did. With the network back, the isolated one
//! rejoins as a standby with every row. A switchover (`kubectl dbop promote`'s request) moves
//! the primary to the standby it names while a writer commits through `-rw` with its own log of
//! acknowledged commits: every one of them is on the new primary.
//!
//! This is a pod's isolation, not a node's loss: the test bed has one real node (the second
//! one is probed in `../shared/design/second-node-probe/`, not yet part of the bed).

use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::instances::{REPLICATION_WAIT, real_node_database};
use dbop_e2e::{TestBed, testbed, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// A primary's initdb and two clones, one after the other, on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(420);
/// From a primary's loss to a promoted standby: the Lease's 10 s, the operator's look, the
/// promotion; generous for a loaded machine (the benchmark measures it, not this test).
const FAILOVER_WAIT: Duration = Duration::from_secs(120);

/// The primary the status names.
async fn named_primary(bed: &TestBed, ns: &str, name: &str) -> Option<String> {
    bed.databases(ns).get(name).await.ok()?.status?.primary
}

/// Waits until the status of Database `name` names a primary other than `old`, which accepts
/// writes.
async fn new_primary(bed: &TestBed, ns: &str, name: &str, old: &str) -> String {
    let primary = wait_until(
        &format!("a primary other than {old}"),
        FAILOVER_WAIT,
        || async { named_primary(bed, ns, name).await.filter(|p| p != old) },
    )
    .await;
    wait_until(&format!("{primary} promoted"), FAILOVER_WAIT, || async {
        let (ok, out, _) = bed.local_psql(ns, &primary, "select pg_is_in_recovery()");
        (ok && out.trim() == "f").then_some(())
    })
    .await;
    primary
}

/// A write through `-rw`, from the client pod, until it succeeds.
async fn write_through_rw(bed: &TestBed, ns: &str, sql: &str) {
    let command = format!(
        "PGHOST=pay-rw PGUSER=postgres exec psql -X -d postgres -v ON_ERROR_STOP=1 -Atc \"{sql}\""
    );
    wait_until("a write through pay-rw", FAILOVER_WAIT, || async {
        let (ok, _, _) = bed.exec(ns, "client", &["sh", "-c", &command]);
        ok.then_some(())
    })
    .await;
}

/// The container's last termination message (the manager's reason to stop).
async fn last_termination(bed: &TestBed, ns: &str, pod: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let pod = pods.get(pod).await.unwrap();
    pod.status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().find(|c| c.name == "postgres"))
        .and_then(|c| c.last_state)
        .and_then(|s| s.terminated)
        .and_then(|t| t.message)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_lost_primary_is_replaced_and_an_isolated_one_stops_writing_first() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("failover").await;
    let _operator = bed.operator_for_real_node(&ns);
    bed.apply_database(&ns, real_node_database("pay", "15.20", 3))
        .await;
    bed.wait_for_phase(&ns, "pay", Phase::Ready, READY_WAIT)
        .await;
    bed.local_ok(
        &ns,
        "pay-0",
        "create table ledger (id int primary key, note text); insert into ledger select g, 'before' from generate_series(1, 100) g; create table fence_probe (at int, writer text)",
    );
    for standby in ["pay-1", "pay-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
        bed.rows_on(&ns, standby, "ledger", 100, REPLICATION_WAIT)
            .await;
    }
    bed.psql_client(&ns, "client", "pay", "pay-credentials")
        .await;

    // 1. The primary's postgres killed: its manager releases the Lease as the server is gone,
    // a standby is promoted, and the old primary comes back as its standby.
    let (killed, _, err) = bed.exec(
        &ns,
        "pay-0",
        &[
            "sh",
            "-c",
            "read pid < \"$PGDATA/postmaster.pid\" && kill -9 \"$pid\"",
        ],
    );
    assert!(killed, "killing pay-0's postmaster: {err}");
    let first = new_primary(&bed, &ns, "pay", "pay-0").await;
    write_through_rw(
        &bed,
        &ns,
        "insert into ledger select g, 'after the kill' from generate_series(101, 200) g",
    )
    .await;
    let standbys: Vec<String> = ["pay-0", "pay-1", "pay-2"]
        .into_iter()
        .filter(|p| *p != first)
        .map(String::from)
        .collect();
    for standby in &standbys {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
        bed.rows_on(&ns, standby, "ledger", 200, REPLICATION_WAIT)
            .await;
    }

    // 2. The new primary isolated. A writer tries every instance in turn over its own socket
    // and keeps the order of what each accepted.
    let mut cut = bed.cut_pod_network(&ns, &first);
    let started = Instant::now();
    let mut accepted: Vec<(u32, String)> = Vec::new();
    let mut attempt = 0u32;
    let promoted = loop {
        assert!(
            started.elapsed() < FAILOVER_WAIT,
            "no other instance accepted a write within {FAILOVER_WAIT:?} of {first}'s isolation; accepted: {accepted:?}"
        );
        attempt += 1;
        for pod in ["pay-0", "pay-1", "pay-2"] {
            let sql = format!("insert into fence_probe values ({attempt}, '{pod}')");
            if bed.local_psql(&ns, pod, &sql).0 {
                accepted.push((attempt, pod.to_string()));
            }
        }
        let others: Vec<&String> = accepted
            .iter()
            .filter(|(_, pod)| *pod != first)
            .map(|(_, pod)| pod)
            .collect();
        if let Some(other) = others.first() {
            break (*other).clone();
        }
    };
    // A few more rounds: the isolated one must stay fenced, and only one other may write.
    for _ in 0..5 {
        attempt += 1;
        for pod in ["pay-0", "pay-1", "pay-2"] {
            let sql = format!("insert into fence_probe values ({attempt}, '{pod}')");
            if bed.local_psql(&ns, pod, &sql).0 {
                accepted.push((attempt, pod.to_string()));
            }
        }
    }
    let first_other = accepted
        .iter()
        .find(|(_, pod)| *pod != first)
        .map(|(at, _)| *at)
        .unwrap();
    let isolated_after: Vec<_> = accepted
        .iter()
        .filter(|(at, pod)| *pod == first && *at >= first_other)
        .collect();
    assert!(
        isolated_after.is_empty(),
        "two primaries: {first} accepted writes after {promoted} did: {accepted:?}"
    );
    let writers: std::collections::BTreeSet<_> = accepted
        .iter()
        .filter(|(at, _)| *at >= first_other)
        .map(|(_, pod)| pod.clone())
        .collect();
    assert_eq!(
        writers.len(),
        1,
        "more than one primary after the failover: {accepted:?}"
    );
    assert_eq!(
        named_primary(&bed, &ns, "pay").await.as_deref(),
        Some(promoted.as_str())
    );
    // Its manager says why it stopped: in its log at once, in the termination message once its
    // server has exited (a fast shutdown waits for its standbys' connections to time out).
    wait_until(
        &format!("{first} saying it fenced itself"),
        FAILOVER_WAIT,
        || async {
            let said = |args: &[&str]| bed.kubectl(args).1.contains("fenced: this primary");
            let logs = said(&["-n", &ns, "logs", &first])
                || said(&["-n", &ns, "logs", &first, "--previous"]);
            (logs || last_termination(&bed, &ns, &first).await.contains("fenced")).then_some(())
        },
    )
    .await;
    write_through_rw(
        &bed,
        &ns,
        "insert into ledger select g, 'after the isolation' from generate_series(201, 300) g",
    )
    .await;

    // 3. The network back: the isolated one rejoins as a standby of the new primary.
    cut.restore();
    for standby in ["pay-0", "pay-1", "pay-2"]
        .into_iter()
        .filter(|p| *p != promoted)
    {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
        bed.rows_on(&ns, standby, "ledger", 300, REPLICATION_WAIT)
            .await;
    }
    let databases = bed.databases(&ns);
    wait_until("Ready with every instance ready", READY_WAIT, || async {
        let s = databases.get("pay").await.ok()?.status?;
        (s.phase == Some(Phase::Ready) && s.instances.iter().all(|i| i.ready)).then_some(())
    })
    .await;
}

/// The writer in the client pod: one insert through `-rw` per connection, each acknowledged id
/// appended to its own log, until the stop file exists.
const WRITER: &str = r#"i=0; while [ ! -f /tmp/stop ]; do i=$((i+1)); if psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "insert into acked values ($i)" >/dev/null 2>&1; then echo $i >> /tmp/acked; fi; done"#;

#[tokio::test]
async fn a_switchover_moves_the_primary_and_loses_no_acknowledged_commit() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("switchover").await;
    let _operator = bed.operator_for_real_node(&ns);
    bed.apply_database(&ns, real_node_database("swap", "15.20", 3))
        .await;
    bed.wait_for_phase(&ns, "swap", Phase::Ready, READY_WAIT)
        .await;
    bed.local_ok(&ns, "swap-0", "create table acked (id int primary key)");
    for standby in ["swap-1", "swap-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
    bed.psql_client(&ns, "client", "swap", "swap-credentials")
        .await;
    let background = format!(
        "nohup sh -c '{}' >/dev/null 2>&1 &",
        WRITER.replace('\'', "'\\''")
    );
    let (ok, _, err) = bed.exec(&ns, "client", &["sh", "-c", &background]);
    assert!(ok, "starting the writer: {err}");
    let acked = || async {
        let (_, out, _) = bed.exec(&ns, "client", &["sh", "-c", "cat /tmp/acked 2>/dev/null"]);
        out.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .collect::<Vec<_>>()
    };
    wait_until("the writer acknowledged", READY_WAIT, || async {
        (acked().await.len() >= 20).then_some(())
    })
    .await;

    // The request, as `kubectl dbop promote swap swap-2` makes it.
    let databases = bed.databases(&ns);
    let patch = json!({"metadata": {"annotations": {"dbop.dev/promote": "swap-2"}}});
    databases
        .patch("swap", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let primary = new_primary(&bed, &ns, "swap", "swap-0").await;
    assert_eq!(primary, "swap-2");
    let before = acked().await.len();
    wait_until(
        "writes acknowledged by the new primary",
        FAILOVER_WAIT,
        || async { (acked().await.len() >= before + 20).then_some(()) },
    )
    .await;
    bed.exec(&ns, "client", &["sh", "-c", "touch /tmp/stop"]);

    // Every commit the writer saw acknowledged, before, during and after, is on the new
    // primary.
    let acknowledged = acked().await;
    let present: std::collections::BTreeSet<u32> = bed
        .local_ok(&ns, "swap-2", "select id from acked")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged commits missing on swap-2: {lost:?}"
    );
    for standby in ["swap-0", "swap-1"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
    let events = bed.kubectl(&[
        "-n",
        &ns,
        "get",
        "events",
        "--field-selector",
        "reason=Switchover",
        "-o",
        "name",
    ]);
    assert!(
        !events.1.trim().is_empty(),
        "no Switchover Event: {events:?}"
    );
    let annotations = databases.get("swap").await.unwrap().metadata.annotations;
    assert!(
        !annotations
            .unwrap_or_default()
            .contains_key("dbop.dev/promote")
    );
}
