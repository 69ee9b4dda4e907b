//! The recovery point after a lost volume, measured on the test bed's real node. A Database
//! archives its WAL (`archiveTimeout` 10 s) and has a physical base backup; a writer in a
//! client pod commits one row per connection and logs each acknowledged id with the moment it
//! was acknowledged. The server is frozen mid-write (as a crash stops it: no shutdown, no last
//! archive), the Database is deleted with its volume (`deletionPolicy: Delete`) and its pod
//! killed, and a new Database recovers the latest point from the bucket. Every
//! acknowledged commit up to some point is there, with no gap and nothing that was never
//! attempted; what is lost is the tail, acknowledged within the bound archiving gives (the
//! timeout, once more for a checkpointer that wakes late, and an upload). The loss is printed.

use std::collections::BTreeSet;
use std::time::Duration;

use dbop::api::{BackupMethod, BackupReason, Database, DatabaseBackup, DatabaseBackupSpec, Phase};
use dbop_e2e::backup_jobs::succeeded_backup;
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, condition, testbed, wait_until, wait_until_or_none};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// A real server: initdb, start, init Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// A base backup Job, or a recovery: a pod, a download or upload, WAL replay.
const JOB_WAIT: Duration = Duration::from_secs(300);
/// `archiveTimeout` of the Database (the shortest allowed).
const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a lost volume may lose: a WAL file is switched at most one timeout after its first
/// commit, the checkpointer may see that up to one timeout late, and the upload takes a moment.
const LOSS_BOUND: Duration = Duration::from_secs(2 * 10 + 5);

/// The writer: one insert through `-rw` per connection; each acknowledged id is appended with
/// the moment it was acknowledged (Unix milliseconds), until the stop file exists.
const WRITER: &str = r#"i=0; while [ ! -f /tmp/stop ]; do i=$((i+1)); echo $i > /tmp/attempted; if psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "insert into acked values ($i)" >/dev/null 2>&1; then echo "$i $(date +%s%3N)" >> /tmp/acked; fi; done"#;

fn s3(endpoint: &str) -> Value {
    json!({"endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
           "credentials": {"secretName": "s3-creds"}})
}

fn start_writer(bed: &TestBed, ns: &str) {
    let background = format!(
        "nohup sh -c '{}' >/dev/null 2>&1 &",
        WRITER.replace('\'', "'\\''")
    );
    let (ok, _, err) = bed.exec(ns, "client", &["sh", "-c", &background]);
    assert!(ok, "starting the writer: {err}");
}

/// The writer's acknowledged commits: (id, Unix milliseconds), in order.
fn acked(bed: &TestBed, ns: &str) -> Vec<(u32, i64)> {
    let (_, out, _) = bed.exec(ns, "client", &["sh", "-c", "cat /tmp/acked 2>/dev/null"]);
    out.lines()
        .filter_map(|l| {
            let (id, at) = l.trim().split_once(' ')?;
            Some((id.parse().ok()?, at.parse().ok()?))
        })
        .collect()
}

fn span(acked: &[(u32, i64)]) -> Duration {
    match (acked.first(), acked.last()) {
        (Some(first), Some(last)) => Duration::from_millis((last.1 - first.1).max(0) as u64),
        _ => Duration::ZERO,
    }
}

async fn physical_backup(bed: &TestBed, ns: &str) {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let backup = DatabaseBackup::new(
        "ledger-base",
        DatabaseBackupSpec {
            database: "ledger".into(),
            reason: BackupReason::Manual,
            method: BackupMethod::Physical,
        },
    );
    api.create(&PostParams::default(), &backup)
        .await
        .expect("the physical DatabaseBackup");
    succeeded_backup(bed, ns, Some("ledger-base"), JOB_WAIT).await;
}

