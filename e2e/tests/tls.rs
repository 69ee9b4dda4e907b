//! TLS on the test bed's real node: a new Database serves TLS with a certificate from its own
//! CA (`TLSReady`); a network client without TLS is refused; `verify-full` with the `ca.crt` of
//! the generated credentials Secret succeeds against the Service's name; and a certificate
//! issued again (its Secret deleted, as a renewal replaces it) reaches the server by a reload
//! while a client holds a connection, which keeps working. Then `spec.tls.allowPlaintext`
//! admits the plaintext client, with no restart. A Database given a certificate Secret of its
//! own (as cert-manager writes one) serves that one, and dbop makes no CA for it.

use std::process::{Command, Stdio};
use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::node::{
    POSTGRES_15_20, REAL_NODE_STORAGE_CLASS, real_node_placement, small_resources,
};
use dbop_e2e::{TestBed, condition, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

/// A real server: initdb and start on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// The kubelet updates a mounted Secret within its sync period (~1 min) plus its cache TTL.
const REMOUNT_WAIT: Duration = Duration::from_secs(180);

/// A client pod with psql, the credentials as environment and the CA's certificate from the
/// generated credentials Secret at /ca/ca.crt.
async fn client(bed: &TestBed, ns: &str, database: &str) {
    let credentials = format!("{database}-credentials");
    bed.create_pod(ns, "client", json!({}), json!({
        "containers": [{
            "name": "psql", "image": POSTGRES_15_20, "command": ["sleep", "3600"],
            "resources": small_resources(),
            "env": [
                {"name": "PGHOST", "value": format!("{database}-rw.{ns}.svc")},
                {"name": "PGCONNECT_TIMEOUT", "value": "5"},
                {"name": "PGUSER", "valueFrom": {"secretKeyRef": {"name": credentials, "key": "username"}}},
                {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": credentials, "key": "password"}}},
            ],
            "volumeMounts": [{"name": "ca", "mountPath": "/ca", "readOnly": true}],
        }],
        "volumes": [{"name": "ca", "secret": {"secretName": credentials,
            "items": [{"key": "ca.crt", "path": "ca.crt"}]}}],
    }))
    .await;
    bed.wait_pod_phase(ns, "client", &["Running"]).await;
}

/// psql in the client pod with libpq's `sslmode` (and the CA for the verifying modes).
fn psql(bed: &TestBed, ns: &str, sslmode: &str, sql: &str) -> (bool, String, String) {
    bed.exec(
        ns,
        "client",
        &[
            "sh",
            "-c",
            "PGSSLMODE=\"$0\" PGSSLROOTCERT=/ca/ca.crt exec psql -X -v ON_ERROR_STOP=1 -d postgres -Atc \"$1\"",
            sslmode,
            sql,
        ],
    )
}

/// How long a network call from the client pod is retried while it fails for another reason
/// than the one under test (the real node's DNS and Service rules can lag a moment).
const NETWORK_WAIT: Duration = Duration::from_secs(60);

/// [`psql`] until it succeeds; its output, trimmed.
async fn psql_ok(bed: &TestBed, ns: &str, sslmode: &str, sql: &str) -> String {
    let mut last = String::new();
    let found = wait_until_or_none(NETWORK_WAIT, || {
        let (ok, out, err) = psql(bed, ns, sslmode, sql);
        if !ok {
            last = err;
        }
        async move { ok.then_some(out) }
    })
    .await;
    found
        .unwrap_or_else(|| panic!("psql ({sslmode}) kept failing: {last}\nSQL: {sql}"))
        .trim()
        .to_string()
}

/// A command in the client pod that must be refused with `expected` in its error: retried
/// while it fails for another reason; a success fails the test at once.
async fn refused(bed: &TestBed, ns: &str, command: &[&str], expected: &str) -> String {
    let mut last = String::new();
    let found = wait_until_or_none(NETWORK_WAIT, || {
        let (ok, _, err) = bed.exec(ns, "client", command);
        assert!(!ok, "admitted: {command:?}");
        let hit = err.contains(expected).then(|| err.clone());
        last = err;
        async move { hit }
    })
    .await;
    found.unwrap_or_else(|| panic!("{command:?} failed, but not with {expected:?}: {last}"))
}

/// A plaintext client (`sslmode=disable`), which must be refused for want of encryption.
async fn plaintext_refused(bed: &TestBed, ns: &str) -> String {
    let command = "PGSSLMODE=disable exec psql -X -d postgres -Atc 'select 1'";
    refused(bed, ns, &["sh", "-c", command], "no encryption").await
}

async fn secret_value(bed: &TestBed, ns: &str, name: &str, key: &str) -> Option<Vec<u8>> {
    let secret = Api::<Secret>::namespaced(bed.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    Some(secret.data?.get(key)?.0.clone())
}

/// The session the renewal must not break: one statement over verify-full that waits (at most
/// 6 minutes) for a row in `marker`, then reports on its own connection. Returned once the
/// server shows it running; started again if it could not connect (the real node's DNS).
async fn hold(bed: &TestBed, ns: &str) -> std::process::Child {
    let kubectl = bed.dir.join("bin/kubectl");
    let spawn = || {
        Command::new(if kubectl.exists() { kubectl.clone() } else { "kubectl".into() })
            .arg("--kubeconfig")
            .arg(&bed.kubeconfig)
            .args(["-n", ns, "exec", "client", "--", "sh", "-c"])
            .arg(
                "PGSSLMODE=verify-full PGSSLROOTCERT=/ca/ca.crt exec psql -X -q -v ON_ERROR_STOP=1 -d postgres -Atc \
                 \"do \\$\\$ declare t timestamptz := clock_timestamp(); begin \
                 loop exit when exists (select 1 from marker) or clock_timestamp() > t + interval '6 minutes'; \
                 perform pg_sleep(0.5); end loop; end \\$\\$\" \
                 -c \"select 'held', count(*) from marker\" -c \"select ssl from pg_stat_ssl where pid = pg_backend_pid()\"",
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl exec")
    };
    let mut held = spawn();
    let running =
        "select count(*) from pg_stat_activity where query like 'do %marker%' and state = 'active'";
    let found = wait_until_or_none(NETWORK_WAIT, || {
        if held.try_wait().expect("the held session").is_some() {
            held = spawn();
        }
        let (_, out, _) = psql(bed, ns, "verify-full", running);
        async move { (out.trim() == "1").then_some(()) }
    })
    .await;
    assert!(found.is_some(), "the held session never ran");
    held
}

/// When the server started, read over its local socket.
fn server_started(bed: &TestBed, ns: &str) -> String {
    let (ok, out, err) = bed.exec(
        ns,
        "orders-0",
        &[
            "psql",
            "-X",
            "-U",
            "postgres",
            "-Atc",
            "select pg_postmaster_start_time()",
        ],
    );
    assert!(ok, "{err}");
    out.trim().to_string()
}

const ENCRYPTED: &str = "select ssl from pg_stat_ssl where pid = pg_backend_pid()";

#[tokio::test]
async fn clients_must_use_tls_verify_full_works_and_a_new_certificate_keeps_connections() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("tls").await;
    let _operator = bed.operator_for_real_node(&ns);
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "orders"}, "spec": {
            "version": "15.20",
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
        }}),
    )
    .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, READY_WAIT)
        .await;
    let databases = bed.databases(&ns);
    let db = wait_until("TLSReady", READY_WAIT, || async {
        let db = databases.get("orders").await.ok()?;
        (condition(&db, "TLSReady")?.0 == "True").then_some(db)
    })
    .await;
    let message = &db.status.as_ref().unwrap().conditions;
    assert!(
        message
            .iter()
            .any(|c| c.type_ == "TLSReady" && c.message.contains("without TLS are refused")),
        "{message:?}"
    );
    client(&bed, &ns, "orders").await;

    // From the network, TLS or nothing.
    plaintext_refused(&bed, &ns).await;
    // verify-full: the CA from the Secret, the Service's name in the certificate.
    assert_eq!(psql_ok(&bed, &ns, "verify-full", ENCRYPTED).await, "t");
    // A CA that is not the Database's (another Database's, made here) fails verification.
    let other = dbop::database::certificates::new_ca(&db, chrono::Utc::now())
        .unwrap()
        .cert_pem;
    let (ok, _, err) = bed.exec(
        &ns,
        "client",
        &["sh", "-c", "printf '%s' \"$0\" > /tmp/other-ca.crt", &other],
    );
    assert!(ok, "{err}");
    refused(
        &bed,
        &ns,
        &["sh", "-c", "PGSSLMODE=verify-ca PGSSLROOTCERT=/tmp/other-ca.crt exec psql -X -d postgres -Atc 'select 1'"],
        "certificate verify failed",
    )
    .await;

    // A held connection, until the test says so (bounded: it cannot hang the suite).
    psql_ok(&bed, &ns, "verify-full", "create table marker (done bool)").await;
    let started = server_started(&bed, &ns);
    let held = hold(&bed, &ns).await;

    // The certificate issued again: its Secret deleted, dbop signs a new one.
    let old = secret_value(&bed, &ns, "orders-server-tls", "tls.crt")
        .await
        .expect("the server certificate");
    Api::<Secret>::namespaced(bed.client.clone(), &ns)
        .delete("orders-server-tls", &DeleteParams::default())
        .await
        .expect("delete the server certificate");
    let new = wait_until("a new server certificate", READY_WAIT, || async {
        secret_value(&bed, &ns, "orders-server-tls", "tls.crt")
            .await
            .filter(|c| *c != old)
    })
    .await;
    // The instance manager installs it and reloads the server.
    let new_text = String::from_utf8(new).unwrap();
    wait_until("the new certificate installed", REMOUNT_WAIT, || async {
        let (ok, out, _) = bed.exec(&ns, "orders-0", &["cat", "/var/run/postgresql/tls/tls.crt"]);
        (ok && out == new_text).then_some(())
    })
    .await;
    let (ok, logs, _) = bed.kubectl(&["-n", &ns, "logs", "orders-0", "-c", "postgres"]);
    assert!(
        ok && logs.contains("the server certificate changed: installed"),
        "{logs}"
    );
    // New connections verify against the same CA.
    assert_eq!(psql_ok(&bed, &ns, "verify-full", ENCRYPTED).await, "t");
    assert_eq!(server_started(&bed, &ns), started, "the server restarted");

    // The held session is still there and still works.
    psql_ok(&bed, &ns, "verify-full", "insert into marker values (true)").await;
    let output = tokio::task::spawn_blocking(move || held.wait_with_output())
        .await
        .unwrap()
        .expect("the held session");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && out.contains("held|1") && out.trim_end().ends_with('t'),
        "held session: {out}{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // allowPlaintext: a reload admits the plaintext client (SCRAM still), nothing restarts.
    databases
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tls": {"allowPlaintext": true}}})),
        )
        .await
        .expect("allow plaintext");
    wait_until("a plaintext client admitted", REMOUNT_WAIT, || async {
        let (ok, out, _) = psql(&bed, &ns, "disable", ENCRYPTED);
        (ok && out.trim() == "f").then_some(())
    })
    .await;
}

