//! The deletion policies and the `DatabaseBackup`s on a real control plane (backup pods driven
//! on kwok): `Snapshot` deletes the data claim only after a final backup succeeded, keeps the
//! claim and holds the deletion (saying why) when the final backup fails or does not finish in
//! time; `Retain` and `Snapshot` keep the Database's `DatabaseBackup`s, `Delete` lets them go
//! with it; `Snapshot` without `spec.backup` is refused at admission.

use std::collections::BTreeSet;

use dbop::api::{BackupPhase, BackupReason, Database, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{
    fail_every_pod_until_failed, finish_pod, running_backup_pod, s3_secret,
};
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde_json::{Value, json};

/// A Database with backups (a yearly schedule: no run comes due during a test), its Job pods
/// held for the test to finish, and `policy`.
fn manifest(name: &str, policy: &str, timeout: &str) -> Value {
    database_manifest(
        name,
        json!({
            "deletionPolicy": policy,
            "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}},
            "backup": {
                "schedule": "0 0 1 1 *",
                "timeout": timeout,
                "s3": {
                    "endpoint": "http://minio.storage.svc:9000",
                    "bucket": "backups",
                    "forcePathStyle": true,
                    "credentials": {"secretName": "s3-creds"}
                }
            }
        }),
    )
}

/// The agent's result for a succeeded dump.
fn succeeded(ns: &str, db: &str) -> String {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": "20261130T000000Z-x",
        "database": "postgres", "bucket": "backups",
        "key": format!("{ns}/{db}/postgres/20261130T000000Z-x/dump.pgc.zst"),
        "sizeBytes": 4242, "sha256": "ab".repeat(32), "engineVersion": "16.4",
        "startedAt": now, "completedAt": now, "message": "dumped 10000 bytes"
    })
    .to_string()
}

async fn ready_database(bed: &TestBed, ns: &str, manifest: Value) -> Database {
    let name = manifest["metadata"]["name"].as_str().unwrap().to_string();
    bed.apply_database(ns, manifest).await;
    bed.wait_for_phase(ns, &name, Phase::Ready, WAIT).await
}

fn backups(bed: &TestBed, ns: &str) -> Api<DatabaseBackup> {
    Api::namespaced(bed.client.clone(), ns)
}

/// A succeeded backup owned by the Database, as dbop makes each scheduled run.
async fn scheduled_backup(bed: &TestBed, ns: &str, db: &Database, name: &str) {
    let mut backup = DatabaseBackup::new(
        name,
        dbop::api::DatabaseBackupSpec {
            database: db.metadata.name.clone().unwrap(),
            reason: BackupReason::Scheduled,
            method: dbop::api::BackupMethod::Logical,
        },
    );
    backup.metadata.owner_references = Some(vec![db.controller_owner_ref(&()).unwrap()]);
    backups(bed, ns)
        .create(&PostParams::default(), &backup)
        .await
        .expect("create the scheduled backup");
    let pod = running_backup_pod(bed, ns, name).await;
    finish_pod(bed, ns, &pod, "Succeeded", &succeeded(ns, "x")).await;
    wait_backup(bed, ns, name, BackupPhase::Succeeded).await;
}

async fn wait_backup(bed: &TestBed, ns: &str, name: &str, phase: BackupPhase) -> DatabaseBackup {
    let api = backups(bed, ns);
    wait_until(&format!("backup {name} {phase:?}"), WAIT, || async {
        let b = api.get(name).await.ok()?;
        (b.status.as_ref()?.phase == Some(phase)).then_some(b)
    })
    .await
}

/// The final backup's name: `<database>-final-<first 8 of the uid without dashes>`.
fn final_name(db: &Database) -> String {
    let uid: String = db
        .metadata
        .uid
        .clone()
        .unwrap()
        .chars()
        .filter(|c| *c != '-')
        .take(8)
        .collect();
    format!("{}-final-{uid}", db.metadata.name.as_deref().unwrap())
}

/// Waits until the Database is Deleting with this `Ready` reason; returns its message.
async fn wait_deleting(bed: &TestBed, ns: &str, name: &str, reason: &str) -> String {
    let api = bed.databases(ns);
    wait_until(&format!("{name} Deleting, {reason}"), WAIT * 2, || async {
        let db = api.get(name).await.ok()?;
        let status = db.status.clone()?;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        (status.phase == Some(Phase::Deleting) && ready.reason == reason)
            .then(|| ready.message.clone())
    })
    .await
}