#[tokio::test]
async fn a_lost_volume_loses_only_the_commits_archiving_had_not_shipped_yet() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("volume-loss").await;
    let _operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let storage = json!({"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS});
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "ledger"}, "spec": {
            "version": "15.20", "storage": storage, "placement": real_node_placement(),
            "deletionPolicy": "Delete",
            "backup": {"schedule": "@yearly", "s3": s3(&endpoint),
                       "walArchiving": {"archiveTimeout": format!("{}s", ARCHIVE_TIMEOUT.as_secs())}},
        }}),
    )
    .await;
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    bed.psql_until_ok(
        &ns,
        "client",
        "postgres",
        "create table acked (id int primary key)",
        READY_WAIT,
    )
    .await;
    physical_backup(&bed, &ns).await;

    // Writes for three archive timeouts, so several WAL files were switched and shipped.
    start_writer(&bed, &ns);
    wait_until("three archive timeouts of writes", READY_WAIT, || async {
        (span(&acked(&bed, &ns)) >= 3 * ARCHIVE_TIMEOUT).then_some(())
    })
    .await;

    // The volume is lost as a crash loses it: the server is frozen mid-write (no shutdown
    // checkpoint, no last archive), then the Database goes with its volume and its pod is
    // killed, the writer still writing.
    let freeze = "for p in /proc/[0-9]*; do \
                  [ \"$(cat $p/comm 2>/dev/null)\" = postgres ] && kill -STOP ${p#/proc/}; \
                  done; true";
    let (ok, _, err) = bed.exec(&ns, "ledger-0", &["sh", "-c", freeze]);
    assert!(ok, "freezing the server: {err}");
    let (ok, _, err) = bed.kubectl(&["-n", &ns, "delete", "database", "ledger", "--wait=false"]);
    assert!(ok, "deleting the Database: {err}");
    bed.kubectl(&[
        "-n",
        &ns,
        "delete",
        "pod",
        "ledger-0",
        "--grace-period=0",
        "--force",
    ]);
    let api: Api<Database> = Api::namespaced(bed.client.clone(), &ns);
    let gone = wait_until_or_none(READY_WAIT, || async {
        api.get_opt("ledger")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "Database ledger still exists");
    bed.exec(&ns, "client", &["sh", "-c", "touch /tmp/stop"]);
    let acknowledged = acked(&bed, &ns);
    let (_, attempted, _) = bed.exec(&ns, "client", &["cat", "/tmp/attempted"]);
    let attempted: u32 = attempted.trim().parse().expect("the last attempted id");

    // The latest point, from the bucket alone.
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "ledger-back"}, "spec": {
            "version": "15.20", "storage": storage, "placement": real_node_placement(),
            "bootstrap": {"fromBackup": {"s3": s3(&endpoint), "database": "ledger",
                                         "namespace": ns, "recoveryTarget": {"latest": true}}},
        }}),
    )
    .await;
    let db = bed
        .wait_for_phase(&ns, "ledger-back", Phase::Ready, JOB_WAIT)
        .await;
    let initialized = condition(&db, "Initialized").map(|c| c.1);
    assert_eq!(initialized.as_deref(), Some("RecoveredToTarget"));
    bed.psql_client(&ns, "client-back", "ledger-back", "ledger-back-credentials")
        .await;
    let rows = bed
        .psql_until_ok(
            &ns,
            "client-back",
            "postgres",
            "select id from acked order by id",
            READY_WAIT,
        )
        .await;
    let restored: BTreeSet<u32> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();

    // Nothing restored that was never attempted (the last attempt may have committed unseen).
    assert!(
        restored.iter().all(|id| *id <= attempted),
        "restored ids past the last attempt {attempted}"
    );
    // The acknowledged commits restored are a prefix: no gap.
    let kept = acknowledged
        .iter()
        .take_while(|(id, _)| restored.contains(id))
        .count();
    let after: Vec<u32> = acknowledged[kept..]
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| restored.contains(id))
        .collect();
    assert!(after.is_empty(), "restored after a gap: {after:?}");
    assert!(kept > 0, "no acknowledged commit was restored");
    let last = acknowledged.last().expect("acknowledged commits").1;
    let lost = match acknowledged.get(kept) {
        Some((_, first_lost)) => Duration::from_millis((last - first_lost).max(0) as u64),
        None => Duration::ZERO,
    };
    println!(
        "e2e: a lost volume lost {} of {} acknowledged commits, the last {:.1} s of writes \
         (archiveTimeout {} s)",
        acknowledged.len() - kept,
        acknowledged.len(),
        lost.as_secs_f64(),
        ARCHIVE_TIMEOUT.as_secs()
    );
    assert!(
        lost <= LOSS_BOUND,
        "lost {lost:?} of acknowledged writes, over {LOSS_BOUND:?}"
    );
}
