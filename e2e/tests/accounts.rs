//! Accounts on the test bed's real node: a new Database's applications connect with the Secret
//! `<name>-app` — its `uri` over TLS, as a role that is not a superuser, owning the application
//! database where the init SQL ran — and that role cannot create roles or read another
//! database's tables. A declared role (`spec.roles`) logs in with the password of the user's
//! Secret, reads through its membership, follows a changed password, loses a membership the
//! spec drops, and is dropped once the spec says `Absent`; the superuser's Secret keeps working.
//! With `spec.tls.superuserAuthentication: Certificate` the superuser's password is refused from
//! the network, while dbop's init Job logs in with the client certificate dbop issued.

use std::time::Duration;

use dbop::api::Phase;
use dbop_e2e::instances::real_node_database;
use dbop_e2e::node::{POSTGRES_15_20, small_resources};
use dbop_e2e::{TestBed, condition, testbed, wait_until_or_none};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// A real server: initdb and start on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// A changed Secret: the operator's pass, the kubelet's Secret volume sync (about a minute
/// plus its cache), the primary's next look.
const REMOUNT_WAIT: Duration = Duration::from_secs(180);

const INIT_SQL: &str = "\
CREATE TABLE items (id int PRIMARY KEY, name text);
INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 25) g;
GRANT SELECT, INSERT ON items TO app;
";

/// A client pod with psql, the application's Secret at /app and the CA at /ca.
async fn client(bed: &TestBed, ns: &str) {
    bed.create_pod(ns, "client", json!({}), json!({
        "containers": [{
            "name": "psql", "image": POSTGRES_15_20, "command": ["sleep", "3600"],
            "resources": small_resources(),
            "volumeMounts": [
                {"name": "app", "mountPath": "/app", "readOnly": true},
                {"name": "ca", "mountPath": "/ca", "readOnly": true},
            ],
        }],
        "volumes": [
            {"name": "app", "secret": {"secretName": "shop-app"}},
            {"name": "ca", "secret": {"secretName": "shop-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ],
    }))
    .await;
    bed.wait_pod_phase(ns, "client", &["Running"]).await;
}

/// psql with the application Secret's `uri`, verifying the server against the CA.
fn as_app(bed: &TestBed, ns: &str, sql: &str) -> (bool, String, String) {
    bed.exec(
        ns,
        "client",
        &[
            "sh",
            "-c",
            "exec psql -X -v ON_ERROR_STOP=1 -Atc \"$0\" \"$(cat /app/uri)&sslmode=verify-full&sslrootcert=/ca/ca.crt\"",
            sql,
        ],
    )
}

/// psql as `user` with `password` into the application database, over TLS.
fn as_role(
    bed: &TestBed,
    ns: &str,
    user: &str,
    password: &str,
    sql: &str,
) -> (bool, String, String) {
    in_database(bed, ns, "app", user, password, sql)
}

/// psql as `user` with `password` into `dbname`, over TLS.
fn in_database(
    bed: &TestBed,
    ns: &str,
    dbname: &str,
    user: &str,
    password: &str,
    sql: &str,
) -> (bool, String, String) {
    bed.exec(
        ns,
        "client",
        &[
            "sh",
            "-c",
            "PGPASSWORD=\"$2\" exec psql -X -v ON_ERROR_STOP=1 -Atc \"$0\" \"host=shop-rw user=$1 dbname=$3 sslmode=require connect_timeout=5\"",
            sql,
            user,
            password,
            dbname,
        ],
    )
}

/// A key of a Secret, as text.
async fn secret_key(secrets: &Api<Secret>, name: &str, key: &str) -> String {
    let secret = secrets.get(name).await.expect("the Secret");
    String::from_utf8(secret.data.unwrap()[key].0.clone()).unwrap()
}

/// Retries `call` until it succeeds with `want`, within `wait`; panics with the last answer.
async fn until(
    wait: Duration,
    what: &str,
    want: &str,
    mut call: impl FnMut() -> (bool, String, String),
) {
    let mut last = (false, String::new(), String::new());
    let found = wait_until_or_none(wait, || {
        last = call();
        let done = last.0 && last.1.trim() == want;
        async move { done.then_some(()) }
    })
    .await;
    assert!(found.is_some(), "{what}: never {want:?}; last {last:?}");
}

fn password_secret(name: &str, password: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"password": password},
    }))
    .unwrap()
}

