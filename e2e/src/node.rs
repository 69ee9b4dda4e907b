//! Helpers for suites that run real containers on the test bed's real node (`dbop-real-node`,
//! kubelet + containerd, started by `e2e/testbed/up.sh` when the host allows it): the placement
//! that takes pods there, the locally built images, pods and their waits, and `kubectl logs` /
//! `exec` through the API server. A missing real node is a failure with a clear message.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Namespace, Node, Pod, ResourceQuota, Secret, Service, ServiceAccount,
};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rand::Rng;
use serde_json::{Value, json};

use crate::{OperatorProcess, TestBed, wait_until};

/// The real node's name.
pub const REAL_NODE: &str = "dbop-real-node";
/// Its taint (and its label, with the value `true`): pods that tolerate it and select it run there.
pub const REAL_NODE_TAINT: &str = "testbed.dbop.dev/real-node";
/// The second real node (`e2e/testbed/second-node.sh`), brought up by the suites that need two.
pub const SECOND_NODE: &str = "dbop-real-node-2";
/// Its own taint, besides the real node's: only pods that tolerate both land there.
pub const SECOND_NODE_TAINT: &str = "testbed.dbop.dev/second-node";
/// The StorageClass of its local PersistentVolumes (real directories on the node).
pub const REAL_NODE_STORAGE_CLASS: &str = "real-node";
/// PostgreSQL operand images built from Debian's packages (e2e/testbed/images.sh).
pub const POSTGRES_15_18: &str = "dbop.local/postgres:15.18";
pub const POSTGRES_15_20: &str = "dbop.local/postgres:15.20";
/// How long a real pod may take to start on a busy 2-core machine.
pub const POD_WAIT: Duration = Duration::from_secs(120);
/// dbop's image built from the code under test (e2e/testbed/dbop-image.sh).
pub const DBOP_IMAGE: &str = "dbop.local/dbop:dev";
/// The S3 server's access keys (a test server on the pod network).
pub const S3_ACCESS_KEY: &str = "e2e-access";
pub const S3_SECRET_KEY: &str = "e2e-secret-key";
/// The port s3s-fs listens on inside its pod, and the TLS front's.
const S3_PORT: i32 = 9000;
const S3_TLS_PORT: i32 = 9443;

