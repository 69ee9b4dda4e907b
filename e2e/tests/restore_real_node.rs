//! A restore for real, on the test bed's real node: a Database whose init SQL makes roles, owned
//! tables and grants is backed up by a scheduled backup Job to an S3 server in a pod; a second
//! Database created with `spec.bootstrap.fromBackup` (that `DatabaseBackup`) comes up
//! `RestoredFromBackup` with the same fingerprint over every table (rows, owners, grants), and
//! the application's login role logs in with its own password. The backups are encrypted on the
//! client (`spec.backup.encryption`) and dumped in parallel streams (`spec.backup.dumpStreams`,
//! stored in parts): the copy restores them in steps (`restoreStreams`) with the source's key
//! Secret, and a
//! Database given a Secret whose key of that name holds other bytes is refused before anything
//! is restored (`EncryptionKeyRefused`).

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::backup_jobs::succeeded_backup;
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, condition, condition_message, testbed, wait_until_or_none};
use kube::Api;
use serde_json::{Value, json};

/// A real server: initdb, start, init or restore Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// Ready, then the next minute boundary, then the Job (copy, dump, upload).
const BACKUP_WAIT: Duration = Duration::from_secs(240);

/// What an application's init SQL sets up: roles, a schema and tables they own, grants, data.
const INIT_SQL: &str = "\
CREATE ROLE ledger_owner NOLOGIN;
CREATE ROLE ledger_reader NOLOGIN;
CREATE ROLE ledger_app LOGIN PASSWORD 'ledger-app-pw';
GRANT ledger_reader TO ledger_app;
CREATE SCHEMA books AUTHORIZATION ledger_owner;
CREATE TABLE books.accounts (id bigserial PRIMARY KEY, owner text NOT NULL, balance numeric(14,2), tags jsonb);
ALTER TABLE books.accounts OWNER TO ledger_owner;
INSERT INTO books.accounts (owner, balance, tags) SELECT 'owner ' || g, g * 3.14, jsonb_build_object('n', g) FROM generate_series(1, 3000) g;
CREATE TABLE public.transfers (id bigserial PRIMARY KEY, account_id bigint, amount numeric(14,2), memo text);
ALTER TABLE public.transfers OWNER TO ledger_owner;
INSERT INTO public.transfers (account_id, amount, memo) SELECT 1 + g % 3000, g / 7.0, repeat('x', g % 40) FROM generate_series(1, 10000) g;
GRANT USAGE ON SCHEMA books TO ledger_reader;
GRANT SELECT ON books.accounts, public.transfers TO ledger_reader;
CREATE TABLE public.empty_one (id int);
";

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

#[tokio::test]
async fn a_database_restored_from_another_databases_backup_holds_the_same_data() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("restore").await;
    let _operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    keys_secret(&bed, &ns, "backup-keys").await;
    keys_secret(&bed, &ns, "other-keys").await;
    let s3 = json!({"endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
                    "credentials": {"secretName": "s3-creds"}});
    bed.apply_database(
        &ns,
        database(
            "ledger",
            json!({"init": {"sql": INIT_SQL}, "backup": {"schedule": "* * * * *", "s3": s3,
                   "encryption": {"secretName": "backup-keys", "keyName": "k1"},
                   "dumpStreams": 2}}),
        ),
    )
    .await;
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    let source = bed.fingerprint_all(&ns, "client", "app", READY_WAIT).await;
    assert!(
        source.contains("books.accounts owner=ledger_owner")
            && source.contains("rows=3000")
            && source.contains("ledger_reader=r/"),
        "{source}"
    );

    let backup = succeeded_backup(&bed, &ns, None, BACKUP_WAIT).await;
    let name = backup.metadata.name.clone().unwrap();
    let id = backup.status.as_ref().and_then(|s| s.backup_id.clone());
    // The application database in three parts (pre-data, one data stream, the rest), `postgres`
    // (no tables) in one.
    let message = backup.status.as_ref().and_then(|s| s.message.clone());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("2 databases in 4 objects")),
        "{message:?}"
    );
    bed.apply_database(
        &ns,
        database(
            "copy",
            json!({"bootstrap": {"fromBackup": {"databaseBackup": name, "restoreStreams": 2}}}),
        ),
    )
    .await;
    let copy = bed
        .wait_for_phase(&ns, "copy", Phase::Ready, READY_WAIT)
        .await;
    assert_eq!(
        condition(&copy, "Initialized"),
        Some(("True".into(), "RestoredFromBackup".into()))
    );
    let said = condition_message(&copy, "Initialized");
    assert!(said.contains("1 in steps with 2 sessions"), "{said}");
    let restored = copy.status.unwrap().bootstrap.expect("status.bootstrap");
    assert_eq!(restored.restored_backup_id, id);

    bed.psql_client(&ns, "client-copy", "copy", "copy-credentials")
        .await;
    let copied = bed
        .fingerprint_all(&ns, "client-copy", "app", READY_WAIT)
        .await;
    assert_eq!(
        copied, source,
        "the restored Database's tables, owners and grants"
    );
    // The application's own login, with its own password, reads through its group's grant.
    let (ok, out, err) = bed.exec(
        &ns,
        "client-copy",
        &[
            "sh",
            "-c",
            "PGUSER=ledger_app PGPASSWORD=ledger-app-pw exec psql -X -d app -Atc 'SELECT count(*) FROM books.accounts'",
        ],
    );
    assert!(ok && out.trim() == "3000", "ledger_app: {out} {err}");

    // The same backup with another key under the same name: refused, nothing restored.
    bed.apply_database(
        &ns,
        database(
            "wrong",
            json!({"bootstrap": {"fromBackup": {"databaseBackup": name,
                   "encryption": {"secretName": "other-keys"}}}}),
        ),
    )
    .await;
    let refused = wait_until_or_none(READY_WAIT, || async {
        let db = bed.databases(&ns).get("wrong").await.ok()?;
        let (status, reason) = condition(&db, "Initialized")?;
        (status == "False" && reason == "EncryptionKeyRefused").then_some(db)
    })
    .await;
    assert!(refused.is_some(), "the wrong key was not refused");
}

/// A Secret of backup keys with a fresh `k1` (base64 of 32 random bytes).
async fn keys_secret(bed: &TestBed, ns: &str, name: &str) {
    let key: [u8; 32] = rand::random();
    // The key file holds the base64 text (what `openssl rand -base64 32` prints).
    let text = serde_json::to_value(k8s_openapi::ByteString(key.to_vec())).expect("base64");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"k1": text},
    }))
    .expect("a Secret");
    Api::namespaced(bed.client.clone(), ns)
        .create(&Default::default(), &secret)
        .await
        .expect("the keys' Secret");
}