#[tokio::test]
async fn applications_get_their_own_role_and_declared_roles_follow_the_spec() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("accounts").await;
    let _operator = bed.operator_for_real_node(&ns);
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &password_secret("reporting-pw", "first-Reporting-pw"),
        )
        .await
        .expect("the role's password Secret");
    let mut manifest = real_node_database("shop", "15.20", 1);
    manifest["spec"]["init"] = json!({"sql": INIT_SQL});
    manifest["spec"]["roles"] = json!([{
        "name": "reporting", "connectionLimit": 4,
        "inRoles": ["pg_read_all_data", "pg_monitor"],
        "passwordSecret": {"name": "reporting-pw", "key": "password"},
    }]);
    bed.apply_database(&ns, manifest).await;
    bed.wait_for_phase(&ns, "shop", Phase::Ready, READY_WAIT)
        .await;
    let db = bed.databases(&ns).get("shop").await.unwrap();
    let status = db.status.clone().unwrap();
    assert_eq!(status.application_secret.as_deref(), Some("shop-app"));
    let accounts = condition(&db, "AccountsReady").expect("AccountsReady");
    assert_eq!(accounts.0, "True", "{accounts:?}");

    // The application's Secret: its uri, verified, as a role that is not a superuser, in the
    // database where the init SQL ran.
    client(&bed, &ns).await;
    until(
        Duration::from_secs(60),
        "the application's uri",
        "app|app|25|t",
        || {
            as_app(
                &bed,
                &ns,
                "select current_user, current_database(), (select count(*) from items), \
                 (select ssl from pg_stat_ssl where pid = pg_backend_pid())",
            )
        },
    )
    .await;
    let (ok, out, _) = as_app(
        &bed,
        &ns,
        "select rolsuper or rolcreaterole or rolcreatedb from pg_roles where rolname = current_user",
    );
    assert!(ok && out.trim() == "f", "{out}");
    let (ok, _, err) = as_app(&bed, &ns, "create role intruder");
    assert!(!ok && err.contains("permission denied"), "{err}");
    let (ok, _, _) = as_app(
        &bed,
        &ns,
        "insert into items values (26, 'by the application')",
    );
    assert!(ok, "the application cannot write its table");
    bed.local_ok(
        &ns,
        "shop-0",
        "create table private (secret text); insert into private values ('s')",
    );
    let app_password = secret_key(&secrets, "shop-app", "password").await;
    let (ok, _, err) = in_database(
        &bed,
        &ns,
        "postgres",
        "app",
        &app_password,
        "select * from private",
    );
    assert!(
        !ok,
        "the application read the superuser's table in another database"
    );
    assert!(err.contains("permission denied"), "{err}");

    // The declared role: its password, its memberships (reads the application's table).
    until(REMOUNT_WAIT, "the declared role", "26", || {
        as_role(
            &bed,
            &ns,
            "reporting",
            "first-Reporting-pw",
            "select count(*) from items",
        )
    })
    .await;
    assert_eq!(
        bed.local_ok(
            &ns,
            "shop-0",
            "select rolconnlimit from pg_roles where rolname = 'reporting'"
        ),
        "4"
    );

    // A new password in the user's Secret, and a membership the spec drops.
    secrets
        .replace(
            "reporting-pw",
            &PostParams::default(),
            &password_secret("reporting-pw", "second-Reporting-pw"),
        )
        .await
        .expect("the new password");
    let changed_at = std::time::Instant::now();
    let roles = json!({"spec": {"roles": [{
        "name": "reporting", "connectionLimit": 4, "inRoles": ["pg_read_all_data"],
        "passwordSecret": {"name": "reporting-pw", "key": "password"},
    }]}});
    bed.databases(&ns)
        .patch("shop", &PatchParams::default(), &Patch::Merge(&roles))
        .await
        .unwrap();
    until(REMOUNT_WAIT, "the changed password", "26", || {
        as_role(
            &bed,
            &ns,
            "reporting",
            "second-Reporting-pw",
            "select count(*) from items",
        )
    })
    .await;
    eprintln!(
        "e2e accounts: the changed password worked {:.1}s after the Secret's change",
        changed_at.elapsed().as_secs_f64()
    );
    let (ok, _, _) = as_role(&bed, &ns, "reporting", "first-Reporting-pw", "select 1");
    assert!(!ok, "the old password still works");
    until(
        REMOUNT_WAIT,
        "the dropped membership",
        "pg_read_all_data",
        || {
            bed.local_psql(
                &ns,
                "shop-0",
                "select string_agg(r.rolname, ',' order by r.rolname) from pg_auth_members m \
             join pg_roles r on r.oid = m.roleid where m.member = 'reporting'::regrole",
            )
        },
    )
    .await;

    // Absent: the role is dropped. The superuser's Secret still works throughout.
    let absent = json!({"spec": {"roles": [{"name": "reporting", "ensure": "Absent"}]}});
    bed.databases(&ns)
        .patch("shop", &PatchParams::default(), &Patch::Merge(&absent))
        .await
        .unwrap();
    until(REMOUNT_WAIT, "the dropped role", "0", || {
        bed.local_psql(
            &ns,
            "shop-0",
            "select count(*) from pg_roles where rolname = 'reporting'",
        )
    })
    .await;
    let password = secret_key(&secrets, "shop-credentials", "password").await;
    let (ok, out, err) = as_role(
        &bed,
        &ns,
        "postgres",
        &password,
        "select rolsuper from pg_roles where rolname = current_user",
    );
    assert!(
        ok && out.trim() == "t",
        "the superuser's Secret stopped working: {err}"
    );
}

