//! Staged minor upgrades on kwok (control flow and timing; `upgrades_real.rs` runs real
//! PostgreSQL): the stages in order, the pre-upgrade backup finished before any pod changes,
//! the operator killed (SIGKILL) at Preflight, at PreUpgradeBackup and at RollingOut resumes
//! with one preflight Job and one pre-upgrade backup, a failed preflight stops with no pod
//! touched and can be abandoned by setting the version back, and a deletion during the rollout
//! waits for the upgrade to reach a safe point.
//!
//! The test bed holds Job pods labelled `testbed.dbop.dev/hold` (from `podMetadata`) until the
//! test finishes them, so each stage can be caught and inspected.

use std::time::Duration;

use chrono::Utc;
use dbop::api::{BackupPhase, BackupReason, Database, DatabaseBackup, Phase, UpgradeStage};
use dbop_e2e::backup_jobs::{finish_pod, running_backup_pod, running_pod, s3_secret};
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

const OLD_IMAGE: &str = "docker.io/library/postgres:15.18";
const NEW_IMAGE: &str = "docker.io/library/postgres:15.20";

fn spec(backups: bool) -> serde_json::Value {
    let mut extra = json!({
        "version": "15.18",
        "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}},
        "upgrade": {"podReadyTimeout": "2m"}
    });
    if backups {
        extra["backup"] = json!({
            "schedule": "0 3 * * *",
            "s3": {
                "endpoint": "http://minio.storage.svc:9000",
                "bucket": "backups",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds"}
            }
        });
    }
    extra
}

async fn set_version(bed: &TestBed, ns: &str, name: &str, version: &str) -> kube::Result<Database> {
    bed.databases(ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"version": version}})),
        )
        .await
}

fn stage(db: &Database) -> Option<UpgradeStage> {
    db.status.as_ref()?.upgrade.as_ref().map(|u| u.stage)
}

async fn wait_stage(bed: &TestBed, ns: &str, name: &str, want: UpgradeStage) -> Database {
    let api = bed.databases(ns);
    wait_until(&format!("upgrade stage {want:?}"), WAIT, || async {
        let db = api.get(name).await.ok()?;
        (stage(&db) == Some(want)).then_some(db)
    })
    .await
}

/// The StatefulSet's image and the uid of its pod 0: what "a pod changed" is measured by.
async fn serving(bed: &TestBed, ns: &str, name: &str) -> (String, String) {
    let sts = Api::<StatefulSet>::namespaced(bed.client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let image = sts.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    let pod = Api::<Pod>::namespaced(bed.client.clone(), ns)
        .get(&format!("{name}-0"))
        .await
        .unwrap();
    (image, pod.metadata.uid.unwrap())
}

/// The running (held) pod of the upgrade's preflight Job.
async fn running_preflight_pod(bed: &TestBed, ns: &str, job: &str) -> Pod {
    let selector = format!("batch.kubernetes.io/job-name={job}");
    running_pod(bed, ns, &selector, "the preflight pod running").await
}

async fn count<K>(bed: &TestBed, ns: &str, selector: &str) -> usize
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .len()
}

async fn pre_upgrade_backups(bed: &TestBed, ns: &str) -> Vec<DatabaseBackup> {
    Api::<DatabaseBackup>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|b| b.spec.reason == BackupReason::PreUpgrade)
        .collect()
}

async fn event_reasons(bed: &TestBed, ns: &str, name: &str) -> Vec<String> {
    let mut events = Api::<Event>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .unwrap()
        .items;
    // eventTime has microseconds: the order of Events of the same second.
    events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    events.into_iter().filter_map(|e| e.reason).collect()
}

/// The Event reasons of `name` once every one of `wanted` is among them (Events are published
/// after the status that announces the transition, so a read right after it may be early).
async fn event_reasons_with(bed: &TestBed, ns: &str, name: &str, wanted: &[&str]) -> Vec<String> {
    wait_until(&format!("Events {wanted:?} of {name}"), WAIT, || async {
        let reasons = event_reasons(bed, ns, name).await;
        wanted
            .iter()
            .all(|w| reasons.iter().any(|r| r == w))
            .then_some(reasons)
    })
    .await
}

