//! The Helm chart (`charts/dbop`) with the test bed's own helm (built from Go modules,
//! `.testbed/tools-bin/helm`): `helm lint`, `helm template` judged by the API server
//! (`--dry-run=server`), the RBAC of both modes, and `helm install` for real on the real node —
//! the operator in the cluster as the chart's ServiceAccount through provisioning and a backup,
//! reaching the API server through the `kubernetes` Service. A removed verb is a clear Forbidden.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement, small_resources};
use dbop_e2e::{
    TestBed, WAIT, database_manifest, operator_binary_path, testbed, wait_until,
    wait_until_or_none, workspace_root,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::Role;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

/// A real server (initdb, start, init Job) and then a per-minute backup on a busy machine.
const REAL_WAIT: Duration = Duration::from_secs(240);

fn chart() -> PathBuf {
    workspace_root().join("charts/dbop")
}

fn helm(bed: &TestBed, args: &[&str]) -> (bool, String, String) {
    bed.helm(args)
}

fn helm_ok(bed: &TestBed, args: &[&str]) -> String {
    let (ok, out, err) = helm(bed, args);
    assert!(ok, "helm {} failed:\n{err}\n{out}", args.join(" "));
    out
}

/// Writes a values file (JSON is YAML) into the test bed's directory.
fn values_file(bed: &TestBed, name: &str, values: &Value) -> PathBuf {
    let path = bed.dir.join("helm").join(format!("{name}.values.yaml"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, values.to_string()).unwrap();
    path
}

/// The documents `helm template` rendered, as JSON values.
fn rendered(bed: &TestBed, namespace: &str, set: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec!["template", "rel", chart.to_str().unwrap(), "-n", namespace];
    for s in set {
        args.extend(["--set", s]);
    }
    let yaml = helm_ok(bed, &args);
    yaml.split("\n---")
        .filter_map(|doc| serde_norway::from_str::<Value>(doc).ok())
        .filter(|v| v.is_object())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The verbs a rule list grants on `resource` (e.g. `secrets`, `statefulsets`).
fn verbs(rules: &Value, resource: &str) -> Vec<String> {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|x| x == resource))
        })
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn the_chart_passes_helm_lint_in_every_mode() {
    let bed = testbed().await;
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for set in [
        "replicaCount=2",
        "watchNamespace=apps",
        "watchNamespaces={apps,shop}",
        "leaderElection.enabled=false",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
        // How most Prometheus installs select rules (this once broke rendering); the full matrix
        // is e2e/tests/chart_render.rs, without a cluster.
        "metrics.prometheusRule.enabled=true,metrics.prometheusRule.labels.release=prometheus",
        "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.labels.release=prometheus",
        "imagePullSecrets[0].name=regcred,operandImagePullSecrets[0]=regcred",
    ] {
        let out = helm_ok(&bed, &["lint", "--strict", chart, "--set", set]);
        assert!(
            out.contains("0 chart(s) failed"),
            "helm lint --set {set}:\n{out}"
        );
    }
}

/// Every value is documented: each key of values.yaml has a comment right above it (or is a
/// documented block's plain list/scalar), so `helm show values` reads as the reference.
#[tokio::test]
async fn helm_show_values_documents_every_top_level_value() {
    let bed = testbed().await;
    let text = helm_ok(&bed, &["show", "values", chart().to_str().unwrap()]);
    let lines: Vec<&str> = text.lines().collect();
    let undocumented: Vec<&str> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.starts_with([' ', '#', '-']) && l.contains(':'))
        .filter(|(i, _)| *i == 0 || !lines[i - 1].starts_with('#'))
        .map(|(_, l)| *l)
        .collect();
    assert!(
        undocumented.is_empty(),
        "values without a comment above: {undocumented:?}"
    );
}

