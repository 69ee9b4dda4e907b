//! `spec.bootstrap.fromBackup` on the kwok test bed: the restore Job takes the init Job's place
//! (from a `DatabaseBackup` and from an S3 location), its pod's result (a termination message
//! the test writes, as the agent would) decides `Initialized`, the phase and
//! `status.bootstrap`; each failure kind the agent reports is a clear condition and Event and
//! never looks initialised; deleting the failed Job restores again; a missing DatabaseBackup or
//! S3 Secret waits as Pending; deleting a Database whose restore runs removes both; the schema
//! refuses what it can judge.

use dbop::api::{BackupPhase, Database, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{finish_pod, running_backup_pod, s3_secret};
use std::time::{Duration, Instant};

use dbop_e2e::{TestBed, WAIT, condition, database_manifest, reconciles, testbed, wait_until};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const HOLD: &str = "testbed.dbop.dev/hold";

fn s3() -> Value {
    json!({"endpoint": "http://minio.storage.svc:9000", "bucket": "backups",
           "forcePathStyle": true, "credentials": {"secretName": "s3-creds"}})
}

/// A Database restored from `from`, with init SQL (which must not run) and held Job pods.
fn restored(name: &str, from: Value) -> Value {
    database_manifest(
        name,
        json!({
            "init": {"sql": "CREATE TABLE must_not_run (id int)"},
            "podMetadata": {"labels": {HOLD: "true"}},
            "bootstrap": {"fromBackup": from},
        }),
    )
}

async fn job(bed: &TestBed, ns: &str, name: &str) -> Option<Job> {
    Api::<Job>::namespaced(bed.client.clone(), ns)
        .get_opt(name)
        .await
        .expect("get Job")
}

/// The running pod of a Job (held by the test bed).
async fn running_pod(bed: &TestBed, ns: &str, job: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    wait_until(&format!("a running pod of {job}"), WAIT, || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| {
                let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let decided = p
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("testbed.dbop.dev/outcome"));
                running && !decided
            })
    })
    .await
}

async fn wait_condition(
    bed: &TestBed,
    ns: &str,
    name: &str,
    type_: &str,
    want: (&str, &str),
) -> Database {
    let api = bed.databases(ns);
    wait_until(&format!("{name}: {type_}={want:?}"), WAIT, || async {
        let db = api.get(name).await.ok()?;
        let (status, reason) = condition(&db, type_)?;
        (status == want.0 && reason == want.1).then_some(db)
    })
    .await
}

/// The operator's writes about a Database (its object, status and Events) in the audit log.
fn writes_about(bed: &TestBed, ns: &str, name: &str) -> usize {
    let event_prefix = format!("{name}.");
    bed.operator_writes(ns)
        .iter()
        .filter(|w| w.name == name || w.name.starts_with(&event_prefix))
        .count()
}

