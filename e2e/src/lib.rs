//! The harness of dbop's end-to-end suites: connect to the local control plane (`make
//! testbed-up`), install the CRDs, give each test its own namespace, and run the operator either
//! in-process or as the real binary (so a test can `kill -9` it). Also reads the API server's
//! audit log to count the operator's writes.
//!
//! An unreachable test bed is a failure, never a skip: these suites run only under
//! `make test-e2e`, which brings the test bed up first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use dbop::api::{Database, Phase};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rand::Rng;
use serde_json::Value;

pub mod agent_restore;
pub mod backup_jobs;
pub mod chaos;
pub mod failover;
pub mod fingerprint;
pub mod instances;
pub mod node;
pub mod plugin;
pub mod primary_lease;
pub mod sized_volume;

/// The user agent of the test's own requests (the operator's start with `dbop/`).
pub const TEST_USER_AGENT: &str = "e2e-tests/1";

/// How long the usual waits may take on a busy 2-core machine.
pub const WAIT: Duration = Duration::from_secs(90);

pub mod reconciles;
pub mod watch;

/// A connection to the test bed.
pub struct TestBed {
    pub client: Client,
    pub kubeconfig: PathBuf,
    /// The test bed's state directory (audit log, logs).
    pub dir: PathBuf,
}

/// Connects to the test bed named by `KUBECONFIG` (default `.testbed/kubeconfig`) and makes
/// sure the CRDs are installed. Panics with a clear message when it cannot.
pub async fn testbed() -> TestBed {
    init_logging();
    let kubeconfig = std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".testbed/kubeconfig"));
    assert!(
        kubeconfig.exists(),
        "no test bed: {} does not exist. Run the e2e suites with `make test-e2e` (it starts the test bed).",
        kubeconfig.display()
    );
    let dir = std::env::var_os("DBOP_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| kubeconfig.parent().unwrap_or(Path::new(".")).to_path_buf());
    let client = client_for(&kubeconfig, TEST_USER_AGENT).await;
    let version = client.apiserver_version().await.unwrap_or_else(|e| {
        panic!(
            "the test bed at {} does not answer: {e}",
            kubeconfig.display()
        )
    });
    tracing::debug!(version = %version.git_version, "connected to the test bed");
    let bed = TestBed {
        client,
        kubeconfig,
        dir,
    };
    bed.install_crds().await;
    bed
}

fn init_logging() {
    use tracing_subscriber::prelude::*;
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(env),
        )
        .with(reconciles::Recorder::layer())
        .try_init();
}

/// A client for this kubeconfig with the given user agent.
pub async fn client_for(kubeconfig: &Path, user_agent: &'static str) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("readable kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("valid kubeconfig");
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    Client::try_from(config).expect("client")
}

/// The label of the namespaces a suite creates: `e2e-suites` names the suite in
/// `DBOP_E2E_SUITE` and deletes them when the suite ends (`delete_suite_namespaces`).
pub const SUITE_LABEL: &str = "testbed.dbop.dev/suite";

/// The labels of a namespace a test creates: the suite it belongs to, when `e2e-suites` runs it.
pub fn suite_label() -> Value {
    match std::env::var("DBOP_E2E_SUITE") {
        Ok(suite) => serde_json::json!({ SUITE_LABEL: suite }),
        Err(_) => serde_json::json!({}),
    }
}

/// Deletes the namespaces a finished suite created, so that its database pods, S3 servers and
/// claims stop holding the real node's CPU, pod slots and volumes while later suites run. The
/// namespace controller removes the pods even while a Database keeps its finalizer (the suite's
/// operator is gone); nothing waits for that.
pub async fn delete_suite_namespaces(
    kubeconfig: &Path,
    suite: &str,
) -> Result<Vec<String>, String> {
    let client = client_for(kubeconfig, TEST_USER_AGENT).await;
    let api: Api<Namespace> = Api::all(client);
    let selector = format!("{SUITE_LABEL}={suite}");
    let list = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing the namespaces of {suite}: {e}"))?;
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.name)
        .collect();
    for name in &names {
        match api.delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(format!("deleting namespace {name}: {e}")),
        }
    }
    Ok(names)
}

/// The workspace root (the e2e crate sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

impl TestBed {
    /// Applies the checked-in CRDs (server-side apply, idempotent) and waits until established.
    pub async fn install_crds(&self) {
        self.install_crd_file("crds/dbop.dev.yaml").await;
    }

