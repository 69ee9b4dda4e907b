//! Bad manifests are refused by the real API server at apply time, with a message that says
//! what to fix (schema enums, ranges, patterns and CEL rules from the generated CRDs).

use dbop_e2e::{database_manifest, testbed};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

async fn apply(bed: &dbop_e2e::TestBed, ns: &str, manifest: Value) -> Result<(), String> {
    bed.try_apply_database(ns, manifest).await.map(|_| ())
}

#[tokio::test]
async fn invalid_databases_are_refused_with_a_message() {
    let bed = testbed().await;
    let ns = bed.namespace("admission").await;
    let long_name = "a".repeat(41);
    let table: Vec<(&str, Value, &str)> = vec![
        (
            "version not MAJOR.MINOR",
            database_manifest("v1", json!({"version": "16"})),
            "spec.version",
        ),
        (
            "ids with assignedBy Platform",
            database_manifest(
                "p1",
                json!({"podSecurity": {"assignedBy": "Platform", "runAsUser": 26}}),
            ),
            "assignedBy Platform lets the platform choose the ids",
        ),
        (
            "runAsUser root",
            database_manifest("p0", json!({"podSecurity": {"runAsUser": 0}})),
            "spec.podSecurity.runAsUser",
        ),
        (
            "replicas above 1",
            database_manifest("r1", json!({"replicas": 3})),
            "spec.replicas",
        ),
        (
            "replicas 0",
            database_manifest("r0", json!({"replicas": 0})),
            "spec.replicas",
        ),
        (
            "encryption without keyName",
            database_manifest(
                "k1",
                json!({"backup": {"schedule": "@daily", "s3": {"bucket": "b"},
                                  "encryption": {"secretName": "backup-keys"}}}),
            ),
            "spec.backup.encryption.keyName: Required value",
        ),
        (
            "encryption keyName not a Secret key",
            database_manifest(
                "k2",
                json!({"backup": {"schedule": "@daily", "s3": {"bucket": "b"},
                                  "encryption": {"secretName": "backup-keys", "keyName": "a/b"}}}),
            ),
            "spec.backup.encryption.keyName",
        ),
        (
            "scheduled base backups without WAL archiving",
            database_manifest(
                "m1",
                json!({"backup": {"schedule": "@daily", "s3": {"bucket": "b"},
                                  "method": "Physical"}}),
            ),
            "method Physical needs walArchiving",
        ),
        (
            "unknown backup method",
            database_manifest(
                "m3",
                json!({"backup": {"schedule": "@daily", "s3": {"bucket": "b"},
                                  "method": "Snapshot"}}),
            ),
            "spec.backup.method",
        ),
        (
            "autoGrow maximum below the size",
            database_manifest(
                "g1",
                json!({"storage": {"size": "2Gi", "autoGrow": {"maximum": "1Gi"}}}),
            ),
            "storage.autoGrow.maximum must be at least storage.size",
        ),
        (
            "autoGrow increment neither a quantity nor a percentage",
            database_manifest(
                "g2",
                json!({"storage": {"size": "1Gi",
                                   "autoGrow": {"maximum": "9Gi", "increment": "150%"}}}),
            ),
            "storage.autoGrow.increment must be a positive quantity",
        ),
        (
            "autoGrow threshold too low to leave time",
            database_manifest(
                "g3",
                json!({"storage": {"size": "1Gi",
                                   "autoGrow": {"maximum": "9Gi", "thresholdPercent": 20}}}),
            ),
            "spec.storage.autoGrow.thresholdPercent",
        ),
        (
            "autoGrow without a maximum",
            database_manifest("g4", json!({"storage": {"size": "1Gi", "autoGrow": {}}})),
            "spec.storage.autoGrow.maximum",
        ),
        (
            "unknown engine",
            database_manifest("e1", json!({"engine": "mysql"})),
            "spec.engine",
        ),
        (
            "size not a quantity",
            database_manifest("s1", json!({"storage": {"size": "lots"}})),
            "storage.size must be a positive quantity",
        ),
        (
            "zero size",
            database_manifest("s0", json!({"storage": {"size": "0"}})),
            "storage.size must be a positive quantity",
        ),
        (
            "no storage",
            json!({"metadata": {"name": "s2"}, "spec": {"version": "16.4"}}),
            "spec.storage",
        ),
        (
            "unknown deletion policy",
            database_manifest("d1", json!({"deletionPolicy": "Shred"})),
            "spec.deletionPolicy",
        ),
        (
            "both init sources",
            database_manifest(
                "i1",
                json!({"init": {"sql": "select 1", "configMapRef": {"name": "a", "key": "b"}}}),
            ),
            "init needs exactly one of sql or configMapRef",
        ),
        (
            "no init source",
            database_manifest("i2", json!({"init": {}})),
            "init needs exactly one of sql or configMapRef",
        ),
        (
            "name too long",
            database_manifest(&long_name, json!({})),
            "metadata.name must be at most 40 characters",
        ),
        (
            "name with a dot (not a Service name)",
            database_manifest("orders.v2", json!({})),
            "metadata.name must be a DNS-1035 label",
        ),
        (
            "name with a leading digit (not a Service name)",
            database_manifest("2orders", json!({})),
            "metadata.name must be a DNS-1035 label",
        ),
        (
            "a parameter dbop manages",
            database_manifest(
                "p1",
                json!({"postgresql": {"parameters": {"port": "5433"}}}),
            ),
            "spec.postgresql.parameters.port is managed by dbop",
        ),
        (
            "an ssl parameter",
            database_manifest(
                "p2",
                json!({"postgresql": {"parameters": {"work_mem": "8MB", "ssl_cert_file": "/x"}}}),
            ),
            "spec.postgresql.parameters.ssl_cert_file is managed by dbop",
        ),
        (
            "shared_preload_libraries as a parameter",
            database_manifest(
                "p3",
                json!({"postgresql": {"parameters": {"shared_preload_libraries": "x"}}}),
            ),
            "use spec.postgresql.sharedPreloadLibraries",
        ),
        (
            "a parameter name that is not one",
            database_manifest(
                "p4",
                json!({"postgresql": {"parameters": {"Work-Mem": "8MB"}}}),
            ),
            "spec.postgresql.parameters: a parameter name",
        ),
        (
            "a parameter value on two lines",
            database_manifest(
                "p5",
                json!({"postgresql": {"parameters": {"work_mem": "8MB\nport = 1"}}}),
            ),
            "spec.postgresql.parameters.work_mem",
        ),
        (
            "a trust rule",
            database_manifest(
                "p6",
                json!({"postgresql": {"pgHba": ["host all all 0.0.0.0/0 trust"]}}),
            ),
            "spec.postgresql.pgHba[0]",
        ),
        (
            "a local rule",
            database_manifest(
                "p7",
                json!({"postgresql": {"pgHba": ["local all all scram-sha-256"]}}),
            ),
            "spec.postgresql.pgHba[0]",
        ),
        (
            "issuerRef with serverCertificate",
            database_manifest(
                "t1",
                json!({"tls": {"issuerRef": {"name": "corp-ca"},
                               "serverCertificate": {"secretName": "mine"}}}),
            ),
            "issuerRef and serverCertificate both name where the server certificate comes from",
        ),
        (
            "issuerRef with superuserAuthentication Certificate",
            database_manifest(
                "t2",
                json!({"tls": {"issuerRef": {"name": "corp-ca"},
                               "superuserAuthentication": "Certificate"}}),
            ),
            "remove issuerRef or use Password",
        ),
        (
            "issuerRef of an unknown kind",
            database_manifest(
                "t3",
                json!({"tls": {"issuerRef": {"name": "corp-ca", "kind": "Vault"}}}),
            ),
            "spec.tls.issuerRef.kind",
        ),
    ];
    for (case, manifest, expected) in table {
        match apply(&bed, &ns, manifest).await {
            Ok(()) => panic!("{case}: accepted, expected a refusal mentioning {expected:?}"),
            Err(message) => assert!(message.contains(expected), "{case}: {message}"),
        }
    }
    let settings = json!({"postgresql": {
        "parameters": {"max_connections": "200", "work_mem": "16MB", "pg_stat_statements.max": "5000"},
        "sharedPreloadLibraries": ["pg_stat_statements"],
        "pgHba": ["hostssl all all 10.0.0.0/8 scram-sha-256", "host all all 192.168.0.0 255.255.0.0 reject"]
    }});
    apply(&bed, &ns, database_manifest("settings", settings))
        .await
        .expect("valid PostgreSQL settings accepted");
    let issuer = json!({"tls": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}});
    apply(&bed, &ns, database_manifest("issuer", issuer))
        .await
        .expect("an issuerRef alone accepted");
}