/// A settled Database (restored, or failed) costs no writes: once its writes have stopped for
/// a few seconds and no reconcile runs, a poke (an annotation: a watch event, nothing to do)
/// is reconciled to the end without a single write.
async fn a_poke_costs_no_writes(bed: &TestBed, ns: &str, name: &str) {
    let quiet = Duration::from_secs(5);
    let mut last: Option<(usize, Instant)> = None;
    let settled = wait_until(&format!("{name} to settle"), WAIT, || {
        let count = writes_about(bed, ns, name);
        if last.is_none_or(|(n, _)| n != count) {
            last = Some((count, Instant::now()));
        }
        let running = reconciles::of_database(ns, name)
            .iter()
            .any(|r| r.finished.is_none());
        let ok = last.is_some_and(|(_, since)| since.elapsed() >= quiet) && !running;
        async move { ok.then_some(count) }
    })
    .await;
    let before = reconciles::of_database(ns, name).len();
    let patch = json!({"metadata": {"annotations": {"e2e.dbop.dev/poke": "1"}}});
    bed.databases(ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("poke");
    wait_until(&format!("the poke of {name} reconciled"), WAIT, || async {
        let after = reconciles::of_database(ns, name);
        after
            .get(before..)?
            .iter()
            .find(|r| r.finished.is_some())
            .map(|_| ())
    })
    .await;
    assert_eq!(
        writes_about(bed, ns, name),
        settled,
        "{name}: a reconcile with nothing to do wrote"
    );
}

fn container_args(job: &Job) -> Vec<String> {
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.containers[0].args.clone().unwrap_or_default()
}

/// A source Database with backups and one succeeded `DatabaseBackup` of it (its pod completed
/// with the agent's result); returns the backup id.
async fn succeeded_backup(bed: &TestBed, ns: &str) -> String {
    let mut source =
        database_manifest("orders", json!({"podMetadata": {"labels": {HOLD: "true"}}}));
    source["spec"]["backup"] = json!({"schedule": "0 2 * * *", "s3": s3()});
    bed.apply_database(ns, source).await;
    bed.wait_for_phase(ns, "orders", Phase::Ready, WAIT).await;
    let backup: DatabaseBackup = serde_json::from_value(json!({
        "apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
        "metadata": {"name": "orders-manual"}, "spec": {"database": "orders"}
    }))
    .unwrap();
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    api.create(&PostParams::default(), &backup)
        .await
        .expect("DatabaseBackup");
    let pod = running_backup_pod(bed, ns, "orders-manual").await;
    let id = "20260101T020000Z-orders-manual";
    let result = json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": id, "database": "postgres",
        "bucket": "backups", "key": format!("{ns}/orders/postgres/{id}/dump.pgc.zst"),
        "sizeBytes": 42, "sha256": "ab".repeat(32), "engineVersion": "16.4", "message": "ok"
    });
    finish_pod(bed, ns, &pod, "Succeeded", &result.to_string()).await;
    wait_until("the DatabaseBackup Succeeded", WAIT, || async {
        let b = api.get("orders-manual").await.ok()?;
        (b.status?.phase == Some(BackupPhase::Succeeded)).then_some(())
    })
    .await;
    id.to_string()
}

#[tokio::test]
async fn a_database_backup_is_restored_by_a_restore_job_instead_of_the_init_job() {
    let bed = testbed().await;
    let ns = bed.namespace("restore-ok").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let id = succeeded_backup(&bed, &ns).await;

    bed.apply_database(
        &ns,
        restored("copy", json!({"databaseBackup": "orders-manual"})),
    )
    .await;
    let db = wait_condition(&bed, &ns, "copy", "Initialized", ("False", "Restoring")).await;
    let restore = wait_until("the restore Job", WAIT, || job(&bed, &ns, "copy-restore")).await;
    assert_eq!(
        db.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Initializing)
    );
    let args = container_args(&restore);
    for want in [
        "restore".to_string(),
        format!("--prefix={ns}/orders"),
        "--source-database=postgres".to_string(),
        "--bucket=backups".into(),
        id.clone(),
    ] {
        assert!(args.contains(&want), "{want} missing from {args:?}");
    }
    let text = serde_json::to_string(&restore).unwrap();
    assert!(
        !text.contains("e2e-secret"),
        "a secret value in the Job: {text}"
    );

    let pod = running_pod(&bed, &ns, "copy-restore").await;
    let result = json!({"outcome": "Succeeded", "operation": "restore", "backupId": id,
                        "key": format!("{ns}/orders/postgres/{id}/dump.pgc.zst"),
                        "completedAt": "2026-01-01T02:05:00Z", "message": "restored"});
    finish_pod(&bed, &ns, &pod, "Succeeded", &result.to_string()).await;
    let db = bed.wait_for_phase(&ns, "copy", Phase::Ready, WAIT).await;
    assert_eq!(
        condition(&db, "Initialized"),
        Some(("True".into(), "RestoredFromBackup".into()))
    );
    let status = db.status.unwrap().bootstrap.expect("status.bootstrap");
    assert_eq!(status.restored_backup_id.as_deref(), Some(id.as_str()));
    assert!(
        job(&bed, &ns, "copy-init").await.is_none(),
        "the init SQL ran after a restore"
    );
    a_poke_costs_no_writes(&bed, &ns, "copy").await;
}

