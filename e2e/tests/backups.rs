//! Scheduled backups on a real control plane: a per-minute schedule makes `DatabaseBackup`s on
//! time, the backup Job's pod (completed by kwok with a termination message the test supplies)
//! fills the status, a failing Job turns `BackupHealthy` False, a missing encryption keys'
//! Secret holds the runs (`EncryptionKeySecretInvalid`) until it exists, and an operator
//! stopped across three due times runs exactly one catch-up.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Timelike, Utc};
use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{
    fail_every_pod_until_failed, finish_pod, running_backup_pod, s3_secret,
};
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

/// Long enough for a minute boundary to pass and the operator to act on it.
const NEXT_MINUTE: Duration = Duration::from_secs(150);

fn with_backups(hold: bool) -> serde_json::Value {
    let mut extra = json!({
        "backup": {
            "schedule": "* * * * *",
            "s3": {
                "endpoint": "http://minio.storage.svc:9000",
                "bucket": "backups",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds"}
            }
        }
    });
    if hold {
        extra["podMetadata"] = json!({"labels": {"testbed.dbop.dev/hold": "true"}});
    }
    extra
}

async fn backups(bed: &TestBed, ns: &str) -> Vec<DatabaseBackup> {
    let mut list = Api::<DatabaseBackup>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list DatabaseBackups")
        .items;
    list.sort_by_key(|b| b.metadata.name.clone());
    list
}

fn created(b: &DatabaseBackup) -> DateTime<Utc> {
    let t = b.metadata.creation_timestamp.as_ref().unwrap().0;
    DateTime::from_timestamp(t.as_second(), 0).unwrap()
}

/// The first scheduled backup, checked to be on time: named after its minute and created
/// within a few seconds of it.
async fn first_scheduled_backup(bed: &TestBed, ns: &str) -> DatabaseBackup {
    let b = wait_until("a scheduled DatabaseBackup", NEXT_MINUTE, || async {
        backups(bed, ns).await.into_iter().next()
    })
    .await;
    let at = created(&b);
    let minute = at.with_second(0).unwrap();
    let late = at - minute;
    assert_eq!(
        b.metadata.name.as_deref(),
        Some(format!("orders-{}", minute.format("%Y%m%d%H%M")).as_str())
    );
    assert!(
        late.num_seconds() <= 15,
        "created {late} after its due time"
    );
    println!(
        "e2e: scheduled backup created {}s after its due time",
        late.num_seconds()
    );
    b
}

async fn wait_backup_phase(
    bed: &TestBed,
    ns: &str,
    name: &str,
    phase: BackupPhase,
) -> DatabaseBackup {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    wait_until(&format!("backup {name} {phase:?}"), WAIT, || async {
        let b = api.get(name).await.ok()?;
        (b.status.as_ref()?.phase == Some(phase)).then_some(b)
    })
    .await
}

#[tokio::test]
async fn a_per_minute_schedule_makes_backups_on_time_and_fills_their_status() {
    let bed = testbed().await;
    let ns = bed.namespace("backup-ok").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("orders", with_backups(true)))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let b = first_scheduled_backup(&bed, &ns).await;
    let name = b.metadata.name.clone().unwrap();
    let pod = running_backup_pod(&bed, &ns, &name).await;
    let result = json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": "20250501T020003Z-x",
        "database": "postgres", "bucket": "backups",
        "key": format!("{ns}/orders/postgres/20250501T020003Z-x/dump.pgc.zst"),
        "sizeBytes": 4242, "sha256": "ab".repeat(32), "engineVersion": "16.4",
        // Now: a completion time a year ago would rightly be older than the RPO.
        "startedAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "completedAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "message": "dumped 10000 bytes"
    });
    finish_pod(&bed, &ns, &pod, "Succeeded", &result.to_string()).await;

    let done = wait_backup_phase(&bed, &ns, &name, BackupPhase::Succeeded).await;
    let status = done.status.unwrap();
    assert_eq!(status.size_bytes, Some(4242));
    assert_eq!(status.sha256, Some("ab".repeat(32)));
    assert_eq!(status.bucket.as_deref(), Some("backups"));
    assert!(status.key.unwrap().ends_with("dump.pgc.zst"));
    assert!(status.started_at.is_some() && status.completed_at.is_some());

    let dbs = bed.databases(&ns);
    let db = wait_until("status.backup.lastSuccessful", WAIT, || async {
        let db = dbs.get("orders").await.ok()?;
        (db.status
            .as_ref()?
            .backup
            .as_ref()?
            .last_successful
            .as_deref()
            == Some(name.as_str()))
        .then_some(db)
    })
    .await;
    assert_eq!(
        condition(&db, "BackupHealthy"),
        Some(("True".into(), "BackupSucceeded".into()))
    );
    assert_eq!(
        condition(&db, "Ready").map(|c| c.0).as_deref(),
        Some("True")
    );
    let backup_status = db.status.unwrap().backup.unwrap();
    assert!(backup_status.next_schedule_time.is_some());
    assert!(backup_status.last_schedule_time.is_some());
}