/// watchNamespace: a Role and RoleBinding in that namespace, no ClusterRole at all (so no
/// cluster-wide Secret read); watchNamespaces: one of each per namespace; without either a
/// ClusterRole. Pull secrets reach the operator's pod
/// and, as DBOP_IMAGE_PULL_SECRETS, the pods dbop creates.
#[tokio::test]
async fn watch_namespace_mode_grants_only_a_role_in_that_namespace() {
    let bed = testbed().await;
    let docs = rendered(&bed, "dbop-system", &["watchNamespace=apps"]);
    assert!(
        of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty()
    );
    let roles = of_kind(&docs, "Role");
    let main = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == "apps")
        .expect("a Role in the watched namespace");
    assert!(verbs(&main["rules"], "secrets").contains(&"get".to_string()));
    let lease_role = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == "dbop-system")
        .expect("the Lease's Role in the release namespace");
    assert_eq!(
        verbs(&lease_role["rules"], "leases"),
        ["get", "create", "patch"]
    );
    assert!(verbs(&lease_role["rules"], "secrets").is_empty());

    // watchNamespaces: one Role and RoleBinding per namespace (the old single value joins the
    // list once), the operator told all of them, still no ClusterRole.
    let docs = rendered(
        &bed,
        "dbop-system",
        &["watchNamespaces={apps,shop}", "watchNamespace=apps"],
    );
    assert!(
        of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty()
    );
    let in_namespaces = |kind: &str| {
        let mut namespaces: Vec<String> = of_kind(&docs, kind)
            .iter()
            .filter(|d| d["metadata"]["name"] == "rel-dbop")
            .map(|d| {
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        namespaces.sort();
        namespaces
    };
    assert_eq!(in_namespaces("Role"), ["apps", "shop"]);
    assert_eq!(in_namespaces("RoleBinding"), ["apps", "shop"]);
    for role in of_kind(&docs, "Role") {
        if role["metadata"]["name"] == "rel-dbop" {
            assert!(verbs(&role["rules"], "secrets").contains(&"get".to_string()));
        }
    }
    let env = of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(env.contains(&json!({"name": "DBOP_WATCH_NAMESPACES", "value": "apps,shop"})));

    let docs = rendered(&bed, "dbop-system", &[]);
    let cluster = of_kind(&docs, "ClusterRole");
    assert_eq!(cluster.len(), 1);
    // Pods: read for Job results and upgrades, watched for the instances' roles, labelled
    // with their role, deleted by an upgrade's rollback or when stuck; never created.
    assert_eq!(
        verbs(&cluster[0]["rules"], "pods"),
        ["list", "watch", "patch", "delete"]
    );

    let docs = rendered(
        &bed,
        "dbop-system",
        &[
            "imagePullSecrets[0].name=regcred",
            "operandImagePullSecrets={regcred,mirror}",
        ],
    );
    let pod = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "DBOP_IMAGE_PULL_SECRETS", "value": "regcred,mirror"})));
}

/// What helm renders, the API server accepts (schemas, admission) in both modes; `helm install
/// --dry-run=server` too.
#[tokio::test]
async fn the_rendered_chart_is_accepted_by_the_api_server() {
    let bed = testbed().await;
    let ns = bed.namespace("helm-dry").await;
    for (name, set) in [
        ("cluster", vec![]),
        ("namespaced", vec![format!("watchNamespace={ns}")]),
    ] {
        let set: Vec<&str> = set.iter().map(String::as_str).collect();
        let docs = rendered(&bed, &ns, &set);
        let file = bed.dir.join("helm").join(format!("{name}-{ns}.yaml"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(
            &file,
            serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": docs}))
                .unwrap(),
        )
        .unwrap();
        let (ok, out, err) = bed.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            &ns,
            "-f",
            file.to_str().unwrap(),
        ]);
        assert!(
            ok,
            "the API server refused the {name} rendering:\n{err}\n{out}"
        );
        assert!(
            out.contains("deployment.apps/rel-dbop created (server dry run)"),
            "{out}"
        );
    }
    let chart = chart();
    let out = helm_ok(
        &bed,
        &[
            "install",
            "dry",
            chart.to_str().unwrap(),
            "-n",
            &ns,
            "--skip-crds",
            "--dry-run=server",
            "--set",
            &format!("watchNamespace={ns}"),
        ],
    );
    assert!(out.contains("STATUS: pending-install"), "{out}");
}

