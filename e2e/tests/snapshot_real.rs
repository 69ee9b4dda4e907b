//! `Snapshot` and verification on the test bed's real node (real PostgreSQL, a real S3 server
//! in a pod, the operator as a process): a successful backup is verified by a real verify Job
//! (`BackupVerified` True), and deleting a `Snapshot` Database leaves a final backup that
//! restores — into another Database's server — to the same content (a fingerprint over every
//! table), while its data claim is gone.

use std::time::Duration;

use dbop::api::{BackupPhase, BackupReason, DatabaseBackup, DatabaseBackupSpec, Phase};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, condition, testbed, wait_until};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const READY_WAIT: Duration = Duration::from_secs(240);
const JOB_WAIT: Duration = Duration::from_secs(240);

fn database(name: &str, extra: Value) -> Value {
    let mut spec = json!({
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
    });
    for (k, v) in extra.as_object().expect("an object") {
        spec[k] = v.clone();
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

const SQL: &str = "CREATE TABLE accounts (id bigserial PRIMARY KEY, owner text NOT NULL, balance numeric(14,2));\n\
    INSERT INTO accounts (owner, balance) SELECT 'owner ' || g, g * 3.14 FROM generate_series(1, 3000) g;\n\
    CREATE TABLE transfers (id bigserial PRIMARY KEY, account_id bigint REFERENCES accounts, memo text);\n\
    INSERT INTO transfers (account_id, memo) SELECT 1 + g % 3000, repeat('x', g % 40) FROM generate_series(1, 9000) g;\n";

async fn backup_phase(bed: &TestBed, ns: &str, name: &str) -> DatabaseBackup {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let b = wait_until(&format!("backup {name} finished"), JOB_WAIT, || async {
        let b = api.get(name).await.ok()?;
        b.status
            .as_ref()?
            .phase
            .is_some_and(BackupPhase::is_finished)
            .then_some(b)
    })
    .await;
    let status = b.status.clone().unwrap();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Succeeded),
        "backup {name}: {:?}",
        status.message
    );
    b
}

#[tokio::test]
async fn a_verified_backup_and_a_final_backup_that_restores_to_the_same_content() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("snap-real").await;
    let _operator = bed.operator_for_real_node(&ns);
    let s3 = bed.s3_server(&ns, "backups", None).await;
    let backup = json!({
        "schedule": "0 0 1 1 *",
        "verify": {"everyNthBackup": 1},
        "s3": {"endpoint": s3, "bucket": "backups", "forcePathStyle": true,
               "credentials": {"secretName": "s3-creds"}},
    });
    let extra = json!({"init": {"sql": SQL}, "deletionPolicy": "Snapshot", "backup": backup});
    bed.apply_database(&ns, database("ledger", extra)).await;
    bed.apply_database(&ns, database("spare", json!({}))).await;
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, READY_WAIT)
        .await;

    // A backup, verified for real: restored into a scratch database, row counts compared.
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), &ns);
    let manual = DatabaseBackup::new(
        "ledger-manual",
        DatabaseBackupSpec {
            database: "ledger".into(),
            reason: BackupReason::Manual,
            method: dbop::api::BackupMethod::Logical,
        },
    );
    api.create(&PostParams::default(), &manual).await.unwrap();
    backup_phase(&bed, &ns, "ledger-manual").await;
    let dbs = bed.databases(&ns);
    let verified = wait_until("BackupVerified", JOB_WAIT, || async {
        let db = dbs.get("ledger").await.ok()?;
        condition(&db, "BackupVerified").map(|c| (c, db))
    })
    .await;
    let db = verified.1;
    assert_eq!(
        verified.0,
        ("True".to_string(), "Verified".to_string()),
        "{:?}",
        db.status
    );
    let uid: String = db.metadata.uid.clone().unwrap().replace('-', "")[..8].into();

    // Data written after that backup must be in the final one.
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    bed.psql_until_ok(
        &ns,
        "client",
        "app",
        "INSERT INTO accounts (owner, balance) VALUES ('after the last backup', 1)",
        READY_WAIT,
    )
    .await;
    let source = bed.fingerprint(&ns, "client", "app").await;
    assert!(source.contains("accounts:3001:"), "{source}");

    dbs.delete("ledger", &DeleteParams::default())
        .await
        .unwrap();
    let final_name = format!("ledger-final-{uid}");
    let final_backup = backup_phase(&bed, &ns, &final_name).await;
    wait_until("ledger gone", JOB_WAIT, || async {
        dbs.get_opt("ledger").await.ok()?.is_none().then_some(())
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the data claim deleted", JOB_WAIT, || async {
        let c = claims.get_opt("data-ledger-0").await.ok()?;
        c.is_none_or(|c| c.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;

    bed.wait_for_phase(&ns, "spare", Phase::Ready, READY_WAIT)
        .await;
    let id = final_backup.status.unwrap().backup_id.unwrap();
    bed.restore_with_agent(&ns, "spare", &format!("{ns}/ledger"), &id, &s3)
        .await;
    bed.psql_client(&ns, "spare-client", "spare", "spare-credentials")
        .await;
    assert_eq!(
        bed.fingerprint(&ns, "spare-client", "restored").await,
        source,
        "the final backup restores to the content at deletion"
    );
}
