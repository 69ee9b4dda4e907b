//! Request-shape tests of one Database reconcile against a mocked API server: which requests
//! the act layer sends, with which field manager and bodies. Reads are answered from a table of
//! objects; every write is recorded. The real API server is exercised by the e2e suites.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{TimeZone, Utc};
use dbop::api::{Database, DatabaseSpec};
use dbop::context::Context;
use dbop::context::caches::{self, Cached, Caches};
use dbop::database::reconcile_database;
use dbop::database::{decide, facts, status};
use dbop::resources::init_job::init_job;
use dbop::resources::{
    accounts, credentials, network_policy, primary_lease, replication, server_config, services,
    short_digest, statefulset, tls,
};
use dbop::settings::Settings;
use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::client::Body;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

/// A request the operator sent.
#[derive(Debug, Clone)]
struct Sent {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

impl Sent {
    fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// Runs one reconcile of `db` against a mock server that knows `objects` (by request path).
async fn reconcile_against(db: &Database, objects: HashMap<String, Value>) -> Vec<Sent> {
    let objects_for_caches = objects.clone();
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let db_json = serde_json::to_value(db).unwrap();
    let server = tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let record = Sent {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap_or_default().to_string())
                    .unwrap_or_default(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (status, mut reply) = answer(&record, &objects);
            if record.path.ends_with("/status") {
                // A status write answers with the whole object.
                let mut whole = db_json.clone();
                whole["status"] = reply["status"].clone();
                reply = whole;
            }
            log.lock().unwrap().push(record);
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            respond.send_response(response);
        }
    });
    let client = kube::Client::new(service, "default");
    let ctx = Context::new(client, Settings::default(), cached(&objects_for_caches));
    reconcile_database(&ctx, db)
        .await
        .expect("reconcile succeeds");
    drop(ctx);
    server.await.unwrap();
    let sent = Arc::try_unwrap(sent).unwrap().into_inner().unwrap();
    let grants = chart_grants();
    for request in &sent {
        let (group, resource, verb) = rbac_of(request);
        assert!(
            grants
                .iter()
                .any(|(g, r, v)| *g == group && *r == resource && v.contains(&verb)),
            "the chart's RBAC does not grant {verb} on {group:?} {resource} ({} {}): charts/dbop/templates/_helpers.tpl",
            request.method,
            request.path
        );
    }
    sent
}

/// What the chart grants the operator (cluster-wide mode): the rules of `dbop.rules` in
/// charts/dbop/templates/_helpers.tpl — plain YAML whose lists are JSON — and the ClusterRole's
/// own (nodes, storage classes), as (API group, resource, verbs).
fn chart_grants() -> Vec<(String, String, Vec<String>)> {
    let helpers = include_str!("../charts/dbop/templates/_helpers.tpl");
    let start = helpers.find(r#"define "dbop.rules""#).expect("dbop.rules");
    let rules = &helpers[start..];
    let rules = &rules[..rules.find("{{- end }}").expect("its end")];
    let list = |line: &str, key: &str| -> Option<Vec<String>> {
        let value = line.trim().trim_start_matches("- ").strip_prefix(key)?;
        Some(serde_json::from_str(value.trim()).expect("a JSON list"))
    };
    let mut grants = vec![
        (
            String::new(),
            "nodes".into(),
            vec!["list".into(), "watch".into()],
        ),
        (
            "storage.k8s.io".into(),
            "storageclasses".into(),
            vec!["get".into()],
        ),
    ];
    let (mut groups, mut resources) = (vec![], vec![]);
    for line in rules.lines() {
        if let Some(g) = list(line, "apiGroups:") {
            groups = g;
        } else if let Some(r) = list(line, "resources:") {
            resources = r;
        } else if let Some(verbs) = list(line, "verbs:") {
            for group in &groups {
                for resource in &resources {
                    grants.push((group.clone(), resource.clone(), verbs.clone()));
                }
            }
        }
    }
    grants
}

/// The API group, resource (with its subresource) and RBAC verb of a request.
fn rbac_of(request: &Sent) -> (String, String, String) {
    let parts: Vec<&str> = request.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => panic!("not an API path: {}", request.path),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => panic!("unexpected path: {}", request.path),
    };
    let verb = match (request.method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if request.query.contains("watch=true") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", _) => "delete",
        (method, _) => panic!("unexpected method {method}"),
    };
    (group, resource, verb.to_string())
}

/// The watch caches as the operator's watches would fill them: every object of the table whose
/// kind dbop watches (the API server still answers for the others, e.g. the user's Secrets).
fn cached(objects: &HashMap<String, Value>) -> Caches {
    let (caches, mut writers) = caches::caches();
    for object in objects.values() {
        let labelled = object["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dbop";
        let value = object.clone();
        match object["kind"].as_str().unwrap_or_default() {
            "StatefulSet" if labelled => apply(&mut writers.statefulsets, value),
            "Service" if labelled => apply(&mut writers.services, value),
            "Job" if labelled => apply(&mut writers.jobs, value),
            "PersistentVolumeClaim" if labelled => apply(&mut writers.claims, value),
            "Secret" if labelled => apply(&mut writers.secrets, value),
            "ConfigMap" if labelled => apply(&mut writers.config_maps, value),
            "Pod" if labelled => apply(&mut writers.pods, value),
            "DatabaseBackup" => apply(&mut writers.backups, value),
            "Lease" if labelled => apply(&mut writers.leases, value),
            "NetworkPolicy" if labelled => apply(&mut writers.network_policies, value),
            _ => {}
        }
    }
    writers.mark_all_synced();
    caches
}

/// `object` stored as its watch would store it (decoded, slimmed, packed: `Cached`).
fn apply<S: Cached>(writer: &mut Writer<S>, object: Value) {
    let object: S::Watched = serde_json::from_value(object).expect("an object of its kind");
    writer.apply_watcher_event(&Event::Apply(S::from_watched(object)));
}

/// GETs come from the table (404 when absent, an empty list for collections); writes echo
/// their body back, as the API server does.
fn answer(request: &Sent, objects: &HashMap<String, Value>) -> (StatusCode, Value) {
    if objects.contains_key(NO_CERT_MANAGER) && request.path.starts_with(CERT_MANAGER_API) {
        // The API server without cert-manager's CRD: 404 to every request of its resources.
        return (
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "the server could not find the requested resource"}),
        );
    }
    if request.method == "GET" {
        if let Some(object) = objects.get(&request.path) {
            return (StatusCode::OK, object.clone());
        }
        let segments = request.path.trim_end_matches('/').split('/').count();
        // /api/v1/namespaces/NS/KIND has 6 segments (with the leading empty one), named objects 7.
        let is_collection = (request.path.starts_with("/api/") && segments == 6)
            || (request.path.starts_with("/apis/") && segments == 7);
        if is_collection {
            return (
                StatusCode::OK,
                json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
            );
        }
        return (
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );
    }
    if request.method == "DELETE" {
        return (
            StatusCode::OK,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
        );
    }
    let mut body = request.body.clone();
    if body.get("metadata").is_none() {
        body["metadata"] = json!({"name": "x", "namespace": "shop"});
    }
    (StatusCode::OK, body)
}

