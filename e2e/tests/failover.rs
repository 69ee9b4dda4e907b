//! Failover on the test bed's real node, with the locally built images: a 3-instance Database
//! shows every instance's WAL position; its first standby is cut off and falls behind, then its
//! primary's postgres is killed (`kill -9` of the postmaster): it fails over to the standby that
//! received the most WAL (not the first by ordinal), writes through `-rw` resume, and the old
//! primary rejoins as a standby; then the new primary's
//! network is cut (its pod's network namespace drops everything but loopback): it stops
//! accepting writes on its own (its primary Lease ran out), exactly one other instance is
//! promoted, and a writer that tries every instance over its own socket, in turn, never sees
//! the isolated one accept a write after another did. With the network back, the isolated one
//! rejoins as a standby with every row. A switchover (`kubectl dbop promote`'s request) moves
//! the primary to the standby it names while a writer commits through `-rw` with its own log of
//! acknowledged commits; the Database then grows to five instances (two more standbys clone and
//! stream) and shrinks to two, a scale-down that would remove that primary: it switches over to
//! a standby that stays first (a ScaleDownSwitchover Event, no failover); every acknowledged
//! commit is on the last primary. A restart and a minor version upgrade of three instances replace the
//! primary's pod last, after a switchover to a standby already replaced (no failover, no
//! acknowledged commit lost).
//!
//! The isolation is a pod's, not a node's loss: a node lost on the test bed's second real node
//! is `node_loss.rs`.

use std::time::{Duration, Instant};