/// A kubeconfig with the test bed's server and CA and a token of the ServiceAccount.
fn service_account_kubeconfig(bed: &TestBed, ns: &str, sa: &str) -> PathBuf {
    let (ok, token, err) = bed.kubectl(&["-n", ns, "create", "token", sa, "--duration", "1h"]);
    assert!(ok, "kubectl create token: {err}");
    let admin: Value =
        serde_norway::from_str(&std::fs::read_to_string(&bed.kubeconfig).unwrap()).unwrap();
    let cluster = &admin["clusters"][0]["cluster"];
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "testbed", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token.trim()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "testbed", "user": sa, "namespace": ns}}],
    });
    let path = bed.dir.join("helm").join(format!("{ns}-{sa}.kubeconfig"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// The chart installed on kwok (its pods are only statuses there); the operator binary runs
/// with a token of the chart's ServiceAccount: a Database reaches Ready with exactly the
/// chart's Role. Then `create` on StatefulSets is taken away: the next Database's StatefulSet
/// is refused and the operator's log says so, naming the ServiceAccount, verb and resource.
#[tokio::test]
async fn as_the_chart_s_service_account_the_operator_works_and_a_removed_verb_is_a_clear_forbidden()
{
    let bed = testbed().await;
    let release_ns = bed.namespace("helm-rbac-op").await;
    let ns = bed.namespace("helm-rbac-db").await;
    let chart = chart();
    helm_ok(
        &bed,
        &[
            "install",
            "rbac",
            chart.to_str().unwrap(),
            "-n",
            &release_ns,
            "--skip-crds",
            "--set",
            &format!("watchNamespace={ns}"),
            "--set",
            "replicaCount=1",
        ],
    );
    let kubeconfig = service_account_kubeconfig(&bed, &release_ns, "rbac-dbop");
    let operator = bed.operator_binary_with_env(
        &ns,
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("DBOP_LEADER_ELECT", "true"),
            ("DBOP_LEADER_ELECT_LEASE_NAME", "rbac-dbop-leader"),
            ("POD_NAMESPACE", &release_ns),
        ],
    );
    bed.apply_database(&ns, database_manifest("first", json!({})))
        .await;
    bed.wait_for_phase(&ns, "first", Phase::Ready, WAIT).await;

    let roles: Api<Role> = Api::namespaced(bed.client.clone(), &ns);
    let mut role = roles.get("rbac-dbop").await.expect("the chart's Role");
    for rule in role.rules.iter_mut().flatten() {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|x| x == "statefulsets"))
        {
            rule.verbs.retain(|v| v != "create");
        }
    }
    roles
        .replace("rbac-dbop", &PostParams::default(), &role)
        .await
        .expect("Role without create");
    bed.apply_database(&ns, database_manifest("second", json!({})))
        .await;
    let user = format!("system:serviceaccount:{release_ns}:rbac-dbop");
    let found = wait_until_or_none(WAIT, || async {
        let log = std::fs::read_to_string(&operator.log_path).ok()?;
        log.lines()
            .find(|l| {
                l.contains("forbidden")
                    && l.contains(&user)
                    && l.contains("cannot create resource")
                    && l.contains("statefulsets")
            })
            .map(String::from)
    })
    .await;
    assert!(
        found.is_some(),
        "no Forbidden for statefulsets in the log:\n{}",
        operator.log_tail()
    );
}