fn database() -> Database {
    let spec: DatabaseSpec =
        serde_json::from_value(json!({"version": "16.4", "storage": {"size": "1Gi"}})).unwrap();
    let mut db = Database::new("orders", spec);
    db.metadata.namespace = Some("shop".into());
    db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
    db.metadata.generation = Some(1);
    db.metadata.resource_version = Some("10".into());
    db.metadata.finalizers = Some(vec![dbop::FINALIZER.into()]);
    db
}

/// The objects of a Ready database as the API server would hold them.
fn ready_world(db: &Database) -> HashMap<String, Value> {
    let settings = Settings::default();
    let ns = "/api/v1/namespaces/shop";
    let mut sts = serde_json::to_value(statefulset::statefulset(db, &settings, None)).unwrap();
    sts["metadata"]["generation"] = json!(1);
    sts["metadata"]["resourceVersion"] = json!("5");
    sts["spec"]["revisionHistoryLimit"] = json!(10);
    sts["status"] = json!({
        "observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
        "currentRevision": "orders-abc", "updateRevision": "orders-abc"
    });
    let mut rw = serde_json::to_value(services::read_write(db)).unwrap();
    rw["spec"]["clusterIP"] = json!("10.0.0.12");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orders-0", "namespace": "shop", "labels": {
            "app.kubernetes.io/managed-by": "dbop", "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/name": "postgresql", "app.kubernetes.io/component": "database",
            "dbop.dev/role": "primary"
        }},
        "spec": {"nodeName": "node-a", "containers": []},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    });
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data-orders-0", "namespace": "shop", "labels": {
            "app.kubernetes.io/managed-by": "dbop", "app.kubernetes.io/instance": "orders"
        }},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "100Gi"}}
    }))
    .unwrap();
    let mut credentials = credentials::generated_secret(db, "pw");
    credentials.metadata.annotations =
        Some([(tls::CA_ID_ANNOTATION.to_string(), tls::ca_id("CA"))].into());
    let server = tls::ServerCertificate {
        cert_pem: "CERT".into(),
        key_pem: "KEY".into(),
        ca_cert_pem: "CA".into(),
        not_after: Utc::now() + chrono::Duration::days(80),
        names: tls::dns_names(db),
    };
    let mut application = accounts::application_secret(db, "app-pw");
    application.metadata.resource_version = Some("3".into());
    let inputs = accounts::inputs(db, &[Some("3".into())]);
    let accounts_secret = accounts::accounts_secret(db, "app-pw", &Default::default(), &inputs);
    HashMap::from([
        (
            format!("{ns}/secrets/orders-credentials"),
            serde_json::to_value(credentials).unwrap(),
        ),
        (
            format!("{ns}/secrets/orders-app"),
            serde_json::to_value(application).unwrap(),
        ),
        (
            format!("{ns}/secrets/orders-accounts"),
            serde_json::to_value(accounts_secret).unwrap(),
        ),
        (
            format!("{ns}/secrets/orders-ca"),
            serde_json::to_value(tls::ca_secret(db, "CA", "KEY")).unwrap(),
        ),
        (
            format!("{ns}/secrets/orders-server-tls"),
            serde_json::to_value(tls::server_secret(db, &server)).unwrap(),
        ),
        (
            format!("{ns}/services/orders-hl"),
            serde_json::to_value(services::headless(db)).unwrap(),
        ),
        (format!("{ns}/services/orders-rw"), rw),
        (
            format!("{ns}/services/orders-ro"),
            serde_json::to_value(services::read_only(db)).unwrap(),
        ),
        (
            format!("{ns}/services/orders-r"),
            serde_json::to_value(services::any_ready(db)).unwrap(),
        ),
        (format!("{ns}/pods/orders-0"), pod),
        (
            "/apis/apps/v1/namespaces/shop/statefulsets/orders".into(),
            sts,
        ),
        (
            format!("{ns}/persistentvolumeclaims/data-orders-0"),
            serde_json::to_value(pvc).unwrap(),
        ),
        (
            format!("{ns}/configmaps/orders-config"),
            serde_json::to_value(server_config::server_config_map(
                db,
                &dbop::resources::replication::topology(db, "orders-0"),
                "postgres",
            ))
            .unwrap(),
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/shop/leases/orders-primary".into(),
            primary_lease_of(db),
        ),
    ])
}