fn backup_result(ns: &str) -> String {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": "20261130T100000Z-x",
        "database": "postgres", "bucket": "backups",
        "key": format!("{ns}/orders/postgres/20261130T100000Z-x/dump.pgc.zst"),
        "sizeBytes": 4242, "sha256": "ab".repeat(32), "engineVersion": "15.18",
        "startedAt": now, "completedAt": now, "message": "dumped"
    })
    .to_string()
}

#[tokio::test]
async fn stages_run_in_order_the_backup_first_and_a_killed_operator_resumes_without_duplicates() {
    let bed = testbed().await;
    let ns = bed.namespace("upgrade").await;
    s3_secret(&bed, &ns).await;
    let mut operator = bed.operator_binary(&ns);
    bed.apply_database(&ns, database_manifest("orders", spec(true)))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let before = serving(&bed, &ns, "orders").await;
    assert_eq!(before.0, OLD_IMAGE);

    set_version(&bed, &ns, "orders", "15.20").await.unwrap();
    let db = wait_stage(&bed, &ns, "orders", UpgradeStage::Preflight).await;
    let job = db.status.unwrap().upgrade.unwrap().preflight_job.unwrap();
    let preflight = running_preflight_pod(&bed, &ns, &job).await;
    // Preflight: nothing that serves changed, the database still serves.
    assert_eq!(serving(&bed, &ns, "orders").await, before);
    let db = bed.databases(&ns).get("orders").await.unwrap();
    assert_eq!(db.status.as_ref().unwrap().phase, Some(Phase::Upgrading));
    assert_eq!(condition(&db, "Ready").unwrap().0, "True");

    // Killed at Preflight: the restarted operator finds its Job.
    operator.kill9();
    let mut operator = bed.operator_binary(&ns);
    finish_pod(&bed, &ns, &preflight, "Succeeded", "15.20").await;
    let db = wait_stage(&bed, &ns, "orders", UpgradeStage::PreUpgradeBackup).await;
    let backup = db
        .status
        .unwrap()
        .upgrade
        .unwrap()
        .pre_upgrade_backup
        .unwrap();
    let backup_pod = running_backup_pod(&bed, &ns, &backup).await;
    // The backup runs before any pod changes.
    assert_eq!(serving(&bed, &ns, "orders").await, before);

    // Killed at PreUpgradeBackup: still one backup.
    operator.kill9();
    let mut operator = bed.operator_binary(&ns);
    finish_pod(&bed, &ns, &backup_pod, "Succeeded", &backup_result(&ns)).await;
    let db = bed
        .wait_for_phase(&ns, "orders", Phase::Ready, Duration::from_secs(120))
        .await;
    assert!(operator.is_running(), "{}", operator.log_tail());
    let status = db.status.unwrap();
    let upgrade = status.upgrade.unwrap();
    assert_eq!(upgrade.stage, UpgradeStage::Complete, "{upgrade:?}");
    assert_eq!(status.current_version.as_deref(), Some("15.20"));
    let stages: Vec<_> = upgrade.stages.iter().map(|s| s.stage).collect();
    use UpgradeStage::*;
    assert_eq!(
        stages,
        vec![Preflight, PreUpgradeBackup, RollingOut, Verifying, Complete]
    );
    assert!(
        upgrade
            .stages
            .windows(2)
            .all(|w| w[0].started_at <= w[1].started_at)
    );
    let after = serving(&bed, &ns, "orders").await;
    assert_eq!(after.0, NEW_IMAGE);
    assert_ne!(after.1, before.1, "pod 0 was replaced on the new image");

    // Exactly one preflight Job and one pre-upgrade backup, which succeeded.
    let preflight_jobs = count::<Job>(&bed, &ns, "app.kubernetes.io/component=preflight").await;
    assert_eq!(preflight_jobs, 1);
    let backups = pre_upgrade_backups(&bed, &ns).await;
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(
        backups[0].status.as_ref().unwrap().phase,
        Some(BackupPhase::Succeeded)
    );
    let reasons = event_reasons_with(&bed, &ns, "orders", &["UpgradeComplete"]).await;
    for want in [
        "UpgradeStarted",
        "UpgradePreUpgradeBackup",
        "UpgradeRollingOut",
        "UpgradeComplete",
    ] {
        assert!(
            reasons.iter().any(|r| r == want),
            "no {want} Event: {reasons:?}"
        );
    }
    drop(operator);
}

