//! `make bench-ha`: failover, switchover and minor upgrades of 3-instance Databases on the test
//! bed's real node, measured from outside. Not a test (nothing here asserts a target): it prints
//! the figures docs/benchmarks.md records and writes them as JSON to
//! `target/bench/ha-<BENCH_LABEL>.json`.
//!
//! `BENCH_HA_TRIALS` (20) trials of each kind, one after the other, on one Database:
//! - `postgres-killed`: `kill -9` of the primary's postmaster;
//! - `pod-deleted`: the primary's pod deleted;
//! - `isolated`: the primary pod's network cut, restored once another instance took writes;
//! - `node-lost`: the primary's node lost (`e2e/testbed/second-node.sh lose`: its kubelet, its
//!   container runtime and every process of its pods killed), brought back once another
//!   instance took writes. The Database then spreads over both real nodes, the second with one
//!   volume (one instance), and each such trial first moves the primary there by a switchover;
//! - `switchover`: `dbop.dev/promote` naming the next standby;
//! - `upgrade`: a minor upgrade (15.18 → 15.20) of a 3-instance Database of its own (a new one
//!   each trial, deleted after it), measured as the write unavailability of the whole upgrade:
//!   the sum of every write gap from the new version's apply until the upgrade is complete and
//!   every instance ready, and the longest of them.
//!
//! `BENCH_HA_KINDS` (all): a comma-separated subset of the kinds' labels. `BENCH_HA_UPGRADES` (5):
//! how many upgrades.
//! `BENCH_HA_SYNCHRONOUS=1`: the Database replicates synchronously (`spec.synchronous`: any 1
//! of 2 standbys confirms each commit, `whenTooFew: Wait`); the JSON file's name says so.
//!
//! Each trial: a writer in a client pod inserts through `-rw`, one connection per insert, as
//! fast as `kubectl exec` allows (about 4 per second); the figure is the write gap: from the last
//! insert acknowledged before the first refused one to the next acknowledged one (its
//! resolution is the writer's period). Once the status names another primary and it
//! acknowledged an insert on its own socket, every attempt also tries one on the old primary's
//! own socket: one acknowledged counts as a two-primary write. Between trials, every
//! instance is ready again, and every insert acknowledged through `-rw` so far is looked for on
//! the primary: one missing counts as an acknowledged commit lost (0 is the promise of
//! synchronous mode; an asynchronous standby may lack the last commits of a killed primary).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dbop::api::{Phase, UpgradeStage};
use dbop_e2e::instances::real_node_database;
use dbop_e2e::node::{SECOND_NODE, SecondNode, two_real_nodes_placement};
use dbop_e2e::{TestBed, testbed, wait_until};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const NAME: &str = "bench";
const RECOVERY: Duration = Duration::from_secs(600);
const FAULT_WAIT: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug)]
enum Kind {
    PostgresKilled,
    PodDeleted,
    Isolated,
    NodeLost,
    Switchover,
    Upgrade,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::PostgresKilled => "postgres-killed",
            Kind::PodDeleted => "pod-deleted",
            Kind::Isolated => "isolated",
            Kind::NodeLost => "node-lost",
            Kind::Switchover => "switchover",
            Kind::Upgrade => "upgrade",
        }
    }
}

struct Trial {
    gap: Duration,
    /// When the new primary first acknowledged an insert on its own socket, from the fault.
    new_primary_wrote: Option<Duration>,
    /// Each attempt of the writer: when it ended, whether it was acknowledged, how long the
    /// insert through `-rw` took (printed for a trial whose gap is long, to say where it went).
    attempts: Vec<(Duration, bool, Duration)>,
    two_primary_writes: u32,
    /// When `-rw` moved off the old primary, from the fault.
    route: RouteMoved,
    /// Inserts acknowledged through `-rw`, in this trial and every one before, missing on the
    /// primary.
    lost_so_far: usize,
}

async fn primary(bed: &TestBed, ns: &str) -> String {
    let db = bed.databases(ns).get(NAME).await.unwrap();
    db.status.and_then(|s| s.primary).unwrap_or_default()
}