/// A Database with `spec.networkPolicy` (one client peer, Prometheus' namespace for metrics).
fn database_with_network_policy() -> Database {
    let mut db = database();
    db.spec.network_policy = Some(
        serde_json::from_value(json!({
            "allowFrom": [{"podSelector": {"matchLabels": {"app": "orders-api"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        }))
        .unwrap(),
    );
    db
}

const NETWORK_POLICY: &str = "/apis/networking.k8s.io/v1/namespaces/shop/networkpolicies/orders";

/// The ready world with the NetworkPolicy as the operator applied it (the API server adds
/// defaults of its own, which the drift check ignores).
fn ready_world_with_network_policy(db: &Database) -> HashMap<String, Value> {
    let mut world = ready_world(db);
    let mut policy = serde_json::to_value(network_policy::network_policy(db).unwrap()).unwrap();
    policy["metadata"]["resourceVersion"] = json!("8");
    policy["metadata"]["generation"] = json!(1);
    world.insert(NETWORK_POLICY.into(), policy);
    world
}

/// The primary Lease as the operator made it, designating `orders-0`.
fn primary_lease_of(db: &Database) -> Value {
    let topology = replication::topology(db, "orders-0");
    let mut lease = primary_lease::designate(db, None, &topology, 0).unwrap();
    lease.metadata.resource_version = Some("7".into());
    let mut value = serde_json::to_value(lease).unwrap();
    value["apiVersion"] = json!("coordination.k8s.io/v1");
    value["kind"] = json!("Lease");
    value
}

fn read<K: serde::de::DeserializeOwned>(world: &HashMap<String, Value>, path: &str) -> Option<K> {
    world
        .get(path)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

/// The status the operator itself would have written for this world.
fn with_settled_status(mut db: Database, world: &HashMap<String, Value>) -> Database {
    let snapshot = facts::Observed {
        credentials_secret: serde_json::from_value(
            world["/api/v1/namespaces/shop/secrets/orders-credentials"].clone(),
        )
        .ok(),
        ca_secret: read(world, "/api/v1/namespaces/shop/secrets/orders-ca"),
        server_tls_secret: read(world, "/api/v1/namespaces/shop/secrets/orders-server-tls"),
        own_certificate: read(world, CERT_MANAGER_SECRET),
        certificate: read(world, CERTIFICATE),
        statefulset: serde_json::from_value(
            world["/apis/apps/v1/namespaces/shop/statefulsets/orders"].clone(),
        )
        .ok(),
        data_claims: vec![
            serde_json::from_value(
                world["/api/v1/namespaces/shop/persistentvolumeclaims/data-orders-0"].clone(),
            )
            .unwrap(),
        ],
        instance_pods: vec![
            serde_json::from_value(world["/api/v1/namespaces/shop/pods/orders-0"].clone()).unwrap(),
        ],
        ..facts::Observed::default()
    };
    let facts = facts::Facts::from_observed(&db, &snapshot);
    let decision = decide::decide(&db, &facts, &Settings::default());
    db.status = Some(status::next_status(
        &db,
        &decision,
        Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
    ));
    db
}

#[tokio::test]
async fn a_new_database_gets_a_primary_lease_and_an_account_that_may_only_use_it() {
    let sent = reconcile_against(&database(), HashMap::new()).await;
    let created = |path: &str| {
        sent.iter()
            .find(|s| s.method == "POST" && s.path == path)
            .unwrap_or_else(|| panic!("nothing created at {path}"))
            .body
            .clone()
    };
    let lease = created("/apis/coordination.k8s.io/v1/namespaces/shop/leases");
    assert_eq!(lease["metadata"]["name"], "orders-primary");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 10);
    assert!(lease["spec"]["holderIdentity"].is_null());
    let topology = lease["metadata"]["annotations"]["dbop.dev/topology"]
        .as_str()
        .unwrap();
    assert!(topology.contains("primary=orders-0"), "{topology}");
    let role = created("/apis/rbac.authorization.k8s.io/v1/namespaces/shop/roles");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": ["orders-primary"], "verbs": ["get", "update"]}])
    );
    let binding = created("/apis/rbac.authorization.k8s.io/v1/namespaces/shop/rolebindings");
    assert_eq!(binding["subjects"][0]["name"], "orders-instance");
    let account = created("/api/v1/namespaces/shop/serviceaccounts");
    assert_eq!(account["metadata"]["name"], "orders-instance");
}

#[tokio::test]
async fn a_new_database_gets_its_objects_by_server_side_apply() {
    let sent = reconcile_against(&database(), HashMap::new()).await;
    let writes: Vec<_> = sent.iter().filter(|s| s.is_write()).collect();
    let summary: Vec<(String, String)> = writes
        .iter()
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();

    // The generated Secret is created (never applied: its password must not be regenerated).
    let secret = writes
        .iter()
        .find(|s| s.method == "POST" && s.path == "/api/v1/namespaces/shop/secrets")
        .unwrap_or_else(|| panic!("no Secret created: {summary:?}"));
    let password = secret.body["data"]["password"]
        .as_str()
        .expect("base64 password");
    assert!(password.len() >= 40, "32 random characters, base64-encoded");

    // Services and the StatefulSet go through server-side apply with dbop's field manager.
    for path in [
        "/api/v1/namespaces/shop/services/orders-hl",
        "/api/v1/namespaces/shop/services/orders-rw",
        "/apis/apps/v1/namespaces/shop/statefulsets/orders",
    ] {
        let apply = writes
            .iter()
            .find(|s| s.method == "PATCH" && s.path == path)
            .unwrap_or_else(|| panic!("no apply of {path}: {summary:?}"));
        assert_eq!(apply.content_type, "application/apply-patch+yaml");
        assert!(apply.query.contains("fieldManager=dbop"), "{}", apply.query);
        assert!(apply.query.contains("force=true"), "{}", apply.query);
        assert!(apply.body["apiVersion"].is_string() && apply.body["kind"].is_string());
    }

    // The database pod: the instance manager as entrypoint, the credentials as a mounted Secret
    // (never an environment variable), the instances' own ServiceAccount (its token may read and
    // update the primary Lease only).
    let sts = writes
        .iter()
        .find(|s| s.path == "/apis/apps/v1/namespaces/shop/statefulsets/orders")
        .unwrap();
    let pod = &sts.body["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "orders-instance");
    assert_eq!(pod["containers"][0]["command"][0], "/dbop/dbop-instance");
    assert!(
        !pod["containers"][0].to_string().contains("secretKeyRef"),
        "{}",
        pod["containers"][0]
    );
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "orders-credentials")
    );

    // No init SQL: no Job. Status goes to Provisioning in one write.
    assert!(
        !writes.iter().any(|s| s.path.contains("/jobs")),
        "{summary:?}"
    );
    let status = writes
        .iter()
        .find(|s| s.path == "/apis/dbop.dev/v1alpha1/namespaces/shop/databases/orders/status")
        .unwrap_or_else(|| panic!("no status write: {summary:?}"));
    assert_eq!(status.body["status"]["phase"], "Provisioning");
    assert_eq!(status.body["status"]["observedGeneration"], 1);

    // The password appears in the Secret's body and nowhere else.
    let decoded = String::from_utf8(base64_decode(password)).unwrap();
    for write in writes
        .iter()
        .filter(|s| s.path != "/api/v1/namespaces/shop/secrets")
    {
        assert!(
            !write.body.to_string().contains(&decoded),
            "password leaked into {}",
            write.path
        );
    }
}

#[tokio::test]
async fn inline_init_sql_becomes_a_config_map_applied_before_its_job() {
    let mut db = database();
    db.spec.init =
        Some(serde_json::from_value(json!({"sql": "CREATE TABLE t (id int);"})).unwrap());
    let world = ready_world(&db);
    let db = with_settled_status(db, &world);
    let sent = reconcile_against(&db, world).await;
    let writes: Vec<&Sent> = sent.iter().filter(|s| s.method != "GET").collect();
    let at = |method: &str, path: &str| {
        writes
            .iter()
            .position(|s| s.method == method && s.path == path)
            .unwrap_or_else(|| {
                let all: Vec<String> = writes
                    .iter()
                    .map(|s| format!("{} {}", s.method, s.path))
                    .collect();
                panic!("no {method} {path}: {all:?}")
            })
    };
    // Named by the SQL's digest, immutable, created once: a Job mounts the SQL it was made
    // for, whatever a kubelet cached of an earlier version.
    let name = format!(
        "orders-init-sql-{}",
        &short_digest(b"CREATE TABLE t (id int);")[..10]
    );
    let config_map = at("POST", "/api/v1/namespaces/shop/configmaps");
    let job = at("POST", "/apis/batch/v1/namespaces/shop/jobs");
    assert!(
        config_map < job,
        "the Job would wait for its ConfigMap: {:?}",
        writes.iter().map(|s| &s.path).collect::<Vec<_>>()
    );
    let body = &writes[config_map].body;
    assert_eq!(body["data"]["init.sql"], "CREATE TABLE t (id int);");
    assert_eq!(body["metadata"]["name"], name.as_str());
    assert_eq!(body["immutable"], true);
    assert_eq!(
        writes[job].body["metadata"]["annotations"]["dbop.dev/init-sql"],
        short_digest(b"CREATE TABLE t (id int);")
    );
    let job_body = writes[job].body.to_string();
    assert!(
        !job_body.contains("CREATE TABLE"),
        "the SQL is inline in the Job"
    );
    assert!(job_body.contains(&name));
}

/// The spec's init SQL changed after its Job failed: that Job is deleted (only that one: its
/// uid is the precondition) with the ConfigMap of its SQL; the next pass makes the new Job.
#[tokio::test]
async fn a_failed_init_job_is_replaced_once_its_sql_changed() {
    let mut db = database();
    db.spec.init = Some(serde_json::from_value(json!({"sql": "SELEC 1;"})).unwrap());
    let mut world = ready_world(&db);
    let mut failed =
        serde_json::to_value(init_job(&db, &Settings::default(), None).unwrap()).unwrap();
    failed["metadata"]["uid"] = json!("job-uid-1");
    failed["status"] = json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]});
    world.insert(
        "/apis/batch/v1/namespaces/shop/jobs/orders-init".into(),
        failed,
    );
    let broken = format!("orders-init-sql-{}", &short_digest(b"SELEC 1;")[..10]);

    db.spec.init = Some(serde_json::from_value(json!({"sql": "SELECT 1;"})).unwrap());
    db.metadata.generation = Some(2);
    let db = with_settled_status(db, &world);
    let sent = reconcile_against(&db, world).await;
    let writes: Vec<&Sent> = sent.iter().filter(|s| s.method != "GET").collect();
    let summary: Vec<String> = writes
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    let delete_job = writes
        .iter()
        .find(|s| {
            s.method == "DELETE" && s.path == "/apis/batch/v1/namespaces/shop/jobs/orders-init"
        })
        .unwrap_or_else(|| panic!("the failed Job is not deleted: {summary:?}"));
    assert_eq!(delete_job.body["preconditions"]["uid"], "job-uid-1");
    assert_eq!(delete_job.body["propagationPolicy"], "Background");
    let config_map = format!("/api/v1/namespaces/shop/configmaps/{broken}");
    assert!(
        writes
            .iter()
            .any(|s| s.method == "DELETE" && s.path == config_map),
        "{summary:?}"
    );
    assert!(
        !writes
            .iter()
            .any(|s| s.method == "POST" && s.path.ends_with("/jobs")),
        "a new Job before the failed one is gone: {summary:?}"
    );
    // `kubectl describe` says why the Job went.
    let event = writes
        .iter()
        .find(|s| s.path.ends_with("/events") && s.body["reason"] == "InitRetrying")
        .unwrap_or_else(|| panic!("no InitRetrying Event: {summary:?}"));
    assert_eq!(event.body["type"], "Normal");
    assert!(
        event.body["note"]
            .as_str()
            .unwrap_or_default()
            .contains("orders-init"),
        "{}",
        event.body
    );
    let status = writes
        .iter()
        .find(|s| s.path.ends_with("/databases/orders/status"))
        .unwrap_or_else(|| panic!("no status write: {summary:?}"));
    assert_eq!(
        status.body["status"]["phase"], "Initializing",
        "{}",
        status.body
    );
}

