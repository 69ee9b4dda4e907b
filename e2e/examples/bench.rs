//! `make bench`: dbop at scale on the test bed's kwok nodes, measured from outside the operator.
//! Not a test (nothing here asserts a target): it prints the figures docs/benchmarks.md records
//! and writes them as JSON to `target/bench/operator-<BENCH_LABEL>.json`.
//!
//! Phases, in one run against the real `dbop run` binary (`DBOP_BIN`, default
//! `target/release/dbop`), watching every namespace:
//! 1. Startup: RSS with no Database (after `/readyz`), then a restart with one Database: process
//!    start → its first reconcile (the finalizer appears).
//! 2. Scale: `BENCH_DATABASES` (1,000) Databases in `BENCH_NAMESPACES` (10) → all Ready; peak
//!    and steady RSS, CPU seconds, the operator's writes by verb (audit log, user agent `dbop/`)
//!    and the API server's requests by verb (`apiserver_request_total`, all clients).
//! 3. Idle: `BENCH_IDLE_SECS` (600) with everything Ready: writes, reconciles, CPU, RSS.
//! 4. Self-repair: `BENCH_DELETIONS` (1,000) deletions of owned Services, StatefulSets and
//!    Secrets spread over the Databases, `BENCH_REPAIR_CONCURRENCY` (4) at a time, each timed by
//!    an independent watch from its DELETED event to the replacement's ADDED event.
//! 5. Self-repair while converging: `BENCH_CONVERGING` (= `BENCH_DATABASES`) new Databases
//!    applied 32 at a time, and while they converge the deletions of phase 4 on the Ready ones:
//!    the repairs' percentiles, how many new Databases were still converging when the last repair
//!    came, and when all of them were Ready.
//! 6. The floor: the operator stopped, the objects it made for one Ready Database (`db-0000`)
//!    copied `BENCH_DATABASES` times under new names by the benchmark itself into namespaces of
//!    their own, 32 Databases' sets at a time, until every copy's StatefulSet is ready: what the
//!    API server, the StatefulSet controller and the kubelets need for the same objects with no
//!    operator. dbop's convergence times are reported as ratios to it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use dbop::api::{Database, Phase};
use dbop_e2e::{TestBed, database_manifest, operator_binary_path, testbed};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const LABEL: &str = "bench.dbop.dev/run=1";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let bed = testbed().await;
    let databases = env_or("BENCH_DATABASES", 1000) as usize;
    let namespaces = env_or("BENCH_NAMESPACES", 10) as usize;
    let idle = Duration::from_secs(env_or("BENCH_IDLE_SECS", 600));
    let deletions = env_or("BENCH_DELETIONS", 1000) as usize;
    let label = std::env::var("BENCH_LABEL").unwrap_or_else(|_| "run".into());
    let mut report = json!({
        "label": label, "date": Utc::now().to_rfc3339(), "binary": operator_binary_path(),
        "databases": databases, "namespaces": namespaces,
    });
    let names: Vec<String> = (0..namespaces).map(|i| format!("bench-{i:02}")).collect();
    for ns in &names {
        create_namespace(&bed.client, ns).await;
    }
    report["startup"] = startup(&bed, &names[0]).await;
    let mut operator = Operator::start(&bed);
    let first = first_reconcile(&bed, &names[0], operator.started).await;
    report["startup"]["to_first_reconcile_ms"] = json!(first.as_millis());
    println!("startup: {}", report["startup"]);

    report["scale"] = scale(&bed, &mut operator, &names, databases).await;
    println!("scale: {}", report["scale"]);
    report["idle"] = idle_phase(&bed, &mut operator, idle).await;
    println!("idle: {}", report["idle"]);
    report["self_repair"] = self_repair(&bed, &names, databases, deletions).await;
    println!("self-repair: {}", report["self_repair"]);
    let converging = env_or("BENCH_CONVERGING", databases as u64) as usize;
    report["self_repair_converging"] =
        repair_while_converging(&bed, &names, databases, converging, deletions).await;
    println!(
        "self-repair while converging: {}",
        report["self_repair_converging"]
    );
    report["after_all"] = json!({"rss_mib": operator.rss_mib(), "cpu_s": operator.cpu_seconds()});
    drop(operator);
    report["floor"] = floor(&bed, &names[0], databases, namespaces).await;
    report["convergence_ratio"] = convergence_ratios(&report, databases);
    println!("floor: {}", report["floor"]);
    println!("convergence / floor: {}", report["convergence_ratio"]);

    let out = dbop_e2e::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let path = out.join(format!("operator-{label}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).expect("report");
    println!("written to {}", path.display());
}

/// The operator process, sampled through /proc and its /metrics.
struct Operator {
    child: std::process::Child,
    started: Instant,
    port: u16,
    peak_rss_kib: Arc<Mutex<u64>>,
}

impl Operator {
    fn start(bed: &TestBed) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = bed.dir.join("logs/bench-dbop.log");
        let _ = std::fs::create_dir_all(log.parent().unwrap());
        let log = std::fs::File::create(&log).expect("log file");
        let started = Instant::now();
        let child = std::process::Command::new(operator_binary_path())
            .args(["run", "--metrics-addr", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &bed.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_RUST_LOG").unwrap_or("warn".into()),
            )
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dbop binary (DBOP_BIN)");
        let peak_rss_kib = Arc::new(Mutex::new(0));
        let (pid, peak) = (child.id(), peak_rss_kib.clone());
        tokio::spawn(async move {
            while let Some(rss) = rss_kib(pid) {
                {
                    let mut peak = peak.lock().unwrap();
                    *peak = (*peak).max(rss);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Operator {
            child,
            started,
            port,
            peak_rss_kib,
        }
    }

    fn rss_mib(&self) -> f64 {
        rss_kib(self.child.id()).unwrap_or(0) as f64 / 1024.0
    }

    fn take_peak_mib(&self) -> f64 {
        let mut peak = self.peak_rss_kib.lock().unwrap();
        let value = *peak as f64 / 1024.0;
        *peak = 0;
        value
    }

    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
            .sum();
        ticks as f64 / 100.0
    }

    async fn http_get(&self, path: &str) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let ok = response.lines().next().is_some_and(|l| l.contains(" 200 "));
        ok.then(|| response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()))?
    }

    async fn wait_ready(&self) -> Duration {
        loop {
            if self.http_get("/readyz").await.is_some() {
                return self.started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `dbop_reconciles_total` of both controllers.
    async fn reconciles(&self) -> f64 {
        let text = self.http_get("/metrics").await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("dbop_reconciles_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

/// RSS with no Database: start, wait for /readyz, let it settle 5 s, sample. (On a test bed
/// that already holds the Databases of an earlier run, `databases_present` says how many.)
async fn startup(bed: &TestBed, first_namespace: &str) -> Value {
    let present = Api::<Database>::all(bed.client.clone())
        .list_metadata(&kube::api::ListParams::default().labels(LABEL))
        .await
        .map(|l| l.items.len())
        .unwrap_or(0);
    let operator = Operator::start(bed);
    let ready = operator.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_rss = operator.rss_mib();
    drop(operator);
    // The Database the restarted operator reconciles first.
    let db = manifest("db-0000");
    bed.apply_database(first_namespace, db).await;
    json!({"to_ready_ms": ready.as_millis(), "rss_no_databases_mib": round(idle_rss), "databases_present": present})
}

fn manifest(name: &str) -> Value {
    let mut m = database_manifest(name, json!({}));
    m["metadata"]["labels"] = json!({"bench.dbop.dev/run": "1"});
    m
}

/// Process start → the finalizer on the one Database (the first thing its reconcile writes).
async fn first_reconcile(bed: &TestBed, ns: &str, started: Instant) -> Duration {
    let api = bed.databases(ns);
    loop {
        if let Ok(db) = api.get("db-0000").await
            && db.finalizers().iter().any(|f| f == dbop::FINALIZER)
        {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn scale(bed: &TestBed, operator: &mut Operator, names: &[String], count: usize) -> Value {
    let before = ApiCounts::read(bed).await;
    let (cpu0, t0, wall0) = (operator.cpu_seconds(), Utc::now(), Instant::now());
    operator.take_peak_mib();
    let ready = tokio::spawn(all_ready(bed.client.clone(), count));
    futures::stream::iter(1..count)
        .map(|i| {
            let ns = &names[i * names.len() / count];
            bed.apply_database(ns, manifest(&format!("db-{i:04}")))
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = wall0.elapsed();
    let timeout = Duration::from_secs(env_or("BENCH_READY_TIMEOUT_SECS", 900));
    let all_ready = tokio::time::timeout(timeout, ready).await;
    let elapsed = wall0.elapsed();
    let (cpu1, t1) = (operator.cpu_seconds(), Utc::now());
    let peak = operator.take_peak_mib();
    let after = ApiCounts::read(bed).await;
    let writes = operator_writes(bed, t0, t1);
    // Steady: 30 s after the last one became Ready.
    tokio::time::sleep(Duration::from_secs(30)).await;
    json!({
        "all_ready": all_ready.is_ok(),
        "all_ready_s": round(elapsed.as_secs_f64()),
        "created_s": round(created.as_secs_f64()),
        "cpu_s": round(cpu1 - cpu0),
        "peak_rss_mib": round(peak),
        "steady_rss_mib": round(operator.rss_mib()),
        "operator_writes_by_verb": writes,
        "apiserver_requests_by_verb": after.minus(&before),
    })
}

/// Waits until `count` bench Databases are Ready (a watch, so no Ready moment is missed).
async fn all_ready(client: Client, count: usize) {
    let ready = |db: &Database| db.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready);
    count_until(Api::all(client), LABEL, count, ready).await;
}

/// Waits until `count` objects of `api` with the `selector` label pass `ready` at once.
async fn count_until<K>(api: Api<K>, selector: &str, count: usize, ready: impl Fn(&K) -> bool)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let config = watcher::Config::default().labels(selector);
    let mut states: HashMap<(String, String), bool> = HashMap::new();
    let mut events = std::pin::pin!(watcher(api, config));
    while let Some(event) = events.try_next().await.expect("watch") {
        if let Event::Apply(object) | Event::InitApply(object) = event {
            let key = (object.namespace().unwrap_or_default(), object.name_any());
            states.insert(key, ready(&object));
            if states.values().filter(|r| **r).count() >= count {
                return;
            }
        }
    }
}

async fn idle_phase(bed: &TestBed, operator: &mut Operator, period: Duration) -> Value {
    let (reconciles0, cpu0, t0) = (
        operator.reconciles().await,
        operator.cpu_seconds(),
        Utc::now(),
    );
    let before = ApiCounts::read(bed).await;
    operator.take_peak_mib();
    tokio::time::sleep(period).await;
    let (reconciles1, cpu1, t1) = (
        operator.reconciles().await,
        operator.cpu_seconds(),
        Utc::now(),
    );
    let after = ApiCounts::read(bed).await;
    json!({
        "seconds": period.as_secs(),
        "operator_writes_by_verb": operator_writes(bed, t0, t1),
        "reconciles": reconciles1 - reconciles0,
        "cpu_s": round(cpu1 - cpu0),
        "rss_mib": round(operator.rss_mib()),
        "peak_rss_mib": round(operator.take_peak_mib()),
        "apiserver_requests_by_verb": after.minus(&before),
    })
}

/// Requests the API server counted, by verb (all clients).
struct ApiCounts(BTreeMap<String, f64>);

impl ApiCounts {
    async fn read(bed: &TestBed) -> Self {
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = bed.client.request_text(request).await.expect("/metrics");
        let mut by_verb = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| l.starts_with("apiserver_request_total{"))
        {
            let verb = line
                .split("verb=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("?")
                .to_string();
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *by_verb.entry(verb).or_insert(0.0) += value;
        }
        ApiCounts(by_verb)
    }

    fn minus(&self, before: &ApiCounts) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .map(|(verb, n)| {
                (
                    verb.clone(),
                    (n - before.0.get(verb).unwrap_or(&0.0)) as u64,
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// The operator's write requests (user agent `dbop/`) between two moments, by verb and
/// resource (leases are not in the audit log).
fn operator_writes(bed: &TestBed, from: DateTime<Utc>, to: DateTime<Utc>) -> BTreeMap<String, u64> {
    let path = bed.dir.join("audit.log");
    let text = std::fs::read_to_string(Path::new(&path)).expect("audit log");
    let mut counts = BTreeMap::new();
    for entry in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let by_dbop = entry["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with("dbop/"));
        let at = entry["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        if by_dbop && at.is_some_and(|at| at >= from && at <= to) {
            let resource = entry["objectRef"]["resource"].as_str().unwrap_or("?");
            let sub = entry["objectRef"]["subresource"]
                .as_str()
                .map(|s| format!("/{s}"));
            let key = format!(
                "{} {resource}{}",
                entry["verb"].as_str().unwrap_or("?"),
                sub.unwrap_or_default()
            );
            *counts.entry(key).or_insert(0) += 1;
        }
    }
    counts
}

type Key = (&'static str, String, String);
/// Deletions waiting for their replacement: when the DELETED event came, and who to tell.
type Pending = Arc<Mutex<HashMap<Key, (Option<Instant>, Option<oneshot::Sender<Duration>>)>>>;

async fn self_repair(bed: &TestBed, names: &[String], count: usize, deletions: usize) -> Value {
    let pending: Pending = Arc::default();
    let watches = [
        tokio::spawn(time_repairs::<Service>(
            bed.client.clone(),
            "Service",
            pending.clone(),
        )),
        tokio::spawn(time_repairs::<StatefulSet>(
            bed.client.clone(),
            "StatefulSet",
            pending.clone(),
        )),
        tokio::spawn(time_repairs::<Secret>(
            bed.client.clone(),
            "Secret",
            pending.clone(),
        )),
    ];
    // Let the watches list first, so no event is missed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let concurrency = env_or("BENCH_REPAIR_CONCURRENCY", 4) as usize;
    let started = Instant::now();
    let samples: Vec<(&str, Option<Duration>)> = futures::stream::iter(0..deletions)
        .map(|i| {
            let db = i % count;
            let ns = names[db * names.len() / count].clone();
            let name = format!("db-{db:04}");
            let (kind, object) = match i % 4 {
                0 => ("Service", format!("{name}-rw")),
                1 => ("StatefulSet", name.clone()),
                2 => ("Service", format!("{name}-hl")),
                _ => ("Secret", format!("{name}-credentials")),
            };
            let timed = delete_and_time(bed.client.clone(), pending.clone(), kind, ns, object);
            async move { (kind, timed.await) }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    watches.iter().for_each(|w| w.abort());
    let mut summary = quantiles(samples.iter().filter_map(|s| s.1));
    summary["deletions"] = json!(deletions);
    summary["concurrency"] = json!(concurrency);
    summary["wall_s"] = json!(round(started.elapsed().as_secs_f64()));
    for kind in ["Service", "StatefulSet", "Secret"] {
        summary[kind] = quantiles(samples.iter().filter(|s| s.0 == kind).filter_map(|s| s.1));
    }
    summary
}

/// `self_repair` on the `count` Ready Databases while `converging` new ones (`new-NNNN`, spread
/// over the same namespaces) are applied and converge.
async fn repair_while_converging(
    bed: &TestBed,
    names: &[String],
    count: usize,
    converging: usize,
    deletions: usize,
) -> Value {
    let started = Instant::now();
    let ready = tokio::spawn(all_ready(bed.client.clone(), count + converging));
    let applied = futures::stream::iter(0..converging)
        .map(|i| {
            let ns = &names[i * names.len() / converging];
            bed.apply_database(ns, manifest(&format!("new-{i:04}")))
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    let (_, mut repairs) = tokio::join!(applied, self_repair(bed, names, count, deletions));
    repairs["new_ready_when_repairs_ended"] = json!(ready_count(bed, "new-").await);
    let timeout = Duration::from_secs(env_or("BENCH_READY_TIMEOUT_SECS", 900));
    let all_ready = tokio::time::timeout(timeout, ready).await.is_ok();
    repairs["converging"] = json!(converging);
    repairs["all_ready"] = json!(all_ready);
    repairs["all_ready_s"] = json!(round(started.elapsed().as_secs_f64()));
    repairs
}

/// How many bench Databases whose name starts with `prefix` are Ready now.
async fn ready_count(bed: &TestBed, prefix: &str) -> usize {
    let api: Api<Database> = Api::all(bed.client.clone());
    let list = api
        .list(&kube::api::ListParams::default().labels(LABEL))
        .await
        .expect("list Databases");
    list.items
        .iter()
        .filter(|db| db.name_any().starts_with(prefix))
        .filter(|db| db.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
        .count()
}

/// p50, p99 and max in milliseconds, and how many samples.
fn quantiles(samples: impl Iterator<Item = Duration>) -> Value {
    let mut sorted: Vec<Duration> = samples.collect();
    sorted.sort();
    let pick = |q: f64| {
        sorted
            .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .map(|d| round(d.as_secs_f64() * 1000.0))
    };
    json!({"repaired": sorted.len(), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)})
}

async fn delete_and_time(
    client: Client,
    pending: Pending,
    kind: &'static str,
    ns: String,
    name: String,
) -> Option<Duration> {
    let (tell, told) = oneshot::channel();
    pending
        .lock()
        .unwrap()
        .insert((kind, ns.clone(), name.clone()), (None, Some(tell)));
    let deleted = match kind {
        "Service" => Api::<Service>::namespaced(client, &ns)
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
        "StatefulSet" => Api::<StatefulSet>::namespaced(client, &ns)
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
        _ => Api::<Secret>::namespaced(client, &ns)
            .delete(&name, &DeleteParams::default())
            .await
            .map(|_| ()),
    };
    if let Err(error) = deleted {
        eprintln!("delete {kind} {ns}/{name}: {error}");
        return None;
    }
    match tokio::time::timeout(Duration::from_secs(60), told).await {
        Ok(Ok(took)) => Some(took),
        _ => {
            eprintln!("{kind} {ns}/{name} not repaired within 60 s");
            None
        }
    }
}

/// An independent watch on one kind (dbop's label): a DELETED event of a pending deletion
/// starts its clock, the next event of that name (the replacement's ADDED) stops it.
async fn time_repairs<K>(client: Client, kind: &'static str, pending: Pending)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let config = watcher::Config::default().labels(dbop::resources::MANAGED_SELECTOR);
    let mut events = std::pin::pin!(watcher(api, config));
    while let Ok(Some(event)) = events.try_next().await {
        let now = Instant::now();
        let (object, deleted) = match event {
            Event::Delete(o) => (o, true),
            Event::Apply(o) => (o, false),
            _ => continue,
        };
        let key = (
            kind,
            object.meta().namespace.clone().unwrap_or_default(),
            object.name_any(),
        );
        let mut pending = pending.lock().unwrap();
        let Some(entry) = pending.get_mut(&key) else {
            continue;
        };
        match (deleted, entry.0) {
            (true, None) => entry.0 = Some(now),
            (false, Some(at)) => {
                if let Some((_, Some(tell))) = pending.remove(&key) {
                    let _ = tell.send(now - at);
                }
            }
            _ => {}
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The kinds dbop makes for a Database itself (pods and claims come from its StatefulSet), in
/// the order the floor creates them.
fn floor_kinds() -> Vec<ApiResource> {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    vec![
        ApiResource::erase::<Secret>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<ServiceAccount>(&()),
        ApiResource::erase::<Role>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<NetworkPolicy>(&()),
        ApiResource::erase::<StatefulSet>(&()),
    ]
}

const FLOOR_LABEL: &str = "bench.dbop.dev/floor";

/// What dbop made for `name` in `ns`, as objects to create again: metadata cut to name, labels
/// and annotations (the floor's label added, dbop's managed-by label changed so no dbop would
/// adopt them), no status, no cluster IPs.
async fn templates(bed: &TestBed, ns: &str, name: &str) -> Vec<(ApiResource, Value)> {
    let selector = format!("app.kubernetes.io/instance={name}");
    let mut templates = Vec::new();
    for kind in floor_kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(bed.client.clone(), ns, &kind);
        let list = api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap_or_else(|e| panic!("list {}: {e}", kind.kind));
        for object in list.items {
            let mut value = serde_json::to_value(&object).expect("object");
            let meta = &value["metadata"];
            let mut labels = meta["labels"].clone();
            labels["app.kubernetes.io/managed-by"] = json!("dbop-bench-floor");
            labels[FLOOR_LABEL] = json!("1");
            value["metadata"] = json!({
                "name": meta["name"], "labels": labels, "annotations": meta["annotations"],
            });
            if let Some(map) = value.as_object_mut() {
                map.remove("status");
            }
            if let Some(spec) = value["spec"].as_object_mut() {
                spec.remove("clusterIP");
                spec.remove("clusterIPs");
            }
            templates.push((kind.clone(), value));
        }
    }
    templates
}

/// Creates `templates` (made for `db-0000`) again for `name` in `ns`, one after the other.
async fn create_copies(client: Client, templates: &[(ApiResource, Value)], ns: &str, name: &str) {
    for (kind, template) in templates {
        let text = template.to_string().replace("db-0000", name);
        let object: DynamicObject = serde_json::from_str(&text).expect("copy");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, kind);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("create {} {name}: {e}", kind.kind),
        }
    }
}

/// Phase 6: `count` copies of `db-0000`'s objects in `namespaces` namespaces of their own,
/// created 32 Databases' sets at a time, until every copy's StatefulSet is ready.
async fn floor(bed: &TestBed, template_ns: &str, count: usize, namespaces: usize) -> Value {
    let templates = templates(bed, template_ns, "db-0000").await;
    let names: Vec<String> = (0..namespaces).map(|i| format!("floor-{i:02}")).collect();
    for ns in &names {
        create_namespace(&bed.client, ns).await;
    }
    let started = Instant::now();
    let ready = tokio::spawn(statefulsets_ready(bed.client.clone(), count));
    futures::stream::iter(0..count)
        .map(|i| {
            let ns = names[i * names.len() / count].clone();
            let (client, templates) = (bed.client.clone(), &templates);
            async move { create_copies(client, templates, &ns, &format!("floor-{i:04}")).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();
    let timeout = Duration::from_secs(env_or("BENCH_READY_TIMEOUT_SECS", 900));
    let all_ready = tokio::time::timeout(timeout, ready).await.is_ok();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, _) in &templates {
        *kinds.entry(kind.kind.clone()).or_default() += 1;
    }
    json!({
        "objects_per_database": kinds,
        "all_ready": all_ready,
        "all_ready_s": round(started.elapsed().as_secs_f64()),
        "created_s": round(created.as_secs_f64()),
    })
}

/// Waits until `count` of the floor's StatefulSets have all their replicas ready.
async fn statefulsets_ready(client: Client, count: usize) {
    let ready = |sts: &StatefulSet| {
        let have = sts.status.as_ref().and_then(|s| s.ready_replicas);
        have.unwrap_or(0) >= sts.spec.replicas.unwrap_or(1)
    };
    count_until(Api::all(client), FLOOR_LABEL, count, ready).await;
}

/// dbop's convergence over the floor's, time per Database: the scale phase's Databases on an
/// empty test bed, and phase 5's (`BENCH_CONVERGING` of them) beside those, each against the
/// floor's `databases` sets.
fn convergence_ratios(report: &Value, databases: usize) -> Value {
    let per_database =
        |phase: &str, count: f64| report[phase]["all_ready_s"].as_f64().unwrap_or(f64::NAN) / count;
    let floor = per_database("floor", databases as f64);
    let converging = report["self_repair_converging"]["converging"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let ratio = |time: f64| (time / floor * 100.0).round() / 100.0;
    json!({
        "scale": ratio(per_database("scale", databases as f64)),
        "while_repairing": ratio(per_database("self_repair_converging", converging)),
    })
}