/// The scheduling fields that put a pod on the real node: its label as node selector and a
/// toleration of its taint. As a Database's `spec.placement` it takes the database pods and
/// every Job of the Database there.
pub fn real_node_placement() -> Value {
    json!({
        "nodeSelector": {REAL_NODE_TAINT: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    })
}

/// [`real_node_placement`] that also tolerates the second real node's taint: the pods spread
/// over both real nodes (a Database's instances prefer different nodes).
pub fn two_real_nodes_placement() -> Value {
    let mut placement = real_node_placement();
    placement["tolerations"]
        .as_array_mut()
        .expect("tolerations")
        .push(json!({"key": SECOND_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}));
    placement
}

/// Resources for test pods: a namespace with a ResourceQuota on cpu and memory admits only
/// containers that set requests and limits.
pub fn small_resources() -> Value {
    json!({"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}})
}

/// Whether the pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A server certificate of a private CA, as PEM (made with the `openssl` command).
pub struct PrivateCa {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl PrivateCa {
    /// A fresh CA and a certificate for `dns_name` signed by it (ECDSA P-256, one day).
    pub fn issue(dns_name: &str) -> PrivateCa {
        let dir = std::env::temp_dir().join(format!("dbop-e2e-ca-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let openssl = |words: &str, subject: Option<&str>| {
            let mut args: Vec<&str> = words.split_whitespace().collect();
            if let Some(subject) = subject {
                args.extend(["-subj", subject]);
            }
            openssl_in(&dir, &args);
        };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        openssl(
            &format!("req -x509 {ec} -keyout ca.key -out ca.pem -days 1"),
            Some("/CN=dbop e2e private CA"),
        );
        openssl(
            &format!("req {ec} -keyout tls.key -out tls.csr"),
            Some(&format!("/CN={dns_name}")),
        );
        std::fs::write(
            dir.join("ext.cnf"),
            format!("subjectAltName=DNS:{dns_name}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"),
        )
        .expect("extensions file");
        openssl(
            "x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out tls.crt -days 1 \
             -extfile ext.cnf",
            None,
        );
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("PEM file");
        let ca = PrivateCa {
            ca_pem: read("ca.pem"),
            cert_pem: read("tls.crt"),
            key_pem: read("tls.key"),
        };
        let _ = std::fs::remove_dir_all(&dir);
        ca
    }
}

/// `openssl ARGS` in `dir`, which must succeed.
fn openssl_in(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl (e2e/testbed/install-deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestBed {
    /// Panics with a clear message unless the real node is registered and Ready.
    pub async fn require_real_node(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes.get_opt(REAL_NODE).await.expect("reading nodes");
        let ready = node
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.clone())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(
            ready,
            "no Ready real node `{REAL_NODE}` on the test bed ({}): it starts with `make test-e2e` as root on a \
             host with overlayfs and cgroups; up.sh printed why not (`real node: none (...)`). \
             See e2e/testbed/README.md.",
            if node.is_some() {
                "registered, not Ready"
            } else {
                "not registered"
            }
        );
    }

    /// The second real node, Ready, with `volumes` local PersistentVolumes of the real node's
    /// StorageClass (so at most that many volume-holding pods land there). One suite at a time
    /// may hold it.
    pub async fn second_node(&self, volumes: usize) -> SecondNode {
        self.require_real_node().await;
        SecondNode::script(
            &self.dir,
            "up",
            &[("DBOP_TESTBED_SECOND_NODE_PVS", volumes.to_string())],
        );
        SecondNode {
            dir: self.dir.clone(),
        }
    }

    /// A fresh plain namespace for a real-node suite. Nothing in it lands on the real node by
    /// itself (managed control planes have no PodNodeSelector admission plugin): a Database
    /// gets there through `spec.placement` ([`real_node_placement`]), a test's own pod through
    /// [`TestBed::create_pod`], which gives it the same node selector and toleration.
    pub async fn real_node_namespace(&self, prefix: &str) -> String {
        let suffix: u32 = rand::rng().random_range(0..1_000_000);
        let name = format!("e2e-{prefix}-{suffix:06}");
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": crate::suite_label()}}),
        )
        .expect("namespace");
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
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

    /// The image reference of a locally built image whose name starts with `prefix` (e.g.
    /// `dbop.local/s3s-fs:`), from the list up.sh imported.
    pub fn real_node_image(&self, prefix: &str) -> String {
        let list = self.dir.join("node/images.list");
        let text = std::fs::read_to_string(&list).unwrap_or_else(|e| {
            panic!(
                "no image list {} ({e}): is the real node up?",
                list.display()
            )
        });
        text.lines()
            .filter_map(|l| l.split_whitespace().next())
            .find(|r| r.starts_with(prefix))
            .unwrap_or_else(|| panic!("no image {prefix}* in {}", list.display()))
            .to_string()
    }

    /// Creates a pod from a spec (`containers` etc.) on the real node (its node selector and
    /// toleration, [`real_node_placement`]); a short grace period, since `sh` as PID 1 ignores
    /// SIGTERM.
    pub async fn create_pod(&self, ns: &str, name: &str, labels: Value, spec: Value) -> Pod {
        let mut spec = spec;
        spec["terminationGracePeriodSeconds"] = json!(1);
        if let Value::Object(placement) = real_node_placement() {
            for (field, value) in placement {
                spec[field] = value;
            }
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels}, "spec": spec,
        }))
        .expect("pod spec");
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"))
    }

    /// Waits until the pod is in one of `phases` (e.g. Succeeded), or panics with its status.
    pub async fn wait_pod_phase(&self, ns: &str, name: &str, phases: &[&str]) -> Pod {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let found = crate::wait_until_or_none(POD_WAIT, || async {
            let pod = pods.get_opt(name).await.ok().flatten()?;
            let phase = pod.status.as_ref()?.phase.clone()?;
            phases.contains(&phase.as_str()).then_some(pod)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "pod {ns}/{name} not {phases:?} after {POD_WAIT:?}: {}",
                self.describe_pod(ns, name)
            )
        })
    }

    /// Waits until the pod is Ready, or panics with its status.
    pub async fn wait_pod_ready(&self, ns: &str, name: &str) -> Pod {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let found = crate::wait_until_or_none(POD_WAIT, || async {
            let pod = pods.get_opt(name).await.ok().flatten()?;
            pod_ready(&pod).then_some(pod)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "pod {ns}/{name} not Ready after {POD_WAIT:?}: {}",
                self.describe_pod(ns, name)
            )
        })
    }

    /// Deletes a pod and waits until it is gone.
    pub async fn delete_pod(&self, ns: &str, name: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("pod deleted");
        wait_until(&format!("pod {ns}/{name} gone"), POD_WAIT, || async {
            matches!(pods.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }

    /// The messages of the Events of `ns` with this reason, one a line.
    pub fn event_messages(&self, ns: &str, reason: &str) -> String {
        let selector = format!("reason={reason}");
        let jsonpath = "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}";
        let args = [
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            jsonpath,
        ];
        self.kubectl(&args).1
    }

    /// `kubectl` of the test bed with this kubeconfig; returns (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(self.kubectl_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl exec` in the pod's first container (through the API server and the kubelet).
    pub fn exec(&self, ns: &str, pod: &str, command: &[&str]) -> (bool, String, String) {
        let mut args = vec!["-n", ns, "exec", pod, "--"];
        args.extend_from_slice(command);
        self.kubectl(&args)
    }

    /// Runs `command` in the pod until it succeeds (e.g. while a Service's rules are being
    /// programmed); returns its output, or panics with the last failure after `timeout`.
    pub async fn exec_until_ok(
        &self,
        ns: &str,
        pod: &str,
        command: &[&str],
        timeout: Duration,
    ) -> String {
        let mut last = String::new();
        let found = crate::wait_until_or_none(timeout, || {
            let (ok, out, err) = self.exec(ns, pod, command);
            if !ok {
                last = format!("{out}{err}");
            }
            async move { ok.then_some(out) }
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "`{}` in {ns}/{pod} kept failing for {timeout:?}: {last}",
                command.join(" ")
            )
        })
    }

    /// `kubectl logs` of the pod's first container.
    pub fn logs(&self, ns: &str, pod: &str) -> String {
        let (ok, out, err) = self.kubectl(&["-n", ns, "logs", pod]);
        assert!(ok, "kubectl logs {ns}/{pod} failed: {err}");
        out
    }

    /// The operator binary for the real node: the locally built PostgreSQL images and dbop's
    /// image from the code under test.
    pub fn operator_for_real_node(&self, namespace: &str) -> OperatorProcess {
        self.operator_binary_with_env(
            namespace,
            &[
                (
                    "DBOP_POSTGRES_IMAGE_TEMPLATE",
                    "dbop.local/postgres:{version}",
                ),
                ("DBOP_AGENT_IMAGE", DBOP_IMAGE),
            ],
        )
    }

    /// A ResourceQuota `compute` on cpu and memory, requests and limits (so the API server
    /// refuses any container without both), once the quota controller has computed its usage.
    pub async fn compute_quota(&self, ns: &str) {
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "compute"},
            "spec": {"hard": {"requests.cpu": "4", "requests.memory": "4Gi",
                              "limits.cpu": "8", "limits.memory": "8Gi"}},
        }))
        .expect("quota");
        let quotas: Api<ResourceQuota> = Api::namespaced(self.client.clone(), ns);
        quotas
            .create(&PostParams::default(), &quota)
            .await
            .expect("quota created");
        wait_until("the quota's status", POD_WAIT, || async {
            quotas.get("compute").await.ok()?.status?.hard.map(|_| ())
        })
        .await;
    }

    /// Panics unless the `compute` quota counted memory requests (pods were admitted under it).
    pub async fn assert_quota_counted(&self, ns: &str) {
        let used = Api::<ResourceQuota>::namespaced(self.client.clone(), ns)
            .get("compute")
            .await
            .expect("quota")
            .status
            .and_then(|s| s.used)
            .unwrap_or_default();
        assert!(
            used.get("requests.memory").is_some_and(|q| q.0 != "0"),
            "the quota counted the pods: {used:?}"
        );
    }

    /// Creates a Secret from string data.
    pub async fn create_secret(&self, ns: &str, name: &str, data: Value) -> Secret {
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data}))
                .expect("secret");
        Api::<Secret>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_or_else(|e| panic!("creating Secret {ns}/{name}: {e}"))
    }

    /// An S3 server on the real node, as most clusters run MinIO: s3s-fs in a pod (the bucket
    /// made by an init container) behind the Service `s3`. With `tls`, s3s-fs listens on the
    /// pod's loopback only and a socat sidecar terminates TLS with the given certificate on
    /// port 443 of the Service. Also creates the Secret `s3-creds` with the access keys.
    /// Returns the endpoint URL once the server is Ready.
    pub async fn s3_server(&self, ns: &str, bucket: &str, tls: Option<&PrivateCa>) -> String {
        self.create_secret(
            ns,
            "s3-creds",
            json!({
                "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            }),
        )
        .await;
        let host = if tls.is_some() {
            "127.0.0.1"
        } else {
            "0.0.0.0"
        };
        let mut containers = vec![json!({
            "name": "s3s-fs", "image": self.real_node_image("dbop.local/s3s-fs:"),
            "args": ["--host", host, "--port", S3_PORT.to_string(), "--access-key", S3_ACCESS_KEY,
                     "--secret-key", S3_SECRET_KEY, "/data"],
            "resources": small_resources(),
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        })];
        let mut volumes = vec![json!({"name": "data", "emptyDir": {}})];
        let (port, service_port, scheme) = match tls {
            None => (S3_PORT, 80, "http"),
            Some(ca) => {
                self.create_secret(
                    ns,
                    "s3-tls",
                    json!({"tls.crt": ca.cert_pem, "tls.key": ca.key_pem}),
                )
                .await;
                containers.push(json!({
                    "name": "tls", "image": self.real_node_image("dbop.local/socat:"),
                    "args": [format!("openssl-listen:{S3_TLS_PORT},reuseaddr,fork,cert=/tls/tls.crt,key=/tls/tls.key,verify=0"),
                             format!("tcp:127.0.0.1:{S3_PORT}")],
                    "resources": small_resources(),
                    "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}],
                }));
                volumes.push(json!({"name": "tls", "secret": {"secretName": "s3-tls"}}));
                (S3_TLS_PORT, 443, "https")
            }
        };
        // Ready when the port the Service targets accepts connections (s3s-fs, or the front).
        let last = containers.len() - 1;
        containers[last]["readinessProbe"] =
            json!({"tcpSocket": {"port": port}, "periodSeconds": 1});
        self.create_pod(
            ns,
            "s3",
            json!({"app": "s3"}),
            json!({
                "initContainers": [{"name": "bucket", "image": POSTGRES_15_20,
                                    "command": ["mkdir", "-p", format!("/data/{bucket}")],
                                    "resources": small_resources(),
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "containers": containers, "volumes": volumes,
            }),
        )
        .await;
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "s3"},
            "spec": {"selector": {"app": "s3"}, "ports": [{"port": service_port, "targetPort": port}]},
        }))
        .expect("service");
        Api::<Service>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &svc)
            .await
            .expect("the S3 Service");
        self.wait_pod_ready(ns, "s3").await;
        format!("{scheme}://s3.{ns}.svc:{service_port}")
    }

    /// A pod with `psql` whose libpq environment points at the Database's `-rw` Service with
    /// the credentials of `secret` (as environment from the Secret: read at the pod's start).
    pub async fn psql_client(&self, ns: &str, name: &str, database: &str, secret: &str) {
        self.create_pod(ns, name, json!({}), json!({
            "containers": [{
                "name": "psql", "image": POSTGRES_15_20, "command": ["sleep", "3600"],
                "resources": small_resources(),
                "env": [
                    {"name": "PGHOST", "value": format!("{database}-rw")},
                    {"name": "PGCONNECT_TIMEOUT", "value": "5"},
                    {"name": "PGUSER", "valueFrom": {"secretKeyRef": {"name": secret, "key": "username", "optional": true}}},
                    {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}},
                ],
            }],
        }))
        .await;
        self.wait_pod_phase(ns, name, &["Running"]).await;
    }

    /// Runs `sql` with psql in a [`TestBed::psql_client`] pod against `dbname` (unaligned,
    /// tuples only); (success, output, errors).
    pub fn psql(&self, ns: &str, pod: &str, dbname: &str, sql: &str) -> (bool, String, String) {
        self.exec(
            ns,
            pod,
            &[
                "sh",
                "-c",
                "PGUSER=${PGUSER:-postgres} exec psql -X -v ON_ERROR_STOP=1 -d \"$0\" -Atc \"$1\"",
                dbname,
                sql,
            ],
        )
    }

    /// Like [`TestBed::psql`], retried until it succeeds (the Service's rules, DNS), within `timeout`.
    pub async fn psql_until_ok(
        &self,
        ns: &str,
        pod: &str,
        dbname: &str,
        sql: &str,
        timeout: Duration,
    ) -> String {
        let mut last = String::new();
        let found = crate::wait_until_or_none(timeout, || {
            let (ok, out, err) = self.psql(ns, pod, dbname, sql);
            if !ok {
                last = err;
            }
            async move { ok.then_some(out) }
        })
        .await;
        found.unwrap_or_else(|| panic!("psql in {ns}/{pod} on {dbname} kept failing for {timeout:?}: {last}\nSQL: {sql}"))
            .trim()
            .to_string()
    }

    /// A fingerprint of every table of the public schema of `dbname`: per table its name, row
    /// count and the md5 of its rows in order, through the `-rw` Service.
    pub async fn fingerprint(&self, ns: &str, pod: &str, dbname: &str) -> String {
        let tables = self
            .psql_until_ok(
                ns,
                pod,
                dbname,
                "select tablename from pg_tables where schemaname = 'public' order by 1",
                POD_WAIT,
            )
            .await;
        assert!(!tables.is_empty(), "no tables in {dbname}");
        let query = tables
            .lines()
            .map(|t| format!(
                "select '{t}' || ':' || count(*) || ':' || md5(coalesce(string_agg(r::text, '|' order by r::text), '')) from public.\"{t}\" r"
            ))
            .collect::<Vec<_>>()
            .join(" union all ");
        self.psql_until_ok(
            ns,
            pod,
            dbname,
            &format!("select string_agg(f, ' ' order by f) from ({query}) x(f)"),
            POD_WAIT,
        )
        .await
    }

    fn describe_pod(&self, ns: &str, name: &str) -> String {
        let (_, out, err) = self.kubectl(&["-n", ns, "describe", "pod", name]);
        format!("{out}{err}")
    }

    /// The test bed's kubectl binary (else `kubectl` from PATH).
    pub fn kubectl_path(&self) -> PathBuf {
        let bin = self.dir.join("bin/kubectl");
        if bin.exists() {
            bin
        } else {
            PathBuf::from("kubectl")
        }
    }
}

