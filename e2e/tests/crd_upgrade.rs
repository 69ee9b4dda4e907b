//! The CRD upgrade path of docs/install.md §3, as a user who installed 0.1.0 with Helm meets it:
//! Helm created the CRDs (0.1.0's, `e2e/testbed/crds-0.1.0.yaml`: `crds/` at the end of that
//! version's work), a Database exists under them, and the documented command
//! (`kubectl apply --server-side -f charts/dbop/crds/dbop.dev.yaml`) brings the current ones.
//! It must succeed over Helm's field ownership, warn about nothing, keep the old Database, accept
//! the new fields, and leave a Database the current operator takes to Ready.
//!
//! It deletes and re-creates the cluster's CRDs, so it runs alone (e2e/suites.yaml).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::{TestBed, WAIT, database_manifest, testbed, wait_until, workspace_root};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::DeleteParams;

const CRDS: [&str; 2] = ["databases.dbop.dev", "databasebackups.dbop.dev"];

fn helm(bed: &TestBed, args: &[&str]) -> (bool, String, String) {
    bed.helm(args)
}

/// The chart as it is, but with 0.1.0's CRDs in `crds/`.
fn chart_with_old_crds(dir: &Path) -> std::path::PathBuf {
    let chart = dir.join("dbop");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("charts/dbop"))
        .arg(&chart)
        .status()
        .expect("cp");
    assert!(copied.success(), "copying the chart");
    std::fs::copy(
        workspace_root().join("e2e/testbed/crds-0.1.0.yaml"),
        chart.join("crds/dbop.dev.yaml"),
    )
    .expect("0.1.0's CRDs into the copy");
    chart
}