async fn wait_gone(bed: &TestBed, ns: &str, name: &str) {
    let api = bed.databases(ns);
    wait_until(&format!("Database {name} gone"), WAIT, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

async fn claim(bed: &TestBed, ns: &str, db: &str) -> Option<PersistentVolumeClaim> {
    Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), ns)
        .get_opt(&format!("data-{db}-0"))
        .await
        .unwrap()
}

/// The claim exists and is not being deleted.
async fn assert_claim_kept(bed: &TestBed, ns: &str, db: &str) {
    let pvc = claim(bed, ns, db).await.expect("the data claim is kept");
    assert!(
        pvc.metadata.deletion_timestamp.is_none(),
        "the data claim of {db} is being deleted"
    );
}

async fn wait_claim_deleted(bed: &TestBed, ns: &str, db: &str) {
    wait_until("the data claim deleted", WAIT, || async {
        match claim(bed, ns, db).await {
            None => Some(()),
            Some(pvc) => pvc.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
}

/// Waits until the Events of Database `name` include each of `reasons` (an Event is published
/// after the status it goes with: read once, it can be a moment behind).
async fn wait_events(bed: &TestBed, ns: &str, name: &str, reasons: &[&str]) {
    let seen = dbop_e2e::wait_until_or_none(WAIT, || async {
        let seen = event_reasons(bed, ns, name).await;
        reasons.iter().all(|r| seen.contains(*r)).then_some(())
    })
    .await;
    if seen.is_none() {
        panic!(
            "no Event {reasons:?} for {name}: {:?}",
            event_reasons(bed, ns, name).await
        );
    }
}

/// The reasons of the Events about the Database.
async fn event_reasons(bed: &TestBed, ns: &str, name: &str) -> BTreeSet<String> {
    Api::<Event>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Database"))
        .filter_map(|e| e.reason)
        .collect()
}

/// Waits until garbage collection removed the Database's StatefulSet: whatever the collector
/// takes with the Database is taken by then.
async fn wait_collected(bed: &TestBed, ns: &str, name: &str) {
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(bed.client.clone(), ns);
    wait_until("the StatefulSet collected", WAIT, || async {
        sts.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn snapshot_deletes_the_claim_only_after_the_final_backup_succeeded() {
    let bed = testbed().await;
    let ns = bed.namespace("snapshot").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let db = ready_database(&bed, &ns, manifest("snap", "Snapshot", "6h")).await;
    scheduled_backup(&bed, &ns, &db, "snap-202611300000").await;

    bed.databases(&ns)
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    let final_name = final_name(&db);
    let message = wait_deleting(&bed, &ns, "snap", "FinalBackupRunning").await;
    assert!(message.contains(&final_name), "{message}");
    let pod = running_backup_pod(&bed, &ns, &final_name).await;
    let final_backup = backups(&bed, &ns).get(&final_name).await.unwrap();
    assert_eq!(final_backup.spec.reason, BackupReason::Final);
    assert!(
        final_backup.metadata.owner_references.is_none(),
        "the final backup must outlive the Database"
    );
    // While the final backup runs, the data is untouched.
    assert_claim_kept(&bed, &ns, "snap").await;

    finish_pod(&bed, &ns, &pod, "Succeeded", &succeeded(&ns, "snap")).await;
    wait_gone(&bed, &ns, "snap").await;
    wait_claim_deleted(&bed, &ns, "snap").await;
    wait_collected(&bed, &ns, "snap").await;
    let kept = backups(&bed, &ns).get("snap-202611300000").await;
    let kept = kept.expect("the scheduled DatabaseBackup outlives the Database under Snapshot");
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
    wait_backup(&bed, &ns, &final_name, BackupPhase::Succeeded).await;
    wait_events(
        &bed,
        &ns,
        "snap",
        &["FinalBackupStarted", "FinalBackupSucceeded"],
    )
    .await;
}

#[tokio::test]
async fn a_failed_final_backup_keeps_the_claim_and_holds_the_deletion_until_the_user_decides() {
    let bed = testbed().await;
    let ns = bed.namespace("snapshot-fail").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let db = ready_database(&bed, &ns, manifest("held", "Snapshot", "6h")).await;
    bed.databases(&ns)
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let final_name = final_name(&db);
    let failure = r#"{"outcome":"Failed","operation":"dump","message":"S3 access denied: check AWS_ACCESS_KEY_ID"}"#;
    fail_every_pod_until_failed(&bed, &ns, &final_name, failure).await;

    let message = wait_deleting(&bed, &ns, "held", "FinalBackupFailed").await;
    assert!(message.contains("S3 access denied"), "{message}");
    assert!(message.contains("data volumes are kept"), "{message}");
    assert_claim_kept(&bed, &ns, "held").await;
    wait_events(&bed, &ns, "held", &["FinalBackupFailed"]).await;

    // Retrying: deleting the failed backup makes a new one, which succeeds.
    backups(&bed, &ns)
        .delete(&final_name, &DeleteParams::default())
        .await
        .unwrap();
    let pod = wait_until("a new final backup pod", WAIT, || async {
        let pod = running_backup_pod(&bed, &ns, &final_name).await;
        let fresh = pod
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("testbed.dbop.dev/outcome"));
        fresh.then_some(pod)
    })
    .await;
    // Still held while the retry runs.
    assert_claim_kept(&bed, &ns, "held").await;
    finish_pod(&bed, &ns, &pod, "Succeeded", &succeeded(&ns, "held")).await;
    wait_gone(&bed, &ns, "held").await;
    wait_claim_deleted(&bed, &ns, "held").await;
}

#[tokio::test]
async fn a_final_backup_that_cannot_finish_in_time_holds_then_retain_lets_the_database_go() {
    let bed = testbed().await;
    let ns = bed.namespace("snapshot-late").await;
    // No S3 Secret: the final backup waits for its credentials until the bound (1 minute).
    let _operator = bed.operator_in_process(&ns).await;
    let db = ready_database(&bed, &ns, manifest("late", "Snapshot", "1m")).await;
    bed.databases(&ns)
        .delete("late", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleting(&bed, &ns, "late", "FinalBackupRunning").await;
    let message = wait_deleting(&bed, &ns, "late", "FinalBackupTimedOut").await;
    assert!(message.contains("did not finish within"), "{message}");
    let pending = backups(&bed, &ns).get(&final_name(&db)).await.unwrap();
    assert_eq!(pending.status.unwrap().phase, Some(BackupPhase::Pending));
    assert_claim_kept(&bed, &ns, "late").await;

    // The user's way out: keep the volumes and let the Database go.
    let patch = json!({"spec": {"deletionPolicy": "Retain"}});
    bed.databases(&ns)
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_gone(&bed, &ns, "late").await;
    wait_collected(&bed, &ns, "late").await;
    assert_claim_kept(&bed, &ns, "late").await;
}

#[tokio::test]
async fn retain_keeps_the_database_backups_and_delete_lets_them_go() {
    let bed = testbed().await;
    let ns = bed.namespace("backup-gc").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let kept = ready_database(&bed, &ns, manifest("kept", "Retain", "6h")).await;
    let dropped = ready_database(&bed, &ns, manifest("dropped", "Delete", "6h")).await;
    scheduled_backup(&bed, &ns, &kept, "kept-202611300000").await;
    scheduled_backup(&bed, &ns, &dropped, "dropped-202611300000").await;

    for name in ["kept", "dropped"] {
        bed.databases(&ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in ["kept", "dropped"] {
        wait_gone(&bed, &ns, name).await;
        wait_collected(&bed, &ns, name).await;
    }
    wait_until("the Delete Database's backup collected", WAIT, || async {
        let gone = backups(&bed, &ns)
            .get_opt("dropped-202611300000")
            .await
            .ok()?
            .is_none();
        gone.then_some(())
    })
    .await;
    let b = backups(&bed, &ns)
        .get("kept-202611300000")
        .await
        .expect("the Retain Database's backup is kept");
    assert!(b.metadata.owner_references.unwrap_or_default().is_empty());
    assert!(b.metadata.deletion_timestamp.is_none());
    // Neither policy took a final backup.
    let reasons: Vec<_> = backups(&bed, &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|b| b.spec.reason)
        .collect();
    assert!(!reasons.contains(&BackupReason::Final), "{reasons:?}");
}

#[tokio::test]
async fn snapshot_without_spec_backup_is_refused_at_admission() {
    let bed = testbed().await;
    let ns = bed.namespace("snapshot-admission").await;
    let manifest = database_manifest("nobackup", json!({"deletionPolicy": "Snapshot"}));
    let mut db: Database = serde_json::from_value(manifest).unwrap();
    db.metadata.namespace = Some(ns.clone());
    let error = bed
        .databases(&ns)
        .create(&PostParams::default(), &db)
        .await
        .expect_err("Snapshot without spec.backup must be refused");
    let text = error.to_string();
    assert!(
        text.contains("deletionPolicy Snapshot needs spec.backup"),
        "{text}"
    );
    // A Database without backups shows no BackupHealthy at all (nothing to alert on).
    let _operator = bed.operator_in_process(&ns).await;
    let ready = ready_database(&bed, &ns, database_manifest("plain", json!({}))).await;
    assert_eq!(condition(&ready, "BackupHealthy"), None);
}