async fn all_ready(bed: &TestBed, ns: &str) {
    three_ready(bed, ns, NAME).await;
    // Every standby on the primary's timeline (a standby that streamed from the one before
    // rejoins the new primary first; a switchover to it meanwhile is refused).
    wait_until("every instance on one timeline", RECOVERY, || async {
        let s = bed.databases(ns).get(NAME).await.ok()?.status?;
        let timelines: std::collections::BTreeSet<_> =
            s.instances.iter().map(|i| i.timeline).collect();
        (timelines.len() == 1 && !timelines.contains(&None)).then_some(())
    })
    .await;
    // Each standby itself (the status can be behind it, and a standby stays ready for 30 s
    // after its stream stops): a trial starts only when every one streams from the primary
    // (a standby that streamed from the one before restarts to follow the new one, seconds
    // after the switchover, and a switchover to it meanwhile is refused: PromoteRefused).
    let now = primary(bed, ns).await;
    for ordinal in 0..3 {
        let pod = format!("{NAME}-{ordinal}");
        if pod != now {
            streams_from(bed, ns, &pod, &now).await;
        }
    }
}

/// Waits until standby `pod` streams from `primary` (its WAL receiver's host is the
/// primary's name in the headless Service).
async fn streams_from(bed: &TestBed, ns: &str, pod: &str, primary: &str) {
    let sql = "select status || ' ' || coalesce(sender_host, '') from pg_stat_wal_receiver";
    let from = format!("streaming {primary}.");
    wait_until(
        &format!("{pod} streaming from {primary}"),
        RECOVERY,
        || async {
            let (ok, out, _) = bed.local_psql(ns, pod, sql);
            (ok && out.trim().starts_with(&from)).then_some(())
        },
    )
    .await;
}

/// One insert through `-rw` from the client pod.
fn write_rw(bed: &TestBed, ns: &str, n: u64) -> bool {
    write_on(bed, ns, "client", n)
}

/// One insert through `-rw` from the client pod `client`.
fn write_on(bed: &TestBed, ns: &str, client: &str, n: u64) -> bool {
    let sql =
        format!("PGCONNECT_TIMEOUT=2 psql -X -q -d postgres -c 'insert into bench values ({n})'");
    bed.exec(ns, client, &["sh", "-c", &sql]).0
}

/// What a fault leaves to undo once another primary took writes.
enum Undo {
    Nothing,
    Cut(dbop_e2e::node::NetworkCut),
    BringBack,
}

async fn fault(
    bed: &TestBed,
    ns: &str,
    kind: Kind,
    old: &str,
    second: Option<&SecondNode>,
) -> Undo {
    match kind {
        Kind::PostgresKilled => {
            let kill = "read pid < \"$PGDATA/postmaster.pid\" && kill -9 \"$pid\"";
            assert!(bed.exec(ns, old, &["sh", "-c", kill]).0, "kill -9 on {old}");
        }
        Kind::PodDeleted => {
            let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
            pods.delete(old, &DeleteParams::default()).await.unwrap();
        }
        Kind::Isolated => return Undo::Cut(bed.cut_pod_network(ns, old)),
        Kind::NodeLost => {
            second.expect("the second node").lose();
            return Undo::BringBack;
        }
        Kind::Switchover => {
            let ordinal: u32 = old.rsplit('-').next().unwrap().parse().unwrap();
            let to = format!("{NAME}-{}", (ordinal + 1) % 3);
            let patch = json!({"metadata": {"annotations": {"dbop.dev/promote": to}}});
            bed.databases(ns)
                .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
        Kind::Upgrade => unreachable!("an upgrade is measured on a Database of its own"),
    }
    Undo::Nothing
}

/// The primary moved to the instance on the second node (a switchover), every instance ready.
async fn primary_on_the_second_node(bed: &TestBed, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let mut there = None;
    for ordinal in 0..3 {
        let name = format!("{NAME}-{ordinal}");
        let pod = pods.get(&name).await.unwrap();
        if pod.spec.and_then(|s| s.node_name).as_deref() == Some(SECOND_NODE) {
            there = Some(name);
        }
    }
    let there = there.expect("an instance on the second node");
    if primary(bed, ns).await == there {
        return;
    }
    // (A switchover goes only to a standby that streams: its pod's Ready condition may be
    // stale after its node came back.)
    bed.streaming_standby(ns, &there, RECOVERY).await;
    let patch = json!({"metadata": {"annotations": {"dbop.dev/promote": there}}});
    bed.databases(ns)
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_until("the switchover to the second node", RECOVERY, || async {
        (primary(bed, ns).await == there).then_some(())
    })
    .await;
    all_ready(bed, ns).await;
}

/// The ids of `acknowledged` that the primary does not have.
async fn lost_commits(bed: &TestBed, ns: &str, acknowledged: &[u64]) -> usize {
    let now = primary(bed, ns).await;
    let ids = bed.local_ok(ns, &now, "select id from bench where id < 1000000000");
    let present: std::collections::BTreeSet<u64> =
        ids.lines().filter_map(|l| l.trim().parse().ok()).collect();
    acknowledged
        .iter()
        .filter(|id| !present.contains(id))
        .count()
}

/// When `-rw` stopped sending to the old primary and sent only to another instance, from the
/// fault: in the API (the Service's EndpointSlice, the endpoints controller's write) and on the
/// first real node (the DNAT rules its kube-proxy wrote). Separates what the Service layer of
/// the test bed took from what dbop took, trial by trial.
#[derive(Clone, Copy, Default)]
struct RouteMoved {
    endpoint_slice: Option<Duration>,
    kube_proxy: Option<Duration>,
}

impl RouteMoved {
    fn describe(&self) -> String {
        let at =
            |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()));
        format!(
            "-rw moved in its EndpointSlice at {}, in kube-proxy's rules at {}",
            at(self.endpoint_slice),
            at(self.kube_proxy)
        )
    }
}

