//! The test bed's real node: pods that really run. The locally built PostgreSQL images run the
//! minor version they are named for; a server started in a pod answers psql from another pod
//! through a ClusterIP Service and by its DNS name; the S3 server answers behind a Service;
//! `kubectl logs`/`exec` work; a real-node volume keeps its data when the pod is deleted; and
//! pods of namespaces that did not opt in never land on the real node.

use std::time::Duration;

use dbop_e2e::node::{POSTGRES_15_18, POSTGRES_15_20, REAL_NODE, REAL_NODE_STORAGE_CLASS};
use dbop_e2e::testbed;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Service};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const NET_WAIT: Duration = Duration::from_secs(60);

fn runs_on_real_node(pod: &k8s_openapi::api::core::v1::Pod) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(
        node.as_deref(),
        Some(REAL_NODE),
        "the namespace's pods belong on the real node"
    );
}

#[tokio::test]
async fn postgres_images_run_the_minor_version_they_are_named_for() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("pgversion").await;
    for (image, want) in [(POSTGRES_15_18, "15.18"), (POSTGRES_15_20, "15.20")] {
        let name = format!("version-{}", want.replace('.', "-"));
        bed.create_pod(&ns, &name, json!({}), json!({
            "restartPolicy": "Never",
            "containers": [{"name": "pg", "image": image, "command": ["postgres", "--version"]}],
        }))
        .await;
        let pod = bed
            .wait_pod_phase(&ns, &name, &["Succeeded", "Failed"])
            .await;
        runs_on_real_node(&pod);
        let logs = bed.logs(&ns, &name);
        let expected = format!("postgres (PostgreSQL) {want} (Debian {want}-");
        assert!(logs.starts_with(&expected), "{image}: {logs}");
    }
}

#[tokio::test]
async fn a_postgres_server_in_a_pod_answers_through_a_service_and_by_dns_name() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("pgserver").await;
    // The server: initdb into an emptyDir, trust for the pod network (test only), listen on all.
    let script = "initdb -D /data/pg -U postgres --auth=trust >/dev/null && \
                  echo 'host all all 0.0.0.0/0 trust' >> /data/pg/pg_hba.conf && \
                  exec postgres -D /data/pg -c listen_addresses='*' -k /tmp";
    bed.create_pod(&ns, "pg", json!({"app": "pg"}), json!({
        "securityContext": {"runAsUser": 999, "runAsGroup": 999},
        "containers": [{
            "name": "postgres", "image": POSTGRES_15_20, "command": ["sh", "-c", script],
            "ports": [{"containerPort": 5432}],
            "readinessProbe": {"exec": {"command": ["pg_isready", "-h", "127.0.0.1", "-U", "postgres"]},
                               "periodSeconds": 1},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }))
    .await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "pg"},
        "spec": {"selector": {"app": "pg"}, "ports": [{"port": 5432, "targetPort": 5432}]},
    }))
    .unwrap();
    let svc = Api::<Service>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("service");
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
    bed.create_pod(
        &ns,
        "client",
        json!({}),
        json!({
            "containers": [{"name": "psql", "image": POSTGRES_15_18, "command": ["sleep", "3600"]}],
        }),
    )
    .await;
    let server = bed.wait_pod_ready(&ns, "pg").await;
    runs_on_real_node(&server);
    bed.wait_pod_phase(&ns, "client", &["Running"]).await;

    let query = "select current_setting('server_version_num')";
    let by_ip = bed
        .exec_until_ok(
            &ns,
            "client",
            &["psql", "-h", &cluster_ip, "-U", "postgres", "-Atc", query],
            NET_WAIT,
        )
        .await;
    assert_eq!(
        by_ip.trim(),
        "150020",
        "the server through the ClusterIP {cluster_ip}"
    );
    let dns_name = format!("pg.{ns}.svc.cluster.local");
    let by_name = bed
        .exec_until_ok(
            &ns,
            "client",
            &["psql", "-h", &dns_name, "-U", "postgres", "-Atc", query],
            NET_WAIT,
        )
        .await;
    assert_eq!(by_name.trim(), "150020", "the server through {dns_name}");
    // The short name resolves through the pod's search path, and the client is the other minor.
    let (ok, out, err) = bed.exec(
        &ns,
        "client",
        &["sh", "-c", "getent hosts pg && psql --version"],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains(&cluster_ip),
        "pg resolves to the ClusterIP {cluster_ip}: {out}"
    );
    assert!(out.contains("psql (PostgreSQL) 15.18"), "{out}");
    // The server's log reaches kubectl logs.
    let logs = bed.logs(&ns, "pg");
    assert!(
        logs.contains("database system is ready to accept connections"),
        "{logs}"
    );
}

