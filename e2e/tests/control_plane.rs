//! Control-plane faults on kwok: kube-apiserver, then etcd, is killed (SIGKILL) while the
//! operator is in the middle of provisioning three Databases, kept down a few seconds and
//! started again with its original flags (`e2e/testbed/restart.sh`). The operator — the real
//! binary, never restarted — must recover by itself: the Databases reach Ready, nothing is
//! created twice, and a Database applied after the restart is picked up (its watches came back).
//!
//! Restarting a control-plane component disturbs every test using the bed, so the scenarios
//! here run one at a time, and this suite must not share a test bed with another one running
//! at the same moment (`cargo test -p dbop-e2e` runs test binaries one after another).

use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::chaos::assert_each_created_once;
use dbop_e2e::{TestBed, WAIT, database_manifest, testbed, wait_until, workspace_root};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;

/// One restart at a time: the scenarios share the control plane.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the component stays down.
const DOWN: Duration = Duration::from_secs(3);

/// How soon after the API server is back the operator must have finished the work (measured:
/// ~20 s; with kube-runtime's default watch backoff it was still stuck after 90 s).
const RECOVERY: Duration = Duration::from_secs(60);

/// Runs `e2e/testbed/restart.sh COMPONENT SECONDS` against this test bed.
async fn restart(bed: &TestBed, component: &str) {
    let script = workspace_root().join("e2e/testbed/restart.sh");
    let out = tokio::process::Command::new(&script)
        .arg(component)
        .arg(DOWN.as_secs().to_string())
        .env("DBOP_TESTBED_DIR", &bed.dir)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "restart.sh {component} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn restart_during_provisioning(component: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let bed = testbed().await;
    let ns = bed.namespace(&format!("cp-{component}")).await;
    let mut operator =
        bed.operator_binary_with_env(&ns, &[("RUST_LOG", "info,kube_runtime=debug")]);
    let sql = json!({"init": {"sql": "CREATE TABLE t (id int);"}});
    for name in ["one", "two", "three"] {
        bed.apply_database(&ns, database_manifest(name, sql.clone()))
            .await;
    }
    // Mid-way: the first Secret exists, the rest of the work is still to do.
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the first credentials Secret", WAIT, || async {
        secrets.get_opt("one-credentials").await.ok()?
    })
    .await;
    let stopped = Instant::now();
    restart(&bed, component).await;
    println!(
        "control-plane: {component} down {DOWN:?}, API server ready again {:.1?} after the kill",
        stopped.elapsed()
    );

    let back = Instant::now();
    for name in ["one", "two", "three"] {
        bed.wait_for_phase(
            &ns,
            name,
            Phase::Ready,
            RECOVERY.saturating_sub(back.elapsed()),
        )
        .await;
    }
    println!(
        "control-plane: all three Ready {:.1?} after the kill of {component}, {:.1?} after it was back",
        stopped.elapsed(),
        back.elapsed()
    );
    assert!(
        operator.is_running(),
        "the operator survived the restart of {component}: {}",
        operator.log_tail()
    );
    // A Database made after the restart is seen: the operator's watches came back.
    let applied = Instant::now();
    bed.apply_database(&ns, database_manifest("after", sql))
        .await;
    bed.wait_for_phase(&ns, "after", Phase::Ready, WAIT).await;
    println!(
        "control-plane: a Database applied after the restart of {component} Ready in {:.1?}",
        applied.elapsed()
    );
    assert!(operator.is_running(), "{}", operator.log_tail());
    assert_each_created_once(&bed, &ns);
}

#[tokio::test]
async fn the_operator_recovers_from_a_kube_apiserver_restart() {
    restart_during_provisioning("kube-apiserver").await;
}

#[tokio::test]
async fn the_operator_recovers_from_an_etcd_restart() {
    restart_during_provisioning("etcd").await;
}
