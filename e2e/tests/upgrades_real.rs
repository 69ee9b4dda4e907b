//! Staged minor upgrades on the test bed's real node, with real PostgreSQL (Debian's 15.18 and
//! 15.20 in the locally built images) and a real S3 server. One Database goes through:
//! a typo'd version (15.99, no such image) stopped at Preflight with the server never down; an
//! upgrade whose new pod is not Ready within `podReadyTimeout`, rolled back to 15.18 and still
//! serving its data; and the real upgrade 15.18 → 15.20: the pre-upgrade backup restores with
//! the agent to identical content, the server reports 15.20 afterwards, the data intact.

use std::time::Duration;

use dbop::api::{BackupPhase, Database, DatabaseBackup, Phase, UpgradeStage};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, condition, testbed};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

/// A real server's start on a busy 2-core machine, or a whole upgrade stage.
const WAIT: Duration = Duration::from_secs(300);

async fn patch_spec(bed: &TestBed, ns: &str, spec: Value) -> Database {
    bed.databases(ns)
        .patch(
            "ledger",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap_or_else(|e| panic!("spec {spec} refused: {e}"))
}

/// Sets the version (and more of the spec), then waits until the upgrade that change started
/// (not an earlier one) ended in `stage`.
async fn upgrade(bed: &TestBed, ns: &str, spec: Value, stage: UpgradeStage) -> Database {
    let api = bed.databases(ns);
    let before = api.get("ledger").await.unwrap();
    let earlier = before.status.and_then(|s| s.upgrade).map(|u| u.started_at);
    let to = spec["version"].as_str().unwrap().to_string();
    patch_spec(bed, ns, spec).await;
    let found = dbop_e2e::wait_until_or_none(WAIT, || async {
        let db = api.get("ledger").await.ok()?;
        let u = db.status.as_ref()?.upgrade.clone()?;
        let this_one = Some(u.started_at) != earlier && u.to == to;
        (this_one && u.stage.is_finished()).then_some(db)
    })
    .await
    .unwrap_or_else(|| {
        let status = bed
            .kubectl(&["-n", ns, "get", "db,dbb,jobs,pods", "-o", "wide"])
            .1;
        panic!("the upgrade to {to} did not end within {WAIT:?}:\n{status}")
    });
    let u = found.status.as_ref().unwrap().upgrade.clone().unwrap();
    assert_eq!(u.stage, stage, "{u:#?}");
    found
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_real_minor_upgrade_backs_up_first_rolls_back_on_failure_and_stops_a_typo_at_preflight() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("upgrade-real").await;
    let operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let sql = "CREATE TABLE accounts (id bigserial PRIMARY KEY, owner text, balance numeric(14,2));\n\
               INSERT INTO accounts (owner, balance) SELECT 'owner ' || g, g * 3.14 \
               FROM generate_series(1, 5000) g;";
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "ledger"}, "spec": {
            "version": "15.18",
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "init": {"sql": sql},
            // No scheduled run during the test: the only backups are the pre-upgrade ones.
            "backup": {"schedule": "0 3 1 1 *", "s3": {"endpoint": endpoint, "bucket": "backups",
                "forcePathStyle": true, "credentials": {"secretName": "s3-creds"}}},
        }}),
    )
    .await;
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, WAIT).await;
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    let version_sql = "show server_version";
    let reported = bed
        .psql_until_ok(&ns, "client", "app", version_sql, WAIT)
        .await;
    assert!(reported.starts_with("15.18"), "{reported}");
    let data = bed.fingerprint(&ns, "client", "app").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let first_pod = pod_uid(&pods.get("ledger-0").await.unwrap());

    // 1. A typo: the image does not exist. Stopped at Preflight; the server never went down.
    let db = upgrade(&bed, &ns, json!({"version": "15.99"}), UpgradeStage::Failed).await;
    let u = db.status.as_ref().unwrap().upgrade.clone().unwrap();
    assert_eq!(u.reason.as_deref(), Some("PreflightFailed"), "{u:#?}");
    assert!(
        u.message.as_deref().unwrap().contains("cannot be pulled"),
        "{u:#?}"
    );
    assert_eq!(condition(&db, "Ready").unwrap().0, "True");
    assert_eq!(
        pod_uid(&pods.get("ledger-0").await.unwrap()),
        first_pod,
        "the pod was touched"
    );
    assert_eq!(bed.fingerprint(&ns, "client", "app").await, data);
    // Back to the running version: allowed at admission, nothing else to do.
    patch_spec(&bed, &ns, json!({"version": "15.18"})).await;

    // 2. The new version not Ready in time (1s is shorter than any real start): rolled back.
    let spec = json!({"version": "15.20", "upgrade": {"podReadyTimeout": "1s"}});
    let db = upgrade(&bed, &ns, spec, UpgradeStage::RolledBack).await;
    let u = db.status.as_ref().unwrap().upgrade.clone().unwrap();
    assert_eq!(u.reason.as_deref(), Some("PodNotReady"), "{u:#?}");
    assert!(u.pre_upgrade_backup.is_some(), "{u:#?}");
    assert_eq!(
        condition(&db, "Upgrading"),
        Some(("False".into(), "RolledBack".into()))
    );
    let reported = bed
        .psql_until_ok(&ns, "client", "app", version_sql, WAIT)
        .await;
    assert!(
        reported.starts_with("15.18"),
        "after the rollback: {reported}"
    );
    assert_eq!(bed.fingerprint(&ns, "client", "app").await, data);
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, WAIT).await;
    let healthy = condition(
        &bed.databases(&ns).get("ledger").await.unwrap(),
        "BackupHealthy",
    );

    // 3. The real upgrade: the same version again, after a change of the spec.
    let spec = json!({"version": "15.20", "upgrade": {"podReadyTimeout": "5m"}});
    let db = upgrade(&bed, &ns, spec, UpgradeStage::Complete).await;
    let status = db.status.clone().unwrap();
    assert_eq!(status.current_version.as_deref(), Some("15.20"));
    let u = status.upgrade.unwrap();
    let backup = u.pre_upgrade_backup.clone().unwrap();
    let b = Api::<DatabaseBackup>::namespaced(bed.client.clone(), &ns)
        .get(&backup)
        .await
        .unwrap();
    let b_status = b.status.unwrap();
    assert_eq!(b_status.phase, Some(BackupPhase::Succeeded));
    assert!(
        b_status
            .engine_version
            .as_deref()
            .unwrap_or("")
            .starts_with("15.18"),
        "{b_status:?}"
    );
    // Its completion came before the rollout started.
    let rollout = u
        .stages
        .iter()
        .find(|s| s.stage == UpgradeStage::RollingOut)
        .unwrap();
    assert!(
        b_status.completed_at.unwrap() <= rollout.started_at,
        "{u:#?}"
    );
    let reported = bed
        .psql_until_ok(&ns, "client", "app", version_sql, WAIT)
        .await;
    assert!(
        reported.starts_with("15.20"),
        "after the upgrade: {reported}"
    );
    assert_eq!(bed.fingerprint(&ns, "client", "app").await, data);
    assert_eq!(
        condition(
            &bed.databases(&ns).get("ledger").await.unwrap(),
            "BackupHealthy"
        ),
        healthy,
        "BackupHealthy untouched by the upgrades"
    );

    // The pre-upgrade backup (the latest) restores to identical content.
    bed.restore_with_agent(&ns, "ledger", &format!("{ns}/ledger"), "latest", &endpoint)
        .await;
    assert_eq!(bed.fingerprint(&ns, "client", "restored").await, data);
    drop(operator);
}
