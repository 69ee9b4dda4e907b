//! `kubectl dbop` against the test bed: the real `kubectl-dbop` binary, with the test bed's
//! KUBECONFIG and `-n`, and the operator in-process where the test needs it. `status` of a Ready
//! Database and of a missing one; `backup --wait` following an on-demand backup (its Job's pod
//! completed by kwok with the result the test supplies) to Succeeded and to Failed; `promote`
//! asking for a switchover that the operator answers (refused, with its reason) and clears;
//! `--kubeconfig`/`--context`/`-n`; `list` and `-o`; `logs`, `psql` and `reload` through a
//! stand-in kubectl (no container runs on kwok); `restart` through the operator to the
//! StatefulSet; `restore`; `report` without any Secret value; `completion` without a cluster;
//! `kubectl dbop <TAB>` through the test bed's own kubectl and `kubectl_complete-dbop`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;

use chrono::Utc;
use dbop::api::{BackupReason, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{
    fail_every_pod_until_failed, finish_pod, running_backup_pod, s3_secret,
};
use dbop_e2e::plugin::{finished, plugin, plugin_binary, plugin_with_kubeconfig};
use dbop_e2e::primary_lease::Renewing;
use dbop_e2e::{TestBed, WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

/// A Database with backups configured (a yearly schedule, so only the test's backups run) whose
/// Job pods kwok holds Running until the test sets their outcome.
fn with_held_backups() -> serde_json::Value {
    json!({
        "backup": {
            "schedule": "0 0 1 1 *",
            "s3": {
                "endpoint": "http://minio.storage.svc:9000",
                "bucket": "backups",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds"}
            }
        },
        "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}}
    })
}

/// The running pod of the only on-demand backup, and that backup's name.
async fn manual_backup_pod(bed: &TestBed, ns: &str) -> (String, Pod) {
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let backup = wait_until("the on-demand DatabaseBackup", WAIT, || async {
        backups
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let name = backup.metadata.name.clone().unwrap();
    assert_eq!(backup.spec.reason, BackupReason::Manual);
    assert_eq!(backup.spec.database, "orders");
    assert!(name.starts_with("orders-manual-"), "{name}");
    let pod = running_backup_pod(bed, ns, &name).await;
    (name, pod)
}

fn succeeded_result(ns: &str) -> String {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": "20261130T090000Z-m",
        "database": "postgres", "bucket": "backups",
        "key": format!("{ns}/orders/postgres/20261130T090000Z-m/dump.pgc.zst"),
        "sizeBytes": 4242, "sha256": "cd".repeat(32), "engineVersion": "16.4",
        "startedAt": now, "completedAt": now, "message": "dumped 10000 bytes"
    })
    .to_string()
}

async fn ready_database_with_backups(bed: &TestBed, prefix: &str) -> String {
    let ns = bed.namespace(prefix).await;
    s3_secret(bed, &ns).await;
    bed.apply_database(&ns, database_manifest("orders", with_held_backups()))
        .await;
    ns
}

#[tokio::test]
async fn status_of_a_ready_database_shows_ready_and_its_conditions() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-status").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("orders", json!({})))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let (out, stdout, _) = finished(plugin(&bed, &["status", "orders", "-n", &ns])).await;
    assert!(out.status.success());
    let line = |start: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{stdout}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("Database:"), ["Database:", &format!("{ns}/orders")]);
    assert_eq!(line("Phase:"), ["Phase:", "Ready"]);
    assert_eq!(
        line("Version:"),
        ["Version:", "spec", "16.4,", "current", "16.4"]
    );
    assert_eq!(line("Endpoint:")[1], format!("orders-rw.{ns}.svc"));
    assert_eq!(&line("Ready ")[..2], ["Ready", "True"]);
    assert_eq!(&line("StorageReady")[..2], ["StorageReady", "True"]);
    assert!(stdout.contains("Backups:   not configured"), "{stdout}");
}

