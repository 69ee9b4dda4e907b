//! The data plane on the test bed's real node: Databases whose PostgreSQL really runs (the
//! locally built operand images, dbop's instance manager from the code under test), the
//! operator as a process. Init SQL larger than an environment variable can hold is applied; the
//! data survives the pod's deletion; a deleted generated Secret gives a new password that the
//! server accepts; a scheduled backup Job uploads a real dump to an S3 server in a pod, which
//! restores with `dbop-backup` to identical content; a backup over HTTPS with a private CA from
//! an operand image without a CA bundle; a namespace with a ResourceQuota; the `InitFailed`
//! runbook for inline SQL (fixed in the spec, the failed Job deleted, the fixed SQL runs).

use std::time::Duration;

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::node::{
    POD_WAIT, PrivateCa, REAL_NODE, REAL_NODE_STORAGE_CLASS, pod_ready, real_node_placement,
};
use dbop_e2e::{TestBed, condition, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

/// A real server: initdb, start, init Job on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// Ready, then the next minute boundary, then the Job (copy, dump, upload).
const BACKUP_WAIT: Duration = Duration::from_secs(240);
/// The kubelet refreshes a mounted Secret within its sync period (~1 min) plus its cache TTL;
/// the instance manager applies the new password within a poll (0.5 s).
const PASSWORD_WAIT: Duration = Duration::from_secs(150);
const NET_WAIT: Duration = Duration::from_secs(60);

/// A Database of version 15.20 (the locally built image) on a real-node volume.
fn database(name: &str, extra: Value) -> Value {
    let mut spec = json!({
        "version": "15.20",
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
    });
    for (k, v) in extra.as_object().expect("an object") {
        spec[k] = v.clone();
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// A per-minute backup schedule to the test's S3 server.
fn backup_spec(endpoint: &str, ca: Option<Value>) -> Value {
    let mut s3 = json!({
        "endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
        "credentials": {"secretName": "s3-creds"},
    });
    if let Some(ca) = ca {
        s3["ca"] = ca;
    }
    json!({"schedule": "* * * * *", "s3": s3})
}

async fn wait_ready(bed: &TestBed, ns: &str, name: &str) {
    bed.wait_for_phase(ns, name, Phase::Ready, READY_WAIT).await;
}

/// The first DatabaseBackup of the namespace that finished; panics if it failed.
async fn first_finished_backup(bed: &TestBed, ns: &str) -> DatabaseBackup {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let backup = wait_until_or_none(BACKUP_WAIT, || async {
        let list = api.list(&ListParams::default()).await.ok()?.items;
        list.into_iter().find(|b| {
            matches!(
                b.status.as_ref().and_then(|s| s.phase),
                Some(BackupPhase::Succeeded | BackupPhase::Failed)
            )
        })
    })
    .await;
    let Some(backup) = backup else {
        let (_, jobs, _) =
            bed.kubectl(&["-n", ns, "get", "databasebackups,jobs,pods", "-o", "wide"]);
        panic!("no backup finished in {ns} within {BACKUP_WAIT:?}:\n{jobs}");
    };
    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Succeeded),
        "the backup failed: {:?}",
        status.message
    );
    assert!(status.size_bytes.unwrap_or(0) > 0, "{status:?}");
    backup
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Init SQL of two tables, larger than the 128 KiB an environment variable can hold.
fn large_init_sql(rows: usize) -> String {
    let mut sql = String::from(
        "CREATE TABLE customers (id int PRIMARY KEY, email text NOT NULL UNIQUE, note text);\n\
         CREATE TABLE orders (id int PRIMARY KEY, customer_id int REFERENCES customers, total numeric(12,2));\n",
    );
    for i in 1..=rows {
        sql.push_str(&format!(
            "INSERT INTO customers VALUES ({i}, 'customer-{i:06}@example.com', 'a note of customer {i} to make the file large');\n"
        ));
    }
    sql.push_str(&format!(
        "INSERT INTO orders SELECT g, g, g * 1.25 FROM generate_series(1, {rows}) g;\n"
    ));
    sql
}

/// Ready with a real server; init SQL over 128 KiB from a ConfigMap applied (checked through
/// the `-rw` Service from a pod); `kubectl logs`/`exec` on the database pod; the data intact
/// after the pod is deleted; a deleted generated Secret → a new password the server accepts.
#[tokio::test]
async fn a_database_runs_for_real_keeps_its_data_and_takes_a_new_password() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("dp-db").await;
    let _operator = bed.operator_for_real_node(&ns);
    let rows = 2000;
    let sql = large_init_sql(rows);
    assert!(
        sql.len() > 128 * 1024,
        "the init SQL is {} bytes",
        sql.len()
    );
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "schema"}, "data": {"schema.sql": sql}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("the init SQL ConfigMap");
    bed.apply_database(
        &ns,
        database(
            "shop",
            json!({"init": {"configMapRef": {"name": "schema", "key": "schema.sql"}}}),
        ),
    )
    .await;
    wait_ready(&bed, &ns, "shop").await;

    // (a) the init SQL's tables and rows, through the -rw Service from another pod.
    bed.psql_client(&ns, "client", "shop", "shop-credentials")
        .await;
    let counts = bed
        .psql_until_ok(
            &ns,
            "client",
            "app",
            "select (select count(*) from customers) || ' ' || (select count(*) from orders) || ' ' || \
             (select email from customers where id = (select max(id) from customers))",
            NET_WAIT,
        )
        .await;
    assert_eq!(
        counts,
        format!("{rows} {rows} customer-{rows:06}@example.com")
    );
    let pod = bed.wait_pod_ready(&ns, "shop-0").await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(REAL_NODE)
    );
    let logs = bed.logs(&ns, "shop-0");
    assert!(
        logs.contains("database system is ready to accept connections"),
        "{logs}"
    );
    // exec: psql over the local socket as the pod's user (peer, mapped to the superuser).
    let (ok, out, err) = bed.exec(
        &ns,
        "shop-0",
        &[
            "psql",
            "-X",
            "-d",
            "app",
            "-Atc",
            "select current_user, count(*) from orders",
        ],
    );
    assert!(ok, "kubectl exec psql: {err}");
    assert_eq!(out.trim(), format!("postgres|{rows}"));

    // (c) the pod deleted: a new one on the same volume, the same data.
    let before = bed.fingerprint(&ns, "client", "app").await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let events: Api<Event> = Api::namespaced(bed.client.clone(), &ns);
    let upgrading_before = phase_events(&events, "Upgrading").await;
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    pods.delete("shop-0", &DeleteParams::default())
        .await
        .expect("pod deleted");
    let old_uid = pod_uid(&pod);
    wait_until("a new pod shop-0, Ready", POD_WAIT, || async {
        let p = pods.get_opt("shop-0").await.ok().flatten()?;
        (pod_uid(&p) != old_uid && pod_ready(&p)).then_some(())
    })
    .await;
    assert_eq!(
        bed.fingerprint(&ns, "client", "app").await,
        before,
        "the data after the pod came back"
    );
    // The Database was Degraded, not Upgrading: a lost pod comes back on the same template.
    // The Event of its return to Ready follows any Event of the phases between.
    wait_until(
        "a Ready Event after the pod's deletion",
        POD_WAIT,
        || async {
            let ready = phase_events(&events, "Ready").await;
            ready
                .iter()
                .any(|(_, _, at)| *at > deleted_at)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        phase_events(&events, "Upgrading").await,
        upgrading_before,
        "a deleted pod is not an upgrade"
    );

    // (d) the generated Secret deleted: a new password, which the server accepts.
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    let old = secrets.get("shop-credentials").await.expect("the Secret");
    secrets
        .delete("shop-credentials", &DeleteParams::default())
        .await
        .expect("Secret deleted");
    let deleted_at = std::time::Instant::now();
    let new = wait_until("a new generated Secret", POD_WAIT, || async {
        let s = secrets.get_opt("shop-credentials").await.ok().flatten()?;
        (s.metadata.uid != old.metadata.uid).then_some(s)
    })
    .await;
    let password = |s: &Secret| s.data.as_ref().and_then(|d| d.get("password")).cloned();
    assert_ne!(password(&new), password(&old), "a new password");
    wait_until(
        "a CredentialsRegenerated Warning Event",
        POD_WAIT,
        || async {
            let list = events
                .list(&ListParams::default().fields("regarding.name=shop"))
                .await
                .ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("CredentialsRegenerated")
                        && e.type_.as_deref() == Some("Warning")
                })
                .map(|_| ())
        },
    )
    .await;
    bed.psql_client(&ns, "client2", "shop", "shop-credentials")
        .await;
    let started = std::time::Instant::now();
    let answer = bed
        .psql_until_ok(
            &ns,
            "client2",
            "app",
            "select count(*) from customers",
            PASSWORD_WAIT,
        )
        .await;
    assert_eq!(answer, rows.to_string());
    eprintln!(
        "e2e dataplane: the new password was accepted {:.1}s after the client started, {:.1}s after the Secret's deletion",
        started.elapsed().as_secs_f64(),
        deleted_at.elapsed().as_secs_f64()
    );
    let (ok, _, err) = bed.psql(&ns, "client", "app", "select 1");
    assert!(!ok, "the old password still works");
    assert!(err.contains("password authentication failed"), "{err}");
}