#[tokio::test]
async fn invalid_changes_are_refused_with_a_message() {
    let bed = testbed().await;
    let ns = bed.namespace("changes").await;
    let base =
        json!({"version": "16.4", "storage": {"size": "2Gi", "storageClassName": "standard"}});
    apply(&bed, &ns, database_manifest("live", base.clone()))
        .await
        .expect("valid Database accepted");

    let with = |patch: Value| {
        let mut spec = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            spec[k] = v.clone();
        }
        database_manifest("live", spec)
    };
    let table: Vec<(&str, Value, &str)> = vec![
        (
            "storage shrinks",
            with(json!({"storage": {"size": "1Gi", "storageClassName": "standard"}})),
            "storage.size may not shrink",
        ),
        (
            "storage class changes",
            with(json!({"storage": {"size": "2Gi", "storageClassName": "fast"}})),
            "storage.storageClassName is immutable",
        ),
        (
            "major upgrade",
            with(json!({"version": "17.0"})),
            "version may only move to a newer minor release",
        ),
        (
            "minor downgrade",
            with(json!({"version": "16.3"})),
            "version may only move to a newer minor release",
        ),
        (
            "credentials added later",
            with(json!({"credentials": {"secretName": "other"}})),
            "credentials cannot change after creation",
        ),
    ];
    for (case, manifest, expected) in table {
        match apply(&bed, &ns, manifest).await {
            Ok(()) => panic!("{case}: accepted, expected a refusal mentioning {expected:?}"),
            Err(message) => assert!(message.contains(expected), "{case}: {message}"),
        }
    }
    // A forward minor upgrade and a larger volume are fine.
    apply(
        &bed,
        &ns,
        with(
            json!({"version": "16.5", "storage": {"size": "4Gi", "storageClassName": "standard"}}),
        ),
    )
    .await
    .expect("minor upgrade and growth accepted");
}