#[tokio::test]
async fn with_certificate_authentication_the_superuser_s_password_is_refused_from_the_network() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("superuser-cert").await;
    let _operator = bed.operator_for_real_node(&ns);
    let mut manifest = real_node_database("shop", "15.20", 1);
    manifest["spec"]["init"] = json!({"sql": INIT_SQL});
    manifest["spec"]["tls"] = json!({"superuserAuthentication": "Certificate"});
    bed.apply_database(&ns, manifest).await;
    // Ready includes Initialized: the init Job logged in as the superuser with its certificate.
    bed.wait_for_phase(&ns, "shop", Phase::Ready, READY_WAIT)
        .await;
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let certificate = secrets
        .get("shop-superuser-tls")
        .await
        .expect("the client certificate");
    assert!(certificate.data.unwrap().contains_key("tls.key"));
    let (ok, out, err) = bed.exec(
        &ns,
        "shop-0",
        &[
            "psql",
            "-X",
            "-U",
            "postgres",
            "-d",
            "app",
            "-Atc",
            "select count(*) from items",
        ],
    );
    assert!(
        ok && out.trim() == "25",
        "the init SQL's table: {out} {err}"
    );

    client(&bed, &ns).await;
    let password = secret_key(&secrets, "shop-credentials", "password").await;
    let mut last = (false, String::new(), String::new());
    let refused = wait_until_or_none(Duration::from_secs(60), || {
        last = as_role(&bed, &ns, "postgres", &password, "select 1");
        // Retried while the Service or DNS is not there yet; done once the server answers.
        let answered = last.2.contains("certificate") || last.0;
        async move { answered.then_some(()) }
    })
    .await;
    assert!(
        refused.is_some() && !last.0,
        "the superuser's password worked from the network: {last:?}"
    );
    // The application's role is untouched by it.
    until(
        Duration::from_secs(60),
        "the application's uri",
        "app",
        || as_app(&bed, &ns, "select current_user"),
    )
    .await;
}