use dbop::api::{Phase, UpgradeStage};
use dbop_e2e::failover::{
    FAILOVER_WAIT, every_acknowledged_commit_is_on, more_acknowledged, named_primary, new_primary,
    new_primary_within, start_acked_writer, why_no_failover,
};
use dbop_e2e::instances::{REPLICATION_WAIT, real_node_database};
use dbop_e2e::{TestBed, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// A primary's initdb and two clones, one after the other, on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(420);

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

/// When an instance's server started.
const STARTED_AT: &str = "select pg_postmaster_start_time()";
/// The host a standby streams from (empty: it does not stream).
const STREAMING_FROM: &str = "select coalesce((select sender_host from pg_stat_wal_receiver where status = 'streaming'), '')";

/// `kill -9` of the postmaster of `pod`.
fn kill_postmaster(bed: &TestBed, ns: &str, pod: &str) {
    let (killed, _, err) = bed.exec(
        ns,
        pod,
        &[
            "sh",
            "-c",
            "read pid < \"$PGDATA/postmaster.pid\" && kill -9 \"$pid\"",
        ],
    );
    assert!(killed, "killing {pod}'s postmaster: {err}");
}

/// The status of the database container of `pod`.
async fn postgres_status(bed: &TestBed, ns: &str, pod: &str) -> Option<ContainerStatus> {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let pod = pods.get(pod).await.unwrap();
    pod.status?
        .container_statuses?
        .into_iter()
        .find(|c| c.name == "postgres")
}

/// The container's last termination message (the manager's reason to stop).
async fn last_termination(bed: &TestBed, ns: &str, pod: &str) -> String {
    postgres_status(bed, ns, pod)
        .await
        .and_then(|c| c.last_state?.terminated?.message)
        .unwrap_or_default()
}

/// How often the database container of `pod` was restarted.
async fn restarts(bed: &TestBed, ns: &str, pod: &str) -> i32 {
    postgres_status(bed, ns, pod)
        .await
        .map_or(0, |c| c.restart_count)
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

    // 0. The status shows every instance's WAL position, and each standby's lag in bytes and
    // in time.
    let databases = bed.databases(&ns);
    wait_until(
        "every instance's WAL position in the status",
        READY_WAIT,
        || async {
            let s = databases.get("pay").await.ok()?.status?;
            let placed = s.instances.len() == 3
                && s.positions_read_at.is_some()
                && s.instances
                    .iter()
                    .all(|i| i.lsn.is_some() && i.timeline == Some(1))
                && s.instances.iter().filter(|i| i.lag_bytes.is_some()).count() == 2
                && s.instances
                    .iter()
                    .filter(|i| i.lag_milliseconds.is_some())
                    .count()
                    == 2;
            placed.then_some(())
        },
    )
    .await;

    // 1. pay-1, the first standby by ordinal, is cut from the others (its manager still tells
    // the operator where it stands) and falls behind: pay-2 gets rows pay-1 never will. The
    // primary's postgres killed: its manager releases the Lease as the server is gone, the
    // standby that received the most WAL is promoted (pay-1 still counts as ready, a standby
    // stays ready 30 s after its stream stops), and the old primary comes back as its standby.
    let mut behind = bed.cut_all_but_status(&ns, "pay-1");
    write_through_rw(
        &bed,
        &ns,
        "insert into ledger select g, 'while pay-1 is cut off' from generate_series(101, 150) g",
    )
    .await;
    bed.rows_on(&ns, "pay-2", "ledger", 150, REPLICATION_WAIT)
        .await;
    kill_postmaster(&bed, &ns, "pay-0");
    let first = new_primary(&bed, &ns, "pay", "pay-0").await;
    // (Events follow the status: waited for.)
    let failovers = wait_until("a FailedOver Event", FAILOVER_WAIT, || async {
        Some(bed.event_messages(&ns, "FailedOver")).filter(|m| !m.trim().is_empty())
    })
    .await;
    assert_eq!(first, "pay-2", "not the most advanced standby: {failovers}");
    assert!(
        failovers.contains("promoting the standby pay-2, the most WAL received (pay-1 "),
        "pay-1 was no candidate, the choice proves nothing: {failovers}"
    );
    bed.rows_on(&ns, "pay-2", "ledger", 150, REPLICATION_WAIT)
        .await;
    behind.restore();
    write_through_rw(
        &bed,
        &ns,
        "insert into ledger select g, 'after the kill' from generate_series(151, 200) g",
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
    // Its manager started the killed server again itself, as a standby: no container restart
    // (the kubelet's back-off would grow with each).
    assert_eq!(
        restarts(&bed, &ns, "pay-0").await,
        0,
        "{}",
        bed.pod_story(&ns, "pay-0")
    );

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
    wait_until("Ready with every instance ready", READY_WAIT, || async {
        let s = databases.get("pay").await.ok()?.status?;
        (s.phase == Some(Phase::Ready) && s.instances.iter().all(|i| i.ready)).then_some(())
    })
    .await;
}

/// Database `name` with three Ready instances (its primary `<name>-0`), a table `acked`, and
/// the writer running in the pod `client` until it has 20 acknowledged commits.
async fn three_instances_with_a_writer(bed: &TestBed, ns: &str, name: &str) {
    three_instances_of(bed, ns, real_node_database(name, "15.20", 3)).await;
}

/// The same for a Database of this manifest (named `name`, three instances).
async fn three_instances_of(bed: &TestBed, ns: &str, database: serde_json::Value) {
    let name = database["metadata"]["name"].as_str().unwrap().to_string();
    let name = name.as_str();
    bed.apply_database(ns, database).await;
    bed.wait_for_phase(ns, name, Phase::Ready, READY_WAIT).await;
    bed.local_ok(
        ns,
        &format!("{name}-0"),
        "create table acked (id int primary key)",
    );
    for standby in [format!("{name}-1"), format!("{name}-2")] {
        bed.streaming_standby(ns, &standby, READY_WAIT).await;
    }
    bed.psql_client(ns, "client", name, &format!("{name}-credentials"))
        .await;
    start_acked_writer(bed, ns);
    more_acknowledged(bed, ns, 20, READY_WAIT).await;
}

/// Synchronous replication (any 1 of the 2 standbys confirms a commit): sync-1 is cut from the
/// others (its manager still reports its position) while the writer commits through `-rw`, so
/// only sync-2 confirms; then the primary's postgres is killed with the writer still running.
/// The failover must promote sync-2, and every commit the writer saw acknowledged is on it.
#[tokio::test]
async fn synchronous_replication_loses_no_acknowledged_commit_when_the_primary_dies() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("synchronous").await;
    let _operator = bed.operator_for_real_node(&ns);
    let mut database = real_node_database("sync", "15.20", 3);
    database["spec"]["synchronous"] = json!({"standbys": 1});
    three_instances_of(&bed, &ns, database).await;
    let (_, names, _) = bed.local_psql(&ns, "sync-0", "show synchronous_standby_names");
    assert_eq!(names.trim(), r#"ANY 1 ("sync-1", "sync-2")"#);
    // The status says which standbys the primary counts to confirm commits (what `kubectl
    // dbop status` shows).
    let databases = bed.databases(&ns);
    wait_until(
        "both standbys counted in the quorum",
        READY_WAIT,
        || async {
            let s = databases.get("sync").await.ok()?.status?;
            let states: Vec<_> = s.instances.iter().map(|i| i.sync_state.clone()).collect();
            (states == [None, Some("quorum".into()), Some("quorum".into())]).then_some(())
        },
    )
    .await;

    let mut cut = bed.cut_all_but_status(&ns, "sync-1");
    more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    // The primary's node is lost: its pod is cut off, then its postmaster killed. (A killed
    // postmaster alone restarts in seconds and takes its Lease back, rightly, before a loaded
    // machine's operator has heard from enough standbys: a race, not a failover.)
    let mut lost = bed.cut_pod_network(&ns, "sync-0");
    kill_postmaster(&bed, &ns, "sync-0");
    let primary = new_primary(&bed, &ns, "sync", "sync-0").await;
    let failovers = wait_until("a FailedOver Event", FAILOVER_WAIT, || async {
        Some(bed.event_messages(&ns, "FailedOver")).filter(|m| !m.trim().is_empty())
    })
    .await;
    assert_eq!(primary, "sync-2", "{failovers}");
    // Writes go on once a standby confirms them again (sync-0 rejoins, or sync-1 is back).
    cut.restore();
    lost.restore();
    more_acknowledged(&bed, &ns, 10, READY_WAIT).await;
    every_acknowledged_commit_is_on(&bed, &ns, "sync-2").await;
}

#[tokio::test]
async fn a_switchover_and_scaling_to_five_then_two_lose_no_acknowledged_commit() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("switchover").await;
    let _operator = bed.operator_for_real_node(&ns);
    three_instances_with_a_writer(&bed, &ns, "swap").await;

    let swap1_started = bed.local_ok(&ns, "swap-1", STARTED_AT);
    // The request, as `kubectl dbop promote swap swap-2` makes it.
    let databases = bed.databases(&ns);
    let patch = json!({"metadata": {"annotations": {"dbop.dev/promote": "swap-2"}}});
    databases
        .patch("swap", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let primary = new_primary(&bed, &ns, "swap", "swap-0").await;
    assert_eq!(primary, "swap-2");
    more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    for standby in ["swap-0", "swap-1"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
    // swap-1 followed swap-2 by a reload: it streams from it, its server never stopped.
    wait_until("swap-1 streaming from swap-2", READY_WAIT, || async {
        let (ok, sender, _) = bed.local_psql(&ns, "swap-1", STREAMING_FROM);
        (ok && sender.trim().starts_with("swap-2.")).then_some(())
    })
    .await;
    assert_eq!(
        bed.local_ok(&ns, "swap-1", STARTED_AT),
        swap1_started,
        "swap-1's server restarted to follow swap-2\n{}",
        bed.pod_story(&ns, "swap-1")
    );
    assert!(
        !bed.event_messages(&ns, "Switchover").trim().is_empty(),
        "no Switchover Event"
    );
    let annotations = databases.get("swap").await.unwrap().metadata.annotations;
    assert!(
        !annotations
            .unwrap_or_default()
            .contains_key("dbop.dev/promote")
    );

    grow_swap_to_five(&bed, &ns).await;

    // Two instances: the scale-down would remove swap-2, the primary (and swap-3 and swap-4).
    // It hands over to a standby that stays by a switchover first; the writer goes on meanwhile.
    bed.apply_database(&ns, real_node_database("swap", "15.20", 2))
        .await;
    let primary = new_primary(&bed, &ns, "swap", "swap-2").await;
    assert!(
        ["swap-0", "swap-1"].contains(&primary.as_str()),
        "{primary}"
    );
    more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for removed in ["swap-4", "swap-3", "swap-2"] {
        wait_until(&format!("{removed} removed"), READY_WAIT, || async {
            pods.get_opt(removed).await.ok()?.is_none().then_some(())
        })
        .await;
    }
    // (Events follow the status: waited for.)
    wait_until("a ScaleDownSwitchover Event", FAILOVER_WAIT, || async {
        bed.event_messages(&ns, "ScaleDownSwitchover")
            .contains("before the scale-down removes swap-2")
            .then_some(())
    })
    .await;
    let failovers = bed.event_messages(&ns, "FailedOver");
    assert!(
        failovers.trim().is_empty(),
        "a failover, not a switchover: {failovers}"
    );
    // Every commit the writer saw acknowledged, before, during and after both switchovers, is
    // on the last primary.
    every_acknowledged_commit_is_on(&bed, &ns, &primary).await;
    let standby = if primary == "swap-0" {
        "swap-1"
    } else {
        "swap-0"
    };
    bed.streaming_standby(&ns, standby, READY_WAIT).await;
}

/// Five instances: two more standbys clone the primary and stream, the writer going on.
async fn grow_swap_to_five(bed: &TestBed, ns: &str) {
    bed.apply_database(ns, real_node_database("swap", "15.20", 5))
        .await;
    for standby in ["swap-3", "swap-4"] {
        bed.streaming_standby(ns, standby, READY_WAIT).await;
    }
    let databases = bed.databases(ns);
    wait_until("five ready instances", READY_WAIT, || async {
        let s = databases.get("swap").await.ok()?.status?;
        let ready = s.instances.iter().filter(|i| i.ready).count();
        (s.phase == Some(Phase::Ready) && ready == 5).then_some(())
    })
    .await;
    more_acknowledged(bed, ns, 20, FAILOVER_WAIT).await;
}

/// A restart (`kubectl dbop restart`'s annotation) of three instances whose primary is roll-0:
/// the StatefulSet replaces roll-2 and roll-1 first, the primary hands over to roll-1 by a
/// switchover (a RolloutSwitchover Event, no failover), and only then is roll-0's pod replaced,
/// as a standby. A writer commits through `-rw` all along with its own log: every acknowledged
/// commit is on the new primary.
#[tokio::test]
async fn a_restart_replaces_the_primary_last_after_a_switchover() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("rollout").await;
    let _operator = bed.operator_for_real_node(&ns);
    three_instances_with_a_writer(&bed, &ns, "roll").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let uid = |pod: Option<Pod>| pod.and_then(|p| p.metadata.uid);
    let primary_uid = uid(pods.get_opt("roll-0").await.unwrap());

    let databases = bed.databases(&ns);
    let patch =
        json!({"metadata": {"annotations": {"dbop.dev/restartedAt": "2026-12-02T23:00:00Z"}}});
    databases
        .patch("roll", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // (Had roll-0's pod been replaced before it handed over, the Lease's release would have
    // been a failover: the FailedOver check below.)
    let primary = new_primary(&bed, &ns, "roll", "roll-0").await;
    if primary != "roll-1" {
        panic!(
            "{primary} is the primary, not roll-1, the lowest of the replaced pods above it; {}",
            why_no_failover(&bed, &ns, "roll").await
        );
    }
    // Then roll-0's pod is replaced too, as a standby, and the rollout ends.
    let restarted = wait_until_or_none(READY_WAIT, || async {
        let replaced = uid(pods.get_opt("roll-0").await.ok()?) != primary_uid;
        let s = databases.get("roll").await.ok()?.status?;
        let all_ready = s.instances.iter().all(|i| i.ready);
        (replaced && all_ready && s.phase == Some(Phase::Ready)).then_some(())
    })
    .await;
    if restarted.is_none() {
        let status = databases.get("roll").await.ok().and_then(|d| d.status);
        panic!(
            "timed out after {READY_WAIT:?} waiting for every instance restarted and Ready: {status:#?}\n{}",
            why_no_failover(&bed, &ns, "roll").await
        );
    }
    more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    wait_until("a RolloutSwitchover Event", FAILOVER_WAIT, || async {
        bed.event_messages(&ns, "RolloutSwitchover")
            .contains("from roll-0 to roll-1 before the rollout replaces the pod of roll-0")
            .then_some(())
    })
    .await;
    let failovers = bed.event_messages(&ns, "FailedOver");
    assert!(failovers.trim().is_empty(), "a failover: {failovers}");
    every_acknowledged_commit_is_on(&bed, &ns, &primary).await;
    for standby in ["roll-0", "roll-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
}

/// A minor version upgrade (15.18 to 15.20) of three instances whose primary is minor-0: the
/// upgrade moves minor-2 and minor-1 to 15.20 first, the primary hands over to minor-1 by a
/// switchover (an UpgradeSwitchover Event, no failover), and only then is minor-0's pod moved,
/// as a standby. A writer commits through `-rw` all along with its own log: every acknowledged
/// commit is on the new primary, and every instance serves 15.20.
#[tokio::test]
async fn a_version_upgrade_replaces_the_primary_last_after_a_switchover() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("upgrade-ha").await;
    let _operator = bed.operator_for_real_node(&ns);
    let mut database = real_node_database("minor", "15.18", 3);
    database["spec"]["upgrade"] = json!({"preUpgradeBackup": false});
    three_instances_of(&bed, &ns, database).await;

    let databases = bed.databases(&ns);
    let patch = json!({"spec": {"version": "15.20"}});
    databases
        .patch("minor", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // Preflight, then two standbys replaced one after the other, then the switchover.
    let primary = new_primary_within(&bed, &ns, "minor", "minor-0", READY_WAIT).await;
    if primary != "minor-1" {
        panic!(
            "{primary} is the primary, not minor-1, the lowest of the upgraded pods above it; {}",
            why_no_failover(&bed, &ns, "minor").await
        );
    }
    let complete = wait_until_or_none(READY_WAIT, || async {
        let s = databases.get("minor").await.ok()?.status?;
        let stage = s.upgrade.as_ref().map(|u| u.stage);
        let all_ready = s.instances.iter().all(|i| i.ready);
        (stage == Some(UpgradeStage::Complete) && all_ready && s.phase == Some(Phase::Ready))
            .then_some(())
    })
    .await;
    if complete.is_none() {
        let status = databases.get("minor").await.ok().and_then(|d| d.status);
        panic!(
            "timed out after {READY_WAIT:?} waiting for the upgrade to complete: {status:#?}\n{}",
            why_no_failover(&bed, &ns, "minor").await
        );
    }
    more_acknowledged(&bed, &ns, 20, FAILOVER_WAIT).await;
    wait_until("an UpgradeSwitchover Event", FAILOVER_WAIT, || async {
        bed.event_messages(&ns, "UpgradeSwitchover")
            .contains(
                "from minor-0 to minor-1 before the version upgrade replaces the pod of minor-0",
            )
            .then_some(())
    })
    .await;
    let failovers = bed.event_messages(&ns, "FailedOver");
    assert!(failovers.trim().is_empty(), "a failover: {failovers}");
    every_acknowledged_commit_is_on(&bed, &ns, &primary).await;
    for standby in ["minor-0", "minor-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
    for instance in ["minor-0", "minor-1", "minor-2"] {
        let version = bed.local_ok(&ns, instance, "show server_version");
        assert!(version.starts_with("15.20"), "{instance} serves {version}");
    }
}