/// `spec.podSecurity` may change until the server first ran (`status.currentVersion`), then
/// not: the data directory belongs to the uid that created it.
#[tokio::test]
async fn pod_security_changes_only_until_the_server_ran() {
    let bed = testbed().await;
    let ns = bed.namespace("podsecurity").await;
    let spec =
        |ids: Value| json!({"version": "16.4", "storage": {"size": "1Gi"}, "podSecurity": ids});
    let ids = database_manifest("ids", spec(json!({"runAsUser": 26})));
    apply(&bed, &ns, ids).await.expect("accepted");
    let fixed = database_manifest("ids", spec(json!({"runAsUser": 70})));
    apply(&bed, &ns, fixed)
        .await
        .expect("a change before the server ran is accepted");
    bed.databases(&ns)
        .patch_status(
            "ids",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"currentVersion": "16.4"}})),
        )
        .await
        .expect("status patched");
    let unset = database_manifest(
        "ids",
        json!({"version": "16.4", "storage": {"size": "1Gi"}}),
    );
    for manifest in [
        database_manifest("ids", spec(json!({"runAsUser": 999}))),
        unset,
    ] {
        match apply(&bed, &ns, manifest).await {
            Ok(()) => panic!("a podSecurity change after the server ran was accepted"),
            Err(message) => assert!(
                message.contains("spec.podSecurity cannot change once the server has run"),
                "{message}"
            ),
        }
    }
    let same = database_manifest("ids", spec(json!({"runAsUser": 70})));
    apply(&bed, &ns, same)
        .await
        .expect("an unchanged podSecurity is accepted");
}