#[tokio::test]
async fn a_preflight_that_finds_another_version_stops_with_no_pod_touched_and_can_be_abandoned() {
    let bed = testbed().await;
    let ns = bed.namespace("upgrade-preflight").await;
    let _operator = bed.operator_binary(&ns);
    bed.apply_database(&ns, database_manifest("orders", spec(false)))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let before = serving(&bed, &ns, "orders").await;

    // Admission refuses what CEL can judge: a major change, an older minor than the running.
    for refused in ["16.4", "15.16"] {
        let error = set_version(&bed, &ns, "orders", refused).await.unwrap_err();
        assert!(
            error.to_string().contains("newer minor"),
            "{refused}: {error}"
        );
    }

    set_version(&bed, &ns, "orders", "15.20").await.unwrap();
    let db = wait_stage(&bed, &ns, "orders", UpgradeStage::Preflight).await;
    let job = db.status.unwrap().upgrade.unwrap().preflight_job.unwrap();
    let pod = running_preflight_pod(&bed, &ns, &job).await;
    finish_pod(&bed, &ns, &pod, "Failed", "15.18").await;
    let db = wait_stage(&bed, &ns, "orders", UpgradeStage::Failed).await;
    let upgrade = db.status.as_ref().unwrap().upgrade.clone().unwrap();
    assert_eq!(upgrade.reason.as_deref(), Some("PreflightFailed"));
    assert!(
        upgrade.message.as_deref().unwrap().contains("15.18"),
        "{upgrade:?}"
    );
    assert_eq!(
        condition(&db, "Upgrading"),
        Some(("False".into(), "PreflightFailed".into()))
    );
    assert_eq!(condition(&db, "Ready").unwrap().0, "True");
    assert_eq!(db.status.as_ref().unwrap().phase, Some(Phase::Ready));
    assert_eq!(
        serving(&bed, &ns, "orders").await,
        before,
        "no pod was touched"
    );
    // Waits for it: the Event follows the status just read.
    event_reasons_with(&bed, &ns, "orders", &["PreflightFailed"]).await;

    // Back to the running version, without manual steps: admission lets it, dbop settles.
    set_version(&bed, &ns, "orders", "15.18").await.unwrap();
    let api = bed.databases(&ns);
    wait_until("Upgrading back to NoUpgrade", WAIT, || async {
        let db = api.get("orders").await.ok()?;
        (condition(&db, "Upgrading")?.1 == "NoUpgrade").then_some(())
    })
    .await;
    assert_eq!(serving(&bed, &ns, "orders").await, before);
}

#[tokio::test]
async fn a_deletion_during_the_rollout_waits_for_the_upgrade_to_reach_a_safe_point() {
    let bed = testbed().await;
    let ns = bed.namespace("upgrade-delete").await;
    let mut operator = bed.operator_binary(&ns);
    let mut extra = spec(false);
    extra["podMetadata"] = json!({});
    bed.apply_database(&ns, database_manifest("orders", extra))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    set_version(&bed, &ns, "orders", "15.20").await.unwrap();
    let api = bed.databases(&ns);
    // Kill the operator the moment the rollout starts; delete while it is down.
    let caught = wait_until("the rollout started", WAIT, || async {
        let db = api.get("orders").await.ok()?;
        matches!(
            stage(&db),
            Some(UpgradeStage::RollingOut | UpgradeStage::Verifying | UpgradeStage::Complete)
        )
        .then_some(stage(&db))
    })
    .await;
    operator.kill9();
    assert_eq!(
        caught,
        Some(UpgradeStage::RollingOut),
        "the rollout was too quick to catch"
    );
    api.delete("orders", &DeleteParams::default())
        .await
        .unwrap();

    // Restarted: the rollout resumes and ends, then the deletion policy runs.
    let operator = bed.operator_binary(&ns);
    wait_until("the Database gone", WAIT, || async {
        api.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    let reasons = event_reasons_with(&bed, &ns, "orders", &["CleanedUp"]).await;
    let at = |r: &str| reasons.iter().position(|x| x == r);
    let (waited, complete, cleaned) = (
        at("DeletionWaitsForUpgrade"),
        at("UpgradeComplete"),
        at("CleanedUp"),
    );
    assert!(
        waited.is_some() && complete.is_some() && cleaned.is_some(),
        "{reasons:?}\n{}",
        operator.log_tail()
    );
    assert!(waited < cleaned && complete < cleaned, "{reasons:?}");
}