#[tokio::test]
async fn status_of_a_missing_database_fails_clearly() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-missing").await;
    let (out, stdout, stderr) = finished(plugin(&bed, &["status", "ghost", "-n", &ns])).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr.trim(),
        format!("error: Database {ns}/ghost not found")
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[tokio::test]
async fn backup_wait_follows_an_on_demand_backup_to_succeeded() {
    let bed = testbed().await;
    let ns = ready_database_with_backups(&bed, "plugin-backup").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let child = plugin(
        &bed,
        &["backup", "orders", "-n", &ns, "--wait", "--timeout", "2m"],
    );
    let (name, pod) = manual_backup_pod(&bed, &ns).await;
    finish_pod(&bed, &ns, &pod, "Succeeded", &succeeded_result(&ns)).await;
    let (out, stdout, _) = finished(child).await;

    assert!(out.status.success());
    assert!(
        stdout.contains(&format!("databasebackup.dbop.dev/{name} created")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "DatabaseBackup {name} succeeded: 4.1 KiB at s3://backups/{ns}/orders/postgres/20261130T090000Z-m/dump.pgc.zst"
        )),
        "{stdout}"
    );
    let (_, screen, _) = finished(plugin(&bed, &["status", "orders", "-n", &ns])).await;
    let row = screen
        .lines()
        .find(|l| l.trim_start().starts_with(&name))
        .unwrap_or_else(|| panic!("no row of {name} in:\n{screen}"));
    assert_eq!(
        row.split_whitespace().take(5).collect::<Vec<_>>(),
        [name.as_str(), "Manual", "Succeeded", "4.1", "KiB"]
    );
}

#[tokio::test]
async fn backup_wait_exits_non_zero_with_the_message_when_the_backup_fails() {
    let bed = testbed().await;
    let ns = ready_database_with_backups(&bed, "plugin-backup-fail").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let child = plugin(&bed, &["backup", "orders", "-n", &ns, "--wait"]);
    let (name, _) = manual_backup_pod(&bed, &ns).await;
    let result = json!({"outcome": "Failed", "operation": "dump",
        "message": "upload refused: bucket backups does not exist"})
    .to_string();
    fail_every_pod_until_failed(&bed, &ns, &name, &result).await;
    let (out, _, stderr) = finished(child).await;

    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(&format!("error: DatabaseBackup {name} failed:"))
            && stderr.contains("bucket backups does not exist"),
        "{stderr}"
    );
}

/// `--physical` asks for a base backup; of a Database that does not archive its WAL it fails
/// at once, and the plugin says why.
#[tokio::test]
async fn backup_physical_of_a_database_without_wal_archiving_fails_saying_why() {
    let bed = testbed().await;
    let ns = ready_database_with_backups(&bed, "plugin-backup-physical").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let child = plugin(
        &bed,
        &[
            "backup",
            "orders",
            "-n",
            &ns,
            "--physical",
            "--wait",
            "--timeout",
            "2m",
        ],
    );
    let (out, _, stderr) = finished(child).await;

    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("spec.backup.walArchiving"), "{stderr}");
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), &ns);
    let made = backups
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].spec.method, dbop::api::BackupMethod::Physical);
}

#[tokio::test]
async fn backup_of_a_missing_database_creates_nothing() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-backup-missing").await;
    let (out, _, stderr) = finished(plugin(&bed, &["backup", "ghost", "-n", &ns])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("Database") && stderr.contains("ghost not found"),
        "{stderr}"
    );
    let backups = Api::<DatabaseBackup>::namespaced(bed.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(backups.items.is_empty());
}

/// `psql` reads the user from the Database's own Secret (here `spec.credentials`) and hands
/// kubectl the exec command line; `KUBECTL=echo` prints that line instead of running it (the
/// exec itself needs a real pod: the real-node suites' business).
#[tokio::test]
async fn psql_execs_as_the_secret_s_user_with_no_password_on_the_command_line() {
    let bed = testbed().await;
    let ns = with_app_credentials(&bed, "plugin-psql", 1, "pw-never-on-argv").await;

    let (out, stdout) =
        kubectl_line(&bed, &["psql", "orders", "-n", &ns, "--", "-c", "select 1"]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout,
        format!(
            "exec -i -n {ns} orders-0 -c postgres -- psql -h /var/run/postgresql -U shopapp -d shopapp -c select 1"
        )
    );
    assert!(!stdout.contains("pw-never-on-argv"));
}

#[tokio::test]
async fn promote_asks_for_a_switchover_and_the_operator_answers_and_clears_the_request() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-promote").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.apply_database(&ns, database_manifest("orders", json!({})))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    // A single instance has no standby to promote: the operator refuses, says why in an
    // Event, and removes the request; the primary stays.
    let (out, stdout, _) =
        finished(plugin(&bed, &["promote", "orders", "orders-1", "-n", &ns])).await;
    assert!(out.status.success());
    assert!(
        stdout.contains("promotion of orders-1 requested"),
        "{stdout}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(bed.client.clone(), &ns);
    let refused = wait_until("a PromoteRefused Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=PromoteRefused"))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains("cannot promote \"orders-1\": it is not one of the 1 instances"),
        "{message}"
    );
    let databases = bed.databases(&ns);
    wait_until("the request removed", WAIT, || async {
        let db = databases.get("orders").await.ok()?;
        (!db.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("dbop.dev/promote"))
        .then_some(())
    })
    .await;
    let status = databases.get("orders").await.unwrap().status.unwrap();
    assert_eq!(status.primary.as_deref(), Some("orders-0"));

    // A missing Database: nothing is patched, the error says so.
    let (out, _, stderr) =
        finished(plugin(&bed, &["promote", "ghost", "ghost-1", "-n", &ns])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("ghost not found"), "{stderr}");
}