    /// Applies every CRD of the YAML file at `path` (from the workspace root; server-side
    /// apply, idempotent) and waits until each is established.
    pub async fn install_crd_file(&self, path: &str) {
        let text = std::fs::read_to_string(workspace_root().join(path)).expect(path);
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for doc in text
            .split("\n---\n")
            .filter(|d| d.contains("kind: CustomResourceDefinition"))
        {
            let crd: CustomResourceDefinition = serde_norway::from_str(doc).expect("CRD YAML");
            let name = crd.metadata.name.clone().expect("CRD name");
            api.patch(
                &name,
                &PatchParams::apply("dbop-e2e").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("the API server refused CRD {name}: {e}"));
            wait_until(
                &format!("CRD {name} established"),
                Duration::from_secs(30),
                || async {
                    let crd = api.get(&name).await.ok()?;
                    crd.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                },
            )
            .await;
        }
    }

    /// Creates a fresh namespace `e2e-<prefix>-<random>` and waits for its default ServiceAccount
    /// (pods cannot be created before it exists).
    pub async fn namespace(&self, prefix: &str) -> String {
        let suffix: u32 = rand::rng().random_range(0..1_000_000);
        let name = format!("e2e-{prefix}-{suffix:06}");
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {
            "name": name, "labels": suite_label()}}))
        .unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
        let sa: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &name);
        wait_until(
            "the default ServiceAccount",
            Duration::from_secs(60),
            || async { sa.get_opt("default").await.ok().flatten().map(|_| ()) },
        )
        .await;
        name
    }

    /// Starts the controller in this process, watching one namespace. Stops when dropped.
    pub async fn operator_in_process(&self, namespace: &str) -> InProcessOperator {
        let client = client_for(&self.kubeconfig, dbop::USER_AGENT).await;
        let ns = namespace.to_string();
        let task = tokio::spawn(async move {
            dbop::runtime::run(client, dbop::settings::Settings::default(), Some(ns)).await;
        });
        InProcessOperator { task }
    }

    /// Starts the real `dbop run` binary, watching one namespace. Killed (SIGKILL) when dropped.
    pub fn operator_binary(&self, namespace: &str) -> OperatorProcess {
        self.operator_binary_with_env(namespace, &[])
    }

    /// Like [`TestBed::operator_binary`], with extra environment (the operator's settings).
    pub fn operator_binary_with_env(
        &self,
        namespace: &str,
        env: &[(&str, &str)],
    ) -> OperatorProcess {
        let binary = operator_binary_path();
        let log_path = self.dir.join("logs").join(format!("dbop-{namespace}.log"));
        let _ = std::fs::create_dir_all(log_path.parent().unwrap());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("operator log file");
        let child = std::process::Command::new(&binary)
            .args([
                "run",
                "--namespace",
                namespace,
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            // DBOP_E2E_OPERATOR_LOG (e.g. `dbop=debug`) for a closer look at one suite.
            .env(
                "RUST_LOG",
                std::env::var("DBOP_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (run `cargo build --bins` first)",
                    binary.display()
                )
            });
        OperatorProcess { child, log_path }
    }

    /// `helm ARGS` with the test bed's kubeconfig and helm's own state under the test bed's
    /// directory (the test bed's helm, built from Go modules); returns (success, stdout, stderr).
    pub fn helm(&self, args: &[&str]) -> (bool, String, String) {
        let binary = self.dir.join("tools-bin/helm");
        assert!(
            binary.exists(),
            "no helm at {}: e2e/testbed/build.sh tools builds it (make testbed-up does)",
            binary.display()
        );
        let home = self.dir.join("helm");
        let out = std::process::Command::new(&binary)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .expect("running helm");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn databases(&self, namespace: &str) -> Api<Database> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Applies a Database manifest (JSON) in the namespace.
    pub async fn apply_database(&self, namespace: &str, manifest: Value) -> Database {
        let name = manifest["metadata"]["name"].clone();
        self.try_apply_database(namespace, manifest)
            .await
            .unwrap_or_else(|e| panic!("Database {name} refused: {e}"))
    }

    /// Applies a Database manifest (JSON) in the namespace: the Database, or the API server's
    /// refusal as text.
    pub async fn try_apply_database(
        &self,
        namespace: &str,
        mut manifest: Value,
    ) -> Result<Database, String> {
        let name = manifest["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        manifest["apiVersion"] = "dbop.dev/v1alpha1".into();
        manifest["kind"] = "Database".into();
        self.databases(namespace)
            .patch(
                &name,
                &PatchParams::apply("e2e-tests").force(),
                &Patch::Apply(&manifest),
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// Waits until the Database reaches the phase, and returns it.
    pub async fn wait_for_phase(
        &self,
        namespace: &str,
        name: &str,
        phase: Phase,
        timeout: Duration,
    ) -> Database {
        let api = self.databases(namespace);
        let found = wait_until_or_none(timeout, || async {
            let db = api.get(name).await.ok()?;
            (db.status.as_ref().and_then(|s| s.phase) == Some(phase)).then_some(db)
        })
        .await;
        match found {
            Some(db) => db,
            None => {
                let last = api.get(name).await.ok().and_then(|db| db.status);
                let around = self.namespace_report(namespace).await;
                panic!(
                    "Database {namespace}/{name} did not reach {phase:?} within {timeout:?}; last status: {last:#?}\n{around}"
                )
            }
        }
    }

    /// What a timed-out wait leaves to read: every pod of the namespace with its phase, node,
    /// unmet conditions and container states, every claim with its phase, and the Warning Events.
    pub async fn namespace_report(&self, namespace: &str) -> String {
        use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
        let lp = kube::api::ListParams::default();
        let mut out = format!("namespace {namespace}:\n");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        for pod in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            let status = pod.status.unwrap_or_default();
            let spec = pod.spec.unwrap_or_default();
            out += &format!(
                "  pod {} {} on {}\n",
                pod.metadata.name.unwrap_or_default(),
                status.phase.unwrap_or_default(),
                spec.node_name.unwrap_or_else(|| "no node".into())
            );
            for c in status.conditions.unwrap_or_default() {
                if c.status != "True" {
                    out += &format!(
                        "    {} {}: {} {}\n",
                        c.type_,
                        c.status,
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default()
                    );
                }
            }
            let containers = status.init_container_statuses.into_iter().flatten();
            for c in containers.chain(status.container_statuses.into_iter().flatten()) {
                out += &format!(
                    "    container {} ready={} restarts={} state={}\n",
                    c.name,
                    c.ready,
                    c.restart_count,
                    serde_json::to_string(&c.state).unwrap_or_default()
                );
            }
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        for pvc in claims.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            out += &format!(
                "  claim {} {}\n",
                pvc.metadata.name.unwrap_or_default(),
                pvc.status.and_then(|s| s.phase).unwrap_or_default()
            );
        }
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        for e in events.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            if e.type_.as_deref() == Some("Warning") {
                out += &format!(
                    "  event {} {}: {}\n",
                    e.involved_object.name.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
            }
        }
        out
    }

    /// The audit-log entries of write requests sent by the operator (user agent `dbop/…`) in
    /// this namespace.
    pub fn operator_writes(&self, namespace: &str) -> Vec<AuditEntry> {
        let path = self.dir.join("audit.log");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read the audit log {}: {e}", path.display()));
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| {
                e["userAgent"]
                    .as_str()
                    .is_some_and(|ua| ua.starts_with("dbop/"))
            })
            .filter(|e| e["objectRef"]["namespace"].as_str() == Some(namespace))
            .map(|e| AuditEntry {
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                resource: e["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                subresource: e["objectRef"]["subresource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name: e["objectRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                at: e["requestReceivedTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect()
    }
}

/// One write request in the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub at: String,
}

/// The operator running as a task of the test process.
pub struct InProcessOperator {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for InProcessOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The operator running as its own process.
pub struct OperatorProcess {
    child: std::process::Child,
    pub log_path: PathBuf,
}

impl OperatorProcess {
    /// `kill -9`: no shutdown, no cleanup, like a node dying.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Where it serves `/metrics`, from its log line (it listens on port 0); None until then.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        let text = std::fs::read_to_string(&self.log_path).ok()?;
        text.lines()
            .filter(|l| l.contains("serving /metrics"))
            .find_map(|l| {
                l.split("local=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
    }

    /// The tail of the operator's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The `dbop` binary next to this test executable (`<target>/debug/dbop`), or `DBOP_BIN`.
pub fn operator_binary_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/debug/deps/<test> → <target>/debug/dbop
    exe.parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("dbop"))
        .expect("target directory")
}

/// Polls `check` every 200 ms until it returns Some, or panics after `timeout`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_until_or_none(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` every 200 ms until it returns Some; None after `timeout`.
pub async fn wait_until_or_none<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if start.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The condition of the given type on a Database, as (status, reason).
pub fn condition(db: &Database, type_: &str) -> Option<(String, String)> {
    find_condition(db, type_).map(|c| (c.status.clone(), c.reason.clone()))
}

/// The message of the Database's condition `type_` ("" when it has none).
pub fn condition_message(db: &Database, type_: &str) -> String {
    find_condition(db, type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The Database's condition `type_`, if its status has one.
fn find_condition<'a>(db: &'a Database, type_: &str) -> Option<&'a Condition> {
    db.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// A minimal Database manifest; `extra` is merged into `spec`.
pub fn database_manifest(name: &str, extra: Value) -> Value {
    let mut spec = serde_json::json!({"version": "16.4", "storage": {"size": "1Gi"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    serde_json::json!({"metadata": {"name": name}, "spec": spec})
}

/// The value of the sample `series` (its name and labels as exposed), if the scrape has it.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// One plain HTTP GET on loopback: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: dbop\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}