/// A database spec for the real node, with `tls`.
fn spec(tls: serde_json::Value) -> serde_json::Value {
    json!({
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "tls": tls,
    })
}

#[tokio::test]
async fn a_certificate_secret_of_the_users_own_is_served_and_verified() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("tls-own").await;
    let _operator = bed.operator_for_real_node(&ns);
    // A CA and certificate of the user's (made here with the same code a cert-manager CA
    // issuer would stand in for), in cert-manager's layout.
    let mut db: dbop::api::Database = serde_json::from_value(
        json!({"apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "billing", "namespace": ns}, "spec": spec(json!({}))}),
    )
    .unwrap();
    db.metadata.namespace = Some(ns.clone());
    let now = chrono::Utc::now();
    let ca = dbop::database::certificates::new_ca(&db, now).unwrap();
    let cert = dbop::database::certificates::new_server(&db, &ca, now).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "billing-cert"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert.cert_pem, "tls.key": cert.key_pem, "ca.crt": ca.cert_pem},
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(bed.client.clone(), &ns);
    secrets
        .create(&Default::default(), &secret)
        .await
        .expect("the user's certificate Secret");
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "billing"}, "spec": spec(json!({"serverCertificate": {"secretName": "billing-cert"}}))}),
    )
    .await;
    bed.wait_for_phase(&ns, "billing", Phase::Ready, READY_WAIT)
        .await;
    let databases = bed.databases(&ns);
    let message = wait_until("TLSReady", READY_WAIT, || async {
        let db = databases.get("billing").await.ok()?;
        let c = db
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "TLSReady")?;
        (c.status == "True").then_some(c.message)
    })
    .await;
    assert!(message.contains("Secret billing-cert"), "{message}");
    assert!(
        secrets.get_opt("billing-ca").await.unwrap().is_none(),
        "dbop made a CA beside the user's certificate"
    );
    // The credentials Secret carries the user's CA, and verify-full succeeds with it.
    let carried = secret_value(&bed, &ns, "billing-credentials", "ca.crt").await;
    assert_eq!(carried.as_deref(), Some(ca.cert_pem.as_bytes()));
    client(&bed, &ns, "billing").await;
    assert_eq!(psql_ok(&bed, &ns, "verify-full", ENCRYPTED).await, "t");
    plaintext_refused(&bed, &ns).await;
}
