//! PostgreSQL's metrics on the test bed's real node: a Database's pod serves `/metrics` on its
//! port `metrics` (on by default), with values the server itself reports, and the custom
//! queries of the ConfigMap key `spec.monitoring.customQueries` names; an edit of that
//! ConfigMap shows in the metrics without a restart of the server; and every metric the chart's
//! alerts and dashboards read is one such a pod, or the operator, exports; `kubectl dbop status`
//! shows the pod's health figures. Scraped through the API server's pod
//! proxy, as a Prometheus in the cluster would reach the pod's IP.

#[path = "offline/mod.rs"]
mod offline;

use std::collections::BTreeSet;

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, http_get, sample, testbed, wait_until};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// A real server: initdb and start on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// The kubelet updates a mounted ConfigMap within its sync period (~1 min) plus its cache TTL.
const REMOUNT_WAIT: Duration = Duration::from_secs(180);

fn queries(answer: u32) -> String {
    format!(
        "queries:\n  - name: answer\n    help: The answer.\n    sql: SELECT {answer} AS value\n    values: [value]\n"
    )
}

async fn put_queries(bed: &TestBed, ns: &str, answer: u32) {
    let api = Api::<ConfigMap>::namespaced(bed.client.clone(), ns);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders-metrics"}, "data": {"queries.yaml": queries(answer)}});
    api.patch(
        "orders-metrics",
        &PatchParams::apply("e2e-tests").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("the queries ConfigMap");
}

/// One scrape of the pod's endpoint (None while it does not answer).
async fn scrape(bed: &TestBed, ns: &str, pod: &str) -> Option<String> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:9187/proxy/metrics");
    let request = http::Request::get(path).body(vec![]).ok()?;
    bed.client.request_text(request).await.ok()
}

/// Metrics a primary exports only while standbys stream to it, and a standby only: the
/// replication tests of the instance manager (instance/tests/metrics.rs) scrape them from a
/// real standby.
const ONLY_WITH_STANDBYS: [&str; 2] = [
    "dbop_pg_replication_lag_bytes",
    "dbop_pg_standby_replay_lag_bytes",
];

/// What a primary exports only while it archives its WAL (this one does not; the instance
/// manager's own test scrapes them from an archiving server).
const ONLY_WITH_ARCHIVING: [&str; 1] = ["dbop_pg_wal_archive_waiting_files"];

/// The metric names of a scrape: its samples', and its families' (a family without samples yet,
/// the operator's backup series before any backup, still says its name and type).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let mut words = family.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["", "_total"],
                "histogram" => &["", "_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            names.extend(line.split(['{', ' ']).next().map(String::from));
        }
    }
    names
}