/// Creates the object (JSON of a `K`) in the namespace.
async fn create<K>(bed: &TestBed, ns: &str, object: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    Api::<K>::namespaced(bed.client.clone(), ns)
        .create(&PostParams::default(), &object)
        .await
        .expect("created")
}

/// A Manual DatabaseBackup `name` of Database orders, made by hand (no operator needed).
async fn backup_by_hand(bed: &TestBed, ns: &str, name: &str) {
    let _: DatabaseBackup = create(
        bed,
        ns,
        json!({"apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
            "metadata": {"name": name},
            "spec": {"database": "orders", "reason": "Manual"}}),
    )
    .await;
}

/// The words of each line of a table.
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// A kubeconfig (in the test's namespace directory) whose current context points at no
/// server, with a second context `elsewhere` for the test bed whose namespace is `ns`.
fn kubeconfig_with_contexts(bed: &TestBed, ns: &str) -> PathBuf {
    use kube::config::{Context, Kubeconfig};
    let mut file = Kubeconfig::read_from(&bed.kubeconfig).expect("the test bed's kubeconfig");
    let bed_context = file.contexts[0].context.clone().expect("a context");
    let mut nowhere = file.clusters[0].clone();
    nowhere.name = "nowhere".into();
    if let Some(cluster) = nowhere.cluster.as_mut() {
        cluster.server = Some("https://127.0.0.1:1".into());
    }
    file.clusters.push(nowhere);
    let named = |name: &str, context: Context| {
        let mut named = file.contexts[0].clone();
        named.name = name.into();
        named.context = Some(context);
        named
    };
    file.contexts = vec![
        named(
            "broken",
            Context {
                cluster: "nowhere".into(),
                ..bed_context.clone()
            },
        ),
        named(
            "elsewhere",
            Context {
                namespace: Some(ns.into()),
                ..bed_context
            },
        ),
    ];
    file.current_context = Some("broken".into());
    let path = std::env::temp_dir().join(format!("{ns}-kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();
    path
}

/// `--kubeconfig` and `--context` as kubectl's: the context's namespace is the default, `-n`
/// overrides it, KUBECONFIG is still read when `--kubeconfig` is not given, and without
/// `--context` the file's current context is used.
#[tokio::test]
async fn kubeconfig_context_and_namespace_flags_choose_as_kubectl() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-flags").await;
    bed.apply_database(&ns, database_manifest("orders", json!({})))
        .await;
    let file = kubeconfig_with_contexts(&bed, &ns);
    let file_arg = file.to_str().unwrap();
    let missing = std::path::Path::new("/nonexistent/kubeconfig");

    // --kubeconfig wins over KUBECONFIG; --context picks the context and its namespace.
    let (out, stdout, _) = finished(plugin_with_kubeconfig(
        missing,
        &["list", "--kubeconfig", file_arg, "--context", "elsewhere"],
    ))
    .await;
    assert!(out.status.success());
    assert_eq!(rows(&stdout)[1][0], "orders", "{stdout}");
    let (out, stdout, _) = finished(plugin_with_kubeconfig(
        missing,
        &[
            "status",
            "orders",
            "--kubeconfig",
            file_arg,
            "--context=elsewhere",
            "-o",
            "json",
        ],
    ))
    .await;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["items"][0]["metadata"]["namespace"], ns.as_str());

    // -n overrides the context's namespace.
    let (out, stdout, stderr) = finished(plugin_with_kubeconfig(
        missing,
        &[
            "list",
            "--kubeconfig",
            file_arg,
            "--context",
            "elsewhere",
            "-n",
            "default",
        ],
    ))
    .await;
    assert!(out.status.success());
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.trim(), "No Databases found in default namespace.");

    // KUBECONFIG is read when no --kubeconfig is given, with --context too.
    let (out, stdout, _) = finished(plugin_with_kubeconfig(
        &file,
        &["list", "--context", "elsewhere"],
    ))
    .await;
    assert!(out.status.success());
    assert_eq!(rows(&stdout)[1][0], "orders", "{stdout}");

    // Without --context the current context (here: no server) is the one used.
    let (out, _, stderr) = finished(plugin_with_kubeconfig(
        missing,
        &["list", "--kubeconfig", file_arg, "-n", &ns],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("cannot list Databases"), "{stderr}");
    let _ = std::fs::remove_file(&file);
}