/// One Database per failure kind the agent reports, all at once.
#[tokio::test]
async fn each_failed_restore_names_its_cause_and_never_looks_initialised() {
    let bed = testbed().await;
    let ns = bed.namespace("restore-fail").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let cases = [
        (
            "missing",
            "not-found",
            "no complete backup of database 'postgres' in bucket 'backups'",
            "BackupNotFound",
        ),
        (
            "tampered",
            "integrity",
            "integrity check failed for k: sha256 is 00, the manifest says ab",
            "BackupChecksumMismatch",
        ),
        (
            "newer",
            "incompatible-version",
            "backup b was taken from PostgreSQL 17.2, a newer major version",
            "BackupFromNewerMajor",
        ),
        (
            "offline",
            "s3",
            "S3 ListObjectsV2 failed (endpoint http://minio.storage.svc:9000): connection refused",
            "S3RequestFailed",
        ),
    ];
    for (name, ..) in cases {
        let from = json!({"s3": s3(), "database": "gone"});
        bed.apply_database(&ns, restored(name, from)).await;
    }
    let run = cases.iter().map(|(name, kind, message, reason)| {
        let (bed, ns) = (&bed, &ns);
        async move {
            let job = format!("{name}-restore");
            let result = json!({"outcome": "Failed", "operation": "restore", "failureKind": kind, "message": message});
            // backoffLimit 1: the agent fails twice.
            for _ in 0..2 {
                let pod = running_pod(bed, ns, &job).await;
                finish_pod(bed, ns, &pod, "Failed", &result.to_string()).await;
            }
            let db = bed.wait_for_phase(ns, name, Phase::Failed, WAIT).await;
            assert_eq!(condition(&db, "Ready"), Some(("False".into(), "RestoreFailed".into())), "{name}");
            assert_eq!(condition(&db, "Initialized"), Some(("False".into(), reason.to_string())), "{name}");
            let c = db.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Initialized").unwrap().clone();
            assert!(c.message.contains(message) && c.message.contains(&format!("delete the Job {job}")), "{name}: {}", c.message);
            assert!(db.status.unwrap().bootstrap.is_none(), "{name}");
        }
    });
    futures::future::join_all(run).await;
    a_poke_costs_no_writes(&bed, &ns, "newer").await;

    // A Warning Event says why, on the Database.
    let events: Api<Event> = Api::namespaced(bed.client.clone(), &ns);
    let warning = wait_until("a Failed Warning Event of tampered", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("tampered")
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("Failed")
            })
    })
    .await;
    assert!(
        warning.note.unwrap_or_default().contains("sha256"),
        "the Event names the cause"
    );

    // The retry path: delete the failed Job, and the restore runs again.
    Api::<Job>::namespaced(bed.client.clone(), &ns)
        .delete("tampered-restore", &DeleteParams::background())
        .await
        .expect("delete the failed Job");
    wait_until("a new restore Job", WAIT, || async {
        let j = job(&bed, &ns, "tampered-restore").await?;
        j.status
            .as_ref()
            .and_then(|s| s.failed)
            .is_none()
            .then_some(())
    })
    .await;
    let pod = running_pod(&bed, &ns, "tampered-restore").await;
    let ok = json!({"outcome": "Succeeded", "operation": "restore", "backupId": "b2"});
    finish_pod(&bed, &ns, &pod, "Succeeded", &ok.to_string()).await;
    let db = bed
        .wait_for_phase(&ns, "tampered", Phase::Ready, WAIT)
        .await;
    assert_eq!(
        condition(&db, "Initialized"),
        Some(("True".into(), "RestoredFromBackup".into()))
    );
}

