//! The operator's HTTP endpoints on a real socket (127.0.0.1, a free port): `/metrics` serves
//! what the controllers recorded in the exposition format, `/healthz` answers while the process
//! lives, `/readyz` follows the readiness the runtime sets. The scrape of a running operator is
//! in the e2e suite (`e2e/tests/operate.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use dbop::api::Phase;
use dbop::api::conditions::{ConditionStatus, ConditionType, merge};
use dbop::ops::metrics::{BACKUP_CONTROLLER, DATABASE_CONTROLLER, Metrics};
use dbop::ops::server::{Readiness, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One GET over a fresh connection: (status code, headers and body as text).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

async fn started() -> (SocketAddr, Arc<Metrics>, Arc<Readiness>) {
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(Readiness::default());
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let addr = serve(any_port, metrics.clone(), ready.clone())
        .await
        .expect("listening");
    (addr, metrics, ready)
}

#[tokio::test]
async fn healthz_answers_and_readyz_follows_readiness() {
    let (addr, _, ready) = started().await;
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await.0, 503);
    ready.set(true);
    assert_eq!(get(addr, "/readyz").await.0, 200);
    assert_eq!(get(addr, "/nothing").await.0, 404);
}

#[tokio::test]
async fn metrics_serve_what_the_controllers_recorded() {
    let (addr, metrics, _) = started().await;
    let key = |name: &str| ("shop".to_string(), name.to_string());
    metrics.reconciled(DATABASE_CONTROLLER, Duration::from_millis(30), None);
    metrics.reconciled(
        DATABASE_CONTROLLER,
        Duration::from_millis(5),
        Some("KubeApiError"),
    );
    metrics.reconciled(BACKUP_CONTROLLER, Duration::from_millis(5), None);
    metrics.database_phase(key("orders"), Some(Phase::Provisioning));
    metrics.database_phase(key("orders"), Some(Phase::Ready));
    metrics.database_phase(key("carts"), Some(Phase::Ready));
    metrics.database_phase(key("gone"), Some(Phase::Failed));
    metrics.database_phase(key("gone"), None);
    metrics.backup_succeeded(key("orders"), 1_700_000_100.0, None);
    metrics.backup_succeeded(key("orders"), 1_700_000_100.0, Some(4096));
    let decided = [ConditionStatus::new(
        ConditionType::BackupHealthy,
        false,
        "BackupFailed",
        "the last backup failed",
    )];
    let backup_unhealthy = merge(&[], &decided, Some(1), Utc::now());
    metrics.database_conditions(key("orders"), &backup_unhealthy, true);
    metrics.database_conditions(key("carts"), &[], false);
    // An older backup reconciled later does not move the metric back.
    metrics.backup_succeeded(key("orders"), 1_700_000_000.0, Some(10));

    let (status, response) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        response.contains("content-type: application/openmetrics-text"),
        "{response}"
    );
    for line in [
        r#"dbop_reconciles_total{controller="database"} 2"#,
        r#"dbop_reconciles_total{controller="backup"} 1"#,
        r#"dbop_reconcile_errors_total{controller="database",reason="KubeApiError"} 1"#,
        r#"dbop_reconcile_duration_seconds_count{controller="database"} 2"#,
        r#"dbop_databases{phase="Ready"} 2"#,
        r#"dbop_databases{phase="Provisioning"} 0"#,
        r#"dbop_databases{phase="Failed"} 0"#,
        r#"dbop_backup_last_success_timestamp_seconds{namespace="shop",database="orders"} 1700000100.0"#,
        r#"dbop_backup_last_success_size_bytes{namespace="shop",database="orders"} 4096"#,
        r#"dbop_database_condition{namespace="shop",database="orders",condition="BackupHealthy"} 0"#,
        r#"dbop_database_backup_scheduled{namespace="shop",database="orders"} 1"#,
        r#"dbop_database_backup_scheduled{namespace="shop",database="carts"} 0"#,
        "# TYPE dbop_reconcile_duration_seconds histogram",
        "# EOF",
    ] {
        assert!(
            response.lines().any(|l| l == line),
            "missing {line:?} in\n{response}"
        );
    }
    // No condition of a Database without any, and nothing left of a deleted one.
    assert!(!response.contains(r#"database="carts",condition"#));
    assert!(!response.contains(r#"database="gone""#));
}

#[tokio::test]
async fn a_taken_address_is_an_error_not_a_panic() {
    let (addr, _, _) = started().await;
    let metrics = Arc::new(Metrics::new());
    let error = serve(addr, metrics, Arc::new(Readiness::default()))
        .await
        .expect_err("the port is in use");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
}