#[tokio::test]
async fn list_and_status_output_show_databases_as_table_json_and_yaml() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-list").await;
    let _operator = bed.operator_in_process(&ns).await;
    // No manager runs in kwok: the test renews billing's primary Lease as its managers would.
    let _managers = Renewing::as_managers(&bed, &ns, "billing");
    bed.apply_database(&ns, database_manifest("orders", json!({})))
        .await;
    bed.apply_database(&ns, database_manifest("billing", json!({"instances": 2})))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    bed.wait_for_phase(&ns, "billing", Phase::Ready, WAIT).await;

    let (out, stdout, _) = finished(plugin(&bed, &["list", "-n", &ns])).await;
    assert!(out.status.success());
    let table = rows(&stdout);
    assert_eq!(
        table[0],
        [
            "NAME", "PHASE", "VERSION", "CURRENT", "READY", "PRIMARY", "AGE"
        ]
    );
    assert_eq!(
        &table[1][..6],
        ["billing", "Ready", "16.4", "16.4", "2/2", "billing-0"]
    );
    assert_eq!(
        &table[2][..6],
        ["orders", "Ready", "16.4", "16.4", "1/1", "orders-0"]
    );
    assert_eq!(table.len(), 3, "{stdout}");

    let (out, stdout, _) = finished(plugin(&bed, &["list", "--all-namespaces"])).await;
    assert!(out.status.success());
    assert_eq!(rows(&stdout)[0][0], "NAMESPACE");
    let ours: Vec<&str> = rows(&stdout)
        .into_iter()
        .filter(|r| r[0] == ns)
        .map(|r| r[1])
        .collect();
    assert_eq!(ours, ["billing", "orders"], "{stdout}");

    let (out, stdout, _) = finished(plugin(&bed, &["list", "-n", &ns, "-o", "json"])).await;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["kind"], "List");
    let mut names: Vec<&str> = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["billing", "orders"]);

    backup_by_hand(&bed, &ns, "orders-by-hand").await;
    let (out, stdout, _) =
        finished(plugin(&bed, &["status", "orders", "-n", &ns, "-o", "yaml"])).await;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_norway::from_str(&stdout).unwrap();
    let items: Vec<(&str, &str)> = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["kind"].as_str().unwrap(),
                i["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        items,
        [("Database", "orders"), ("DatabaseBackup", "orders-by-hand")]
    );
    assert_eq!(doc["items"][0]["status"]["phase"], "Ready");
    assert!(doc["items"][0]["metadata"].get("managedFields").is_none());
}

/// Runs `kubectl-dbop ARGS` with `KUBECTL=echo`: its output is the kubectl command line it
/// would run.
async fn kubectl_line(bed: &TestBed, args: &[&str]) -> (Output, String) {
    let out = tokio::process::Command::new(plugin_binary())
        .args(args)
        .env("KUBECONFIG", &bed.kubeconfig)
        .env("KUBECTL", "echo")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("kubectl-dbop");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    println!(
        "e2e: kubectl-dbop {args:?}: {line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, line)
}

/// A bare pod with these labels (kwok runs it), no operator involved.
async fn labelled_pod(bed: &TestBed, ns: &str, name: &str, labels: serde_json::Value) {
    let _: Pod = create(
        bed,
        ns,
        json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]}
        }),
    )
    .await;
}

