//! Helpers for suites that run real containers on the test bed's real node (`dbop-real-node`,
//! kubelet + containerd, started by `e2e/testbed/up.sh` when the host allows it): namespaces that
//! opt in to the real node, the locally built images, pods and their waits, and `kubectl logs` /
//! `exec` through the API server. A missing real node is a failure with a clear message.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rand::Rng;
use serde_json::{Value, json};

use crate::{TestBed, wait_until};

/// The real node's name.
pub const REAL_NODE: &str = "dbop-real-node";
/// Its taint; namespaces that opt in tolerate it.
pub const REAL_NODE_TAINT: &str = "testbed.dbop.dev/real-node";
/// The StorageClass of its local PersistentVolumes (real directories on the node).
pub const REAL_NODE_STORAGE_CLASS: &str = "real-node";
/// PostgreSQL operand images built from Debian's packages (e2e/testbed/images.sh).
pub const POSTGRES_15_18: &str = "dbop.local/postgres:15.18";
pub const POSTGRES_15_20: &str = "dbop.local/postgres:15.20";
/// How long a real pod may take to start on a busy 2-core machine.
pub const POD_WAIT: Duration = Duration::from_secs(120);

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

    /// A fresh namespace whose pods land on the real node: the PodNodeSelector and
    /// PodTolerationRestriction admission plugins add the node selector and the toleration to
    /// every pod created in it (so the operator's pods get them without knowing).
    pub async fn real_node_namespace(&self, prefix: &str) -> String {
        let suffix: u32 = rand::rng().random_range(0..1_000_000);
        let name = format!("e2e-{prefix}-{suffix:06}");
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "annotations": {
            "scheduler.alpha.kubernetes.io/node-selector": format!("{REAL_NODE_TAINT}=true"),
            "scheduler.alpha.kubernetes.io/defaultTolerations":
                json!([{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]).to_string(),
        }}}))
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

    /// Creates a pod from a spec (`containers` etc.); a short grace period, since `sh` as PID 1
    /// ignores SIGTERM.
    pub async fn create_pod(&self, ns: &str, name: &str, labels: Value, spec: Value) -> Pod {
        let mut spec = spec;
        spec["terminationGracePeriodSeconds"] = json!(1);
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
            let ready = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(pod)
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

    fn describe_pod(&self, ns: &str, name: &str) -> String {
        let (_, out, err) = self.kubectl(&["-n", ns, "describe", "pod", name]);
        format!("{out}{err}")
    }

    fn kubectl_path(&self) -> PathBuf {
        let bin = self.dir.join("bin/kubectl");
        if bin.exists() {
            bin
        } else {
            PathBuf::from("kubectl")
        }
    }
}
