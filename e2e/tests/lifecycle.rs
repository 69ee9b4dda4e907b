//! A Database's life on a real control plane: it reaches Ready with everything it owns, grows
//! its volume, and says what to fix when a reference is wrong.

use dbop::api::Phase;
use dbop_e2e::{WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_database_reaches_ready_with_everything_it_owns() {
    let bed = testbed().await;
    let ns = bed.namespace("ready").await;
    let _operator = bed.operator_in_process(&ns).await;
    let started = std::time::Instant::now();
    bed.apply_database(
        &ns,
        database_manifest(
            "orders",
            json!({"init": {"sql": "CREATE TABLE orders (id bigint primary key);"}}),
        ),
    )
    .await;
    let db = bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    println!(
        "e2e: Database orders reached Ready in {:?}",
        started.elapsed()
    );

    let status = db.status.clone().unwrap();
    assert_eq!(status.observed_generation, db.metadata.generation);
    assert_eq!(status.current_version.as_deref(), Some("16.4"));
    assert_eq!(status.target_version.as_deref(), Some("16.4"));
    assert_eq!(
        status.endpoint.as_deref(),
        Some(format!("orders-rw.{ns}.svc").as_str())
    );
    assert_eq!(
        condition(&db, "Ready"),
        Some(("True".into(), "DatabaseReady".into()))
    );
    assert_eq!(
        condition(&db, "StorageReady"),
        Some(("True".into(), "Bound".into()))
    );
    assert_eq!(
        condition(&db, "Initialized"),
        Some(("True".into(), "Completed".into()))
    );
    assert_eq!(
        condition(&db, "Upgrading"),
        Some(("False".into(), "NoUpgrade".into()))
    );
    assert!(
        db.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&dbop::FINALIZER.to_string())
    );

    let c = &bed.client;
    let secret = Api::<Secret>::namespaced(c.clone(), &ns)
        .get("orders-credentials")
        .await
        .unwrap();
    assert_eq!(secret.data.as_ref().unwrap()["password"].0.len(), 32);
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Database", "orders")
    );
    for name in ["orders-hl", "orders-rw", "orders-ro", "orders-r"] {
        Api::<Service>::namespaced(c.clone(), &ns)
            .get(name)
            .await
            .unwrap();
    }
    let sts = Api::<StatefulSet>::namespaced(c.clone(), &ns)
        .get("orders")
        .await
        .unwrap();
    assert_eq!(sts.status.unwrap().ready_replicas, Some(1));
    // The claim was made by the real StatefulSet controller and bound by the real PV binder.
    let pvc = Api::<PersistentVolumeClaim>::namespaced(c.clone(), &ns)
        .get("data-orders-0")
        .await
        .unwrap();
    assert_eq!(pvc.status.unwrap().phase.as_deref(), Some("Bound"));
    let job = Api::<Job>::namespaced(c.clone(), &ns)
        .get("orders-init")
        .await
        .unwrap();
    assert_eq!(job.status.unwrap().succeeded, Some(1));

    // `kubectl describe` shows the way there.
    let events = Api::<Event>::namespaced(c.clone(), &ns)
        .list(&ListParams::default().fields("regarding.name=orders"))
        .await
        .unwrap();
    let reasons: Vec<String> = events
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
    for phase in ["Provisioning", "Initializing", "Ready"] {
        assert!(
            reasons.iter().any(|r| r == phase),
            "no {phase} Event in {reasons:?}"
        );
    }
}

#[tokio::test]
async fn a_larger_storage_size_expands_the_claim() {
    let bed = testbed().await;
    let ns = bed.namespace("grow").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("grow", json!({})))
        .await;
    bed.wait_for_phase(&ns, "grow", Phase::Ready, WAIT).await;

    bed.apply_database(
        &ns,
        database_manifest("grow", json!({"storage": {"size": "3Gi"}})),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the claim to request 3Gi", WAIT, || async {
        let pvc = claims.get("data-grow-0").await.ok()?;
        let requested = pvc.spec?.resources?.requests?.get("storage")?.0.clone();
        (requested == "3Gi").then_some(())
    })
    .await;
    // The StatefulSet's claim template is immutable and was left alone.
    let sts = Api::<StatefulSet>::namespaced(bed.client.clone(), &ns)
        .get("grow")
        .await
        .unwrap();
    let template = &sts.spec.volume_claim_templates.unwrap()[0];
    assert_eq!(
        template
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"]
            .0,
        "1Gi"
    );
    // The status of the new generation, read after the wait (not the object from before it).
    let status = wait_until("observedGeneration to catch up", WAIT, || async {
        let db = bed.databases(&ns).get("grow").await.ok()?;
        let status = db.status?;
        (status.observed_generation == db.metadata.generation).then_some(status)
    })
    .await;
    assert_eq!(status.phase, Some(Phase::Ready), "{status:#?}");
}

#[tokio::test]
async fn a_missing_credentials_secret_says_what_to_fix_and_recovers() {
    let bed = testbed().await;
    let ns = bed.namespace("creds").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(
        &ns,
        database_manifest(
            "billing",
            json!({"credentials": {"secretName": "billing-admin"}}),
        ),
    )
    .await;
    let db = bed
        .wait_for_phase(&ns, "billing", Phase::Pending, WAIT)
        .await;
    let ready = db
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.reason, "CredentialsSecretNotFound");
    assert!(
        ready.message.contains("billing-admin") && ready.message.contains("password"),
        "{}",
        ready.message
    );
    // Nothing was created for a database that cannot start.
    let sts: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    assert!(sts.get_opt("billing").await.unwrap().is_none());
    // The Event follows the status that announces the phase: wait for it, not one look.
    let events = Api::<Event>::namespaced(bed.client.clone(), &ns);
    wait_until("a Warning Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("regarding.name=billing"))
            .await
            .ok()?;
        list.items
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning"))
            .then_some(())
    })
    .await;

    // The user fixes it: the database proceeds on its own.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "billing-admin"},
        "stringData": {"username": "postgres", "password": "correct-horse-battery-staple"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    bed.wait_for_phase(&ns, "billing", Phase::Ready, WAIT).await;
}

#[tokio::test]
async fn an_unsupported_version_fails_with_a_reason_and_creates_nothing() {
    let bed = testbed().await;
    let ns = bed.namespace("version").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("legacy", json!({"version": "9.6"})))
        .await;
    let db = bed.wait_for_phase(&ns, "legacy", Phase::Failed, WAIT).await;
    assert_eq!(
        condition(&db, "Ready"),
        Some(("False".into(), "UnsupportedVersion".into()))
    );
    let sts: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    assert!(sts.get_opt("legacy").await.unwrap().is_none());
}
