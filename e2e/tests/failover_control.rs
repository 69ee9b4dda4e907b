//! The failover's control flow on a real control plane (kwok plays the kubelets; the test plays
//! the instance managers by writing the primary Lease as they would): while the primary renews
//! its Lease nothing moves; when it stops, the operator designates the first ready standby,
//! labels it, records it and says so in one `FailedOver` Event; the operator killed (`kill -9`)
//! right after that designation and started again does not promote a second time while the
//! designated standby takes the Lease; a primary that releases its Lease is replaced at once.

use dbop::api::Phase;
use dbop_e2e::primary_lease::{Renewing, designated, write_as};
use dbop_e2e::{TestBed, WAIT, database_manifest, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

const LEASE: &str = "orders-primary";

async fn failed_over_events(bed: &TestBed, ns: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(bed.client.clone(), ns);
    events
        .list(&ListParams::default().fields("reason=FailedOver"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

async fn role(pods: &Api<Pod>, name: &str) -> Option<String> {
    let pod = pods.get(name).await.ok()?;
    pod.metadata.labels?.get("dbop.dev/role").cloned()
}

async fn status_primary(bed: &TestBed, ns: &str) -> Option<String> {
    bed.databases(ns).get("orders").await.ok()?.status?.primary
}

#[tokio::test]
async fn a_lost_primary_is_replaced_once_even_across_an_operator_kill() {
    let bed = testbed().await;
    let ns = bed.namespace("failover-control").await;
    let mut operator = bed.operator_binary(&ns);
    bed.apply_database(&ns, database_manifest("orders", json!({"instances": 3})))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let leases: Api<Lease> = Api::namespaced(bed.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the Lease designating orders-0", WAIT, || async {
        (designated(&leases, LEASE).await.as_deref() == Some("orders-0")).then_some(())
    })
    .await;

    // orders-0 takes and renews its Lease: for longer than the Lease's duration, nothing moves.
    let primary = Renewing::start(&leases, LEASE, "orders-0");
    primary.for_renewals(7).await;
    assert_eq!(status_primary(&bed, &ns).await.as_deref(), Some("orders-0"));
    assert!(failed_over_events(&bed, &ns).await.is_empty());

    // orders-0 stops renewing (its node is gone): the first ready standby is designated.
    primary.stop();
    wait_until("orders-1 designated", WAIT, || async {
        (designated(&leases, LEASE).await.as_deref() == Some("orders-1")).then_some(())
    })
    .await;
    // The operator dies right after the designation, and comes back.
    operator.kill9();
    let _operator = bed.operator_binary(&ns);
    let new_primary = Renewing::start(&leases, LEASE, "orders-1");
    new_primary.for_renewals(7).await;
    wait_until("orders-1 recorded and labelled", WAIT, || async {
        let recorded = status_primary(&bed, &ns).await.as_deref() == Some("orders-1");
        let labelled = role(&pods, "orders-1").await.as_deref() == Some("primary")
            && role(&pods, "orders-0").await.as_deref() == Some("standby");
        (recorded && labelled).then_some(())
    })
    .await;
    assert_eq!(
        designated(&leases, LEASE).await.as_deref(),
        Some("orders-1")
    );
    // One failover only: never a second Event (a second promotion). The one Event can be
    // missing: an operator killed between its Lease write and its Event does not say it again
    // after its restart (it finds orders-1 designated already) — a known gap (issue 22).
    let events = failed_over_events(&bed, &ns).await;
    assert!(events.len() <= 1, "one failover only: {events:?}");
    for event in &events {
        assert!(
            event.contains("the primary orders-0 is lost")
                && event.contains("has not held the primary Lease for 10 s")
                && event.contains("promoting the standby orders-1"),
            "{event}"
        );
    }

    // orders-1 releases its Lease (its server stopped): replaced at once by orders-0.
    new_primary.stop();
    assert!(write_as(&leases, LEASE, "orders-1", true).await);
    wait_until("orders-0 designated after the release", WAIT, || async {
        (designated(&leases, LEASE).await.as_deref() == Some("orders-0")).then_some(())
    })
    .await;
    // The Event follows the Lease's write: wait for it, not just look once.
    let released = wait_until_or_none(WAIT, || async {
        let events = failed_over_events(&bed, &ns).await;
        events
            .iter()
            .any(|e| e.contains("orders-1 released the primary Lease"))
            .then_some(())
    })
    .await;
    assert!(
        released.is_some(),
        "no Event for the release: {:?}",
        failed_over_events(&bed, &ns).await
    );
}