/// The test bed's second real node, up while this lives (`TestBed::second_node`), torn down on
/// drop. Its loss is real: [`SecondNode::lose`] kills its kubelet, its container runtime and
/// every process of its pods at once.
pub struct SecondNode {
    dir: PathBuf,
}

impl SecondNode {
    fn script(dir: &Path, action: &str, env: &[(&str, String)]) {
        let out = Command::new(crate::workspace_root().join("e2e/testbed/second-node.sh"))
            .arg(action)
            .env("DBOP_TESTBED_DIR", dir)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("running e2e/testbed/second-node.sh (the real-node suites run as root)");
        assert!(
            out.status.success(),
            "second-node.sh {action}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The node lost at once, as when it loses power: to the API server it stays Ready until
    /// the node controller's grace runs out, while nothing on it answers.
    pub fn lose(&self) {
        Self::script(&self.dir, "lose", &[]);
    }

    /// The lost node back, on the state it had (its kubelet restarts its pods' containers).
    pub fn bring_back(&self) {
        Self::script(&self.dir, "return", &[]);
    }
}

impl Drop for SecondNode {
    fn drop(&mut self) {
        let out = Command::new(crate::workspace_root().join("e2e/testbed/second-node.sh"))
            .arg("down")
            .env("DBOP_TESTBED_DIR", &self.dir)
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("second-node.sh down failed: {out:?}");
        }
    }
}

/// A pod's network cut from everything but its own loopback (`TestBed::cut_pod_network`): its
/// processes reach neither the API server, nor the Services, nor the other pods, and nothing
/// reaches them over the network. `kubectl exec` still works (it goes through the kubelet and
/// the container runtime, not the pod's network). Restored on drop.
pub struct NetworkCut {
    netns: String,
    /// Its iptables rules, each inserted first (so the last one is the first that matches).
    rules: Vec<Vec<String>>,
    restored: bool,
}

/// The iptables rules of a cut, inserted first in the pod's network namespace.
const CUT_RULES: [[&str; 6]; 2] = [
    ["INPUT", "!", "-i", "lo", "-j", "DROP"],
    ["OUTPUT", "!", "-o", "lo", "-j", "DROP"],
];

/// What a cut that spares the instance manager's status endpoint adds after `CUT_RULES`.
const STATUS_RULES: [[&str; 7]; 2] = [
    ["INPUT", "-p", "tcp", "--dport", "8008", "-j", "ACCEPT"],
    ["OUTPUT", "-p", "tcp", "--sport", "8008", "-j", "ACCEPT"],
];

impl NetworkCut {
    fn iptables(&self, action: &str, rule: &[String]) -> (bool, String) {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .args(["iptables", "-w", action])
            .args(rule)
            .output()
            .expect("running nsenter iptables (the real-node suites run as root)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Puts the pod's network back.
    pub fn restore(&mut self) {
        if self.restored {
            return;
        }
        for rule in &self.rules {
            let (ok, err) = self.iptables("-D", rule);
            assert!(ok, "removing the cut {rule:?}: {err}");
        }
        self.restored = true;
    }
}

impl Drop for NetworkCut {
    fn drop(&mut self) {
        if !self.restored {
            for rule in &self.rules {
                let _ = self.iptables("-D", rule);
            }
        }
    }
}

impl TestBed {
    /// Cuts the network of the real-node pod `ns/name` (`NetworkCut`): its sandbox's network
    /// namespace, from the node's container runtime, gets rules that drop every packet that
    /// is not on its loopback.
    pub fn cut_pod_network(&self, ns: &str, name: &str) -> NetworkCut {
        self.cut(ns, name, &[])
    }

    /// The same, but the instance manager's status endpoint still answers: the instance is cut
    /// from its primary (and everyone else) while the operator still reads its WAL position.
    pub fn cut_all_but_status(&self, ns: &str, name: &str) -> NetworkCut {
        self.cut(ns, name, &STATUS_RULES.map(|r| r.to_vec()))
    }

    fn cut(&self, ns: &str, name: &str, spared: &[Vec<&str>]) -> NetworkCut {
        let crictl = |args: &[&str]| {
            let out = Command::new(self.dir.join("node-bin/crictl"))
                .arg("--config")
                .arg(self.dir.join("crictl.yaml"))
                .args(args)
                .output()
                .expect("running the real node's crictl");
            assert!(
                out.status.success(),
                "crictl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let ids = crictl(&[
            "pods",
            "--name",
            name,
            "--namespace",
            ns,
            "--state",
            "ready",
            "-q",
        ]);
        let id = ids
            .lines()
            .next()
            .unwrap_or_else(|| panic!("no ready sandbox of {ns}/{name} on the real node"));
        let inspect: Value =
            serde_json::from_str(&crictl(&["inspectp", id])).expect("crictl inspectp's JSON");
        let netns = inspect["info"]["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .and_then(|all| all.iter().find(|n| n["type"] == "network"))
            .and_then(|n| n["path"].as_str())
            .unwrap_or_else(|| panic!("no network namespace in {ns}/{name}'s sandbox"))
            .to_string();
        let owned = |r: &[&str]| r.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let rules = CUT_RULES
            .iter()
            .map(|r| owned(r))
            .chain(spared.iter().map(|r| owned(r)))
            .collect();
        let cut = NetworkCut {
            netns,
            rules,
            restored: false,
        };
        for rule in &cut.rules {
            let (ok, err) = cut.iptables("-I", rule);
            assert!(ok, "cutting {ns}/{name}'s network ({rule:?}): {err}");
        }
        cut
    }
}
