//! Secret hygiene across a full scenario on the kwok test bed: a Database with generated
//! credentials and scheduled, encrypted backups to S3 (its Secret holds a known secret key,
//! the encryption keys' Secret a known key) is driven to Ready and through one scheduled
//! backup (kwok completes the backup pod with a termination message the test supplies). Then
//! everything an operator of the cluster can read — the operator's own log (the real binary at
//! debug level), every Event, every object in the namespace but the Secrets (Database and
//! DatabaseBackup with their status, Jobs, pods, StatefulSets, Services, ConfigMaps, PVCs) —
//! is searched for the generated password, the S3 secret key, the encryption key and the
//! private keys of the Database's TLS (its CA's and its server certificate's). None may
//! appear; the password may only be in its own Secret. And no pod template dbop made (Jobs,
//! StatefulSets, their pods) reads a Secret into an environment variable: secrets reach the
//! containers as mounted files only.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::{
    TestBed, WAIT, backup_jobs, database_manifest, operator_binary_path, testbed, wait_until,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{ApiResource, Discovery, Scope};
use kube::{Api, Client};
use serde_json::json;

/// Long enough for a minute boundary to pass and the operator to act on it.
const NEXT_MINUTE: Duration = Duration::from_secs(150);

/// The S3 secret key the test plants; random so no other text matches it by chance.
fn s3_secret_key() -> String {
    format!("s3-secret-{:016x}", rand::random::<u64>())
}

/// The real operator binary at debug level, its stdout and stderr in `log`. Killed on drop.
struct Operator(Child);

impl Operator {
    fn start(bed: &TestBed, namespace: &str, log: &Path) -> Operator {
        let file = std::fs::File::create(log).expect("operator log file");
        let child = std::process::Command::new(operator_binary_path())
            .args(["run", "--namespace", namespace])
            .env("KUBECONFIG", &bed.kubeconfig)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log handle"))
            .stderr(file)
            .spawn()
            .expect("the dbop binary (run `cargo build --bins` first)");
        Operator(child)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The backups' encryption key the test plants (as `openssl rand -base64 32` makes one).
fn encryption_key() -> String {
    let bytes: [u8; 32] = rand::random();
    serde_json::to_value(ByteString(bytes.to_vec()))
        .expect("base64")
        .as_str()
        .expect("a string")
        .to_string()
}

/// The Secret of the encryption keys: an older key and the one in use.
async fn encryption_secret(bed: &TestBed, ns: &str, key: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "backup-keys"},
        "stringData": {"k0": encryption_key(), "k1": key}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(bed.client.clone(), ns)
        .create(&Default::default(), &secret)
        .await
        .expect("create the encryption keys' Secret");
}

fn backup_spec() -> serde_json::Value {
    json!({
        "backup": {
            "schedule": "* * * * *",
            "s3": {
                "endpoint": "http://minio.storage.svc:9000",
                "bucket": "backups",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds"}
            },
            "encryption": {"secretName": "backup-keys", "keyName": "k1"}
        },
        // A declared role with a password of the user's, and the superuser off the network
        // (dbop's Jobs carry its client certificate).
        "roles": [{"name": "reporting", "passwordSecret": {"name": "reporting-pw", "key": "password"}}],
        "tls": {"superuserAuthentication": "Certificate"},
        // The backup pod stays Running until the test gives it an outcome.
        "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}}
    })
}

/// The generated password, read from the Secret dbop made.
async fn generated_password(bed: &TestBed, ns: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), ns);
    wait_until("the generated credentials Secret", WAIT, || async {
        let secret = secrets.get_opt("orders-credentials").await.ok()??;
        let ByteString(bytes) = secret.data?.get("password")?.clone();
        String::from_utf8(bytes).ok()
    })
    .await
}