/// Every write the ServiceAccount made, from the audit log (it records writes only):
/// (resource[/sub], verb, code).
fn requests_of(bed: &TestBed, user: &str) -> Vec<(String, String, u64)> {
    let text = std::fs::read_to_string(bed.dir.join("audit.log")).expect("the audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user)
        .map(|e| {
            let r = &e["objectRef"];
            let resource = match r["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", r["resource"].as_str().unwrap_or("")),
                None => r["resource"].as_str().unwrap_or("").to_string(),
            };
            (
                resource,
                e["verb"].as_str().unwrap_or("").to_string(),
                e["responseStatus"]["code"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// `helm install` for real: the release image (the Dockerfile's: `make static`'s binaries,
/// loaded by `e2e/testbed/dbop-image.sh release`) runs the operator in the cluster (two
/// replicas, leader election on) as the chart's ServiceAccount, and its `dbop-instance` runs
/// the database pod, reaching the API server through the `kubernetes`
/// Service; it provisions a real PostgreSQL and backs it up to an S3 server in a pod; none of
/// its writes is forbidden (audit log) nor any read (its logs); `kubectl dbop psql` runs a
/// query in the database pod.
#[tokio::test]
async fn helm_install_runs_the_operator_in_the_cluster_through_provisioning_and_a_backup() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("helm").await;
    let image = release_image(&bed);
    let (repository, tag) = image
        .rsplit_once(':')
        .expect("an image reference with a tag");
    let values = values_file(
        &bed,
        &ns,
        &json!({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "postgresImageTemplate": "dbop.local/postgres:{version}",
            "watchNamespace": ns,
            "replicaCount": 2,
            "logFormat": "text",
            "leaderElection": {"leaseDurationSeconds": 10, "renewGraceSeconds": 4},
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
            // The operator's pods reach the real node through the chart's own values.
            "nodeSelector": real_node_placement()["nodeSelector"],
            "tolerations": real_node_placement()["tolerations"],
        }),
    );
    let chart = chart();
    let t0 = std::time::Instant::now();
    let out = helm_ok(
        &bed,
        &[
            "install",
            "it",
            chart.to_str().unwrap(),
            "-n",
            &ns,
            "--skip-crds",
            "-f",
            values.to_str().unwrap(),
            "--wait",
            "--timeout",
            "4m",
        ],
    );
    tracing::info!(took = ?t0.elapsed(), "helm install --wait:\n{out}");
    let endpoint = bed.s3_server(&ns, "backups", None).await;

    let mut db = database_manifest("shop", json!({}));
    db["spec"] = json!({
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "resources": small_resources(),
        "backup": {"schedule": "* * * * *", "s3": {
            "endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
            "credentials": {"secretName": "s3-creds"}}},
    });
    bed.apply_database(&ns, db).await;
    let operator_logs = || {
        bed.kubectl(&[
            "-n",
            &ns,
            "logs",
            "-l",
            "app.kubernetes.io/name=dbop",
            "--tail",
            "30",
        ])
        .1
    };
    let ready = wait_until_or_none(REAL_WAIT, || async {
        let db = bed.databases(&ns).get("shop").await.ok()?;
        (db.status.as_ref()?.phase == Some(Phase::Ready)).then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "not Ready; the operator's log:\n{}",
        operator_logs()
    );
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), &ns);
    let finished = wait_until_or_none(REAL_WAIT, || async {
        backups
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|b| {
                matches!(
                    b.status.as_ref().and_then(|s| s.phase),
                    Some(BackupPhase::Succeeded | BackupPhase::Failed)
                )
            })
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no backup finished; the operator's log:\n{}",
            operator_logs()
        )
    });
    let status = finished.status.unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Succeeded),
        "{:?}",
        status.message
    );

    // The leader is one of the chart's pods.
    let lease = Api::<Lease>::namespaced(bed.client.clone(), &ns)
        .get("it-dbop-leader")
        .await
        .expect("the Lease");
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        holder.starts_with("it-dbop-"),
        "the Lease is held by {holder:?}"
    );

    // It ran as the chart's ServiceAccount, and nothing it did was forbidden.
    let requests = requests_of(&bed, &format!("system:serviceaccount:{ns}:it-dbop"));
    assert!(
        requests
            .iter()
            .any(|(r, v, _)| r == "databases/status" && v == "patch"),
        "{requests:?}"
    );
    let forbidden: Vec<_> = requests
        .iter()
        .filter(|(_, _, code)| *code == 403)
        .collect();
    assert!(forbidden.is_empty(), "forbidden requests: {forbidden:?}");
    let mut used: Vec<String> = requests
        .iter()
        .map(|(r, v, _)| format!("{r} {v}"))
        .collect();
    used.sort();
    used.dedup();
    tracing::info!("the operator's writes (resource verb): {used:?}");
    // Reads are not in the audit log: a forbidden list, watch or get shows in the logs.
    let logs = bed
        .kubectl(&[
            "-n",
            &ns,
            "logs",
            "-l",
            "app.kubernetes.io/name=dbop",
            "--tail",
            "-1",
            "--prefix",
        ])
        .1;
    let denied: Vec<&str> = logs.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        denied.is_empty(),
        "forbidden in the operator's logs: {denied:#?}"
    );

    assert_eq!(psql(&bed, &ns, "select 6 * 7").await, "42");
    let before = DatabasePod::now(&bed, &ns).await;
    upgrade_the_operator(&bed, &ns, &values, &holder).await;
    the_upgrade_restarted_no_database(&bed, &ns, &before).await;
    a_restart_moves_the_database_to_the_new_instance_manager(&bed, &ns, &before).await;
}