/// Removes the finalizers of every Database and DatabaseBackup left in the test bed: a CRD is
/// deleted only after its objects, and an object whose operator is gone (another suite's, a
/// run that failed) would hold it forever.
async fn release_leftovers(bed: &TestBed) {
    let (ok, out, err) = bed.kubectl(&[
        "get",
        "databases.dbop.dev,databasebackups.dbop.dev",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name} {.metadata.namespace}{\"\\n\"}{end}",
    ]);
    assert!(ok, "listing leftovers: {err}");
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let Some((object, ns)) = line.split_once(' ') else {
            continue;
        };
        let kind = if object.starts_with("Database/") {
            "databases.dbop.dev"
        } else {
            "databasebackups.dbop.dev"
        };
        let name = object.split_once('/').map(|(_, n)| n).unwrap_or_default();
        let _ = bed.kubectl(&[
            "-n",
            ns,
            "patch",
            kind,
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
    }
}

async fn delete_crds(bed: &TestBed) {
    release_leftovers(bed).await;
    let api: Api<CustomResourceDefinition> = Api::all(bed.client.clone());
    for name in CRDS {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    wait_until("the CRDs gone", Duration::from_secs(120), || async {
        for name in CRDS {
            if api.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
}

async fn crd(bed: &TestBed, name: &str) -> CustomResourceDefinition {
    Api::<CustomResourceDefinition>::all(bed.client.clone())
        .get(name)
        .await
        .expect(name)
}

/// Whether the Database CRD's schema knows `spec.<field>`.
fn knows_spec_field(crd: &CustomResourceDefinition, field: &str) -> bool {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    !schema["openAPIV3Schema"]["properties"]["spec"]["properties"][field].is_null()
}

/// The release's name: its cluster-scoped objects (ClusterRoles) are named after it.
const RELEASE: &str = "crd-upgrade";

/// A release of this suite left by an earlier run that failed (its ClusterRoles would stop the
/// install).
fn uninstall_leftovers(bed: &TestBed) {
    let (ok, out, err) = helm(bed, &["list", "-A", "-o", "json"]);
    assert!(ok, "helm list: {err}");
    let releases: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_default();
    for release in releases.iter().filter(|r| r["name"] == RELEASE) {
        let ns = release["namespace"].as_str().unwrap_or_default();
        let (ok, _, err) = helm(bed, &["uninstall", RELEASE, "-n", ns]);
        assert!(ok, "helm uninstall of a leftover release in {ns}: {err}");
    }
}

#[tokio::test]
async fn crds_helm_created_at_0_1_0_upgrade_with_the_documented_command() {
    let bed = testbed().await;
    uninstall_leftovers(&bed);
    delete_crds(&bed).await;

    // 0.1.0 installed with Helm: Helm creates the CRDs of crds/ (and never touches them again).
    let ns = bed.namespace("crd-upgrade").await;
    // Removed when the test passes (kept to look at when it fails).
    let scratch = std::env::temp_dir().join(format!("dbop-crd-upgrade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let chart = chart_with_old_crds(&scratch);
    let (ok, out, err) = helm(
        &bed,
        &["install", RELEASE, chart.to_str().unwrap(), "-n", &ns],
    );
    assert!(ok, "helm install with 0.1.0's CRDs:\n{err}\n{out}");
    let created = crd(&bed, CRDS[0]).await;
    let managers: Vec<_> = created
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m.contains("helm")),
        "Helm did not create the CRD (managers {managers:?})"
    );
    assert!(
        !knows_spec_field(&created, "application"),
        "the fixture is not 0.1.0's CRD: it knows spec.application"
    );

    // A Database made under 0.1.0's schema.
    let legacy = scratch.join("legacy.yaml");
    std::fs::write(
        &legacy,
        serde_json::to_string(&serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "legacy", "namespace": ns},
            "spec": {"engine": "postgres", "version": "16.4", "storage": {"size": "1Gi"},
                     "deletionPolicy": "Delete"}
        }))
        .unwrap(),
    )
    .unwrap();
    let (ok, _, err) = bed.kubectl(&["apply", "-f", legacy.to_str().unwrap()]);
    assert!(ok, "a Database under 0.1.0's CRD: {err}");

    // The documented upgrade, word for word (docs/install.md §3).
    let current = workspace_root().join("charts/dbop/crds/dbop.dev.yaml");
    let (ok, out, err) = bed.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        current.to_str().unwrap(),
    ]);
    assert!(ok, "the documented CRD upgrade failed:\n{err}\n{out}");
    assert!(
        !err.to_lowercase().contains("warning"),
        "the CRD upgrade warned:\n{err}"
    );
    let upgraded = crd(&bed, CRDS[0]).await;
    assert!(
        knows_spec_field(&upgraded, "application"),
        "the CRD was not upgraded: no spec.application"
    );
    wait_until("the upgraded CRDs established", WAIT, || async {
        let crd = Api::<CustomResourceDefinition>::all(bed.client.clone())
            .get(CRDS[0])
            .await
            .ok()?;
        let conditions = crd.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;

    // The old Database is kept, the new fields are accepted, and the current operator takes both
    // to Ready.
    assert!(
        bed.databases(&ns).get("legacy").await.is_ok(),
        "the Database made under 0.1.0's CRD is gone or unreadable"
    );
    bed.apply_database(
        &ns,
        database_manifest(
            "current",
            serde_json::json!({"application": {"database": "shop", "owner": "shopper"}}),
        ),
    )
    .await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.wait_for_phase(&ns, "legacy", Phase::Ready, WAIT).await;
    let current = bed.wait_for_phase(&ns, "current", Phase::Ready, WAIT).await;
    let application = current.spec.application.expect("spec.application kept");
    assert_eq!(
        application.database, "shop",
        "the new field did not survive"
    );

    let (ok, _, err) = helm(&bed, &["uninstall", RELEASE, "-n", &ns]);
    assert!(ok, "helm uninstall: {err}");
    // What the other suites expect: the current CRDs, applied as every suite applies them.
    bed.install_crds().await;
    let _ = std::fs::remove_dir_all(&scratch);
}
