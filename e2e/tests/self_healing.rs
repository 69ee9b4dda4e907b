//! Self-healing: an owned object deleted or edited by hand is repaired from the watch event
//! (not a periodic resync: the steady-state requeue is minutes away). Prints each repair time.

use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;

/// Far below the 5-minute steady-state requeue: a repair within this came from a watch event.
const REPAIR_DEADLINE: Duration = Duration::from_secs(60);

async fn delete_and_wait_for_return<K>(api: &Api<K>, name: &str) -> Duration
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let before = api.get(name).await.unwrap().meta().uid.clone();
    let start = Instant::now();
    api.delete(name, &DeleteParams::foreground()).await.unwrap();
    wait_until(&format!("{name} to come back"), REPAIR_DEADLINE, || async {
        let now = api.get_opt(name).await.ok()??;
        (now.meta().uid != before && now.meta().deletion_timestamp.is_none()).then_some(())
    })
    .await;
    start.elapsed()
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
    for name in ["heal-rw", "heal-hl"] {
        let took = delete_and_wait_for_return(&services, name).await;
        println!("e2e: Service {name} deleted by hand, repaired in {took:?}");
    }
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let took = delete_and_wait_for_return(&secrets, "heal-credentials").await;
    println!("e2e: Secret heal-credentials deleted by hand, repaired in {took:?}");
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    let took = delete_and_wait_for_return(&statefulsets, "heal").await;
    println!("e2e: StatefulSet heal deleted by hand, repaired in {took:?}");
    bed.wait_for_phase(&ns, "heal", Phase::Ready, WAIT).await;
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
    let image = |sts: &StatefulSet| {
        sts.spec.template.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    let original = image(&statefulsets.get("edit").await.unwrap());
    // A person "fixes" the image and scales it, as kubectl edit would (another field manager).
    let edit = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "postgres", "image": "postgres:latest"}]}}}});
    let start = Instant::now();
    statefulsets
        .patch("edit", &PatchParams::default(), &Patch::Strategic(&edit))
        .await
        .unwrap();
    wait_until("the edit to be undone", REPAIR_DEADLINE, || async {
        let sts = statefulsets.get("edit").await.ok()?;
        (image(&sts) == original && sts.spec.replicas == Some(1)).then_some(())
    })
    .await;
    println!(
        "e2e: StatefulSet edited by hand (image, replicas), put back in {:?}",
        start.elapsed()
    );
    bed.wait_for_phase(&ns, "edit", Phase::Ready, WAIT).await;
}