/// The database pod, and when its postgres started.
#[derive(Debug, PartialEq)]
struct DatabasePod {
    uid: String,
    copy_image: String,
    postmaster_started: String,
}

impl DatabasePod {
    async fn now(bed: &TestBed, ns: &str) -> DatabasePod {
        let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
        let pod = pods.get("shop-0").await.expect("the database pod");
        let copy_image = pod
            .spec
            .and_then(|s| s.init_containers)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.image)
            .expect("the copying init container's image");
        DatabasePod {
            uid: pod.metadata.uid.expect("a pod uid"),
            copy_image,
            postmaster_started: psql(bed, ns, "select pg_postmaster_start_time()").await,
        }
    }
}

/// After `helm upgrade` to another operator image, the database pod is the same pod, its
/// postgres started when it did, and it still runs the old operator's instance manager.
async fn the_upgrade_restarted_no_database(bed: &TestBed, ns: &str, before: &DatabasePod) {
    assert_eq!(before.copy_image, release_image(bed));
    let after = DatabasePod::now(bed, ns).await;
    assert_eq!(
        &after, before,
        "the operator upgrade restarted the database"
    );
}

/// `dbop.dev/restartedAt` on the Database rolls its pod onto the new operator's instance
/// manager: a new postgres start time, and the copying init container runs the new image.
async fn a_restart_moves_the_database_to_the_new_instance_manager(
    bed: &TestBed,
    ns: &str,
    before: &DatabasePod,
) {
    let (ok, _, err) = bed.kubectl(&[
        "-n",
        ns,
        "annotate",
        "database",
        "shop",
        "dbop.dev/restartedAt=2026-12-01T00:00:00Z",
    ]);
    assert!(ok, "kubectl annotate: {err}");
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    wait_until("the restarted database pod is Ready", REAL_WAIT, || async {
        let pod = pods.get("shop-0").await.ok()?;
        let moved = pod.metadata.uid.as_deref() != Some(before.uid.as_str());
        let ready = pod
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (moved && ready).then_some(())
    })
    .await;
    let after = DatabasePod::now(bed, ns).await;
    assert_eq!(after.copy_image, NEXT_OPERATOR_IMAGE);
    assert_ne!(after.postmaster_started, before.postmaster_started);
}

/// The operator image `helm upgrade` moves to: the debug build's (another image than the
/// release one the chart installed).
const NEXT_OPERATOR_IMAGE: &str = "dbop.local/dbop:dev";