/// The addresses `-rw`'s EndpointSlices name as ready.
async fn rw_endpoints(client: &kube::Client, ns: &str) -> Vec<String> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let selector = format!("kubernetes.io/service-name={NAME}-rw");
    let Ok(list) = slices.list(&ListParams::default().labels(&selector)).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}

/// The addresses kube-proxy's DNAT rules send `-rw`'s connections to (`iptables-save`: the
/// first real node's kube-proxy writes this machine's rules).
fn rw_proxied(ns: &str) -> Vec<String> {
    let Ok(out) = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
    else {
        return Vec::new();
    };
    let service = format!("--comment \"{ns}/{NAME}-rw");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find(&service)? + service.len()..];
            if !(rest.starts_with(':') || rest.starts_with('"')) {
                return None;
            }
            let to = line.split("--to-destination ").nth(1)?;
            Some(to.split(':').next()?.to_string())
        })
        .collect()
}

/// Watches `-rw` from `start` until it sends only to addresses other than `old_ip`, both in
/// the API and in kube-proxy's rules, or until `done`.
fn watch_route(
    bed: &TestBed,
    ns: &str,
    old_ip: String,
    start: Instant,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<RouteMoved> {
    let (client, ns) = (bed.client.clone(), ns.to_string());
    let moved = move |ips: &[String]| !ips.is_empty() && !ips.contains(&old_ip);
    tokio::spawn(async move {
        let mut route = RouteMoved::default();
        while !done.load(Ordering::SeqCst)
            && (route.endpoint_slice.is_none() || route.kube_proxy.is_none())
        {
            if route.endpoint_slice.is_none() && moved(&rw_endpoints(&client, &ns).await) {
                route.endpoint_slice = Some(start.elapsed());
            }
            if route.kube_proxy.is_none() && moved(&rw_proxied(&ns)) {
                route.kube_proxy = Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        route
    })
}

async fn pod_ip(bed: &TestBed, ns: &str, pod: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let pod = pods.get(pod).await.unwrap();
    pod.status.and_then(|s| s.pod_ip).unwrap_or_default()
}

async fn trial(
    bed: &TestBed,
    ns: &str,
    kind: Kind,
    second: Option<&SecondNode>,
    counter: &mut u64,
    acknowledged: &mut Vec<u64>,
) -> Trial {
    if matches!(kind, Kind::NodeLost) {
        primary_on_the_second_node(bed, ns).await;
    }
    let old = primary(bed, ns).await;
    let old_ip = pod_ip(bed, ns, &old).await;
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let route = watch_route(bed, ns, old_ip, start, done.clone());
    let mut undo = fault(bed, ns, kind, &old, second).await;
    let mut two_primary_writes = 0;
    let mut other_wrote = false;
    // The write gap: from the last acknowledged insert before the first refused one to the
    // next acknowledged one (a deleted pod serves until its shutdown begins).
    let mut last_ack = Duration::ZERO;
    let mut failed = false;
    // In a switchover the old primary serves until it stops: an insert it acknowledges after a
    // refused one closes a gap the writer saw, but not the switchover's, which goes on until
    // the new primary writes. Such earlier gaps are added to it.
    let old_may_answer = matches!(kind, Kind::Switchover);
    let mut earlier = Duration::ZERO;
    let mut new_primary_wrote = None;
    let mut attempts = Vec::new();
    let gap = loop {
        assert!(
            start.elapsed() < FAULT_WAIT,
            "{kind:?}: no write within {FAULT_WAIT:?}"
        );
        *counter += 1;
        let began = start.elapsed();
        let acked = write_rw(bed, ns, *counter);
        if acked {
            acknowledged.push(*counter);
        }
        let at = start.elapsed();
        attempts.push((at, acked, at - began));
        let now_primary = primary(bed, ns).await;
        let moved = now_primary != old;
        // Another instance acknowledged a write on its own socket (a -rw acknowledgement may
        // still come from the old primary while the Service's endpoints move).
        let sql = |n: u64| format!("insert into bench values ({})", n + 1_000_000_000);
        if moved && !other_wrote && bed.local_psql(ns, &now_primary, &sql(*counter)).0 {
            other_wrote = true;
            new_primary_wrote = Some(start.elapsed());
        }
        if other_wrote && bed.local_psql(ns, &old, &sql(*counter + 500_000_000)).0 {
            two_primary_writes += 1;
        }
        match (acked, failed) {
            (true, true) if other_wrote || !old_may_answer => break earlier + (at - last_ack),
            (true, true) => {
                earlier += at - last_ack;
                (failed, last_ack) = (false, at);
            }
            // The new primary writes and no insert was refused since: no gap the writer could
            // see. (Before it writes, an insert acknowledged through `-rw` may be the old
            // primary's, which has yet to stop.)
            (true, false) if other_wrote => break earlier,
            (true, false) => last_ack = at,
            (false, _) => failed = true,
        }
    };
    // The route has moved by now unless -rw acknowledged the old primary all along (a
    // switchover with no gap the writer could see): the watch stops with the writer.
    done.store(true, Ordering::SeqCst);
    let route = route.await.unwrap();
    if !matches!(undo, Undo::Nothing) {
        wait_until("another primary after the fault", FAULT_WAIT, || async {
            (primary(bed, ns).await != old).then_some(())
        })
        .await;
    }
    match &mut undo {
        Undo::Cut(cut) => cut.restore(),
        Undo::BringBack => {
            second.expect("the second node").bring_back();
            // The lost pods look Ready all along: wait for the old primary itself.
            bed.streaming_standby(ns, &old, RECOVERY).await;
        }
        Undo::Nothing => {}
    }
    all_ready(bed, ns).await;
    Trial {
        gap,
        new_primary_wrote,
        attempts,
        two_primary_writes,
        route,
        lost_so_far: lost_commits(bed, ns, acknowledged).await,
    }
}

/// What one minor upgrade cost the writer.
struct Upgraded {
    /// Every write gap of the upgrade, summed.
    unavailable: Duration,
    longest: Duration,
    gaps: usize,
    took: Duration,
}

/// One minor upgrade of a new 3-instance Database `name` (15.18 → 15.20) under the writer,
/// the Database deleted after it.
async fn upgrade_trial(bed: &TestBed, ns: &str, name: &str) -> Upgraded {
    let databases = bed.databases(ns);
    bed.apply_database(ns, real_node_database(name, "15.18", 3))
        .await;
    three_ready(bed, ns, name).await;
    let status = databases.get(name).await.unwrap().status.unwrap();
    let first = status.primary.unwrap();
    bed.local_ok(ns, &first, "create table bench (id bigint)");
    let client = format!("client-{name}");
    bed.psql_client(ns, &client, name, &format!("{name}-credentials"))
        .await;
    bed.apply_database(ns, real_node_database(name, "15.20", 3))
        .await;
    let start = Instant::now();
    let (mut unavailable, mut longest, mut gaps) = (Duration::ZERO, Duration::ZERO, 0);
    let (mut last_ack, mut failed, mut n) = (Duration::ZERO, false, 0u64);
    loop {
        assert!(
            start.elapsed() < RECOVERY,
            "{name}: the upgrade took over {RECOVERY:?}"
        );
        n += 1;
        let acked = write_on(bed, ns, &client, n);
        let at = start.elapsed();
        match (acked, failed) {
            (true, true) => {
                let gap = at - last_ack;
                unavailable += gap;
                longest = longest.max(gap);
                gaps += 1;
                (last_ack, failed) = (at, false);
            }
            (true, false) => last_ack = at,
            (false, _) => failed = true,
        }
        if acked && upgraded(bed, ns, name).await {
            break;
        }
    }
    let took = start.elapsed();
    bed.databases(ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    pods.delete(&client, &DeleteParams::default())
        .await
        .unwrap();
    Upgraded {
        unavailable,
        longest,
        gaps,
        took,
    }
}

/// The upgrade of `name` is complete and every instance ready on 15.20.
async fn upgraded(bed: &TestBed, ns: &str, name: &str) -> bool {
    let Some(s) = bed
        .databases(ns)
        .get(name)
        .await
        .ok()
        .and_then(|d| d.status)
    else {
        return false;
    };
    let complete = s
        .upgrade
        .as_ref()
        .is_some_and(|u| u.to == "15.20" && u.stage == UpgradeStage::Complete);
    complete && s.phase == Some(Phase::Ready) && s.instances.iter().all(|i| i.ready)
}

/// `name` Ready with its three instances ready.
async fn three_ready(bed: &TestBed, ns: &str, name: &str) {
    wait_until(
        &format!("every instance of {name} ready"),
        RECOVERY,
        || async {
            let s = bed.databases(ns).get(name).await.ok()?.status?;
            (s.phase == Some(Phase::Ready)
                && s.instances.len() == 3
                && s.instances.iter().all(|i| i.ready))
            .then_some(())
        },
    )
    .await;
}

/// `BENCH_HA_UPGRADES` minor upgrades, each of a new Database: the write unavailability's p50
/// and max over them, and the longest single gap.
async fn upgrades(bed: &TestBed, ns: &str, trials: usize) -> serde_json::Value {
    let mut totals = Vec::new();
    let mut longest = Duration::ZERO;
    for n in 0..trials {
        let u = upgrade_trial(bed, ns, &format!("up{n}")).await;
        println!(
            "upgrade #{n}: writes refused for {:.2} s in all ({} gaps, the longest {:.2} s); the upgrade took {:.0} s",
            u.unavailable.as_secs_f64(),
            u.gaps,
            u.longest.as_secs_f64(),
            u.took.as_secs_f64()
        );
        totals.push(u.unavailable);
        longest = longest.max(u.longest);
    }
    totals.sort();
    let (p50, max) = (percentile(&totals, 0.5), *totals.last().unwrap());
    println!(
        "upgrade: {trials} trials, write unavailability p50 {:.2} s, max {:.2} s, longest gap {:.2} s",
        p50.as_secs_f64(),
        max.as_secs_f64(),
        longest.as_secs_f64()
    );
    json!({"trials": trials, "p50_s": p50.as_secs_f64(), "max_s": max.as_secs_f64(),
           "longest_gap_s": longest.as_secs_f64(),
           "unavailable_s": totals.iter().map(Duration::as_secs_f64).collect::<Vec<_>>()})
}

/// A trial's attempts, compact: `1.23+0.31 ok`, `2.10+2.00 no`.
fn timeline(attempts: &[(Duration, bool, Duration)]) -> String {
    attempts
        .iter()
        .map(|(at, ok, took)| {
            let verdict = if *ok { "ok" } else { "no" };
            format!(
                "{:.2}+{:.2} {verdict}",
                at.as_secs_f64(),
                took.as_secs_f64()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The kinds of loss `BENCH_HA_KINDS` names (comma-separated labels; all when unset).
fn kinds_asked() -> Vec<Kind> {
    let only = std::env::var("BENCH_HA_KINDS").unwrap_or_default();
    [
        Kind::PostgresKilled,
        Kind::PodDeleted,
        Kind::Isolated,
        Kind::NodeLost,
        Kind::Switchover,
        Kind::Upgrade,
    ]
    .into_iter()
    .filter(|k| only.is_empty() || only.split(',').any(|o| o == k.label()))
    .collect()
}

/// One kind's figures, printed and as JSON: the write gap's p50 and max over its trials, the
/// two-primary writes and the acknowledged commits lost.
fn summarise(
    kind: Kind,
    mut gaps: Vec<Duration>,
    two: u32,
    lost: usize,
    acknowledged: usize,
) -> serde_json::Value {
    gaps.sort();
    let trials = gaps.len();
    let (p50, max) = (percentile(&gaps, 0.5), *gaps.last().unwrap());
    println!(
        "{}: {trials} trials, write gap p50 {:.2} s, max {:.2} s, two-primary writes {two}, acknowledged commits lost {lost}",
        kind.label(),
        p50.as_secs_f64(),
        max.as_secs_f64()
    );
    json!({"trials": trials, "p50_s": p50.as_secs_f64(), "max_s": max.as_secs_f64(),
           "two_primary_writes": two, "acknowledged_commits_lost": lost,
           "acknowledged_commits": acknowledged,
           "gaps_s": gaps.iter().map(Duration::as_secs_f64).collect::<Vec<_>>()})
}

/// The Database the fault kinds share, ready with a table `bench` and the client pod `client`.
async fn shared_database(bed: &TestBed, ns: &str, node_lost: bool, synchronous: bool) {
    let mut database = real_node_database(NAME, "15.20", 3);
    if node_lost {
        database["spec"]["placement"] = two_real_nodes_placement();
    }
    if synchronous {
        database["spec"]["synchronous"] = json!({"standbys": 1, "whenTooFew": "Wait"});
    }
    bed.apply_database(ns, database).await;
    all_ready(bed, ns).await;
    let first = primary(bed, ns).await;
    bed.local_ok(ns, &first, "create table bench (id bigint)");
    bed.psql_client(ns, "client", NAME, "bench-credentials")
        .await;
}

#[tokio::main]
async fn main() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let count = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let trials = count("BENCH_HA_TRIALS", 20);
    let label = std::env::var("BENCH_LABEL").unwrap_or_else(|_| "local".into());
    let synchronous = std::env::var("BENCH_HA_SYNCHRONOUS").is_ok_and(|v| v == "1");
    let mode = if synchronous { "-synchronous" } else { "" };
    let out = std::path::Path::new("target/bench");
    std::fs::create_dir_all(out).unwrap();
    let path = out.join(format!("ha-{label}{mode}.json"));
    let kinds = kinds_asked();
    let node_lost = kinds.iter().any(|k| matches!(k, Kind::NodeLost));
    let second = if node_lost {
        Some(bed.second_node(1).await)
    } else {
        None
    };
    let ns = bed.real_node_namespace("bench-ha").await;
    let _operator = bed.operator_for_real_node(&ns);
    let mut results = serde_json::Map::new();
    // Each kind's figures are written as soon as it ends: a run cut short keeps them.
    let save = |results: &serde_json::Map<String, serde_json::Value>| {
        std::fs::write(&path, serde_json::to_string_pretty(results).unwrap()).unwrap();
    };
    if kinds.iter().any(|k| matches!(k, Kind::Upgrade)) {
        let upgrades_asked = count("BENCH_HA_UPGRADES", 5);
        results.insert("upgrade".into(), upgrades(&bed, &ns, upgrades_asked).await);
        save(&results);
    }
    let faults: Vec<Kind> = kinds
        .into_iter()
        .filter(|k| !matches!(k, Kind::Upgrade))
        .collect();
    if !faults.is_empty() {
        shared_database(&bed, &ns, node_lost, synchronous).await;
    }
    let mut counter = 0u64;
    let mut acknowledged = Vec::new();
    let mut lost_so_far = 0;
    for kind in faults {
        let (mut gaps, mut routes) = (Vec::new(), Vec::new());
        let (mut two, mut lost) = (0, 0);
        for n in 0..trials {
            let began = Instant::now();
            let t = trial(
                &bed,
                &ns,
                kind,
                second.as_ref(),
                &mut counter,
                &mut acknowledged,
            )
            .await;
            let lost_now = t.lost_so_far.saturating_sub(lost_so_far);
            lost_so_far = t.lost_so_far;
            println!(
                "{} #{n}: {:.2} s, two-primary writes {}, acknowledged commits lost {} (the trial took {:.0} s; the new primary wrote on its own socket at {})",
                kind.label(),
                t.gap.as_secs_f64(),
                t.two_primary_writes,
                lost_now,
                began.elapsed().as_secs_f64(),
                t.new_primary_wrote
                    .map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
            );
            println!("  {}", t.route.describe());
            routes.push(json!([
                t.route.endpoint_slice.map(|d| d.as_secs_f64()),
                t.route.kube_proxy.map(|d| d.as_secs_f64()),
                t.new_primary_wrote.map(|d| d.as_secs_f64()),
                t.gap.as_secs_f64()
            ]));
            if t.gap > Duration::from_secs(5) {
                println!(
                    "  attempts (ended at s, acknowledged, insert took s): {}",
                    timeline(&t.attempts)
                );
            }
            gaps.push(t.gap);
            two += t.two_primary_writes;
            lost += lost_now;
        }
        let mut summary = summarise(kind, gaps, two, lost, acknowledged.len());
        // Per trial, in order: -rw moved in its EndpointSlice, in kube-proxy's rules, the new
        // primary wrote on its own socket (s from the fault), the write gap (s).
        summary["route_slice_proxy_wrote_gap_s"] = json!(routes);
        results.insert(kind.label().into(), summary);
        save(&results);
    }
    println!("written to {}", path.display());
}