/// Drives the first scheduled backup to Succeeded: kwok ends its pod with the agent's result.
async fn run_one_backup(bed: &TestBed, ns: &str) -> String {
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let name = wait_until("a scheduled DatabaseBackup", NEXT_MINUTE, || async {
        backups
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .first()?
            .metadata
            .name
            .clone()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let selector = format!("dbop.dev/backup={name}");
    let pod = wait_until("the backup pod running", WAIT, || async {
        pods.list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let result = json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": "20250501T020003Z-x",
        "database": "postgres", "bucket": "backups", "sizeBytes": 4242,
        "sha256": "ab".repeat(32), "engineVersion": "16.4",
        "startedAt": now, "completedAt": now, "message": "dumped 10000 bytes"
    });
    let patch = json!({"metadata": {"annotations": {
        "testbed.dbop.dev/outcome": "Succeeded",
        "testbed.dbop.dev/termination-message": result.to_string(),
    }}});
    pods.patch(
        pod.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("annotate the backup pod");
    wait_until(&format!("backup {name} Succeeded"), WAIT, || async {
        let b = backups.get(&name).await.ok()?;
        (b.status?.phase == Some(BackupPhase::Succeeded)).then_some(())
    })
    .await;
    name
}

/// Every namespaced object in `ns` the API server lists (Events included), as JSON text, by
/// `kind/name` — except Secrets, which are where the credentials belong.
async fn everything_but_secrets(client: &Client, ns: &str) -> Vec<(String, String)> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("API discovery");
    let mut found = vec![];
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            let listable = caps.supports_operation(kube::discovery::verbs::LIST);
            if caps.scope != Scope::Namespaced || !listable || resource.kind == "Secret" {
                continue;
            }
            found.extend(list_as_text(client, ns, &resource).await);
        }
    }
    found
}

async fn list_as_text(client: &Client, ns: &str, resource: &ApiResource) -> Vec<(String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return vec![];
    };
    list.items
        .into_iter()
        .map(|o| {
            let name = format!(
                "{}/{}",
                resource.kind,
                o.metadata.name.clone().unwrap_or_default()
            );
            (name, serde_json::to_string(&o).expect("JSON"))
        })
        .collect()
}

/// Where `needle` (or its base64 form, as Secret-like data would hold it) occurs.
fn leaks<'a>(haystacks: &'a [(String, String)], needle: &str) -> Vec<&'a str> {
    // A ByteString serialises as base64, as a Secret's or ConfigMap's data holds it.
    let b64 = serde_json::to_value(ByteString(needle.as_bytes().to_vec())).expect("base64");
    let b64 = b64.as_str().expect("a string");
    haystacks
        .iter()
        .filter(|(_, text)| text.contains(needle) || text.contains(b64))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// The containers (and init containers) of every pod template and pod in `objects` (Jobs,
/// StatefulSets, Pods) whose environment reads a Secret (`valueFrom.secretKeyRef` or
/// `envFrom.secretRef`), as `kind/name container VAR`.
fn secret_env_vars(objects: &[(String, String)]) -> (usize, Vec<String>) {
    let mut templates = 0;
    let mut found = vec![];
    for (name, text) in objects {
        let kind = name.split('/').next().unwrap_or_default();
        let object: serde_json::Value = serde_json::from_str(text).expect("JSON");
        let spec = match kind {
            "Job" | "StatefulSet" => &object["spec"]["template"]["spec"],
            "Pod" => &object["spec"],
            _ => continue,
        };
        templates += 1;
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                let container = c["name"].as_str().unwrap_or_default();
                for e in c["env"].as_array().into_iter().flatten() {
                    if !e["valueFrom"]["secretKeyRef"].is_null() {
                        found.push(format!("{name} {container} {}", e["name"]));
                    }
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    if !e["secretRef"].is_null() {
                        found.push(format!("{name} {container} envFrom {}", e["secretRef"]));
                    }
                }
            }
        }
    }
    (templates, found)
}

/// A key of a Secret as text, once it exists.
async fn secret_text(bed: &TestBed, ns: &str, name: &str, key: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), ns);
    wait_until(&format!("Secret {name}"), WAIT, || async {
        let secret = secrets.get_opt(name).await.ok()??;
        let ByteString(bytes) = secret.data?.get(key)?.clone();
        String::from_utf8(bytes).ok()
    })
    .await
}

/// A line of the PEM private key under `key` of dbop's Secret `name` (the first of its base64
/// body: 64 characters no other text has), once dbop has made it.
async fn key_line(bed: &TestBed, ns: &str, name: &str, key: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), ns);
    wait_until(&format!("Secret {name}"), WAIT, || async {
        let secret = secrets.get_opt(name).await.ok()??;
        let ByteString(bytes) = secret.data?.get(key)?.clone();
        let pem = String::from_utf8(bytes).ok()?;
        let line = pem.lines().nth(1)?.to_string();
        (line.len() >= 40).then_some(line)
    })
    .await
}