#[tokio::test]
async fn a_failing_backup_job_turns_backup_healthy_false() {
    let bed = testbed().await;
    let ns = bed.namespace("backup-fail").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("orders", with_backups(true)))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let b = first_scheduled_backup(&bed, &ns).await;
    let name = b.metadata.name.clone().unwrap();
    let result = json!({"outcome": "Failed", "operation": "dump",
        "message": "S3 access denied: check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the bucket policy"})
    .to_string();
    // The Job retries once (backoffLimit 1): every pod it starts fails the same way.
    fail_every_pod_until_failed(&bed, &ns, &name, &result).await;
    let failed = wait_backup_phase(&bed, &ns, &name, BackupPhase::Failed).await;
    assert!(
        failed
            .status
            .unwrap()
            .message
            .unwrap()
            .contains("S3 access denied"),
        "the agent's message reaches the status"
    );
    let dbs = bed.databases(&ns);
    let db = wait_until("BackupHealthy False", WAIT, || async {
        let db = dbs.get("orders").await.ok()?;
        // Before the failure it is already False (NoSuccessfulBackup: a run was due and none
        // succeeded); then it names the failure.
        (condition(&db, "BackupHealthy")?.1 == "LastBackupFailed").then_some(db)
    })
    .await;
    assert_eq!(
        condition(&db, "BackupHealthy"),
        Some(("False".into(), "LastBackupFailed".into()))
    );
    assert_eq!(
        condition(&db, "Ready").map(|c| c.0).as_deref(),
        Some("True"),
        "a failed backup does not make the database unready"
    );
}

#[tokio::test]
async fn a_missing_encryption_secret_holds_backups_until_it_exists() {
    let bed = testbed().await;
    let ns = bed.namespace("backup-keys").await;
    s3_secret(&bed, &ns).await;
    let _operator = bed.operator_in_process(&ns).await;
    let mut spec = with_backups(true);
    spec["backup"]["encryption"] = json!({"secretName": "backup-keys", "keyName": "k1"});
    bed.apply_database(&ns, database_manifest("orders", spec))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let dbs = bed.databases(&ns);
    let db = wait_until(
        "BackupHealthy False for the key Secret",
        NEXT_MINUTE,
        || async {
            let db = dbs.get("orders").await.ok()?;
            (condition(&db, "BackupHealthy")?.1 == "EncryptionKeySecretInvalid").then_some(db)
        },
    )
    .await;
    let message = db
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BackupHealthy")
        .unwrap()
        .message;
    assert!(
        message.contains("Secret backup-keys") && message.contains("k1"),
        "{message}"
    );
    assert!(backups(&bed, &ns).await.is_empty(), "no backup started");
    // The Secret appears: the next due time makes a backup, whose Job mounts the keys.
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "backup-keys"},
        "stringData": {"k1": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(bed.client.clone(), &ns)
        .create(&Default::default(), &secret)
        .await
        .expect("create the keys' Secret");
    let b = wait_until("a backup once the Secret exists", NEXT_MINUTE, || async {
        backups(&bed, &ns).await.into_iter().next()
    })
    .await;
    let pod = running_backup_pod(&bed, &ns, b.metadata.name.as_deref().unwrap()).await;
    let volumes = pod.spec.unwrap().volumes.unwrap_or_default();
    assert!(
        volumes.iter().any(
            |v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("backup-keys")
        ),
        "{volumes:?}"
    );
}

