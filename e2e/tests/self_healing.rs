//! Self-healing: an owned object deleted or edited by hand is repaired from the watch event, not
//! by a periodic resync (the steady-state requeue is minutes away). Several samples per object
//! type, each timed by an independent watch from the DELETED event to the replacement's ADDED
//! event (or from the edit to its undoing); prints p50 and max. The bound is loose on purpose:
//! it tells a watch-driven repair from a resync on a loaded 2-core machine; the speed target
//! itself is measured by the benchmarks.

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::watch::{ObjectWatch, p50_max};
use dbop_e2e::{TestBed, WAIT, database_manifest, reconciles, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams, WatchEvent};
use kube::{Api, Resource};
use serde_json::json;

/// Far below the 5-minute steady-state requeue, far above a watch-driven repair (about half a
/// second with today's debounce): a repair within this came from the watch event.
const REPAIR_BOUND: Duration = Duration::from_secs(10);
/// Samples per object type.
const SAMPLES: usize = 5;
/// How long without a reconcile counts as quiet before a sample.
const QUIET: Duration = Duration::from_secs(2);

/// Deletes the object and times its repair from the DELETED event to the replacement's ADDED
/// event, as seen by a watch opened before the delete.
async fn time_repair<K>(api: &Api<K>, name: &str) -> Duration
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut watch = ObjectWatch::start(api, name).await;
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let (old_uid, deleted_at) = watch
        .next("DELETED event", WAIT, |e| match e {
            WatchEvent::Deleted(o) => Some(o.meta().uid.clone()),
            _ => None,
        })
        .await;
    let (_, added_at) = watch
        .next("ADDED event of a replacement", REPAIR_BOUND, |e| match e {
            WatchEvent::Added(o) if o.meta().uid != old_uid => Some(()),
            _ => None,
        })
        .await;
    added_at - deleted_at
}

/// Waits until the Database serves again through a StatefulSet whose pod is ready.
async fn wait_serving(bed: &TestBed, ns: &str, name: &str) {
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), ns);
    wait_until("the StatefulSet to be ready", WAIT, || async {
        let sts = statefulsets.get_opt(name).await.ok()??;
        let status = sts.status?;
        (status.ready_replicas == Some(1)
            && status.replicas == 1
            && status.observed_generation == sts.metadata.generation)
            .then_some(())
    })
    .await;
    bed.wait_for_phase(ns, name, Phase::Ready, WAIT).await;
    wait_reconciles_quiet(ns, name).await;
}

/// Waits until no reconcile of the Database runs or has started for `QUIET`: the operator's own
/// status writes wake it up again for a while after each repair, and a reconcile already under
/// way would repair the next hand edit whether or not its watch event was seen.
async fn wait_reconciles_quiet(ns: &str, name: &str) {
    wait_until("the operator's reconciles to quiet down", WAIT, || async {
        let all = reconciles::of_database(ns, name);
        let running = all.iter().any(|r| r.finished.is_none());
        let quiet = all.last().is_none_or(|r| r.started.elapsed() >= QUIET);
        (!running && quiet).then_some(())
    })
    .await;
}

fn report(what: &str, samples: &[Duration]) {
    let (p50, max) = p50_max(samples).expect("samples");
    println!(
        "e2e: {what}: repaired {} times, p50 {p50:?}, max {max:?} (DELETED → ADDED, independent watch)",
        samples.len()
    );
}

#[tokio::test]
async fn deleted_children_come_back() {
    let bed = testbed().await;
    let ns = bed.namespace("heal").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("heal", json!({})))
        .await;
    bed.wait_for_phase(&ns, "heal", Phase::Ready, WAIT).await;

    let services: Api<Service> = Api::namespaced(bed.client.clone(), &ns);
    let mut samples = vec![];
    for i in 0..SAMPLES {
        let name = if i % 2 == 0 { "heal-rw" } else { "heal-hl" };
        wait_reconciles_quiet(&ns, "heal").await;
        samples.push(time_repair(&services, name).await);
    }
    report("Services heal-rw, heal-hl", &samples);

    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let mut samples = vec![];
    for _ in 0..SAMPLES {
        wait_reconciles_quiet(&ns, "heal").await;
        samples.push(time_repair(&secrets, "heal-credentials").await);
    }
    report("Secret heal-credentials", &samples);

    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    let mut samples = vec![];
    for _ in 0..SAMPLES {
        wait_serving(&bed, &ns, "heal").await;
        samples.push(time_repair(&statefulsets, "heal").await);
    }
    report("StatefulSet heal", &samples);
    wait_serving(&bed, &ns, "heal").await;
}

fn image(sts: &StatefulSet) -> String {
    sts.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

#[tokio::test]
async fn a_hand_edited_statefulset_is_put_back() {
    let bed = testbed().await;
    let ns = bed.namespace("edit").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("edit", json!({})))
        .await;
    bed.wait_for_phase(&ns, "edit", Phase::Ready, WAIT).await;

    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    let original = image(&statefulsets.get("edit").await.unwrap());
    let mut samples = vec![];
    for i in 0..SAMPLES {
        wait_serving(&bed, &ns, "edit").await;
        // A person "fixes" the image, and every other time scales it too, as kubectl edit
        // would (another field manager). The image alone is seen only through the
        // StatefulSet's own watch; a second replica also brings a claim (watched too).
        let edited = format!("postgres:hand-edit-{i}");
        let replicas = if i % 2 == 0 { 1 } else { 2 };
        let edit = json!({"spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "postgres", "image": edited}]}}}});
        let mut watch = ObjectWatch::start(&statefulsets, "edit").await;
        statefulsets
            .patch("edit", &PatchParams::default(), &Patch::Strategic(&edit))
            .await
            .unwrap();
        let is = |e: &WatchEvent<StatefulSet>, want: &str, replicas: i32| match e {
            WatchEvent::Modified(sts) => {
                (image(sts) == want && sts.spec.replicas == Some(replicas)).then_some(())
            }
            _ => None,
        };
        let (_, edited_at) = watch
            .next("MODIFIED event with the edit", WAIT, |e| {
                is(e, &edited, replicas)
            })
            .await;
        let (_, undone_at) = watch
            .next("MODIFIED event undoing the edit", REPAIR_BOUND, |e| {
                is(e, &original, 1)
            })
            .await;
        samples.push(undone_at - edited_at);
    }
    let (p50, max) = p50_max(&samples).expect("samples");
    println!(
        "e2e: StatefulSet edited by hand (image, replicas): put back {} times, p50 {p50:?}, max {max:?}",
        samples.len()
    );
    wait_serving(&bed, &ns, "edit").await;
}
