//! The manifests in `docs/examples/` as a new user applies them: each file, as it is, is accepted
//! by the API server (cert-manager's kinds stood in for by `e2e/testbed/cert-manager-crd.yaml`),
//! and every Database in it, with dbop running, reaches what the example promises on the test
//! bed's kwok nodes: Ready with the condition its feature sets, or, where the example needs
//! something that only the user can make (a backup to restore, a CA, an issuer), a condition that
//! names what to make, and no Warning Event about anything else. Every file has a row in
//! `EXPECTED`, so a new example is checked on purpose, and a row whose file is gone fails too.

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::{TestBed, WAIT, testbed, wait_until, workspace_root};
use k8s_openapi::api::core::v1::Event;
use kube::api::{DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Api, ResourceExt};
use serde::Deserialize;
use serde_json::Value;

/// What one example's Database shows once dbop has acted on it.
struct Expected {
    file: &'static str,
    database: &'static str,
    phase: Phase,
    /// A condition: type, status, reason, and a text its message holds.
    condition: (&'static str, &'static str, &'static str, &'static str),
    /// The reason of the one Warning Event about the Database that is expected (the condition's
    /// own), if any.
    warning: Option<&'static str>,
    /// A `DatabaseBackup` of the example that has Succeeded, if it makes one.
    backup: Option<&'static str>,
}

const EXPECTED: &[Expected] = &[
    Expected {
        file: "database.yaml",
        database: "orders",
        phase: Phase::Ready,
        condition: ("Initialized", "True", "Completed", "init"),
        warning: None,
        backup: None,
    },
    Expected {
        file: "database-with-credentials.yaml",
        database: "billing",
        phase: Phase::Ready,
        condition: ("Initialized", "True", "Completed", "init"),
        warning: None,
        backup: None,
    },
    Expected {
        file: "database-with-backups.yaml",
        database: "orders",
        phase: Phase::Ready,
        condition: (
            "BackupHealthy",
            "True",
            "BackupSucceeded",
            "orders-before-migration",
        ),
        warning: None,
        backup: Some("orders-before-migration"),
    },
    Expected {
        file: "database-backups-aws-irsa.yaml",
        database: "orders",
        phase: Phase::Ready,
        condition: ("BackupHealthy", "True", "FirstBackupNotDue", "T02:00:00Z"),
        warning: None,
        backup: None,
    },
    Expected {
        file: "database-backups-minio.yaml",
        database: "orders",
        phase: Phase::Ready,
        condition: (
            "BackupHealthy",
            "False",
            "S3CaSourceInvalid",
            "ConfigMap minio-ca",
        ),
        warning: Some("S3CaSourceInvalid"),
        backup: None,
    },
    Expected {
        file: "database-with-network-policy.yaml",
        database: "orders",
        phase: Phase::Ready,
        condition: ("NetworkPolicyReady", "True", "Applied", "NetworkPolicy"),
        warning: None,
        backup: None,
    },
    Expected {
        file: "database-cert-manager-issuer.yaml",
        database: "orders",
        // kwok plays the pods, which on a real node would wait for cert-manager's Secret: only
        // the condition is the example's.
        phase: Phase::Ready,
        condition: (
            "TLSReady",
            "False",
            "CertificateSecretInvalid",
            "for Certificate orders-server",
        ),
        warning: None,
        backup: None,
    },
    Expected {
        file: "database-restored.yaml",
        database: "orders-restored",
        phase: Phase::Pending,
        condition: (
            "Initialized",
            "False",
            "BackupNotFound",
            "DatabaseBackup orders-202605010200",
        ),
        warning: Some("Pending"),
        backup: None,
    },
];

/// The documents of a YAML file, as JSON.
fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("a YAML document"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Applies one document as it is (server-side apply), in `ns` when its kind is namespaced.
async fn apply(bed: &TestBed, ns: &str, file: &str, doc: &Value) {
    let (group, version) = match doc["apiVersion"].as_str().expect("apiVersion") {
        gv if gv.contains('/') => gv.split_once('/').unwrap(),
        v => ("", v),
    };
    let kind = doc["kind"].as_str().expect("kind");
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(&bed.client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("{file}: the API server serves no {kind}: {e}"));
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(bed.client.clone(), ns, &resource),
        Scope::Cluster => Api::all_with(bed.client.clone(), &resource),
    };
    let object: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply("e2e-examples"),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("{file}: the API server refused {kind} {name}: {e}"));
}

/// Applies the example in a namespace of its own with dbop running there, and checks it.
async fn check(bed: &TestBed, expected: &Expected) {
    let path = workspace_root().join("docs/examples").join(expected.file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let ns = bed.namespace("example").await;
    let _operator = bed.operator_in_process(&ns).await;
    for doc in documents(&text) {
        apply(bed, &ns, expected.file, &doc).await;
    }
    let (type_, status, reason, text) = expected.condition;
    let what = format!(
        "{}: {} {:?} with {type_}={status} ({reason})",
        expected.file, expected.database, expected.phase
    );
    let databases = bed.databases(&ns);
    let message = wait_until(&what, WAIT, || async {
        let db = databases.get(expected.database).await.ok()?;
        let st = db.status?;
        let c = st.conditions.into_iter().find(|c| c.type_ == type_)?;
        (st.phase == Some(expected.phase) && c.status == status && c.reason == reason)
            .then_some(c.message)
    })
    .await;
    assert!(message.contains(text), "{what}: {message}");
    if let Some(name) = expected.backup {
        let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), &ns);
        let backup = backups.get(name).await.unwrap();
        assert_eq!(
            backup.status.and_then(|s| s.phase),
            Some(BackupPhase::Succeeded),
            "{what}: the on-demand backup"
        );
    }
    let events: Api<Event> = Api::namespaced(bed.client.clone(), &ns);
    let fields = "type=Warning,involvedObject.kind=Database";
    let warnings: Vec<String> = events
        .list(&ListParams::default().fields(fields))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .filter(|r| Some(r.as_str()) != expected.warning)
        .collect();
    assert!(
        warnings.is_empty(),
        "{what}: other Warning Events: {warnings:?}"
    );
}

#[tokio::test]
async fn every_example_is_accepted_and_does_what_it_says() {
    let bed = testbed().await;
    bed.install_crd_file("e2e/testbed/cert-manager-crd.yaml")
        .await;
    let mut files: Vec<String> = std::fs::read_dir(workspace_root().join("docs/examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut rows: Vec<String> = EXPECTED.iter().map(|e| e.file.to_string()).collect();
    rows.sort();
    assert_eq!(files, rows, "docs/examples and the rows of EXPECTED");
    futures::future::join_all(EXPECTED.iter().map(|e| check(&bed, e))).await;
    // The cert-manager example's ClusterIssuer is cluster-wide: not left behind.
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "ClusterIssuer");
    let issuers: Api<DynamicObject> =
        Api::all_with(bed.client.clone(), &kube::api::ApiResource::from_gvk(&gvk));
    issuers
        .delete("corp-ca", &Default::default())
        .await
        .expect("the example's ClusterIssuer deleted");
}