#[tokio::test]
async fn no_password_or_s3_secret_key_outside_their_secrets() {
    let bed = testbed().await;
    let ns = bed.namespace("hygiene").await;
    let secret_key = s3_secret_key();
    backup_jobs::s3_secret_with_key(&bed, &ns, &secret_key).await;
    let key = encryption_key();
    encryption_secret(&bed, &ns, &key).await;
    let role_password = encryption_key();
    let role_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "reporting-pw"},
        "stringData": {"password": role_password}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(bed.client.clone(), &ns)
        .create(&Default::default(), &role_secret)
        .await
        .expect("the role's password Secret");
    let log = bed.dir.join("logs").join(format!("dbop-{ns}-debug.log"));
    std::fs::create_dir_all(log.parent().unwrap()).expect("log directory");
    let operator = Operator::start(&bed, &ns, &log);
    bed.apply_database(&ns, database_manifest("orders", backup_spec()))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    let password = generated_password(&bed, &ns).await;
    let application_password = secret_text(&bed, &ns, "orders-app", "password").await;
    let superuser_key = key_line(&bed, &ns, "orders-superuser-tls", "tls.key").await;
    let server_key = key_line(&bed, &ns, "orders-server-tls", "tls.key").await;
    let ca_key = key_line(&bed, &ns, "orders-ca", "ca.key").await;
    let backup = run_one_backup(&bed, &ns).await;
    drop(operator);

    let mut searched = everything_but_secrets(&bed.client, &ns).await;
    let log_text = std::fs::read_to_string(&log).expect("operator log");
    let kinds: std::collections::BTreeSet<&str> = searched
        .iter()
        .filter_map(|(n, _)| n.split('/').next())
        .collect();
    println!(
        "hygiene: searched {} objects ({kinds:?}) and {} log lines; backup {backup}",
        searched.len(),
        log_text.lines().count()
    );
    for kind in [
        "Database",
        "DatabaseBackup",
        "Event",
        "Job",
        "Pod",
        "StatefulSet",
    ] {
        assert!(
            kinds.contains(kind),
            "no {kind} was collected: the search would prove little"
        );
    }
    assert!(
        log_text.lines().count() > 20,
        "the operator logged almost nothing"
    );
    // No container of any Job, StatefulSet or pod dbop made reads a Secret into its
    // environment (the backup Job mounts the credentials, the S3 key and the encryption keys).
    let (templates, env_refs) = secret_env_vars(&searched);
    assert!(templates >= 3, "only {templates} pod specs were looked at");
    assert!(
        env_refs.is_empty(),
        "Secrets read into environment variables: {env_refs:?}"
    );
    let job = searched
        .iter()
        .find(|(n, _)| n.starts_with("Job/"))
        .map(|(_, text)| text.clone())
        .expect("the backup Job");
    assert!(
        job.contains("\"secretName\":\"backup-keys\""),
        "the keys are mounted"
    );
    assert!(job.contains("--encryption-key=k1"), "the key is named");
    searched.push(("the operator's log".into(), log_text));
    for (what, secret) in [
        ("the generated password", &password),
        ("the S3 secret key", &secret_key),
        ("the encryption key", &key),
        ("the server certificate's private key", &server_key),
        ("the CA's private key", &ca_key),
        ("the application's password", &application_password),
        ("the declared role's password", &role_password),
        ("the superuser's client key", &superuser_key),
    ] {
        let found = leaks(&searched, secret);
        assert!(found.is_empty(), "{what} appears in {found:?}");
    }
    // And the search can find them where they are.
    let in_secrets = list_as_text(&bed.client, &ns, &ApiResource::erase::<Secret>(&())).await;
    assert_eq!(
        leaks(&in_secrets, &password),
        vec!["Secret/orders-credentials"]
    );
    assert_eq!(leaks(&in_secrets, &secret_key), vec!["Secret/s3-creds"]);
    assert_eq!(leaks(&in_secrets, &key), vec!["Secret/backup-keys"]);
    assert_eq!(
        leaks(&in_secrets, &application_password),
        vec!["Secret/orders-accounts", "Secret/orders-app"]
    );
    assert_eq!(
        leaks(&in_secrets, &role_password),
        vec!["Secret/orders-accounts", "Secret/reporting-pw"]
    );
    // The backup Job presents the superuser's client certificate.
    assert!(
        job.contains("orders-superuser-tls"),
        "the client certificate is mounted"
    );
}