/// The annotation that records the due time a scheduled backup was made for (part of the API:
/// `kubectl get databasebackup -o yaml` shows it to users).
const SCHEDULED_AT: &str = "dbop.dev/scheduled-at";

/// The due time a scheduled backup was made for.
fn scheduled_at(b: &DatabaseBackup) -> Option<DateTime<Utc>> {
    let text = b.metadata.annotations.as_ref()?.get(SCHEDULED_AT)?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::minutes(1)).unwrap()
}

/// The backups made for one of these due times.
async fn backups_due_at(bed: &TestBed, ns: &str, due: &[DateTime<Utc>]) -> Vec<DatabaseBackup> {
    backups(bed, ns)
        .await
        .into_iter()
        .filter(|b| scheduled_at(b).is_some_and(|t| due.contains(&t)))
        .collect()
}

#[tokio::test]
async fn an_operator_stopped_across_three_due_times_runs_one_catch_up() {
    let bed = testbed().await;
    let ns = bed.namespace("backup-catchup").await;
    s3_secret(&bed, &ns).await;
    let mut operator = bed.operator_binary(&ns);
    bed.apply_database(&ns, database_manifest("orders", with_backups(false)))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    // Pods complete by themselves (no hold): the first run succeeds.
    let first = first_scheduled_backup(&bed, &ns).await;
    let first_name = first.metadata.name.clone().unwrap();
    wait_backup_phase(&bed, &ns, &first_name, BackupPhase::Succeeded).await;
    assert!(operator.is_running(), "{}", operator.log_tail());
    operator.kill9();
    let stopped_at = Utc::now();

    // Three due times pass while nothing runs. The restart comes early in the minute of the
    // third, so the operator's first look precedes the next regular run: a catch-up is then a
    // backup scheduled at a missed due time, never to be confused with the next regular run.
    let first_missed = minute_of(stopped_at) + TimeDelta::minutes(1);
    let missed: Vec<DateTime<Utc>> = (0..3)
        .map(|i| first_missed + TimeDelta::minutes(i))
        .collect();
    let next_regular = missed[2] + TimeDelta::minutes(1);
    let restart_at = missed[2] + TimeDelta::seconds(5);
    // Waiting for the clock itself: no condition to observe while the operator is down.
    tokio::time::sleep((restart_at - Utc::now()).to_std().unwrap_or_default()).await;
    let restarted_at = Utc::now();
    assert!(
        restarted_at < next_regular - TimeDelta::seconds(30),
        "restarted at {restarted_at}, too close to the next due time {next_regular}"
    );
    let operator = bed.operator_binary(&ns);

    let name_of = |t: DateTime<Utc>| format!("orders-{}", t.format("%Y%m%d%H%M"));
    let catch_up = wait_until(
        "a catch-up run scheduled at a due time missed during the outage",
        WAIT,
        || async { backups_due_at(&bed, &ns, &missed).await.into_iter().next() },
    )
    .await;
    let catch_up = catch_up.metadata.name.clone().unwrap();
    assert_eq!(
        catch_up,
        name_of(missed[2]),
        "the catch-up is the latest missed run"
    );
    wait_backup_phase(&bed, &ns, &catch_up, BackupPhase::Succeeded).await;

    // The next regular run comes on time: the operator has looked at the schedule again since
    // the catch-up, and still made no other run for the outage.
    let regular = wait_until("the next regular run", NEXT_MINUTE, || async {
        backups_due_at(&bed, &ns, &[next_regular])
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(regular.metadata.name, Some(name_of(next_regular)));
    let during: Vec<String> = backups_due_at(&bed, &ns, &missed)
        .await
        .into_iter()
        .filter_map(|b| b.metadata.name)
        .collect();
    assert_eq!(
        during,
        vec![catch_up.clone()],
        "exactly one run for the due times missed during the outage ({missed:?}); log:\n{}",
        operator.log_tail()
    );
    println!(
        "e2e: one catch-up run ({catch_up}) for {} missed due times, then the regular run {}",
        missed.len(),
        name_of(next_regular)
    );
}
