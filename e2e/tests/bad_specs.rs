//! Specs the API server admits but dbop cannot run (an unsupported major version, a schedule
//! that never fires, an unknown time zone, a zero timeout, a missing credentials Secret, a
//! placement no node matches) are
//! surfaced as a condition whose message names the field — the complement of `admission.rs`,
//! where the schema refuses what it can judge.

use std::time::Duration;

use dbop_e2e::{TestBed, database_manifest, testbed, wait_until};
use serde_json::{Value, json};

const SURFACED: Duration = Duration::from_secs(60);

fn with_backup(extra: Value) -> Value {
    let mut backup = json!({
        "schedule": "0 2 * * *",
        "s3": {"bucket": "backups", "credentials": {"secretName": "s3-creds"}}
    });
    for (k, v) in extra.as_object().unwrap() {
        backup[k] = v.clone();
    }
    json!({ "backup": backup })
}

/// Waits until the Database's condition `type_` is False with `reason` and a message that
/// names `field`, and returns the message.
async fn surfaced(
    bed: &TestBed,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
    field: &str,
) -> String {
    let api = bed.databases(ns);
    wait_until(
        &format!("{name}: {type_}=False {reason}, naming {field}"),
        SURFACED,
        || async {
            let db = api.get(name).await.ok()?;
            let c = db
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == type_)?;
            (c.status == "False" && c.reason == reason && c.message.contains(field))
                .then_some(c.message)
        },
    )
    .await
}

#[tokio::test]
async fn admitted_but_unrunnable_specs_surface_as_conditions_naming_the_field() {
    let bed = testbed().await;
    let ns = bed.namespace("bad-specs").await;
    let _operator = bed.operator_in_process(&ns).await;
    let table: Vec<(&str, Value, &str, &str, &str)> = vec![
        (
            "old",
            json!({"version": "12.4"}),
            "Ready",
            "UnsupportedVersion",
            "PostgreSQL 12",
        ),
        (
            "no-secret",
            json!({"credentials": {"secretName": "missing"}}),
            "Ready",
            "CredentialsSecretNotFound",
            "spec.credentials.secretName",
        ),
        (
            "nowhere",
            json!({"placement": {"nodeSelector": {"dbop.dev/no-such-node": "true"}}}),
            "Ready",
            "Unschedulable",
            // The scheduler's own reason, passed on (it may first say the claim is not bound).
            "didn't match Pod's node affinity/selector",
        ),
        (
            "never",
            with_backup(json!({"schedule": "0 0 31 2 *"})),
            "BackupHealthy",
            "InvalidBackupSpec",
            "spec.backup.schedule",
        ),
        (
            "minute61",
            with_backup(json!({"schedule": "61 * * * *"})),
            "BackupHealthy",
            "InvalidBackupSpec",
            "spec.backup.schedule",
        ),
        (
            "mars",
            with_backup(json!({"timeZone": "Mars/Olympus"})),
            "BackupHealthy",
            "InvalidBackupSpec",
            "spec.backup.timeZone",
        ),
        (
            "zero",
            with_backup(json!({"timeout": "0s"})),
            "BackupHealthy",
            "InvalidBackupSpec",
            "spec.backup.timeout",
        ),
    ];
    for (name, spec, _, _, _) in &table {
        bed.apply_database(&ns, database_manifest(name, spec.clone()))
            .await;
    }
    for (name, _, type_, reason, field) in &table {
        let message = surfaced(&bed, &ns, name, type_, reason, field).await;
        println!("bad spec {name}: {type_} {reason}: {message}");
    }
}