#[tokio::test]
async fn a_hand_edited_statefulset_is_the_only_thing_rewritten() {
    let mut world = ready_world(&database());
    let db = with_settled_status(database(), &world);
    world
        .get_mut("/apis/apps/v1/namespaces/shop/statefulsets/orders")
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["image"] = json!("postgres:latest");
    let sent = reconcile_against(&db, world).await;
    // The edit is undone; the status says a rollout is under way (the pods follow the template).
    let object_writes: Vec<(String, String)> = sent
        .iter()
        .filter(|s| s.is_write() && !s.path.ends_with("/status") && !s.path.contains("/events"))
        .map(|s| (s.method.clone(), s.path.clone()))
        .collect();
    assert_eq!(
        object_writes,
        vec![(
            "PATCH".to_string(),
            "/apis/apps/v1/namespaces/shop/statefulsets/orders".to_string()
        )],
    );
}

#[tokio::test]
async fn a_missing_user_secret_writes_only_status_and_an_event() {
    let mut db = database();
    db.spec.credentials = Some(dbop::api::CredentialsSpec {
        secret_name: "admin".into(),
    });
    let sent = reconcile_against(&db, HashMap::new()).await;
    let writes: Vec<_> = sent.iter().filter(|s| s.is_write()).collect();
    let paths: Vec<&str> = writes.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(writes.len(), 2, "{paths:?}");
    let status = writes
        .iter()
        .find(|s| s.path.ends_with("/status"))
        .expect("status written");
    assert_eq!(status.body["status"]["phase"], "Pending");
    let ready = &status.body["status"]["conditions"][0];
    assert_eq!(ready["reason"], "CredentialsSecretNotFound");
    assert!(ready["message"].as_str().unwrap().contains("admin"));
    let event = writes
        .iter()
        .find(|s| s.path.contains("/events"))
        .expect("an Event");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["reason"], "Pending");
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    out
}

