//! `spec.postgresql` on the test bed's real node: a Database with parameters, a preloaded
//! library, an extra pg_hba rule, memory defaults from its memory limit and init SQL that
//! creates a database (`singleTransaction: false`) reaches Ready and the server runs with all
//! of them; a reloadable change is applied in place (the postmaster's start time and the pod
//! unchanged); a restart-needing change restarts the server, and status said so with the
//! parameter's name until it was done.

use std::time::Duration;

use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, pod_ready, real_node_placement};
use dbop_e2e::{TestBed, testbed, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// A real server: initdb, start, init Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// The kubelet updates a mounted ConfigMap within its sync period (~1 min) plus its cache TTL;
/// the instance manager looks every 2 s.
const RELOAD_WAIT: Duration = Duration::from_secs(180);
/// A rolling restart: smart shutdown, start, probes.
const RESTART_WAIT: Duration = Duration::from_secs(240);

fn database(postgresql: Value) -> Value {
    json!({"metadata": {"name": "conf"}, "spec": {
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "postgresql": postgresql,
        "init": {
            "singleTransaction": false,
            // Idempotent, as docs/postgresql-configuration.md asks (a retry reruns it).
            "sql": "SELECT 'CREATE DATABASE reports' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'reports')\\gexec\nCREATE TABLE IF NOT EXISTS seen (id int);\n"
        },
    }})
}

fn settings(work_mem: &str, max_connections: &str) -> Value {
    json!({
        "parameters": {
            "work_mem": work_mem,
            "max_connections": max_connections,
            "log_min_duration_statement": "250",
        },
        "sharedPreloadLibraries": ["pg_stat_statements"],
        "pgHba": ["host all all 192.0.2.0/24 reject"],
    })
}

/// One value from the server, over the pod's local socket (None while it cannot answer).
fn query(bed: &TestBed, ns: &str, sql: &str) -> Option<String> {
    let (ok, out, _) = bed.exec(ns, "conf-0", &["psql", "-X", "-Atc", sql]);
    ok.then(|| out.trim().to_string())
}

async fn patch_postgresql(bed: &TestBed, ns: &str, postgresql: Value) {
    bed.databases(ns)
        .patch(
            "conf",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"postgresql": postgresql}})),
        )
        .await
        .expect("spec.postgresql patched");
}

/// The `RestartPending` condition as (status, message).
async fn restart_pending(bed: &TestBed, ns: &str) -> Option<(String, String)> {
    let db = bed.databases(ns).get("conf").await.ok()?;
    let c = db
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "RestartPending")?;
    Some((c.status, c.message))
}

#[tokio::test]
async fn parameters_are_applied_reloaded_in_place_and_restarted_when_needed() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("pg-params").await;
    let _operator = bed.operator_for_real_node(&ns);
    bed.apply_database(&ns, database(settings("12MB", "50")))
        .await;
    bed.wait_for_phase(&ns, "conf", dbop::api::Phase::Ready, READY_WAIT)
        .await;

    // The spec's parameters, the memory defaults of a 512Mi limit, the library, the rule.
    let show = |name: &str| query(&bed, &ns, &format!("SHOW {name}"));
    assert_eq!(show("work_mem").as_deref(), Some("12MB"));
    assert_eq!(show("max_connections").as_deref(), Some("50"));
    assert_eq!(show("log_min_duration_statement").as_deref(), Some("250ms"));
    assert_eq!(show("shared_buffers").as_deref(), Some("128MB"));
    assert_eq!(show("effective_cache_size").as_deref(), Some("384MB"));
    assert_eq!(
        show("shared_preload_libraries").as_deref(),
        Some("pg_stat_statements")
    );
    // dbop's own settings are untouched.
    assert_eq!(show("port").as_deref(), Some("5432"));
    let rules = query(
        &bed,
        &ns,
        "select string_agg(type || ' ' || coalesce(address, '-') || ' ' || auth_method, ',' order by line_number) from pg_hba_file_rules",
    )
    .unwrap();
    assert!(rules.starts_with("local - peer,"), "{rules}");
    assert!(
        rules.contains("host 192.0.2.0 reject,hostssl 0.0.0.0 scram-sha-256"),
        "{rules}"
    );
    // Init SQL made a database: it cannot run in a transaction block.
    let made = query(
        &bed,
        &ns,
        "select count(*) from pg_database where datname = 'reports'",
    );
    assert_eq!(made.as_deref(), Some("1"));
    let (reason_ok, _) = restart_pending(&bed, &ns).await.expect("RestartPending");
    assert_eq!(reason_ok, "False");

    // A reloadable change: applied by a reload, the postmaster and the pod unchanged.
    let started = query(&bed, &ns, "select pg_postmaster_start_time()").unwrap();
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let uid = pods.get("conf-0").await.unwrap().metadata.uid;
    patch_postgresql(&bed, &ns, settings("20MB", "50")).await;
    wait_until("work_mem 20MB, by a reload", RELOAD_WAIT, || async {
        (show("work_mem").as_deref() == Some("20MB")).then_some(())
    })
    .await;
    assert_eq!(
        query(&bed, &ns, "select pg_postmaster_start_time()").as_deref(),
        Some(started.as_str()),
        "a reload does not restart the server"
    );
    assert_eq!(pods.get("conf-0").await.unwrap().metadata.uid, uid);
    assert_eq!(restart_pending(&bed, &ns).await.unwrap().0, "False");

    // A restart-needing change: RestartPending names it, the pod restarts, the value applies.
    patch_postgresql(&bed, &ns, settings("20MB", "60")).await;
    let message = wait_until("RestartPending True", RESTART_WAIT, || async {
        restart_pending(&bed, &ns)
            .await
            .filter(|(status, _)| status == "True")
            .map(|(_, message)| message)
    })
    .await;
    assert!(message.contains("max_connections"), "{message}");
    wait_until(
        "max_connections 60 after a restart",
        RESTART_WAIT,
        || async { (show("max_connections").as_deref() == Some("60")).then_some(()) },
    )
    .await;
    let restarted = query(&bed, &ns, "select pg_postmaster_start_time()").unwrap();
    assert_ne!(
        restarted, started,
        "a restart-needing change restarts the server"
    );
    wait_until("RestartPending False once rolled", RESTART_WAIT, || async {
        let done = restart_pending(&bed, &ns).await?.0 == "False";
        let pod = pods.get("conf-0").await.ok()?;
        (done && pod_ready(&pod)).then_some(())
    })
    .await;
    assert_eq!(show("work_mem").as_deref(), Some("20MB"));
}