#[tokio::test]
async fn a_missing_backup_object_or_s3_secret_waits_without_a_job() {
    let bed = testbed().await;
    let ns = bed.namespace("restore-wait").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        restored("nobackup", json!({"databaseBackup": "does-not-exist"})),
    )
    .await;
    bed.apply_database(
        &ns,
        restored("nosecret", json!({"s3": s3(), "backupId": "b1"})),
    )
    .await;
    for (name, reason) in [
        ("nobackup", "BackupNotFound"),
        ("nosecret", "S3CredentialsSecretNotFound"),
    ] {
        let db = wait_condition(&bed, &ns, name, "Initialized", ("False", reason)).await;
        bed.wait_for_phase(&ns, name, Phase::Pending, WAIT).await;
        assert_eq!(
            condition(&db, "Ready").map(|c| c.1).as_deref(),
            Some(reason)
        );
        assert!(
            job(&bed, &ns, &format!("{name}-restore")).await.is_none(),
            "{name}"
        );
    }
    // The Secret appears: the restore starts (from the periodic look at what is not watched).
    s3_secret(&bed, &ns).await;
    let restore = wait_until("the restore Job after the Secret", WAIT, || {
        job(&bed, &ns, "nosecret-restore")
    })
    .await;
    assert!(container_args(&restore).contains(&"b1".to_string()));
    assert!(job(&bed, &ns, "nobackup-init").await.is_none());
}

#[tokio::test]
async fn deleting_a_database_whose_restore_runs_removes_it_and_its_job() {
    let bed = testbed().await;
    let ns = bed.namespace("restore-del").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, restored("copy", json!({"s3": s3()})))
        .await;
    running_pod(&bed, &ns, "copy-restore").await;
    bed.databases(&ns)
        .delete("copy", &DeleteParams::default())
        .await
        .expect("delete the Database");
    wait_until("the Database gone", WAIT, || async {
        bed.databases(&ns)
            .get_opt("copy")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    wait_until("the restore Job gone", WAIT, || async {
        job(&bed, &ns, "copy-restore").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_schema_refuses_what_it_can_judge() {
    let bed = testbed().await;
    let ns = bed.namespace("restore-admit").await;
    let refused = [
        (
            "both",
            json!({"databaseBackup": "b", "s3": s3()}),
            "exactly one of databaseBackup or s3",
        ),
        ("neither", json!({}), "exactly one of databaseBackup or s3"),
        (
            "id-with-backup",
            json!({"databaseBackup": "b", "backupId": "x"}),
            "go with s3",
        ),
        ("bad-id", json!({"s3": s3(), "backupId": "a/b"}), "backupId"),
        (
            "two-targets",
            json!({"s3": s3(), "recoveryTarget": {"lsn": "0/3000100", "restorePoint": "p"}}),
            "exactly one of time, lsn, restorePoint or latest",
        ),
        (
            "no-target",
            json!({"s3": s3(), "recoveryTarget": {"latest": false}}),
            "exactly one of time, lsn, restorePoint or latest",
        ),
        (
            "bad-lsn",
            json!({"s3": s3(), "recoveryTarget": {"lsn": "3000100"}}),
            "lsn",
        ),
    ];
    for (name, from, words) in refused {
        let mut manifest = restored(name, from);
        manifest["apiVersion"] = "dbop.dev/v1alpha1".into();
        manifest["kind"] = "Database".into();
        let db: Database = serde_json::from_value(manifest).unwrap();
        let err = bed
            .databases(&ns)
            .create(&PostParams::default(), &db)
            .await
            .expect_err(name);
        assert!(err.to_string().contains(words), "{name}: {err}");
    }
    bed.apply_database(&ns, restored("fixed", json!({"s3": s3()})))
        .await;
    let mut changed = restored("fixed", json!({"s3": s3(), "backupId": "other"}));
    changed["apiVersion"] = "dbop.dev/v1alpha1".into();
    changed["kind"] = "Database".into();
    let err = bed
        .databases(&ns)
        .patch(
            "fixed",
            &kube::api::PatchParams::apply("e2e-tests").force(),
            &kube::api::Patch::Apply(&changed),
        )
        .await
        .expect_err("bootstrap changed");
    assert!(err.to_string().contains("bootstrap is immutable"), "{err}");
}
