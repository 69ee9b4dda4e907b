//! Continuous WAL archiving for real, on the test bed's real node: a Database with
//! `spec.backup.walArchiving` ships its WAL to an S3 server in a pod. A WAL file nobody closes
//! is archived within `archiveTimeout` (the bound on what a lost volume loses on a quiet
//! server), and so is one closed by `pg_switch_wal()`. Each is proven by bringing the file
//! back from the bucket with the agent in the database pod (`wal-fetch`, which checks its
//! checksum) and finding in it the marker the test wrote. `ContinuousArchiving` says True;
//! while the S3 Service leads nowhere it turns False (`ArchiveFailing`) and the WAL waits; when
//! S3 is back, every file from before the outage to the newest is in the bucket: no gap.

use std::time::Duration;

use dbop::api::{Database, Phase};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, condition, testbed, wait_until, wait_until_or_none};
use kube::Api;
use serde_json::json;

/// A real server: initdb, start, init Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// `archiveTimeout` of the Database (the shortest allowed).
const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an archived file may take to show in `pg_stat_archiver`: the timeout (the
/// checkpointer checks it every `ARCHIVE_TIMEOUT`, so up to twice that after a write) and one
/// upload, with room for a loaded machine — well under PostgreSQL's `checkpoint_timeout` (5
/// minutes), which bounds a checkpointer that was never woken.
const ARCHIVED_WAIT: Duration = Duration::from_secs(90);

/// The operator looks at an archiving Database every minute; a failing `wal-push` gives up
/// after its one-minute deadline.
const CONDITION_WAIT: Duration = Duration::from_secs(240);

/// Waits until the Database's `ContinuousArchiving` is `status` with `reason`.
async fn wait_condition(bed: &TestBed, ns: &str, status: &str, reason: &str) {
    let api: Api<Database> = Api::namespaced(bed.client.clone(), ns);
    let want = (status.to_string(), reason.to_string());
    wait_until(
        &format!("ContinuousArchiving {status} ({reason})"),
        CONDITION_WAIT,
        || {
            let (api, want) = (api.clone(), want.clone());
            async move {
                let db = api.get("archived").await.ok()?;
                (condition(&db, "ContinuousArchiving") == Some(want)).then_some(())
            }
        },
    )
    .await;
}

/// Points the S3 Service at no pod (`away`) or back at the server.
fn s3_service(bed: &TestBed, ns: &str, away: bool) {
    let app = if away { "nowhere" } else { "s3" };
    let patch = format!("{{\"spec\":{{\"selector\":{{\"app\":\"{app}\"}}}}}}");
    let (ok, out, err) = bed.kubectl(&["-n", ns, "patch", "service", "s3", "-p", &patch]);
    assert!(ok, "patching the S3 Service: {out}{err}");
}

/// The WAL file after `file` on its timeline (16 MiB segments).
fn next_wal(file: &str) -> String {
    let (timeline, rest) = file.split_at(8);
    let log = u64::from_str_radix(&rest[..8], 16).expect("hex");
    let seg = u64::from_str_radix(&rest[8..], 16).expect("hex");
    let (log, seg) = if seg == 0xFF {
        (log + 1, 0)
    } else {
        (log, seg + 1)
    };
    format!("{timeline}{log:08X}{seg:08X}")
}

/// The WAL file holding a logical message with `marker` (written now, not transactional).
async fn mark(bed: &TestBed, ns: &str, marker: &str) -> String {
    let sql = format!("select pg_walfile_name(pg_logical_emit_message(false, '{marker}', 'x'))");
    bed.psql_until_ok(ns, "client", "app", &sql, READY_WAIT)
        .await
}

/// Waits until PostgreSQL reports `file` (or a later one) archived with no failure since;
/// panics with what `pg_stat_archiver` says otherwise.
async fn wait_archived(bed: &TestBed, ns: &str, file: &str) {
    let sql = "select coalesce(last_archived_wal, '') || '|' || failed_count || '|' || \
               coalesce(last_failed_wal, '') from pg_stat_archiver";
    let mut last = String::new();
    let done = wait_until_or_none(ARCHIVED_WAIT, || {
        let (ok, out, _) = bed.psql(ns, "client", "app", sql);
        last = out.trim().to_string();
        let archived = last.split('|').next().unwrap_or_default().to_string();
        async move { (ok && archived.as_str() >= file).then_some(()) }
    })
    .await;
    if done.is_none() {
        let (_, server, _) = bed.psql(
            ns,
            "client",
            "app",
            "select current_setting('archive_mode'), current_setting('archive_timeout'), \
             pg_walfile_name(pg_current_wal_lsn()), pg_current_wal_lsn()",
        );
        panic!(
            "{file} not archived within {ARCHIVED_WAIT:?}: pg_stat_archiver says {last:?}; \
             archive_mode, archive_timeout, current WAL: {server}"
        );
    }
}

/// Brings `file` back from the bucket in the database pod and returns the logical messages'
/// prefixes `pg_waldump` finds in it.
fn fetched_markers(bed: &TestBed, ns: &str, file: &str) -> String {
    // pg_waldump reads the position from the file's name.
    let script = "set -e; f=/tmp/fetched/$0; mkdir -p /tmp/fetched; \
                  /dbop/dbop-backup wal-fetch \"$0\" \"$f\"; \
                  test \"$(stat -c %s \"$f\")\" = 16777216; \
                  /usr/lib/postgresql/15/bin/pg_waldump \"$f\" 2>/dev/null | grep -o 'prefix \"[^\"]*\"' || true; \
                  rm -f \"$f\"";
    let (ok, out, err) = bed.exec(ns, "archived-0", &["sh", "-c", script, file]);
    assert!(
        ok,
        "fetching {file} back from the bucket failed: {out}{err}"
    );
    out
}

#[tokio::test]
async fn the_wal_reaches_the_bucket_on_time_and_catches_up_after_an_s3_outage() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("walarch").await;
    let _operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let s3 = json!({"endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
                    "credentials": {"secretName": "s3-creds"}});
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "archived"}, "spec": {
            "version": "15.20",
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "backup": {"schedule": "@yearly", "s3": s3,
                       "walArchiving": {"archiveTimeout": format!("{}s", ARCHIVE_TIMEOUT.as_secs())}},
        }}),
    )
    .await;
    bed.wait_for_phase(&ns, "archived", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(&ns, "client", "archived", "archived-credentials")
        .await;

    // A file nobody closes: archive_timeout does (the instance manager woke PostgreSQL's
    // checkpointer at start, which otherwise honours it only after its first checkpoint), and
    // the agent stores it.
    let quiet = mark(&bed, &ns, "dbop-quiet").await;
    wait_archived(&bed, &ns, &quiet).await;
    let found = fetched_markers(&bed, &ns, &quiet);
    assert!(found.contains("\"dbop-quiet\""), "{quiet}: {found}");

    // A file closed at once.
    let closed = mark(&bed, &ns, "dbop-closed").await;
    assert!(closed > quiet, "{closed} after {quiet}");
    bed.psql_until_ok(&ns, "client", "app", "select pg_switch_wal()", READY_WAIT)
        .await;
    wait_archived(&bed, &ns, &closed).await;
    let found = fetched_markers(&bed, &ns, &closed);
    assert!(found.contains("\"dbop-closed\""), "{closed}: {found}");
    wait_condition(&bed, &ns, "True", "Archiving").await;

    // S3 out of reach: archiving fails, is said to, and the WAL waits on the volume.
    s3_service(&bed, &ns, true);
    let during = mark(&bed, &ns, "dbop-during").await;
    bed.psql_until_ok(&ns, "client", "app", "select pg_switch_wal()", READY_WAIT)
        .await;
    wait_condition(&bed, &ns, "False", "ArchiveFailing").await;
    let after = mark(&bed, &ns, "dbop-after").await;
    bed.psql_until_ok(&ns, "client", "app", "select pg_switch_wal()", READY_WAIT)
        .await;

    // Back: every file from the last one archived before the outage on is in the bucket.
    s3_service(&bed, &ns, false);
    wait_archived(&bed, &ns, &after).await;
    wait_condition(&bed, &ns, "True", "Archiving").await;
    let mut file = next_wal(&closed);
    while file <= after {
        let found = fetched_markers(&bed, &ns, &file);
        if file == during {
            assert!(found.contains("\"dbop-during\""), "{file}: {found}");
        }
        file = next_wal(&file);
    }
    let found = fetched_markers(&bed, &ns, &after);
    assert!(found.contains("\"dbop-after\""), "{after}: {found}");
}

#[test]
fn wal_files_follow_each_other() {
    assert_eq!(
        next_wal("000000010000000000000003"),
        "000000010000000000000004"
    );
    assert_eq!(
        next_wal("0000000200000001000000FF"),
        "000000020000000200000000"
    );
}
