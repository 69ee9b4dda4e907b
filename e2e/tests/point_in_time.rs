//! Point-in-time recovery for real, on the test bed's real node. A Database of two instances
//! archives its WAL to an S3 server in a pod; its schedule (`spec.backup.method: Physical`,
//! every minute, then suspended) makes a `DatabaseBackup` of method `Physical` that takes a base
//! backup from the streaming standby (the agent's `base-backup` in a Job, as the replication
//! role, over its own replication connection, the server compressing; the status says where
//! it was read and who compressed it). Rows are committed, then the primary's pod is
//! deleted and the standby promoted on timeline 2, and more rows are committed before and after
//! a recorded moment on the new timeline, whose WAL and history file the new primary archives.
//! A new Database recovering that DatabaseBackup with `recoveryTarget.time` at that moment
//! replays across the timeline switch: it has exactly the rows committed before the moment,
//! runs on timeline 3, and says in `status.bootstrap` which base backup it started from and
//! which commit it reached; `kubectl dbop status` shows the restorable
//! window opening at that base backup. A target before every base backup (named by
//! the bucket's location) is refused with the earliest restorable point, and no server starts
//! on the volume. Then scheduled verification recovers the base backup and every WAL file
//! since into a scratch instance of the verify Job's own and reads it whole. Last, a recovery
//! to the latest point begun while the S3 server is out of reach retries (four failed attempts,
//! one more than a Job used to allow) until it is back and has every row.

use std::time::Duration;

use dbop::api::{BackupMethod, BackupReason, Database, Phase};
use dbop_e2e::backup_jobs::succeeded_backup;
use dbop_e2e::failover::{named_primary, new_primary};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::plugin::{finished, plugin};
use dbop_e2e::{
    TestBed, condition, condition_message, http_get, sample, testbed, wait_until,
    wait_until_or_none,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

/// A real server: initdb, start, init Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// A recovery: the Job's pod, the base backup's download, WAL replay, then the server's start.
const RECOVERED_WAIT: Duration = Duration::from_secs(300);
/// The next minute's scheduled base backup Job: its pod, the image, a checkpoint and the upload
/// of a small instance.
const BACKUP_WAIT: Duration = Duration::from_secs(300);
/// An archived file shows in `pg_stat_archiver` after one upload (the file is switched).
const ARCHIVED_WAIT: Duration = Duration::from_secs(90);

/// The server's clock, in RFC 3339 (as the API takes a target time).
const NOW: &str = "select to_char(clock_timestamp() at time zone 'UTC', \
                   'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

fn s3(endpoint: &str) -> Value {
    json!({"endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
           "credentials": {"secretName": "s3-creds"}})
}

/// A Database recovered as `from_backup` says.
fn recovered(name: &str, from_backup: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "bootstrap": {"fromBackup": from_backup},
    }})
}

/// Runs SQL on `ledger` through the client pod; its single-line output.
async fn sql(bed: &TestBed, ns: &str, pod: &str, query: &str) -> String {
    bed.psql_until_ok(ns, pod, "app", query, READY_WAIT).await
}

/// Waits until `file` (or a later one) is archived with no failure since.
async fn wait_archived(bed: &TestBed, ns: &str, file: &str) {
    let query = "select coalesce(last_archived_wal, '') from pg_stat_archiver";
    let archived = wait_until_or_none(ARCHIVED_WAIT, || {
        let (ok, out, _) = bed.psql(ns, "client", "app", query);
        async move { (ok && out.trim() >= file).then_some(()) }
    })
    .await;
    assert!(
        archived.is_some(),
        "{file} not archived within {ARCHIVED_WAIT:?}"
    );
}