/// Regression guard (issue 14): one reconcile of a Ready Database sends no request at all. What
/// dbop owns (Services, StatefulSet, generated Secret, claims, Jobs, DatabaseBackups) is read
/// from the watch caches, and nothing drifted, so nothing is written. A change that reads an
/// owned object from the API server again, or writes, fails here.
#[tokio::test]
async fn a_reconcile_of_a_ready_database_sends_no_request() {
    let world = ready_world(&database());
    let db = with_settled_status(database(), &world);
    let sent = reconcile_against(&db, world).await;
    let requests: Vec<String> = sent
        .iter()
        .map(|s| format!("{} {}{}", s.method, s.path, query_of(s)))
        .collect();
    assert_eq!(
        requests,
        Vec::<String>::new(),
        "the requests of one reconcile of a Ready Database"
    );
}

/// The same guard with `spec.networkPolicy`: the policy comes from the watch cache, and one in
/// shape is not written again.
#[tokio::test]
async fn a_ready_database_with_its_network_policy_sends_no_request() {
    let db = database_with_network_policy();
    let world = ready_world_with_network_policy(&db);
    let db = with_settled_status(db, &world);
    let conditions = &db.status.as_ref().unwrap().conditions;
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "NetworkPolicyReady" && c.status == "True"),
        "{conditions:?}"
    );
    let sent = reconcile_against(&db, world).await;
    let requests: Vec<String> = sent
        .iter()
        .map(|s| format!("{} {}{}", s.method, s.path, query_of(s)))
        .collect();
    assert_eq!(requests, Vec::<String>::new());
}

/// A NetworkPolicy edited by hand (a peer added) is applied again, by server-side apply with
/// dbop's field manager, and nothing else is written.
#[tokio::test]
async fn a_hand_edited_network_policy_is_applied_again() {
    let db = database_with_network_policy();
    let mut world = ready_world_with_network_policy(&db);
    let db = with_settled_status(db, &world);
    let policy = world.get_mut(NETWORK_POLICY).unwrap();
    policy["spec"]["ingress"][0]["from"][2] = json!({"podSelector": {}});
    let sent = reconcile_against(&db, world).await;
    let writes: Vec<&Sent> = sent.iter().filter(|s| s.is_write()).collect();
    let paths: Vec<String> = writes
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(paths, [format!("PATCH {NETWORK_POLICY}")]);
    let apply = writes[0];
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert!(apply.query.contains("fieldManager=dbop") && apply.query.contains("force=true"));
    assert_eq!(apply.body["kind"], "NetworkPolicy");
    assert_eq!(
        apply.body["spec"]["ingress"][0]["from"][2],
        json!({"podSelector": {"matchLabels": {"app": "orders-api"}}})
    );
    assert_eq!(apply.body["spec"]["policyTypes"], json!(["Ingress"]));
}

/// A new Database with `spec.networkPolicy`: the policy is applied before the StatefulSet, so
/// its pods start behind it.
#[tokio::test]
async fn a_new_databases_pods_start_behind_its_network_policy() {
    let sent = reconcile_against(&database_with_network_policy(), HashMap::new()).await;
    let at = |path: &str| {
        sent.iter()
            .position(|s| s.method == "PATCH" && s.path == path)
            .unwrap_or_else(|| panic!("no apply of {path}"))
    };
    let policy = at(NETWORK_POLICY);
    assert!(policy < at("/apis/apps/v1/namespaces/shop/statefulsets/orders"));
    assert_eq!(sent[policy].content_type, "application/apply-patch+yaml");
    assert_eq!(
        sent[policy].body["apiVersion"], "networking.k8s.io/v1",
        "{}",
        sent[policy].body
    );
}

/// `spec.networkPolicy` taken away: the policy is deleted and its condition dropped. The pods
/// do not restart: the StatefulSet only records the new spec (its inputs annotation), as for
/// any spec change, with the same pod template.
#[tokio::test]
async fn a_network_policy_no_longer_asked_for_is_deleted() {
    const STATEFULSET: &str = "/apis/apps/v1/namespaces/shop/statefulsets/orders";
    let with_policy = database_with_network_policy();
    let world = ready_world_with_network_policy(&with_policy);
    let template = world[STATEFULSET]["spec"]["template"].clone();
    let mut db = with_settled_status(with_policy, &world);
    db.spec.network_policy = None;
    let sent = reconcile_against(&db, world).await;
    let writes: Vec<String> = sent
        .iter()
        .filter(|s| s.is_write())
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        writes,
        [
            format!("DELETE {NETWORK_POLICY}"),
            format!("PATCH {STATEFULSET}"),
            "PATCH /apis/dbop.dev/v1alpha1/namespaces/shop/databases/orders/status".to_string()
        ]
    );
    let statefulset = sent.iter().find(|s| s.path == STATEFULSET).unwrap();
    assert_eq!(
        statefulset.body["spec"]["template"], template,
        "no pod restarts"
    );
    let status = sent.iter().find(|s| s.path.ends_with("/status")).unwrap();
    let conditions = status.body["status"]["conditions"].as_array().unwrap();
    assert!(
        !conditions.iter().any(|c| c["type"] == "NetworkPolicyReady"),
        "{conditions:?}"
    );
}