#[tokio::test]
async fn the_s3_server_answers_behind_a_service() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("s3").await;
    let image = bed.real_node_image("dbop.local/s3s-fs:");
    bed.create_pod(&ns, "s3", json!({"app": "s3"}), json!({
        "containers": [{
            "name": "s3s-fs", "image": image,
            "args": ["--host", "0.0.0.0", "--port", "9000", "--access-key", "test", "--secret-key", "testtest", "/data"],
            "ports": [{"containerPort": 9000}],
            "readinessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }))
    .await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "spec": {"selector": {"app": "s3"}, "ports": [{"port": 80, "targetPort": 9000}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("service");
    bed.create_pod(
        &ns,
        "client",
        json!({}),
        json!({
            "containers": [{"name": "sh", "image": POSTGRES_15_18, "command": ["sleep", "3600"]}],
        }),
    )
    .await;
    runs_on_real_node(&bed.wait_pod_ready(&ns, "s3").await);
    bed.wait_pod_phase(&ns, "client", &["Running"]).await;
    // An unsigned request: the S3 server must answer it with an S3 error document (403).
    let http = "exec 3<>/dev/tcp/s3/80 && printf 'GET / HTTP/1.1\\r\\nHost: s3\\r\\nConnection: close\\r\\n\\r\\n' >&3 && cat <&3";
    let answer = bed
        .exec_until_ok(&ns, "client", &["bash", "-c", http], NET_WAIT)
        .await;
    let status = answer.lines().next().unwrap_or_default();
    assert!(
        status.starts_with("HTTP/1.1 403"),
        "status line {status:?} in {answer}"
    );
    assert!(answer.contains("<Error>"), "an S3 error document: {answer}");
}

#[tokio::test]
async fn a_real_node_volume_keeps_its_data_when_the_pod_is_deleted() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("volume").await;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"storageClassName": REAL_NODE_STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    claims
        .create(&PostParams::default(), &pvc)
        .await
        .expect("claim");
    let token = format!("token-{}", rand::random::<u64>());
    let pod_spec = |command: String| {
        json!({
            "restartPolicy": "Never",
            "containers": [{"name": "sh", "image": POSTGRES_15_18, "command": ["sh", "-c", command],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        })
    };
    bed.create_pod(
        &ns,
        "writer",
        json!({}),
        pod_spec(format!("echo {token} > /data/file && sync")),
    )
    .await;
    let writer = bed
        .wait_pod_phase(&ns, "writer", &["Succeeded", "Failed"])
        .await;
    runs_on_real_node(&writer);
    assert_eq!(
        writer.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded")
    );
    bed.delete_pod(&ns, "writer").await;

    // The data is in a real directory on the node: the PV's local path.
    let pv_name = claims
        .get("data")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound");
    let pv = Api::<PersistentVolume>::all(bed.client.clone())
        .get(&pv_name)
        .await
        .unwrap();
    let path = pv
        .spec
        .and_then(|s| s.local)
        .map(|l| l.path)
        .expect("a local PV");
    let on_disk =
        std::fs::read_to_string(format!("{path}/file")).expect("the file on the node's disk");
    assert_eq!(on_disk.trim(), token);

    bed.create_pod(&ns, "reader", json!({}), pod_spec("cat /data/file".into()))
        .await;
    let reader = bed
        .wait_pod_phase(&ns, "reader", &["Succeeded", "Failed"])
        .await;
    assert_eq!(
        reader.status.and_then(|s| s.phase).as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        bed.logs(&ns, "reader").trim(),
        token,
        "the second pod reads what the first wrote"
    );
}

#[tokio::test]
async fn pods_without_the_real_node_s_placement_stay_on_the_kwok_nodes() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.namespace("kwokonly").await;
    // Not `create_pod`, which gives every pod the real node's placement.
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": POSTGRES_15_18, "command": ["sleep", "3600"]}],
        },
    }))
    .expect("pod spec");
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(bed.client.clone(), &ns)
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .expect("pod created");
    let pod = bed.wait_pod_phase(&ns, "p", &["Running"]).await;
    let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
    assert!(
        node.starts_with("kwok-node-"),
        "a pod without the opt-in landed on {node}"
    );
}
