//! The failover's control flow on a real control plane (kwok plays the kubelets; the test plays
//! the instance managers by writing the primary Lease as they would): while the primary renews
//! its Lease nothing moves; when it stops, the operator designates the first ready standby,
//! labels it, records it and says so in one `FailedOver` Event; the operator killed (`kill -9`)
//! right after that designation and started again does not promote a second time while the
//! designated standby takes the Lease, and its one `FailedOver` Event is not repeated; a
//! primary that releases its Lease is replaced at once. An operator killed after the Event and
//! before the Lease write announces the failover it then carries out only once.

use dbop::api::Phase;
use dbop_e2e::primary_lease::{Renewing, designated, write_as};
use dbop_e2e::{
    OperatorProcess, TestBed, WAIT, database_manifest, testbed, wait_until, wait_until_or_none,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, PostParams};
use kube::{Api, Resource};
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

/// The operator, a Ready Database `orders` of three instances whose Lease designates
/// `orders-0`, the Leases of the namespace, and orders-0's renewals. orders-0 renews from the
/// moment the Lease exists, as its manager would: a designation nobody takes is a lost primary
/// once it is the Lease's 10 s old, and a loaded machine can take that long to report Ready.
async fn three_instances(bed: &TestBed, ns: &str) -> (OperatorProcess, Api<Lease>, Renewing) {
    let operator = bed.operator_binary(ns);
    let leases: Api<Lease> = Api::namespaced(bed.client.clone(), ns);
    let primary = Renewing::start(&leases, LEASE, "orders-0");
    bed.apply_database(ns, database_manifest("orders", json!({"instances": 3})))
        .await;
    bed.wait_for_phase(ns, "orders", Phase::Ready, WAIT).await;
    wait_until("the Lease designating orders-0", WAIT, || async {
        (designated(&leases, LEASE).await.as_deref() == Some("orders-0")).then_some(())
    })
    .await;
    (operator, leases, primary)
}

#[tokio::test]
async fn a_lost_primary_is_replaced_once_even_across_an_operator_kill() {
    let bed = testbed().await;
    let ns = bed.namespace("failover-control").await;
    let (mut operator, leases, primary) = three_instances(&bed, &ns).await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);

    // orders-0 renews its Lease: for longer than the Lease's duration, nothing moves.
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
    // One failover, one Event: published before the Lease write, so the kill after the write
    // cannot lose it, and the restarted operator does not repeat it.
    let events = failed_over_events(&bed, &ns).await;
    assert_eq!(events.len(), 1, "exactly one FailedOver Event: {events:?}");
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

/// The lost primary's last renewal of `lease`, Unix milliseconds, once it has run out.
async fn expired_renewal_ms(leases: &Api<Lease>, lease: &str) -> i64 {
    wait_until("the primary Lease run out", WAIT, || async {
        let spec = leases.get(lease).await.ok()?.spec?;
        let renewed = spec.renew_time?.0.as_millisecond();
        let duration = i64::from(spec.lease_duration_seconds?) * 1000;
        let now = chrono::Utc::now().timestamp_millis();
        (now > renewed + duration + 1000).then_some(renewed)
    })
    .await
}

/// The operator killed after publishing a failover's Event and before writing the Lease that
/// carries the failover out: the restarted operator decides the same failover and designates
/// the standby, and there is still exactly one `FailedOver` Event, the one from before the
/// kill. The state that kill leaves is made here exactly: the operator stopped, the primary's
/// Lease run out, and the Event published under the failover's name.
#[tokio::test]
async fn a_failover_announced_before_a_kill_is_announced_once() {
    let bed = testbed().await;
    let ns = bed.namespace("failover-announced").await;
    let (mut operator, leases, primary) = three_instances(&bed, &ns).await;
    primary.for_renewals(2).await;
    operator.kill9();
    primary.stop();
    let renewed = expired_renewal_ms(&leases, LEASE).await;

    let database = bed.databases(&ns).get("orders").await.expect("orders");
    let note = "published by the operator just before it was killed";
    let event = EventsV1Event {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("orders.failedover.orders-0.{renewed}")),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some("Reconcile".into()),
        reason: Some("FailedOver".into()),
        note: Some(note.into()),
        type_: Some("Warning".into()),
        regarding: Some(database.object_ref(&())),
        reporting_controller: Some("dbop".into()),
        reporting_instance: Some("dbop".into()),
        ..Default::default()
    };
    let events: Api<EventsV1Event> = Api::namespaced(bed.client.clone(), &ns);
    events
        .create(&PostParams::default(), &event)
        .await
        .expect("the Event of the failover");

    let _operator = bed.operator_binary(&ns);
    wait_until("orders-1 designated", WAIT, || async {
        (designated(&leases, LEASE).await.as_deref() == Some("orders-1")).then_some(())
    })
    .await;
    let new_primary = Renewing::start(&leases, LEASE, "orders-1");
    new_primary.for_renewals(3).await;
    wait_until("orders-1 recorded", WAIT, || async {
        (status_primary(&bed, &ns).await.as_deref() == Some("orders-1")).then_some(())
    })
    .await;
    let announced = failed_over_events(&bed, &ns).await;
    assert_eq!(announced, [note], "exactly the Event from before the kill");
}