/// A database pod without its role label (a new pod, or one an earlier dbop made): one merge
/// patch of that label alone, before the Services that select by it are applied, and nothing else.
#[tokio::test]
async fn a_pod_without_its_role_label_gets_it_by_one_merge_patch() {
    let mut world = ready_world(&database());
    let db = with_settled_status(database(), &world);
    let pod = world
        .get_mut("/api/v1/namespaces/shop/pods/orders-0")
        .unwrap();
    pod["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("dbop.dev/role");
    let sent = reconcile_against(&db, world).await;
    let requests: Vec<String> = sent
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(requests, ["PATCH /api/v1/namespaces/shop/pods/orders-0"]);
    assert_eq!(sent[0].content_type, "application/merge-patch+json");
    assert_eq!(
        sent[0].body,
        json!({"metadata": {"labels": {"dbop.dev/role": "primary"}}})
    );
}

/// The objects dbop does not label (the user's credentials Secret, the S3 Secret, an init
/// ConfigMap) are not watched: they are the only reads that still go to the API server, one GET
/// each.
#[tokio::test]
async fn only_the_users_objects_are_read_from_the_api_server() {
    let mut db = database();
    db.spec.credentials = Some(dbop::api::CredentialsSpec {
        secret_name: "admin".into(),
    });
    db.spec.init = Some(
        serde_json::from_value(json!({"configMapRef": {"name": "schema", "key": "init.sql"}}))
            .unwrap(),
    );
    db.spec.backup = Some(
        serde_json::from_value(json!({
            "schedule": "0 3 * * *",
            "s3": {"bucket": "b", "endpoint": "http://s3.local:9000",
                   "credentials": {"secretName": "s3-keys"}}
        }))
        .unwrap(),
    );
    let ns = "/api/v1/namespaces/shop";
    let mut world = ready_world(&db);
    world.insert(
        format!("{ns}/secrets/admin"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "admin", "namespace": "shop"},
               "data": {"password": "cHc="}}),
    );
    world.insert(
        format!("{ns}/secrets/s3-keys"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-keys", "namespace": "shop"},
               "data": {"AWS_ACCESS_KEY_ID": "YQ==", "AWS_SECRET_ACCESS_KEY": "Yg=="}}),
    );
    world.insert(
        format!("{ns}/configmaps/schema"),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "schema", "namespace": "shop"},
               "data": {"init.sql": "select 1"}}),
    );
    let sent = reconcile_against(&db, world).await;
    let gets: Vec<String> = sent
        .iter()
        .filter(|s| !s.is_write())
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        gets,
        vec![
            format!("GET {ns}/configmaps/schema"),
            format!("GET {ns}/secrets/s3-keys"),
            format!("GET {ns}/secrets/admin"),
        ]
    );
}

fn query_of(sent: &Sent) -> String {
    match sent.query.as_str() {
        "" => String::new(),
        query => format!("?{query}"),
    }
}

/// A mock API server that serves LIST and WATCH from a table of objects (by resource name), so
/// the real controllers can run against it. Watches stay open; the Services watch delivers the
/// events the test sends. Writes are reported on `writes` as "METHOD path".
mod watching {
    use super::*;
    use futures::StreamExt;
    use futures::channel::mpsc;
    use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
    use hyper::body::{Bytes, Frame};

    pub type MockBody = UnsyncBoxBody<Bytes, std::convert::Infallible>;

    pub struct Server {
        pub service_events: mpsc::UnboundedSender<Value>,
        pub writes: mpsc::UnboundedReceiver<String>,
    }

    /// The plural resource of a request path: the segment after the version, or after
    /// `namespaces/NS`.
    fn resource_of(path: &str) -> String {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let rest = match segments.first() {
            Some(&"api") => &segments[2..],
            _ => &segments[3.min(segments.len())..],
        };
        match rest {
            ["namespaces", _, resource, ..] => resource.to_string(),
            [resource, ..] => resource.to_string(),
            [] => String::new(),
        }
    }

    fn plural(kind: &str) -> String {
        match kind {
            "PersistentVolumeClaim" => "persistentvolumeclaims".into(),
            other => format!("{}s", other.to_lowercase()),
        }
    }

    fn body(bytes: Vec<u8>) -> MockBody {
        http_body_util::Full::new(Bytes::from(bytes)).boxed_unsync()
    }

    pub fn start(objects: Vec<Value>) -> (kube::Client, Server) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<MockBody>>();
        let (service_events, mut events_rx) = mpsc::unbounded::<Value>();
        let (writes_tx, writes) = mpsc::unbounded();
        tokio::spawn(async move {
            // Watch bodies that must stay open as long as the server runs.
            let mut open = Vec::new();
            let mut services_watch = Some(());
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, request_body) = request.into_parts();
                let path = parts.uri.path().to_string();
                let query = parts.uri.query().unwrap_or_default().to_string();
                let resource = resource_of(&path);
                let response = if parts.method == http::Method::GET && query.contains("watch=true")
                {
                    let (tx, rx) =
                        mpsc::unbounded::<Result<Frame<Bytes>, std::convert::Infallible>>();
                    if resource == "services" && services_watch.take().is_some() {
                        let forwarded = std::mem::replace(&mut events_rx, mpsc::unbounded().1);
                        tokio::spawn(forwarded.for_each(move |event| {
                            let mut line = serde_json::to_vec(&event).unwrap();
                            line.push(b'\n');
                            let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(line))));
                            async {}
                        }));
                    } else {
                        open.push(tx);
                    }
                    StreamBody::new(rx).boxed_unsync()
                } else if parts.method == http::Method::GET {
                    let items: Vec<Value> = objects
                        .iter()
                        .filter(|o| plural(o["kind"].as_str().unwrap_or_default()) == resource)
                        .cloned()
                        .collect();
                    body(
                        serde_json::to_vec(&json!({
                            "apiVersion": "v1", "kind": "List",
                            "metadata": {"resourceVersion": "1"}, "items": items
                        }))
                        .unwrap(),
                    )
                } else {
                    let _ = writes_tx.unbounded_send(format!("{} {path}", parts.method));
                    let bytes = request_body.collect_bytes().await.unwrap_or_default();
                    body(bytes.to_vec())
                };
                let response = Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(response)
                    .unwrap();
                respond.send_response(response);
            }
        });
        let client = kube::Client::new(service, "default");
        (
            client,
            Server {
                service_events,
                writes,
            },
        )
    }
}