/// `logs` picks the pod labelled `dbop.dev/role=primary` (not the first, not the status's),
/// an instance when named, refuses one that is not an instance; `--operator` the pod of the
/// chart's labels holding the leader Lease; `--kubeconfig` is passed on to kubectl.
#[tokio::test]
async fn logs_shows_the_labelled_primary_an_instance_or_the_operator_s_leader() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-logs").await;
    bed.apply_database(&ns, database_manifest("orders", json!({"instances": 3})))
        .await;
    let instance = |role: &str| {
        json!({"app.kubernetes.io/name": "postgresql", "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/managed-by": "dbop", "dbop.dev/role": role})
    };
    labelled_pod(&bed, &ns, "orders-0", instance("standby")).await;
    labelled_pod(&bed, &ns, "orders-1", instance("primary")).await;

    let (out, line) =
        kubectl_line(&bed, &["logs", "orders", "-n", &ns, "--tail", "20", "-f"]).await;
    assert!(out.status.success());
    assert_eq!(
        line,
        format!("logs -n {ns} orders-1 -c postgres -f --tail=20")
    );
    let (_, line) = kubectl_line(&bed, &["logs", "orders", "orders-2", "-n", &ns]).await;
    assert_eq!(line, format!("logs -n {ns} orders-2 -c postgres"));
    let (out, _) = kubectl_line(&bed, &["logs", "orders", "orders-7", "-n", &ns]).await;
    assert_eq!(out.status.code(), Some(1));
    let kubeconfig = bed.kubeconfig.to_str().unwrap();
    let (_, line) = kubectl_line(
        &bed,
        &["logs", "orders", "-n", &ns, "--kubeconfig", kubeconfig],
    )
    .await;
    assert_eq!(
        line,
        format!("--kubeconfig={kubeconfig} logs -n {ns} orders-1 -c postgres")
    );

    let operator_labels =
        json!({"app.kubernetes.io/name": "dbop", "app.kubernetes.io/component": "operator"});
    labelled_pod(&bed, &ns, "dbop-aaaa", operator_labels.clone()).await;
    labelled_pod(&bed, &ns, "dbop-bbbb", operator_labels.clone()).await;
    let _: k8s_openapi::api::coordination::v1::Lease = create(
        &bed,
        &ns,
        json!({"metadata": {"name": "dbop-leader"}, "spec": {"holderIdentity": "dbop-bbbb"}}),
    )
    .await;
    let (out, line) = kubectl_line(&bed, &["logs", "--operator", "--tail", "5", "-n", &ns]).await;
    assert!(out.status.success());
    assert_eq!(line, format!("logs -n {ns} dbop-bbbb -c dbop --tail=5"));
    // Without -n every namespace is searched; another installation (here: one in a second
    // namespace) is not guessed between.
    let other = bed.namespace("plugin-logs-other").await;
    labelled_pod(&bed, &other, "dbop-cccc", operator_labels.clone()).await;
    let (out, _) = kubectl_line(&bed, &["logs", "--operator"]).await;
    assert_eq!(out.status.code(), Some(1));
}

/// `restart` sets `dbop.dev/restartedAt`; the operator carries it into the StatefulSet's pod
/// template and its recorded inputs, so the StatefulSet has a new revision to roll out.
#[tokio::test]
async fn restart_rolls_the_pod_template_through_the_operator() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let bed = testbed().await;
    let ns = bed.namespace("plugin-restart").await;
    let _operator = bed.operator_in_process(&ns).await;
    let _managers = Renewing::as_managers(&bed, &ns, "orders");
    bed.apply_database(&ns, database_manifest("orders", json!({"instances": 2})))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    let before = statefulsets.get("orders").await.unwrap();
    let template_annotation = |s: &StatefulSet| {
        s.spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("dbop.dev/restartedAt").cloned())
    };
    assert_eq!(template_annotation(&before), None);

    let (out, stdout, _) = finished(plugin(&bed, &["restart", "orders", "-n", &ns])).await;
    assert!(out.status.success());
    assert!(stdout.contains("restart requested"), "{stdout}");
    let requested = bed
        .databases(&ns)
        .get("orders")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
        .get("dbop.dev/restartedAt")
        .cloned()
        .expect("the Database carries the request");
    let after = wait_until("the pod template restarted", WAIT, || async {
        let sts = statefulsets.get("orders").await.ok()?;
        (template_annotation(&sts).as_deref() == Some(requested.as_str())).then_some(sts)
    })
    .await;
    let inputs = after.metadata.annotations.unwrap_or_default()["dbop.dev/template-inputs"].clone();
    assert!(
        inputs.contains(&format!("\"restartedAt\":\"{requested}\"")),
        "{inputs}"
    );
    let revision = |s: &StatefulSet| s.status.as_ref().and_then(|s| s.update_revision.clone());
    wait_until("a new StatefulSet revision", WAIT, || async {
        let sts = statefulsets.get("orders").await.ok()?;
        (revision(&sts).is_some() && revision(&sts) != revision(&before)).then_some(())
    })
    .await;

    let (out, _, stderr) = finished(plugin(&bed, &["restart", "ghost", "-n", &ns])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("ghost not found"), "{stderr}");
}

