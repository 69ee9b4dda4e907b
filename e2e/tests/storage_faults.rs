//! Storage faults on the real node: the S3 server becomes unreachable from the pods (its pod is
//! deleted, the Service has no endpoint), and an on-demand backup is taken. The real agent in
//! the backup Job must fail cleanly: the DatabaseBackup Failed with a message naming the
//! endpoint, `BackupHealthy` False saying which backup failed and why, nothing complete-looking
//! in the bucket. Then S3 comes back and the next backup succeeds and `BackupHealthy` turns True.

use std::time::Duration;

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::node::{
    POSTGRES_15_20, REAL_NODE_STORAGE_CLASS, S3_ACCESS_KEY, S3_SECRET_KEY, real_node_placement,
    small_resources,
};
use dbop_e2e::{TestBed, condition, testbed, wait_until};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const READY_WAIT: Duration = Duration::from_secs(240);
/// Two pods (backoffLimit 1), each failing after its connection attempts.
const BACKUP_WAIT: Duration = Duration::from_secs(240);

async fn manual_backup(bed: &TestBed, ns: &str, name: &str) -> DatabaseBackup {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let b: DatabaseBackup = serde_json::from_value(json!({
        "metadata": {"name": name}, "spec": {"database": "shop", "reason": "Manual"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &b)
        .await
        .expect("DatabaseBackup");
    wait_until(&format!("backup {name} finished"), BACKUP_WAIT, || async {
        let b = api.get(name).await.ok()?;
        b.status.as_ref()?.phase?.is_finished().then_some(b)
    })
    .await
}

/// The S3 pod as `TestBed::s3_server` makes it (plain HTTP), to bring S3 back after an outage.
async fn s3_pod(bed: &TestBed, ns: &str) {
    bed.create_pod(
        ns,
        "s3",
        json!({"app": "s3"}),
        json!({
            "initContainers": [{"name": "bucket", "image": POSTGRES_15_20,
                                "command": ["mkdir", "-p", "/data/backups"],
                                "resources": small_resources(),
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "containers": [{
                "name": "s3s-fs", "image": bed.real_node_image("dbop.local/s3s-fs:"),
                "args": ["--host", "0.0.0.0", "--port", "9000", "--access-key", S3_ACCESS_KEY,
                         "--secret-key", S3_SECRET_KEY, "/data"],
                "resources": small_resources(),
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "readinessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1},
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
        }),
    )
    .await;
    bed.wait_pod_ready(ns, "s3").await;
}

#[tokio::test]
async fn s3_unreachable_from_the_pod_fails_cleanly_and_the_next_backup_succeeds() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("sf-s3").await;
    let _operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let spec = json!({
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "init": {"sql": "CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 1000) g;"},
        // Daily: the scheduled run does not interfere; the backups here are on demand.
        "backup": {"schedule": "0 3 * * *", "s3": {
            "endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
            "credentials": {"secretName": "s3-creds"}}},
    });
    bed.apply_database(&ns, json!({"metadata": {"name": "shop"}, "spec": spec}))
        .await;
    bed.wait_for_phase(&ns, "shop", Phase::Ready, READY_WAIT)
        .await;

    // The outage: no S3 pod behind the Service.
    bed.delete_pod(&ns, "s3").await;
    let failed = manual_backup(&bed, &ns, "during-outage").await;
    let status = failed.status.clone().unwrap();
    let message = status.message.clone().unwrap_or_default();
    println!("storage-faults: S3 unreachable → {message}");
    assert_eq!(status.phase, Some(BackupPhase::Failed), "{status:?}");
    assert!(
        status.key.is_none() && status.size_bytes.is_none(),
        "{status:?}"
    );
    assert!(
        message.contains(&endpoint) && message.contains("bucket 'backups'"),
        "the failure names the endpoint and bucket: {message}"
    );
    let dbs = bed.databases(&ns);
    let db = wait_until("BackupHealthy says why", BACKUP_WAIT, || async {
        let db = dbs.get("shop").await.ok()?;
        (condition(&db, "BackupHealthy")?.1 == "LastBackupFailed").then_some(db)
    })
    .await;
    let health = db
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "BackupHealthy")
        .unwrap()
        .clone();
    assert_eq!(health.status, "False");
    assert!(
        health.message.contains("during-outage") && health.message.contains(&endpoint),
        "{}",
        health.message
    );
    assert_eq!(
        condition(&db, "Ready").map(|c| c.0).as_deref(),
        Some("True")
    );

    // S3 is back (empty: the outage lost nothing complete-looking, there was nothing to keep).
    s3_pod(&bed, &ns).await;
    let ok = manual_backup(&bed, &ns, "after-outage").await;
    let status = ok.status.clone().unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Succeeded), "{status:?}");
    assert!(status.size_bytes.unwrap_or(0) > 0, "{status:?}");
    wait_until("BackupHealthy True again", BACKUP_WAIT, || async {
        let db = dbs.get("shop").await.ok()?;
        (condition(&db, "BackupHealthy")?.0 == "True").then_some(())
    })
    .await;
}