/// Regression guard (issue 14): the path from a watch event to the repair has no fixed delay
/// (no debounce, no sleep). The real controllers run against the mock API server on a paused
/// clock, which only moves when every task waits for a timer: the deleted `-rw` Service's
/// DELETED event must lead to its re-apply without the clock moving at all. A 500 ms debounce
/// makes it move 500 ms.
#[tokio::test(start_paused = true)]
async fn a_deleted_service_is_reapplied_with_no_delay_after_its_watch_event() {
    use futures::StreamExt;
    use tokio::time::{Duration, Instant, sleep, timeout};

    let world = ready_world(&database());
    let db = with_settled_status(database(), &world);
    let mut objects: Vec<Value> = world.values().cloned().collect();
    objects.push(serde_json::to_value(&db).unwrap());
    let rw = world["/api/v1/namespaces/shop/services/orders-rw"].clone();
    let (client, mut server) = watching::start(objects);
    let metrics = Arc::new(dbop::ops::metrics::Metrics::new());
    let ready = Arc::new(dbop::ops::server::Readiness::default());
    let operator = tokio::spawn(dbop::runtime::run_observed(
        client,
        Settings::default(),
        &[],
        dbop::runtime::DEFAULT_RECONCILE_CONCURRENCY,
        metrics.clone(),
        ready,
    ));
    // The first reconcile of the Ready Database (from the initial lists) writes nothing.
    let reconciled = || {
        metrics
            .encode()
            .lines()
            .any(|l| l.starts_with("dbop_reconciles_total{controller=\"database\"} 1"))
    };
    timeout(Duration::from_secs(60), async {
        while !reconciled() {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the Database is reconciled once after the lists");

    let deleted_at = Instant::now();
    let mut rw = rw;
    rw["metadata"]["resourceVersion"] = json!("2");
    server
        .service_events
        .unbounded_send(json!({"type": "DELETED", "object": rw}))
        .unwrap();
    let write = timeout(Duration::from_secs(600), server.writes.next())
        .await
        .expect("a write after the deletion")
        .expect("the server runs");
    let took = deleted_at.elapsed();
    assert_eq!(write, "PATCH /api/v1/namespaces/shop/services/orders-rw");
    assert_eq!(
        took,
        Duration::ZERO,
        "the clock moved between the watch event and the repair: a fixed delay is in the way"
    );
    operator.abort();
}

const CERT_MANAGER_API: &str = "/apis/cert-manager.io/";
/// In a world: the API server has no cert-manager CRD.
const NO_CERT_MANAGER: &str = "!no-cert-manager";
const CERTIFICATE: &str = "/apis/cert-manager.io/v1/namespaces/shop/certificates/orders-server";
const CERT_MANAGER_SECRET: &str = "/api/v1/namespaces/shop/secrets/orders-cert-manager-tls";

/// A Database whose server certificate comes from the cert-manager Issuer `corp-ca`.
fn database_with_issuer() -> Database {
    let mut db = database();
    db.spec.tls = Some(serde_json::from_value(json!({"issuerRef": {"name": "corp-ca"}})).unwrap());
    db
}

/// The ready world of a Database with `spec.tls.issuerRef`: no CA or certificate of dbop's,
/// the Certificate as dbop applied it (with what cert-manager adds), and the Secret
/// cert-manager wrote (not dbop's: no label, so not in the watch cache).
fn ready_world_with_issuer(db: &Database) -> HashMap<String, Value> {
    let mut world = ready_world(db);
    world.remove("/api/v1/namespaces/shop/secrets/orders-ca");
    world.remove("/api/v1/namespaces/shop/secrets/orders-server-tls");
    let mut certificate =
        serde_json::to_value(dbop::resources::cert_manager::certificate(db).unwrap()).unwrap();
    certificate["metadata"]["resourceVersion"] = json!("9");
    certificate["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    world.insert(CERTIFICATE.into(), certificate);
    let pem = |s: &str| {
        use std::fmt::Write;
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let bytes = s.as_bytes();
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    let _ = out.write_char(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    };
    world.insert(
        CERT_MANAGER_SECRET.into(),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "orders-cert-manager-tls", "namespace": "shop",
                            "annotations": {"cert-manager.io/certificate-name": "orders-server"}},
               "data": {"tls.crt": pem("CERT"), "tls.key": pem("KEY"), "ca.crt": pem("CA")}}),
    );
    world
}

fn writes_of(sent: &[Sent]) -> Vec<String> {
    sent.iter()
        .filter(|s| s.is_write())
        .map(|s| format!("{} {}", s.method, s.path))
        .collect()
}

/// A new Database with `spec.tls.issuerRef`: dbop applies the cert-manager Certificate (its
/// names, the issuer, dbop's key and lifetime), makes no CA or certificate of its own, and
/// its pods mount the Secret cert-manager fills.
#[tokio::test]
async fn with_an_issuer_the_certificate_is_applied_and_no_ca_is_made() {
    let db = database_with_issuer();
    let sent = reconcile_against(&db, HashMap::new()).await;
    let writes = writes_of(&sent);
    let secrets: Vec<&Value> = sent
        .iter()
        .filter(|s| s.is_write() && s.path.starts_with("/api/v1/namespaces/shop/secrets"))
        .map(|s| &s.body["metadata"]["name"])
        .collect();
    assert_eq!(
        secrets,
        ["orders-credentials", "orders-app", "orders-accounts"],
        "no Secret of dbop's TLS (no CA, no server certificate)"
    );
    let apply = sent
        .iter()
        .find(|s| s.method == "PATCH" && s.path == CERTIFICATE)
        .unwrap_or_else(|| panic!("no apply of the Certificate: {writes:?}"));
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert!(apply.query.contains("fieldManager=dbop"), "{}", apply.query);
    assert_eq!(apply.body["apiVersion"], "cert-manager.io/v1");
    assert_eq!(apply.body["kind"], "Certificate");
    assert_eq!(
        apply.body["metadata"]["ownerReferences"][0]["name"], "orders",
        "{}",
        apply.body
    );
    let spec = &apply.body["spec"];
    assert_eq!(spec["secretName"], "orders-cert-manager-tls");
    assert_eq!(spec["dnsNames"], json!(tls::dns_names(&db)));
    assert_eq!(
        spec["issuerRef"],
        json!({"name": "corp-ca", "kind": "Issuer", "group": "cert-manager.io"})
    );
    assert_eq!(
        spec["privateKey"],
        json!({"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"})
    );
    let statefulset = sent
        .iter()
        .find(|s| {
            s.method == "PATCH" && s.path == "/apis/apps/v1/namespaces/shop/statefulsets/orders"
        })
        .expect("the StatefulSet applied");
    let certificate = sent
        .iter()
        .position(|s| s.path == CERTIFICATE && s.is_write())
        .unwrap();
    let sts_at = sent
        .iter()
        .position(|s| std::ptr::eq(s, statefulset))
        .unwrap();
    assert!(
        certificate < sts_at,
        "the Certificate before the pods that wait for it"
    );
    let volumes = statefulset.body["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let tls_volume = volumes.iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(
        tls_volume["secret"]["secretName"],
        "orders-cert-manager-tls"
    );
}

/// A settled Database with `spec.tls.issuerRef` writes nothing: it reads the Certificate and
/// cert-manager's Secret (neither is dbop's, neither watched), one GET each.
#[tokio::test]
async fn a_ready_database_with_an_issuer_only_reads_its_certificate_and_secret() {
    let db = database_with_issuer();
    let world = ready_world_with_issuer(&db);
    let db = with_settled_status(db, &world);
    let conditions = &db.status.as_ref().unwrap().conditions;
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "TLSReady" && c.status == "True"),
        "{conditions:?}"
    );
    let sent = reconcile_against(&db, world).await;
    let requests: Vec<String> = sent
        .iter()
        .map(|s| format!("{} {}{}", s.method, s.path, query_of(s)))
        .collect();
    assert_eq!(
        requests,
        [
            format!("GET {CERT_MANAGER_SECRET}"),
            format!("GET {CERTIFICATE}")
        ]
    );
}