/// The `dbop_*` metric names a template of the chart reads (rendered with the alerts and the
/// dashboards on).
fn names_read_by(template: &str) -> BTreeSet<String> {
    let dir = offline::scratch("monitoring");
    let (ok, out, err) = offline::helm_cmd(
        &dir,
        &[
            "template",
            "dbop",
            offline::chart().to_str().unwrap(),
            "--show-only",
            template,
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "dashboards.enabled=true",
        ],
    );
    assert!(ok, "helm template: {err}");
    let _ = std::fs::remove_dir_all(&dir);
    out.match_indices("dbop_")
        .filter(|(at, _)| {
            // A name starts there (not inside another word, a label value or a uid).
            let before = out[..*at].chars().next_back();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .map(|(at, _)| {
            out[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.ends_with('_'))
        .collect()
}

fn psql(bed: &TestBed, ns: &str, sql: &str) -> String {
    let (ok, out, err) = bed.exec(
        ns,
        "orders-0",
        &["psql", "-X", "-U", "postgres", "-Atc", sql],
    );
    assert!(ok, "psql {sql}: {err}");
    out.trim().to_string()
}

#[tokio::test]
async fn a_database_pod_serves_its_metrics_and_custom_queries() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("metrics").await;
    let operator = bed.operator_for_real_node(&ns);
    put_queries(&bed, &ns, 42).await;
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "orders"}, "spec": {
            "version": "15.20",
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "monitoring": {"customQueries": {"name": "orders-metrics", "key": "queries.yaml"}},
        }}),
    )
    .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, READY_WAIT)
        .await;

    let text = wait_until("a scrape with the custom query", READY_WAIT, || async {
        scrape(&bed, &ns, "orders-0")
            .await
            .filter(|t| t.contains("dbop_pg_custom_answer_value"))
    })
    .await;
    assert_eq!(sample(&text, "dbop_pg_up"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "dbop_pg_custom_answer_value"),
        Some(42.0),
        "{text}"
    );
    // Values the server reports for the same things.
    let max_connections: f64 = psql(&bed, &ns, "show max_connections").parse().unwrap();
    assert_eq!(
        sample(&text, "dbop_pg_max_connections"),
        Some(max_connections)
    );
    assert_eq!(sample(&text, "dbop_pg_in_recovery"), Some(0.0));
    // A table of a known size moves the database's size by at least that much.
    let before = sample(&text, "dbop_pg_database_size_bytes{datname=\"postgres\"}")
        .expect("the postgres database's size");
    psql(
        &bed,
        &ns,
        "create table filler as select repeat('x', 1000) as pad from generate_series(1, 8000)",
    );
    let table: f64 = psql(&bed, &ns, "select pg_total_relation_size('filler')")
        .parse()
        .unwrap();
    let server: f64 = psql(&bed, &ns, "select pg_database_size('postgres')")
        .parse()
        .unwrap();
    let text = scrape(&bed, &ns, "orders-0").await.expect("a scrape");
    let after = sample(&text, "dbop_pg_database_size_bytes{datname=\"postgres\"}").unwrap();
    assert!(after - before >= table, "{before} → {after}, table {table}");
    assert!(
        (after - server).abs() <= 1_048_576.0,
        "exported {after}, server {server}"
    );

    // What the chart's alerts and dashboards read is exported: PostgreSQL's by this pod (now
    // that it has a table), the operator's by this operator. The operator's families without a
    // sample yet (no backup, no error) are not exported: the dashboards read none of those, and
    // the operator's alerts are run on recorded series (alerts.rs).
    let addr = wait_until("the operator's metrics address", READY_WAIT, || async {
        operator.metrics_addr()
    })
    .await;
    let (status, operator_text) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200, "{operator_text}");
    let (pod_names, operator_names) = (exported(&text), exported(&operator_text));
    let alerts = names_read_by("templates/prometheusrule.yaml");
    let dashboards = names_read_by("templates/dashboards.yaml");
    let postgres: BTreeSet<&String> = alerts
        .iter()
        .chain(&dashboards)
        .filter(|n| n.starts_with("dbop_pg_"))
        .collect();
    let operator_read: BTreeSet<&String> = dashboards
        .iter()
        .filter(|n| !n.starts_with("dbop_pg_"))
        .collect();
    assert!(
        postgres.len() >= 10 && !operator_read.is_empty(),
        "the chart reads {postgres:?} {operator_read:?}"
    );
    let unknown: Vec<&&String> = postgres
        .iter()
        .filter(|n| {
            let conditional = ONLY_WITH_STANDBYS.contains(&n.as_str())
                || ONLY_WITH_ARCHIVING.contains(&n.as_str());
            !pod_names.contains(**n) && !conditional
        })
        .chain(
            operator_read
                .iter()
                .filter(|n| !operator_names.contains(**n)),
        )
        .collect();
    assert!(
        unknown.is_empty(),
        "the chart's alerts and dashboards read metrics nothing exports: {unknown:?}"
    );

    // `kubectl dbop status` shows the pod's health figures from the same endpoint.
    let plugin = dbop_e2e::operator_binary_path().with_file_name("kubectl-dbop");
    let out = std::process::Command::new(&plugin)
        .args(["status", "orders", "-n", &ns])
        .env("KUBECONFIG", &bed.kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", plugin.display()));
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{screen}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = screen
        .lines()
        .skip_while(|l| !l.starts_with("Health"))
        .find(|l| l.trim_start().starts_with("orders-0"))
        .unwrap_or_else(|| panic!("no health row for orders-0:\n{screen}"));
    let connections = format!("/{max_connections:.0}");
    for part in [
        "primary",
        " up ",
        connections.as_str(),
        " of ",
        "% of the limit",
    ] {
        assert!(row.contains(part), "{part:?} in {row:?}\n{screen}");
    }

    // An edit of the queries needs no restart.
    let started = psql(&bed, &ns, "select pg_postmaster_start_time()");
    put_queries(&bed, &ns, 43).await;
    wait_until("the edited custom query", REMOUNT_WAIT, || async {
        let text = scrape(&bed, &ns, "orders-0").await?;
        (sample(&text, "dbop_pg_custom_answer_value") == Some(43.0)).then_some(())
    })
    .await;
    assert_eq!(
        psql(&bed, &ns, "select pg_postmaster_start_time()"),
        started,
        "the server did not restart"
    );
}
