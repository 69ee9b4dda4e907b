//! Operand images whose `postgres` user is not uid 999, on the test bed's real node (the images
//! are e2e/testbed/images.sh's variants of the Debian-built one): CloudNativePG's layout (uid 26)
//! and Alpine's (uid 70) get their uid from the image's name; an OpenShift-like arbitrary uid
//! with no passwd entry (`spec.podSecurity.runAsUser: 1000650000`) runs with the image's
//! nss_wrapper; and the same uid on an image without nss_wrapper fails the Database with
//! `ImageUserNotFound` instead of crash-looping unexplained, and serves once its uid is fixed in
//! place (dbop replaces the crash-looping pod). Each server answers a query over
//! the local socket (peer authentication, which looks the uid up) from `kubectl exec`.

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::node::{POD_WAIT, POSTGRES_15_18};
use dbop_e2e::{TestBed, condition, condition_message, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use serde_json::{Value, json};

/// A real server: initdb and start, four at once on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(300);
const CNPG_IMAGE: &str = "dbop.local/cloudnative-pg/postgresql:15.18";
const ALPINE_IMAGE: &str = "dbop.local/alpine/postgres:15.18-alpine";
/// A uid from an OpenShift namespace's range: in no image's /etc/passwd.
const ARBITRARY_UID: i64 = 1000650000;

fn database(name: &str, image: &str, pod_security: Option<Value>) -> Value {
    let mut spec = json!({
        "version": "15.18", "image": image,
        "storage": {"size": "1Gi", "storageClassName": dbop_e2e::node::REAL_NODE_STORAGE_CLASS},
        "placement": dbop_e2e::node::real_node_placement(),
    });
    if let Some(p) = pod_security {
        spec["podSecurity"] = p;
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// The pod template's (runAsUser, runAsGroup, fsGroup).
async fn template_ids(
    bed: &TestBed,
    ns: &str,
    name: &str,
) -> (Option<i64>, Option<i64>, Option<i64>) {
    let api = Api::<StatefulSet>::namespaced(bed.client.clone(), ns);
    let sts = wait_until(&format!("StatefulSet {name}"), POD_WAIT, || async {
        api.get_opt(name).await.ok().flatten()
    })
    .await;
    let sc = sts
        .spec
        .template
        .spec
        .and_then(|s| s.security_context)
        .unwrap_or_default();
    (sc.run_as_user, sc.run_as_group, sc.fs_group)
}

/// Ready; the pod runs as `uid`; psql over the local socket (peer) answers as the superuser.
async fn serves_as(bed: &TestBed, ns: &str, name: &str, uid: i64) {
    bed.wait_for_phase(ns, name, Phase::Ready, READY_WAIT).await;
    let pod = format!("{name}-0");
    let (ok, out, err) = bed.exec(ns, &pod, &["id", "-u"]);
    assert!(ok, "id -u in {pod}: {err}");
    assert_eq!(out.trim(), uid.to_string(), "{pod}'s uid");
    // `-U`: an exec'd process has no nss_wrapper, so psql cannot take the OS user's name;
    // the server's peer check looks the uid up through its own.
    let (ok, out, err) = bed.exec(
        ns,
        &pod,
        &[
            "psql",
            "-X",
            "-U",
            "postgres",
            "-Atc",
            "select current_user || ' ' || (6 * 7)",
        ],
    );
    assert!(ok, "psql in {pod}: {err}");
    assert_eq!(out.trim(), "postgres 42", "{pod}");
}

#[tokio::test]
async fn images_of_other_uids_and_an_arbitrary_uid_serve_and_one_without_a_user_says_why() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("operand-uid").await;
    let _operator = bed.operator_for_real_node(&ns);
    let openshift = json!({"runAsUser": ARBITRARY_UID, "runAsGroup": 0, "fsGroup": ARBITRARY_UID});
    for manifest in [
        database("cnpg", CNPG_IMAGE, None),
        database("alpine", ALPINE_IMAGE, None),
        database("openshift", POSTGRES_15_18, Some(openshift.clone())),
        database(
            "nouser",
            ALPINE_IMAGE,
            Some(json!({"runAsUser": ARBITRARY_UID})),
        ),
    ] {
        bed.apply_database(&ns, manifest).await;
    }

    // The defaults from the image's name, and the spec's ids as given.
    assert_eq!(
        template_ids(&bed, &ns, "cnpg").await,
        (Some(26), Some(26), Some(26))
    );
    assert_eq!(
        template_ids(&bed, &ns, "alpine").await,
        (Some(70), Some(70), Some(70))
    );
    assert_eq!(
        template_ids(&bed, &ns, "openshift").await,
        (Some(ARBITRARY_UID), Some(0), Some(ARBITRARY_UID))
    );

    serves_as(&bed, &ns, "cnpg", 26).await;
    serves_as(&bed, &ns, "alpine", 70).await;
    serves_as(&bed, &ns, "openshift", ARBITRARY_UID).await;
    let logs = bed.logs(&ns, "openshift-0");
    assert!(
        logs.contains(&format!(
            "uid {ARBITRARY_UID} has no entry in /etc/passwd: PostgreSQL runs with nss_wrapper"
        )),
        "{logs}"
    );

    // No entry and no nss_wrapper: a condition that says what to set, not a silent crash loop.
    let db = bed
        .wait_for_phase(&ns, "nouser", Phase::Failed, READY_WAIT)
        .await;
    let (status, reason) = condition(&db, "Ready").expect("a Ready condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ImageUserNotFound")
    );
    let message = condition_message(&db, "Ready");
    assert!(
        message.starts_with("pod nouser-0: ")
            && message.contains(&format!("uid {ARBITRARY_UID}"))
            && message.contains("spec.podSecurity.runAsUser"),
        "{message}"
    );

    // Fixed in place (the image's own uid, from its name): the StatefulSet controller waits
    // for the crash-looping pod to become ready before it rolls it, so dbop replaces it.
    bed.apply_database(&ns, database("nouser", ALPINE_IMAGE, None))
        .await;
    serves_as(&bed, &ns, "nouser", 70).await;
}