/// A new namespace with Database orders of `instances` whose `spec.credentials` is a Secret
/// `app-creds` (user `shopapp`, this password).
async fn with_app_credentials(
    bed: &TestBed,
    prefix: &str,
    instances: i32,
    password: &str,
) -> String {
    let ns = bed.namespace(prefix).await;
    let _: Secret = create(
        bed,
        &ns,
        json!({"metadata": {"name": "app-creds"},
            "stringData": {"username": "shopapp", "password": password}}),
    )
    .await;
    let spec = json!({"instances": instances, "credentials": {"secretName": "app-creds"}});
    bed.apply_database(&ns, database_manifest("orders", spec))
        .await;
    ns
}

/// `reload` execs `SELECT pg_reload_conf()` in every instance (here through a stand-in kubectl
/// that logs its arguments, answers `t`, and fails for orders-1): each pod's outcome is
/// printed, and one failure is exit 1.
#[tokio::test]
async fn reload_runs_pg_reload_conf_in_every_instance_and_reports_each() {
    let bed = testbed().await;
    let ns = with_app_credentials(&bed, "plugin-reload", 3, "pw-never-on-argv").await;
    let dir = std::env::temp_dir().join(format!("{ns}-kubectl"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("kubectl");
    let log = dir.join("calls");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"$@\" >> \"$FAKE_KUBECTL_LOG\"\ncase \"$*\" in *' orders-1 '*) echo 'error: container postgres is not running' >&2; exit 1;; esac\necho t\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let out = tokio::process::Command::new(plugin_binary())
        .args(["reload", "orders", "-n", &ns])
        .env("KUBECONFIG", &bed.kubeconfig)
        .env("KUBECTL", &script)
        .env("FAKE_KUBECTL_LOG", &log)
        .output()
        .await
        .expect("kubectl-dbop reload");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("e2e: reload: {stdout}{stderr}");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "orders-0: configuration reloaded",
            "orders-2: configuration reloaded"
        ]
    );
    assert!(
        stderr.contains("orders-1: reload failed: error: container postgres is not running"),
        "{stderr}"
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let expected: Vec<String> = (0..3)
        .map(|i| format!("exec -i -n {ns} orders-{i} -c postgres -- psql -h /var/run/postgresql -U shopapp -d shopapp -X -A -t -c SELECT pg_reload_conf()"))
        .collect();
    assert_eq!(calls.lines().collect::<Vec<_>>(), expected);
    assert!(!format!("{calls}{stdout}{stderr}").contains("pw-never-on-argv"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `restore` makes a new Database restoring the DatabaseBackup with the source's version and
/// storage (`--storage-size` overrides one); `--dry-run` prints it and creates nothing; without
/// a terminal it does not ask, on one it asks and only a yes creates; an existing Database of
/// the new name is refused and left as it was.
#[tokio::test]
async fn restore_creates_a_new_database_from_a_backup_and_never_overwrites() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-restore").await;
    bed.apply_database(
        &ns,
        database_manifest(
            "orders",
            json!({"version": "16.4", "storage": {"size": "3Gi", "storageClassName": "fast"}}),
        ),
    )
    .await;
    backup_by_hand(&bed, &ns, "orders-by-hand").await;
    let args = |to: &'static str, extra: &[&'static str]| {
        let mut args: Vec<String> = [
            "restore",
            "orders",
            "--from-backup",
            "orders-by-hand",
            "--to",
            to,
            "-n",
        ]
        .map(String::from)
        .to_vec();
        args.push(ns.clone());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        finished(plugin(&bed, &refs))
    };
    let databases = bed.databases(&ns);

    let (out, stdout, _) = run(args("orders-copy", &["--dry-run"])).await;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_norway::from_str(&stdout).unwrap();
    assert_eq!(doc["kind"], "Database");
    assert_eq!(doc["metadata"]["name"], "orders-copy");
    assert_eq!(doc["spec"]["version"], "16.4");
    assert_eq!(
        doc["spec"]["storage"],
        json!({"size": "3Gi", "storageClassName": "fast"})
    );
    assert_eq!(
        doc["spec"]["bootstrap"],
        json!({"fromBackup": {"databaseBackup": "orders-by-hand"}})
    );
    assert!(databases.get_opt("orders-copy").await.unwrap().is_none());

    // stdin is not a terminal: no question.
    let (out, stdout, _) = run(args("orders-copy", &["--storage-size", "5Gi"])).await;
    assert!(out.status.success());
    assert!(
        stdout.contains(&format!(
            "Will create Database {ns}/orders-copy: version 16.4, 5Gi of fast"
        )),
        "{stdout}"
    );
    let created = databases.get("orders-copy").await.unwrap();
    assert_eq!(created.spec.storage.size, "5Gi");
    let from = created
        .spec
        .bootstrap
        .as_ref()
        .unwrap()
        .from_backup
        .database_backup
        .clone();
    assert_eq!(from.as_deref(), Some("orders-by-hand"));

    let version = created.metadata.resource_version.clone();
    let (out, _, stderr) = run(args("orders-copy", &["--yes", "--storage-size", "9Gi"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("already exists"), "{stderr}");
    let after = databases.get("orders-copy").await.unwrap();
    assert_eq!(after.metadata.resource_version, version);

    // On a terminal (util-linux `script` gives it one) it asks; only a yes creates.
    let on_a_terminal = |answer: &'static str, to: &'static str| {
        let line = format!("{} {}", plugin_binary().display(), args(to, &[]).join(" "));
        let mut child = tokio::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("KUBECONFIG", &bed.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("script (util-linux)");
        let mut stdin = child.stdin.take().unwrap();
        async move {
            use tokio::io::AsyncWriteExt;
            stdin.write_all(answer.as_bytes()).await.unwrap();
            drop(stdin);
            finished(child).await
        }
    };
    let (out, stdout, _) = on_a_terminal("n\n", "orders-asked").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout.contains("Create it? [y/N] Nothing created."),
        "{stdout}"
    );
    assert!(databases.get_opt("orders-asked").await.unwrap().is_none());
    let (out, stdout, _) = on_a_terminal("y\n", "orders-asked").await;
    assert!(out.status.success());
    assert!(
        stdout.contains("database.dbop.dev/orders-asked created"),
        "{stdout}"
    );
    assert!(databases.get_opt("orders-asked").await.unwrap().is_some());

    let (out, _, stderr) = run(args("orders", &["--yes"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("new Database"), "{stderr}");
    let (out, _, stderr) = finished(plugin(
        &bed,
        &[
            "restore",
            "orders",
            "--from-backup",
            "ghost",
            "--to",
            "x",
            "-n",
            &ns,
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("DatabaseBackup") && stderr.contains("ghost not found"),
        "{stderr}"
    );
}

/// `completion` needs no cluster: it answers before reading a kubeconfig.
#[tokio::test]
async fn completion_needs_no_kubeconfig() {
    let out = tokio::process::Command::new(plugin_binary())
        .args(["completion", "zsh"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .await
        .expect("kubectl-dbop completion");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("#compdef kubectl-dbop"));
}

/// `kubectl dbop <TAB>`: the real kubectl finds `kubectl_complete-dbop` (a link to the
/// plugin, as `make plugin` installs it) and offers its commands, a flag's values, and the
/// Databases of the namespace `-n` names, from the cluster.
#[tokio::test]
async fn kubectl_s_own_completion_offers_commands_values_and_database_names() {
    let bed = testbed().await;
    let ns = bed.namespace("plugin-complete").await;
    for name in ["orders", "ops", "shop"] {
        bed.apply_database(&ns, database_manifest(name, json!({})))
            .await;
    }
    let bin = tempdir_for_links();
    for link in ["kubectl-dbop", "kubectl_complete-dbop"] {
        std::os::unix::fs::symlink(plugin_binary(), bin.join(link)).expect("link");
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let complete = |words: &[&str]| {
        let out = std::process::Command::new(bed.kubectl_path())
            .args(["__complete", "dbop"])
            .args(words)
            .env("KUBECONFIG", &bed.kubeconfig)
            .env("PATH", &path)
            .output()
            .expect("kubectl __complete");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let commands = complete(&[""]);
    for command in ["status", "list", "restore", "report", "completion"] {
        assert!(commands.lines().any(|l| l == command), "{commands}");
    }
    assert!(commands.ends_with(":4\n"), "{commands}");
    assert_eq!(complete(&["status", "-n", &ns, "o"]), "ops\norders\n:4\n");
    assert_eq!(complete(&["-n", &ns, "list", "-o", ""]), "json\nyaml\n:4\n");
    // Another namespace's Databases are not offered; a cluster that cannot be read offers none.
    let empty = bed.namespace("plugin-complete-empty").await;
    assert_eq!(complete(&["status", "-n", &empty, "o"]), ":4\n");
    assert_eq!(
        complete(&["status", "--kubeconfig", "/nonexistent", ""]),
        ":4\n"
    );
    std::fs::remove_dir_all(&bin).ok();
}

/// A fresh directory for the completion test's links.
fn tempdir_for_links() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dbop-e2e-complete-{}-{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the links");
    dir
}

/// Every file under `dir`, by path relative to it.
fn files_under(dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(
                    rel,
                    String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned(),
                );
            }
        }
    }
    out
}

/// `report` writes the Database, its backups, the objects dbop made, Events and logs (on kwok
/// the logs cannot be read: README.txt says so) into a directory or a `.tar.gz`; every Secret
/// of the namespace is listed by name and keys, and no value of any of them (nor its base64)
/// is anywhere in the bundle.
#[tokio::test]
async fn report_collects_the_database_s_objects_and_never_a_secret_value() {
    let bed = testbed().await;
    let ns = with_app_credentials(&bed, "plugin-report", 1, "pw-never-in-a-report").await;
    let _operator = bed.operator_in_process(&ns).await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;

    let tmp = std::env::temp_dir().join(format!("{ns}-report"));
    std::fs::create_dir_all(&tmp).unwrap();
    let dir = tmp.join("bundle");
    let report_to = |out: &PathBuf| {
        let out = out.to_str().unwrap().to_string();
        finished(plugin(&bed, &["report", "orders", "-n", &ns, "-o", &out]))
    };
    let (out, stdout, _) = report_to(&dir).await;
    assert!(out.status.success());
    assert!(stdout.contains("wrote"), "{stdout}");
    let files = files_under(&dir);
    for file in [
        "README.txt",
        "database.yaml",
        "databasebackups.yaml",
        "statefulsets.yaml",
        "pods.yaml",
        "persistentvolumeclaims.yaml",
        "services.yaml",
        "jobs.yaml",
        "configmaps.yaml",
        "events.yaml",
        "secrets.yaml",
    ] {
        assert!(files.contains_key(file), "no {file} in {:?}", files.keys());
    }
    let db: serde_json::Value = serde_norway::from_str(&files["database.yaml"]).unwrap();
    assert_eq!(db["metadata"]["name"], "orders");
    assert!(files["pods.yaml"].contains("name: orders-0"));
    assert!(files["statefulsets.yaml"].contains("kind: StatefulSet"));
    assert!(files["services.yaml"].contains("name: orders-rw"));
    assert!(
        files["README.txt"].contains("log of orders-0/postgres"),
        "{}",
        files["README.txt"]
    );
    let listing: serde_json::Value = serde_norway::from_str(&files["secrets.yaml"]).unwrap();
    let app = listing["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "app-creds")
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(app["keys"], json!(["password", "username"]));

    // No value of any Secret in the namespace (the generated ones too), raw or base64: only
    // the ones that are public anyway (the Service's host, the port, names, certificates) may
    // appear, in the Database's status or a ConfigMap.
    let public = ["host", "port", "dbname", "username", "ca.crt", "tls.crt"];
    let secrets = Api::<Secret>::namespaced(bed.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(secrets.len() > 2, "{}", secrets.len());
    let values: Vec<String> = secrets
        .iter()
        .flat_map(|s| s.data.clone().unwrap_or_default())
        .filter(|(k, v)| !public.contains(&k.as_str()) && v.0.len() >= 8)
        .map(|(_, v)| v)
        .flat_map(|v| {
            let json = serde_json::to_value(&v).unwrap(); // base64, as the API serves it
            [
                String::from_utf8_lossy(&v.0).into_owned(),
                json.as_str().unwrap().to_string(),
            ]
        })
        .collect();
    assert!(values.iter().any(|v| v == "pw-never-in-a-report"));
    let everything: String = files.values().cloned().collect();
    for value in &values {
        assert!(
            !everything.contains(value.as_str()),
            "a Secret value in the report"
        );
    }

    let archive = tmp.join("bundle.tar.gz");
    let (out, _, _) = report_to(&archive).await;
    assert!(out.status.success());
    let extracted = tmp.join("extracted");
    std::fs::create_dir_all(&extracted).unwrap();
    let tar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&extracted)
        .status()
        .expect("tar");
    assert!(tar.success());
    let from_archive = files_under(&extracted.join(format!("dbop-report-{ns}-orders")));
    assert_eq!(
        from_archive.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>()
    );
    let everything: String = from_archive.values().cloned().collect();
    for value in &values {
        assert!(
            !everything.contains(value.as_str()),
            "a Secret value in the archive"
        );
    }
    // An existing path is not written over.
    let (out, _, stderr) = report_to(&archive).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("exists"), "{stderr}");
    let _ = std::fs::remove_dir_all(&tmp);
}