/// A scheduled backup Job uploads a real dump to an S3 server in a pod; the dump restores with
/// `dbop-backup restore` into a scratch database with identical content.
#[tokio::test]
async fn a_scheduled_backup_restores_to_identical_content() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("dp-backup").await;
    let _operator = bed.operator_for_real_node(&ns);
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let sql = "CREATE TABLE accounts (id bigserial PRIMARY KEY, owner text NOT NULL, balance numeric(14,2), \
                 opened timestamptz NOT NULL, tags jsonb);\n\
               INSERT INTO accounts (owner, balance, opened, tags) SELECT 'owner ' || g, g * 3.14, \
                 timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour', jsonb_build_object('n', g, 'odd', g % 2 = 1) \
                 FROM generate_series(1, 5000) g;\n\
               CREATE TABLE transfers (id bigserial PRIMARY KEY, account_id bigint REFERENCES accounts, amount numeric(14,2), memo text);\n\
               INSERT INTO transfers (account_id, amount, memo) SELECT 1 + g % 5000, g / 7.0, repeat('x', g % 50) \
                 FROM generate_series(1, 20000) g;\n\
               CREATE TABLE empty_one (id int);\n";
    bed.apply_database(
        &ns,
        database(
            "ledger",
            json!({"init": {"sql": sql}, "backup": backup_spec(&endpoint, None)}),
        ),
    )
    .await;
    wait_ready(&bed, &ns, "ledger").await;
    bed.psql_client(&ns, "client", "ledger", "ledger-credentials")
        .await;
    let source = bed.fingerprint(&ns, "client", "app").await;
    assert!(
        source.contains("accounts:5000:") && source.contains("transfers:20000:"),
        "{source}"
    );

    let backup = first_finished_backup(&bed, &ns).await;
    eprintln!(
        "e2e dataplane: backup {:?} of {} bytes",
        backup.status.as_ref().and_then(|s| s.key.clone()),
        backup
            .status
            .as_ref()
            .and_then(|s| s.size_bytes)
            .unwrap_or(0)
    );
    bed.restore_with_agent(&ns, "ledger", &format!("{ns}/ledger"), "latest", &endpoint)
        .await;
    assert_eq!(
        bed.fingerprint(&ns, "client", "restored").await,
        source,
        "the restored database's content"
    );
}

