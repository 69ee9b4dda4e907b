//! Deletion: the finalizer applies `deletionPolicy` — Retain keeps the data claims (and the
//! credentials that open them), Delete removes them — also for a Database that never finished
//! provisioning.

use dbop::api::Phase;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

async fn delete_and_wait_gone(bed: &dbop_e2e::TestBed, ns: &str, name: &str) {
    let api = bed.databases(ns);
    api.delete(name, &DeleteParams::default()).await.unwrap();
    wait_until(&format!("Database {name} to be gone"), WAIT, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn retain_keeps_the_claim_and_the_credentials() {
    let bed = testbed().await;
    let ns = bed.namespace("retain").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("keep", json!({})))
        .await;
    bed.wait_for_phase(&ns, "keep", Phase::Ready, WAIT).await;
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let password = secrets.get("keep-credentials").await.unwrap().data.unwrap()["password"].clone();

    delete_and_wait_gone(&bed, &ns, "keep").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    // Give the garbage collector time to do anything it would do.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let pvc = claims
        .get("data-keep-0")
        .await
        .expect("the data claim is kept");
    assert!(pvc.metadata.deletion_timestamp.is_none());
    let secret = secrets
        .get("keep-credentials")
        .await
        .expect("the credentials are kept");
    assert!(
        secret
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // A new Database of the same name adopts both: same claim, same password.
    bed.apply_database(&ns, database_manifest("keep", json!({})))
        .await;
    bed.wait_for_phase(&ns, "keep", Phase::Ready, WAIT).await;
    let again = secrets.get("keep-credentials").await.unwrap();
    assert_eq!(
        again.data.unwrap()["password"],
        password,
        "the password that opens the retained data"
    );
    assert_eq!(again.metadata.owner_references.unwrap()[0].kind, "Database");
    assert_eq!(
        claims.get("data-keep-0").await.unwrap().metadata.uid,
        pvc.metadata.uid
    );
}

#[tokio::test]
async fn delete_removes_the_claim() {
    let bed = testbed().await;
    let ns = bed.namespace("delete").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        database_manifest("drop", json!({"deletionPolicy": "Delete"})),
    )
    .await;
    bed.wait_for_phase(&ns, "drop", Phase::Ready, WAIT).await;

    delete_and_wait_gone(&bed, &ns, "drop").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the data claim to be deleted", WAIT, || async {
        let pvc = claims.get_opt("data-drop-0").await.ok()?;
        pvc.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the generated Secret to be collected", WAIT, || async {
        secrets
            .get_opt("drop-credentials")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_database_that_never_provisioned_is_deleted_without_delay() {
    let bed = testbed().await;
    let ns = bed.namespace("never").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        database_manifest(
            "stuck",
            json!({"credentials": {"secretName": "does-not-exist"}, "deletionPolicy": "Delete"}),
        ),
    )
    .await;
    bed.wait_for_phase(&ns, "stuck", Phase::Pending, WAIT).await;
    delete_and_wait_gone(&bed, &ns, "stuck").await;
}