/// Waits until the Database's `Initialized` condition has `reason`; the Database.
async fn wait_initialized(bed: &TestBed, ns: &str, name: &str, reason: &str) -> Database {
    let api: Api<Database> = Api::namespaced(bed.client.clone(), ns);
    wait_until(
        &format!("{name}: Initialized {reason}"),
        RECOVERED_WAIT,
        || {
            let api = api.clone();
            async move {
                let db = api.get(name).await.ok()?;
                let found = condition(&db, "Initialized")?;
                (found.1 == reason).then_some(db)
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_new_database_has_exactly_the_rows_committed_before_the_target() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("pitr").await;
    let operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "ledger"}, "spec": {
            "version": "15.20", "instances": 2,
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "backup": {"schedule": "* * * * *", "method": "Physical", "s3": s3(&endpoint),
                       "walArchiving": {"archiveTimeout": "10s"}},
        }}),
    )
    .await;
    let ready = bed
        .wait_for_phase(&ns, "ledger", Phase::Ready, READY_WAIT)
        .await;
    // No backup runs before the Database is Ready: its creation is before every base backup.
    let created = ready
        .metadata
        .creation_timestamp
        .expect("creationTimestamp");
    let before_backups = chrono::DateTime::from_timestamp(created.0.as_second(), 0)
        .expect("a time")
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    sql(
        &bed,
        &ns,
        "client",
        "create table entries (n int primary key); insert into entries select generate_series(1, 3)",
    )
    .await;

    // The base backup: the schedule's DatabaseBackup, of method Physical (the agent's
    // base-backup in a Job, connected as the replication role). No more runs after it.
    let backup = succeeded_backup(&bed, &ns, None, BACKUP_WAIT).await;
    bed.databases(&ns)
        .patch(
            "ledger",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {"suspend": true}}})),
        )
        .await
        .expect("suspend the schedule");
    assert_eq!(
        (backup.spec.reason, backup.spec.method),
        (BackupReason::Scheduled, BackupMethod::Physical)
    );
    let message = backup.status.as_ref().and_then(|s| s.message.clone());
    assert!(
        message
            .as_deref()
            .unwrap_or_default()
            .contains("(from the standby)"),
        "a base backup of a Database with a ready standby is read from it: {message:?}"
    );
    // Over the Job's TLS (verify-full) with several hosts and prefer-standby, the agent's own
    // replication connection took it and the server compressed it (no pg_basebackup).
    assert!(
        message
            .as_deref()
            .unwrap_or_default()
            .contains("compressed by the server"),
        "{message:?}"
    );
    let base = backup.metadata.name.clone().expect("a name");
    let completed = (backup.status.as_ref())
        .and_then(|s| s.completed_at)
        .expect("a completed base backup has its time");
    let key = backup.status.and_then(|s| s.key).unwrap_or_default();
    assert!(key.contains("/ledger/physical/base/"), "{key}");
    let (_, screen, _) = finished(plugin(&bed, &["status", "ledger", "-n", &ns])).await;
    let from = screen
        .lines()
        .find(|l| l.contains("Restorable from:"))
        .unwrap_or_default();
    assert!(from.contains(&format!("(base backup {base})")), "{screen}");
    // The operator exports where the window begins: when the base backup ended.
    let series = format!(
        "dbop_database_restorable_since_timestamp_seconds{{namespace=\"{ns}\",database=\"ledger\"}}"
    );
    let addr = wait_until("the operator's metrics address", READY_WAIT, || async {
        operator.metrics_addr()
    })
    .await;
    let since = wait_until(
        "the restorable window's start exported",
        READY_WAIT,
        || async { sample(&http_get(addr, "/metrics").await.1, &series) },
    )
    .await;
    assert_eq!(since as i64, completed.timestamp(), "{series} {since}");

    // Rows 4 and 5 commit on timeline 1; the primary's pod is deleted and the standby takes
    // over on timeline 2, where 6 commits before the target and 7 and 8 after it.
    for n in [4, 5] {
        sql(
            &bed,
            &ns,
            "client",
            &format!("insert into entries values ({n})"),
        )
        .await;
    }
    let old = named_primary(&bed, &ns, "ledger").await.expect("a primary");
    // Replication is asynchronous: the standby has rows 4 and 5 before the primary goes.
    let standby = ["ledger-0", "ledger-1"]
        .into_iter()
        .find(|p| *p != old)
        .expect("the other instance");
    wait_until("rows 4 and 5 on the standby", READY_WAIT, || async {
        let count = ["psql", "-X", "-U", "postgres", "-d", "app", "-Atc"];
        let query = "select count(*) from entries";
        let (ok, out, _) = bed.exec(&ns, standby, &[&count[..], &[query]].concat());
        (ok && out.trim() == "5").then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods.delete(&old, &DeleteParams::default())
        .await
        .expect("the primary's pod deleted");
    new_primary(&bed, &ns, "ledger", &old).await;
    sql(&bed, &ns, "client", "insert into entries values (6)").await;
    let target = sql(&bed, &ns, "client", NOW).await;
    let later = format!("select clock_timestamp() > '{target}'::timestamptz");
    wait_until("the server's clock past the target", READY_WAIT, || {
        let (ok, out, _) = bed.psql(&ns, "client", "app", &later);
        async move { (ok && out.trim() == "t").then_some(()) }
    })
    .await;
    for n in [7, 8] {
        sql(
            &bed,
            &ns,
            "client",
            &format!("insert into entries values ({n})"),
        )
        .await;
    }
    let last = sql(
        &bed,
        &ns,
        "client",
        "select pg_walfile_name(pg_switch_wal())",
    )
    .await;
    wait_archived(&bed, &ns, &last).await;

    bed.apply_database(
        &ns,
        recovered(
            "ledger-pitr",
            json!({"databaseBackup": base, "recoveryTarget": {"time": target}}),
        ),
    )
    .await;
    let db = wait_initialized(&bed, &ns, "ledger-pitr", "RecoveredToTarget").await;
    let status = db.status.clone().unwrap_or_default();
    let bootstrap = status.bootstrap.expect("status.bootstrap");
    assert_eq!(bootstrap.timeline, Some(3), "{bootstrap:?}");
    let target_time: chrono::DateTime<chrono::Utc> =
        target.parse().unwrap_or_else(|e| panic!("{target}: {e}"));
    let reached = bootstrap.recovered_to.expect("recoveredTo");
    assert!(
        reached <= target_time,
        "reached {reached} after {target_time}"
    );
    assert!(bootstrap.restored_backup_id.is_some(), "{bootstrap:?}");

    bed.wait_for_phase(&ns, "ledger-pitr", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(&ns, "client-pitr", "ledger-pitr", "ledger-pitr-credentials")
        .await;
    let rows = sql(
        &bed,
        &ns,
        "client-pitr",
        "select string_agg(n::text, ',' order by n) from entries",
    )
    .await;
    assert_eq!(rows, "1,2,3,4,5,6", "rows committed before {target}");
    let timeline = sql(
        &bed,
        &ns,
        "client-pitr",
        "select timeline_id from pg_control_checkpoint()",
    )
    .await;
    assert_eq!(timeline, "3", "a timeline after the source's second");

    // Before every base backup: refused with the window, and no server on the volume.
    bed.apply_database(
        &ns,
        recovered(
            "too-early",
            json!({"s3": s3(&endpoint), "database": "ledger",
                   "recoveryTarget": {"time": before_backups}}),
        ),
    )
    .await;
    let db = wait_initialized(&bed, &ns, "too-early", "RecoveryTargetBeforeBackups").await;
    let message = condition_message(&db, "Initialized");
    assert!(message.contains("earliest"), "{message}");
    assert_eq!(db.status.and_then(|s| s.phase), Some(Phase::Failed));
    let (_, out, _) = bed.kubectl(&["-n", &ns, "get", "statefulset", "too-early", "-o", "name"]);
    assert!(out.trim().is_empty(), "a StatefulSet was made: {out}");

    verify_in_a_scratch_instance(&bed, &ns, &base).await;
    recover_through_an_s3_outage(&bed, &ns, &base).await;
}

/// The longest the bucket stays out of reach of a recovery: until its fourth attempt failed.
const OUTAGE: Duration = Duration::from_secs(240);

/// Points the S3 Service at no pod (`away`) or back at the server.
fn s3_service(bed: &TestBed, ns: &str, away: bool) {
    let app = if away { "nowhere" } else { "s3" };
    let patch = format!("{{\"spec\":{{\"selector\":{{\"app\":\"{app}\"}}}}}}");
    let (ok, out, err) = bed.kubectl(&["-n", ns, "patch", "service", "s3", "-p", &patch]);
    assert!(ok, "patching the S3 Service: {out}{err}");
}

/// A recovery to the latest point that starts while the bucket is out of reach: its attempts
/// fail and are retried (more than the three a Job used to allow) until the bucket is back
/// minutes later; then it recovers every row, none lost to an attempt that ended early.
async fn recover_through_an_s3_outage(bed: &TestBed, ns: &str, base: &str) {
    s3_service(bed, ns, true);
    let outage = std::time::Instant::now();
    bed.apply_database(
        ns,
        recovered(
            "ledger-latest",
            json!({"databaseBackup": base, "recoveryTarget": {"latest": true}}),
        ),
    )
    .await;
    // Four failed attempts: one more than a recovery Job used to allow (the Job's back-off
    // puts them about 75 s apart from the first).
    wait_until("four failed recovery attempts", OUTAGE, || async {
        let (_, failed, _) = bed.kubectl(&[
            "-n",
            ns,
            "get",
            "job",
            "ledger-latest-restore",
            "-o",
            "jsonpath={.status.failed}",
        ]);
        (failed.trim().parse::<u32>().unwrap_or(0) >= 4).then_some(())
    })
    .await;
    s3_service(bed, ns, false);
    println!("S3 out of reach of the recovery for {:?}", outage.elapsed());
    let db = wait_initialized(bed, ns, "ledger-latest", "RecoveredToTarget").await;
    let bootstrap = db
        .status
        .and_then(|s| s.bootstrap)
        .expect("status.bootstrap");
    assert_eq!(bootstrap.timeline, Some(3), "{bootstrap:?}");
    bed.wait_for_phase(ns, "ledger-latest", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(
        ns,
        "client-latest",
        "ledger-latest",
        "ledger-latest-credentials",
    )
    .await;
    let rows = sql(
        bed,
        ns,
        "client-latest",
        "select string_agg(n::text, ',' order by n) from entries",
    )
    .await;
    assert_eq!(
        rows, "1,2,3,4,5,6,7,8",
        "every row archived before the outage"
    );
}

/// Scheduled verification of the base backup: a Job recovers it and all the WAL since, across
/// the failover's timeline switch, into a scratch volume of its own, replays to the newest
/// archived file and reads every table; `BackupVerified` says so with the recovery time, and
/// the live server keeps serving.
async fn verify_in_a_scratch_instance(bed: &TestBed, ns: &str, base: &str) {
    bed.databases(ns)
        .patch(
            "ledger",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {"verify": {"schedule": "* * * * *"}}}})),
        )
        .await
        .expect("verify every minute");
    let db = wait_until("BackupVerified", RECOVERED_WAIT, || async {
        let db = bed.databases(ns).get("ledger").await.ok()?;
        condition(&db, "BackupVerified").map(|_| db)
    })
    .await;
    let verification = db
        .status
        .and_then(|s| s.verification)
        .expect("status.verification");
    let message = verification.message.clone().unwrap_or_default();
    assert_eq!(
        verification.outcome.as_deref(),
        Some("Succeeded"),
        "{message}"
    );
    assert!(
        message.contains("every archived WAL file replayed"),
        "{message}"
    );
    // Every table read: at least the 8 rows of `entries` (dbop's own tables may add some).
    let rows: u64 = message
        .rsplit_once(" read whole: ")
        .and_then(|(_, counts)| counts.split(", ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no row count in {message}"));
    assert!(rows >= 8, "{message}");
    assert!(
        verification.last_verified_backup_id.is_some(),
        "{verification:?}"
    );
    assert!(
        verification.recovery_time.is_some(),
        "the recovery time measured: {verification:?}"
    );
    let job = verification.job.expect("the verify Job");
    let (_, volumes, _) = bed.kubectl(&[
        "-n",
        ns,
        "get",
        "job",
        &job,
        "-o",
        "jsonpath={.spec.template.spec.volumes[*].persistentVolumeClaim.claimName}",
    ]);
    assert!(
        volumes.trim().is_empty(),
        "the verification mounted {volumes}"
    );
    println!(
        "base backup {base} verified: {} ({message})",
        verification.recovery_time.unwrap_or_default()
    );
    let rows = sql(bed, ns, "client", "select count(*) from entries").await;
    assert_eq!(rows, "8", "the live server is untouched");
}