/// In a namespace with a ResourceQuota (cpu and memory requests and limits required), a
/// Database reaches Ready and backs up over HTTPS to an S3 server whose certificate is signed
/// by a private CA (`s3.ca`), from the operand image, which has no CA bundle.
#[tokio::test]
async fn under_a_resource_quota_a_backup_over_https_with_a_private_ca() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("dp-quota").await;
    bed.compute_quota(&ns).await;
    let _operator = bed.operator_for_real_node(&ns);
    let ca = PrivateCa::issue(&format!("s3.{ns}.svc"));
    let endpoint = bed.s3_server(&ns, "backups", Some(&ca)).await;
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "s3-ca"}, "data": {"ca.pem": ca.ca_pem}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("the CA ConfigMap");
    let ca_ref = json!({"configMapKeyRef": {"name": "s3-ca", "key": "ca.pem"}});
    bed.apply_database(
        &ns,
        database(
            "billing",
            json!({
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                              "limits": {"cpu": "1", "memory": "512Mi"}},
                "init": {"sql": "CREATE TABLE invoices AS SELECT g AS id, g * 2 AS cents FROM generate_series(1, 100) g;"},
                "backup": backup_spec(&endpoint, Some(ca_ref)),
            }),
        ),
    )
    .await;
    wait_ready(&bed, &ns, "billing").await;
    // The operand image has no CA bundle: only s3.ca (plus the agent's built-in public roots)
    // can make the private CA's certificate trusted.
    let (ok, _, _) = bed.exec(
        &ns,
        "billing-0",
        &["test", "-e", "/etc/ssl/certs/ca-certificates.crt"],
    );
    assert!(!ok, "the operand image has a CA bundle");
    first_finished_backup(&bed, &ns).await;
    bed.assert_quota_counted(&ns).await;
}

