//! Backup verification on a real control plane (verify pods driven on kwok): with
//! `verify.everyNthBackup: 1` each successful backup starts one verify Job (one, also across an
//! operator restart), its success sets `BackupVerified` and `status.verification`, and a failed
//! verification (a row-count mismatch) turns `BackupVerified` and `BackupHealthy` False.

use dbop::api::{BackupPhase, BackupReason, Database, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{finish_pod, s3_secret};
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Resource};
use serde_json::json;

const VERIFY_PODS: &str = "app.kubernetes.io/component=verify";

fn manifest() -> serde_json::Value {
    database_manifest(
        "checked",
        json!({
            "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}},
            "backup": {
                "schedule": "0 0 1 1 *",
                "verify": {"everyNthBackup": 1},
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

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A succeeded backup owned by the Database, as dbop makes each scheduled run.
async fn succeeded_backup(bed: &TestBed, ns: &str, db: &Database, name: &str) {
    let mut backup = DatabaseBackup::new(
        name,
        dbop::api::DatabaseBackupSpec {
            database: "checked".into(),
            reason: BackupReason::Scheduled,
            method: dbop::api::BackupMethod::Logical,
        },
    );
    backup.metadata.owner_references = Some(vec![db.controller_owner_ref(&()).unwrap()]);
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    api.create(&PostParams::default(), &backup).await.unwrap();
    let selector = format!("dbop.dev/backup={name}");
    let pod = running_pods(bed, ns, &selector).await.remove(0);
    let result = json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": format!("{name}-id"),
        "bucket": "backups", "key": format!("{ns}/checked/postgres/{name}-id/dump.pgc.zst"),
        "sizeBytes": 1, "startedAt": now(), "completedAt": now(), "message": "dumped"
    });
    finish_pod(bed, ns, &pod, "Succeeded", &result.to_string()).await;
    wait_until(&format!("backup {name} Succeeded"), WAIT, || async {
        let b = api.get(name).await.ok()?;
        (b.status?.phase == Some(BackupPhase::Succeeded)).then_some(())
    })
    .await;
}

async fn verify_jobs(bed: &TestBed, ns: &str) -> Vec<String> {
    Api::<Job>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default().labels(VERIFY_PODS))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|j| j.metadata.name)
        .collect()
}

async fn wait_condition(
    bed: &TestBed,
    ns: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Database {
    let api = bed.databases(ns);
    wait_until(&format!("{type_}={status} ({reason})"), WAIT, || async {
        let db = api.get("checked").await.ok()?;
        (condition(&db, type_)? == (status.to_string(), reason.to_string())).then_some(db)
    })
    .await
}

#[tokio::test]
async fn each_backup_is_verified_once_and_a_failed_verification_is_unhealthy() {
    let bed = testbed().await;
    let ns = bed.namespace("verify").await;
    s3_secret(&bed, &ns).await;
    let operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, manifest()).await;
    let db = bed.wait_for_phase(&ns, "checked", Phase::Ready, WAIT).await;
    assert_eq!(
        condition(&db, "BackupVerified"),
        None,
        "nothing verified yet"
    );

    succeeded_backup(&bed, &ns, &db, "checked-1").await;
    let pod = running_pods(&bed, &ns, VERIFY_PODS).await.remove(0);
    assert_eq!(
        verify_jobs(&bed, &ns).await,
        vec!["checked-1-verify".to_string()]
    );
    // A restarted operator finds the Job of the trigger it already acted on.
    drop(operator);
    let _operator = bed.operator_in_process(&ns).await;
    let ok = json!({
        "outcome": "Succeeded", "operation": "verify", "backupId": "checked-1-id",
        "completedAt": now(), "message": "restored; the row counts of 3 tables match"
    });
    finish_pod(&bed, &ns, &pod, "Succeeded", &ok.to_string()).await;
    let db = wait_condition(&bed, &ns, "BackupVerified", "True", "Verified").await;
    assert_eq!(
        verify_jobs(&bed, &ns).await,
        vec!["checked-1-verify".to_string()]
    );
    let v = db.status.unwrap().verification.unwrap();
    assert_eq!(v.last_verified_backup_id.as_deref(), Some("checked-1-id"));
    assert!(v.last_verified_time.is_some());

    // The next backup is verified too; this time the row counts differ.
    succeeded_backup(&bed, &ns, &db_now(&bed, &ns).await, "checked-2").await;
    let mismatch = r#"{"outcome":"Failed","operation":"verify","message":"table public.t: manifest has 100 rows, restored database has 99"}"#;
    fail_until_job_failed(&bed, &ns, "checked-2-verify", mismatch).await;
    let db = wait_condition(&bed, &ns, "BackupVerified", "False", "VerificationFailed").await;
    assert_eq!(
        condition(&db, "BackupHealthy"),
        Some(("False".into(), "VerificationFailed".into()))
    );
    let mut jobs = verify_jobs(&bed, &ns).await;
    jobs.sort();
    assert_eq!(jobs, vec!["checked-1-verify", "checked-2-verify"]);
    let message = &db
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BackupVerified")
        .unwrap()
        .message;
    assert!(message.contains("manifest has 100 rows"), "{message}");
}

async fn db_now(bed: &TestBed, ns: &str) -> Database {
    bed.databases(ns).get("checked").await.unwrap()
}

fn decided(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("testbed.dbop.dev/outcome"))
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The running pods (held by the test bed, no outcome chosen yet) matching `selector`.
async fn running_pods(bed: &TestBed, ns: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    wait_until(&format!("a running pod {selector}"), WAIT, || async {
        let list: Vec<Pod> = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|p| running(p) && !decided(p))
            .collect();
        (!list.is_empty()).then_some(list)
    })
    .await
}

/// Fails every pod of Job `job` (it retries once) with `result` until the Job failed.
async fn fail_until_job_failed(bed: &TestBed, ns: &str, job: &str, result: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    wait_until(&format!("Job {job} failed"), WAIT, || async {
        for pod in pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
        {
            if running(&pod) && !decided(&pod) {
                finish_pod(bed, ns, &pod, "Failed", result).await;
            }
        }
        let status = jobs.get(job).await.ok()?.status?;
        let failed = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Failed" && c.status == "True");
        failed.then_some(())
    })
    .await;
}