/// Upgrading dbop as docs/install.md says: the CRDs first (server-side apply), then `helm
/// upgrade` to another operator image. The Deployment rolls; a pod of the new revision takes the
/// Lease; it serves a backup asked for with `kubectl dbop backup --wait`.
async fn upgrade_the_operator(bed: &TestBed, ns: &str, values: &std::path::Path, old_holder: &str) {
    let crds = chart().join("crds/dbop.dev.yaml");
    let (ok, _, err) = bed.kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()]);
    assert!(ok, "kubectl apply --server-side of the CRDs: {err}");
    let chart = chart();
    helm_ok(
        bed,
        &[
            "upgrade",
            "it",
            chart.to_str().unwrap(),
            "-n",
            ns,
            "-f",
            values.to_str().unwrap(),
            "--set-string",
            "podAnnotations.e2e/revision=2",
            "--set-string",
            &format!(
                "image.tag={}",
                NEXT_OPERATOR_IMAGE.rsplit_once(':').unwrap().1
            ),
            "--wait",
            "--timeout",
            "4m",
        ],
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(bed.client.clone(), ns);
    let leases = Api::<Lease>::namespaced(bed.client.clone(), ns);
    let new_holder = wait_until(
        "a pod of the new revision holds the Lease",
        REAL_WAIT,
        || async {
            let holder = leases
                .get("it-dbop-leader")
                .await
                .ok()?
                .spec?
                .holder_identity?;
            let pod = pods.get(&holder).await.ok()?;
            let revision = pod.metadata.annotations?.get("e2e/revision").cloned();
            (revision.as_deref() == Some("2")).then_some(holder)
        },
    )
    .await;
    assert_ne!(new_holder, old_holder);
    let plugin = operator_binary_path().with_file_name("kubectl-dbop");
    let out = tokio::process::Command::new(&plugin)
        .args(["backup", "shop", "-n", ns, "--wait", "--timeout", "4m"])
        .env("KUBECONFIG", &bed.kubeconfig)
        .output()
        .await
        .expect("kubectl-dbop backup");
    assert!(
        out.status.success(),
        "kubectl dbop backup --wait after the upgrade: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl dbop psql shop -- -tAc QUERY` in the real database pod: its output.
async fn psql(bed: &TestBed, ns: &str, query: &str) -> String {
    let plugin = operator_binary_path().with_file_name("kubectl-dbop");
    let kubectl = bed.dir.join("bin/kubectl");
    let out = wait_until("kubectl dbop psql answers", WAIT, || async {
        let out = tokio::process::Command::new(&plugin)
            .args(["psql", "shop", "-n", ns, "--", "-tAc", query])
            .env("KUBECONFIG", &bed.kubeconfig)
            .env("KUBECTL", &kubectl)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await;
    out.trim().to_string()
}

/// The release image on the real node: `dbop.local/dbop:<version>`, never the debug `:dev`.
fn release_image(bed: &TestBed) -> String {
    let image = bed.real_node_image(&format!("dbop.local/dbop:{}", workspace_version()));
    assert_ne!(image, "dbop.local/dbop:dev");
    image
}

/// The workspace's version (this crate's is the workspace's), which tags the release image.
fn workspace_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The install image, built without Docker (`images.sh release`) from `make static`'s
/// binaries (`make test-e2e` builds them), is what the Dockerfile describes (`check-image.sh`:
/// same files, owners, modes, static binaries, user, entrypoint, command).
#[tokio::test]
async fn the_release_image_built_without_docker_matches_the_dockerfile() {
    let _bed = testbed().await;
    let release = workspace_root().join("target/x86_64-unknown-linux-musl/release");
    for b in ["dbop", "dbop-backup", "dbop-instance"] {
        assert!(
            release.join(b).exists(),
            "no {}: `make static` builds the release binaries (make test-e2e runs it)",
            release.join(b).display()
        );
    }
    let out = Command::new(workspace_root().join("e2e/testbed/images.sh"))
        .arg("release")
        .env("DBOP_RELEASE_BIN_DIR", &release)
        .output()
        .expect("images.sh release");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "images.sh release failed:\n{stderr}");
    let reference = format!("dbop.local/dbop:{} ", workspace_version());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&reference));
    assert!(stderr.contains("matches the Dockerfile"), "{stderr}");
}

/// The most writes the operator sent within any one second (audit log timestamps).
fn busiest_second(bed: &TestBed, ns: &str) -> (usize, usize) {
    let mut at: Vec<chrono::DateTime<chrono::Utc>> = bed
        .operator_writes(ns)
        .iter()
        .filter_map(|w| w.at.parse().ok())
        .collect();
    at.sort();
    let busiest = (0..at.len())
        .map(|i| {
            at[i..]
                .iter()
                .take_while(|t| **t - at[i] < chrono::TimeDelta::seconds(1))
                .count()
        })
        .max()
        .unwrap_or(0);
    (busiest, at.len())
}

/// The chart's `api.qps`/`api.burst` (DBOP_API_QPS/DBOP_API_BURST) bound what the operator
/// sends: with 2 requests per second and a burst of 2, four new Databases still reach Ready,
/// and no second of the audit log holds more than burst + qps = 4 of its writes (without the
/// limit the first second holds many more).
#[tokio::test]
async fn the_api_budget_bounds_the_operator_s_request_rate() {
    let bed = testbed().await;
    let ns = bed.namespace("helm-qps").await;
    let _operator =
        bed.operator_binary_with_env(&ns, &[("DBOP_API_QPS", "2"), ("DBOP_API_BURST", "2")]);
    for i in 0..4 {
        bed.apply_database(&ns, database_manifest(&format!("db{i}"), json!({})))
            .await;
    }
    for i in 0..4 {
        bed.wait_for_phase(
            &ns,
            &format!("db{i}"),
            Phase::Ready,
            Duration::from_secs(240),
        )
        .await;
    }
    let (busiest, writes) = busiest_second(&bed, &ns);
    assert!(writes >= 20, "only {writes} writes");
    assert!(
        busiest <= 4,
        "{busiest} writes within one second (of {writes})"
    );
}