/// The `InitFailed` runbook (docs/runbooks.md), for real, for both sources of init SQL at once:
/// a statement that fails stops each Database at Failed with `InitFailed`; fixing the SQL is
/// enough — in `spec.init.sql` (a spec edit), or in the user's ConfigMap (`configMapRef`, which
/// dbop does not watch) — dbop replaces the Job that ran the broken SQL with one that runs the
/// fixed SQL, and each Database becomes Ready with the fixed schema. The inline SQL's broken
/// ConfigMap goes with its Job.
#[tokio::test]
async fn a_failed_init_sql_fixed_where_it_lives_runs_again_fixed() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("dp-init").await;
    let _operator = bed.operator_for_real_node(&ns);
    let config_maps = Api::<ConfigMap>::namespaced(bed.client.clone(), &ns);
    let jobs = Api::<Job>::namespaced(bed.client.clone(), &ns);
    let broken = "CREATE TABLE fixed (id int); SELEC 1;";
    let users_sql = |sql: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "schema"}, "data": {"init.sql": sql}}))
            .unwrap()
    };
    config_maps
        .create(&PostParams::default(), &users_sql(broken))
        .await
        .expect("the user's init SQL ConfigMap");
    bed.apply_database(&ns, database("fix", json!({"init": {"sql": broken}})))
        .await;
    let from_config_map = json!({"init": {"configMapRef": {"name": "schema", "key": "init.sql"}}});
    bed.apply_database(&ns, database("fixcm", from_config_map.clone()))
        .await;
    let mut failed_uids = vec![];
    for name in ["fix", "fixcm"] {
        let db = bed
            .wait_for_phase(&ns, name, Phase::Failed, READY_WAIT)
            .await;
        assert_eq!(
            condition(&db, "Ready").map(|(_, reason)| reason).as_deref(),
            Some("InitFailed"),
            "{name}: {:?}",
            db.status
        );
        let job = jobs
            .get(&format!("{name}-init"))
            .await
            .expect("the failed Job");
        failed_uids.push(job.metadata.uid);
    }

    // Fixing the SQL where it lives is enough: no Job to delete by hand.
    let fixed = "CREATE TABLE fixed (id int); INSERT INTO fixed VALUES (7);";
    bed.apply_database(&ns, database("fix", json!({"init": {"sql": fixed}})))
        .await;
    config_maps
        .replace("schema", &PostParams::default(), &users_sql(fixed))
        .await
        .expect("the user's ConfigMap fixed");
    for (name, failed_uid) in ["fix", "fixcm"].into_iter().zip(failed_uids) {
        wait_ready(&bed, &ns, name).await;
        let job = jobs
            .get(&format!("{name}-init"))
            .await
            .expect("the init Job");
        assert_ne!(
            job.metadata.uid, failed_uid,
            "{name}: a new Job ran the fixed SQL"
        );
        let events = Api::<Event>::namespaced(bed.client.clone(), &ns)
            .list(&ListParams::default().fields(&format!("regarding.name={name}")))
            .await
            .expect("list Events");
        assert!(
            events
                .items
                .iter()
                .any(|e| e.reason.as_deref() == Some("InitRetrying")),
            "{name}: no InitRetrying Event"
        );
        bed.psql_client(
            &ns,
            &format!("client-{name}"),
            name,
            &format!("{name}-credentials"),
        )
        .await;
        let rows = bed
            .psql_until_ok(
                &ns,
                &format!("client-{name}"),
                "app",
                "select id from fixed",
                NET_WAIT,
            )
            .await;
        assert_eq!(rows, "7", "{name}: the fixed init SQL ran");
    }
    let made: Vec<String> = config_maps
        .list(&ListParams::default())
        .await
        .expect("list ConfigMaps")
        .items
        .into_iter()
        .filter(|cm| {
            cm.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("fix-init-sql-"))
        })
        .flat_map(|cm| cm.data.unwrap_or_default().into_values())
        .collect();
    assert_eq!(
        made,
        vec![fixed.to_string()],
        "one SQL ConfigMap, the fixed SQL's: the broken one went with its Job"
    );
}

/// The Events of the Database `shop` with this reason: each one's uid, how many times it was
/// seen, and when last.
async fn phase_events(
    events: &Api<Event>,
    reason: &str,
) -> Vec<(String, i32, k8s_openapi::jiff::Timestamp)> {
    let list = events
        .list(&ListParams::default().fields("regarding.name=shop"))
        .await
        .expect("list Events");
    let mut found: Vec<_> = list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            let (count, last) = match &e.series {
                Some(series) => (series.count, series.last_observed_time.0),
                None => (1, e.event_time.map(|t| t.0).unwrap_or_default()),
            };
            (e.metadata.uid.unwrap_or_default(), count, last)
        })
        .collect();
    found.sort();
    found
}
