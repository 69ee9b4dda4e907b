//! Deletion: the finalizer applies `deletionPolicy` — Retain keeps the data claims (and the
//! credentials that open them), Delete removes them — also for a Database that never finished
//! provisioning. Every deletion goes through the Deleting phase (seen by a watch opened before
//! the delete) and ends with a CleanedUp Event that names the policy.

use std::time::{Duration, Instant};

use dbop::api::{Database, Phase};
use dbop_e2e::watch::ObjectWatch;
use dbop_e2e::{TestBed, WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, WatchEvent};
use serde_json::json;

/// Deletes the Database and waits until it is gone; checks it passed through the Deleting
/// phase and that the CleanedUp Event names the policy. Returns how long the deletion took.
async fn delete_and_wait_gone(bed: &TestBed, ns: &str, name: &str, policy: &str) -> Duration {
    let api = bed.databases(ns);
    let mut watch = ObjectWatch::start(&api, name).await;
    let start = Instant::now();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let (events, gone_at) = watch.until_deleted(WAIT).await;
    let phases: Vec<Option<Phase>> = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Modified(db) | WatchEvent::Deleted(db) => Some(phase(db)),
            _ => None,
        })
        .collect();
    assert!(
        phases.contains(&Some(Phase::Deleting)),
        "Database {name} never showed phase Deleting on its way out: {phases:?}"
    );
    let event = cleaned_up_event(bed, ns, name).await;
    assert!(
        event.contains(&format!("deletionPolicy {policy}")),
        "the CleanedUp Event names the policy: {event}"
    );
    gone_at - start
}

fn phase(db: &Database) -> Option<Phase> {
    db.status.as_ref().and_then(|s| s.phase)
}

/// The note of the CleanedUp Event about the Database. It is published before the finalizer
/// is removed, so it exists once the Database is gone.
async fn cleaned_up_event(bed: &TestBed, ns: &str, name: &str) -> String {
    let events = Api::<Event>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .unwrap();
    let reasons: Vec<_> = events
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    events
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("CleanedUp"))
        .and_then(|e| e.note)
        .unwrap_or_else(|| panic!("no CleanedUp Event about {name}: {reasons:?}"))
}

/// Waits until garbage collection has removed what the Database owned (its Services and
/// StatefulSet): after that, anything the collector would take is taken.
async fn wait_owned_objects_collected(bed: &TestBed, ns: &str, name: &str) {
    let services: Api<Service> = Api::namespaced(bed.client.clone(), ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), ns);
    let rw = format!("{name}-rw");
    let hl = format!("{name}-hl");
    wait_until("the owned objects to be collected", WAIT, || async {
        let left = [
            services.get_opt(&rw).await.ok()?.is_some(),
            services.get_opt(&hl).await.ok()?.is_some(),
            statefulsets.get_opt(name).await.ok()?.is_some(),
        ];
        (!left.contains(&true)).then_some(())
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

    delete_and_wait_gone(&bed, &ns, "keep", "Retain").await;
    wait_owned_objects_collected(&bed, &ns, "keep").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    let pvc = claims
        .get("data-keep-0")
        .await
        .expect("the data claim is kept");
    assert!(pvc.metadata.deletion_timestamp.is_none());
    let secret = secrets
        .get("keep-credentials")
        .await
        .expect("the credentials are kept");
    assert!(secret.metadata.deletion_timestamp.is_none());
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

    delete_and_wait_gone(&bed, &ns, "drop", "Delete").await;
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

/// Far below the first retries of a failing cleanup (5 s, then 10 s, …) added up, and below
/// any provisioning timeout: a deletion within this did not wait for provisioning.
const PROMPT_DELETION: Duration = Duration::from_secs(10);

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
    let took = delete_and_wait_gone(&bed, &ns, "stuck", "Delete").await;
    println!("e2e: a Database that never provisioned was deleted in {took:?}");
    assert!(
        took <= PROMPT_DELETION,
        "deleting a Database that never provisioned took {took:?} (more than {PROMPT_DELETION:?})"
    );
}