/// The Certificate's names edited by hand are put back, by one server-side apply.
#[tokio::test]
async fn a_hand_edited_certificate_is_applied_again() {
    let db = database_with_issuer();
    let mut world = ready_world_with_issuer(&db);
    let db = with_settled_status(db, &world);
    world.get_mut(CERTIFICATE).unwrap()["spec"]["dnsNames"] = json!(["evil.example.com"]);
    let sent = reconcile_against(&db, world).await;
    assert_eq!(writes_of(&sent), [format!("PATCH {CERTIFICATE}")]);
    let apply = sent.iter().find(|s| s.is_write()).unwrap();
    assert_eq!(apply.body["spec"]["dnsNames"], json!(tls::dns_names(&db)));
}

/// Without cert-manager (404 to its resource), the pass goes on: `TLSReady` False with
/// `CertManagerNotInstalled` and a Warning Event saying to install it; nothing of dbop's CA.
#[tokio::test]
async fn without_cert_manager_tls_ready_says_to_install_it_and_the_pass_goes_on() {
    let db = database_with_issuer();
    let world = HashMap::from([(NO_CERT_MANAGER.to_string(), Value::Null)]);
    let sent = reconcile_against(&db, world).await;
    let writes = writes_of(&sent);
    assert!(
        writes.contains(&"PATCH /apis/apps/v1/namespaces/shop/statefulsets/orders".to_string()),
        "the rest of the pass is done: {writes:?}"
    );
    assert!(
        !writes.iter().any(|w| w.ends_with("/secrets/orders-ca")),
        "{writes:?}"
    );
    let status = sent
        .iter()
        .find(|s| s.path.ends_with("/status"))
        .expect("status written");
    let conditions = status.body["status"]["conditions"].as_array().unwrap();
    let tls_ready = conditions
        .iter()
        .find(|c| c["type"] == "TLSReady")
        .unwrap_or_else(|| panic!("{conditions:?}"));
    assert_eq!(tls_ready["status"], "False");
    assert_eq!(tls_ready["reason"], "CertManagerNotInstalled");
    assert!(
        tls_ready["message"]
            .as_str()
            .unwrap()
            .contains("install cert-manager"),
        "{tls_ready}"
    );
    let event = sent
        .iter()
        .find(|s| s.path.contains("/events") && s.body["reason"] == "CertManagerNotInstalled")
        .unwrap_or_else(|| panic!("no Event: {writes:?}"));
    assert_eq!(event.body["type"], "Warning");
}

/// `spec.tls.issuerRef` taken away: the Certificate is deleted (in the pass whose StatefulSet
/// still mounts cert-manager's Secret; the next mounts dbop's own).
#[tokio::test]
async fn an_issuer_no_longer_named_has_its_certificate_deleted() {
    let with_issuer = database_with_issuer();
    let world = ready_world_with_issuer(&with_issuer);
    let mut db = with_settled_status(with_issuer, &world);
    db.spec.tls = None;
    let sent = reconcile_against(&db, world).await;
    let writes = writes_of(&sent);
    assert!(
        writes.contains(&format!("DELETE {CERTIFICATE}")),
        "{writes:?}"
    );
    assert!(
        !writes.contains(&format!("DELETE {CERT_MANAGER_SECRET}")),
        "cert-manager's Secret is cert-manager's: {writes:?}"
    );
}

/// A Secret of the user's own that happens to have cert-manager's name: the pods keep mounting
/// it, so no Certificate is deleted (else every pass would send a DELETE).
#[tokio::test]
async fn a_users_secret_named_like_cert_managers_deletes_nothing() {
    let world = ready_world_with_issuer(&database_with_issuer());
    let mut db = database();
    db.spec.tls = Some(
        serde_json::from_value(
            json!({"serverCertificate": {"secretName": "orders-cert-manager-tls"}}),
        )
        .unwrap(),
    );
    let db = with_settled_status(db, &world);
    let sent = reconcile_against(&db, world).await;
    let writes = writes_of(&sent);
    assert!(
        !writes.iter().any(|w| w.starts_with("DELETE")),
        "{writes:?}"
    );
}
