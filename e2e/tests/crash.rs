//! Crash: the real binary is killed with SIGKILL at several points of provisioning and
//! restarted; the Database converges with no duplicate object and no regenerated password.

use dbop::api::Phase;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

#[tokio::test]
async fn kill_9_during_provisioning_converges_without_duplicates() {
    let bed = testbed().await;
    let ns = bed.namespace("crash").await;
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);

    let mut operator = bed.operator_binary(&ns);
    bed.apply_database(
        &ns,
        database_manifest(
            "sturdy",
            json!({"init": {"sql": "CREATE TABLE t (id int);"}}),
        ),
    )
    .await;
    // Kill it as soon as it has made the Secret: mid-way through its first reconcile.
    let secret = wait_until("the credentials Secret", WAIT, || async {
        secrets.get_opt("sturdy-credentials").await.ok()?
    })
    .await;
    operator.kill9();
    assert!(!operator.is_running());

    // Restart, and kill again once the StatefulSet exists.
    let mut operator = bed.operator_binary(&ns);
    wait_until("the StatefulSet", WAIT, || async {
        statefulsets.get_opt("sturdy").await.ok()?
    })
    .await;
    operator.kill9();

    // Restart, and kill again in the middle of initialisation if we catch it (kwok is quick).
    let mut operator = bed.operator_binary(&ns);
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), &ns);
    wait_until("the init Job", WAIT, || async {
        jobs.get_opt("sturdy-init").await.ok()?
    })
    .await;
    operator.kill9();

    let operator = bed.operator_binary(&ns);
    let db = bed.wait_for_phase(&ns, "sturdy", Phase::Ready, WAIT).await;
    assert!(
        db.status.unwrap().current_version.is_some(),
        "{}",
        operator.log_tail()
    );

    // Exactly one of everything, and the password was never regenerated.
    let selector = ListParams::default().labels("app.kubernetes.io/instance=sturdy");
    let count_secrets = secrets.list(&selector).await.unwrap().items.len();
    let count_sts = statefulsets.list(&selector).await.unwrap().items.len();
    let count_services = Api::<Service>::namespaced(bed.client.clone(), &ns)
        .list(&selector)
        .await
        .unwrap()
        .items
        .len();
    let count_jobs = jobs.list(&selector).await.unwrap().items.len();
    let count_claims = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), &ns)
        .list(&selector)
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(
        (
            count_secrets,
            count_sts,
            count_services,
            count_jobs,
            count_claims
        ),
        (5, 1, 4, 1, 1),
        "secrets (credentials, CA, server certificate, application, accounts), statefulsets, services (-hl, -rw, -ro, -r), jobs, claims"
    );
    let now = secrets.get("sturdy-credentials").await.unwrap();
    assert_eq!(
        now.metadata.uid, secret.metadata.uid,
        "the Secret was not recreated"
    );
    let job = jobs.get("sturdy-init").await.unwrap();
    assert_eq!(
        job.status.unwrap().succeeded,
        Some(1),
        "the init SQL ran once"
    );
}
