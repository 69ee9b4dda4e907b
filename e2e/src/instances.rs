//! Helpers for the suites of Databases with standbys on the real node (`high_availability`,
//! `failover`): each instance's own socket (psql as the superuser, peer authentication, which
//! works whatever its role and whatever the Services select), its rows, its role as the server
//! itself says, and a small resource request so that several instances fit on the real node.

use std::time::Duration;

use serde_json::{Value, json};

use crate::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use crate::{TestBed, wait_until, wait_until_or_none};

/// A row replicated to a streaming standby, or an instance changing role.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(60);

/// A small CPU request for each instance: the suites run several database pods at once on the
/// real node's two CPUs, beside another suite.
pub fn instance_resources() -> Value {
    json!({"requests": {"cpu": "25m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}})
}

/// A Database of `instances` on the real node, with its small resource request.
pub fn real_node_database(name: &str, version: &str, instances: i32) -> Value {
    json!({"metadata": {"name": name}, "spec": {
        "version": version,
        "instances": instances,
        "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
        "placement": real_node_placement(),
        "resources": instance_resources(),
    }})
}

impl TestBed {
    /// psql as the superuser over an instance's own socket: (success, stdout, stderr).
    pub fn local_psql(&self, ns: &str, pod: &str, sql: &str) -> (bool, String, String) {
        self.exec(
            ns,
            pod,
            &[
                "psql",
                "-X",
                "-U",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-Atc",
                sql,
            ],
        )
    }

    /// `local_psql` that must succeed: its trimmed output.
    pub fn local_ok(&self, ns: &str, pod: &str, sql: &str) -> String {
        let (ok, out, err) = self.local_psql(ns, pod, sql);
        assert!(ok, "{pod}: {sql}: {err}");
        out.trim().to_string()
    }

    /// Waits until `pod` has `rows` rows in `table`.
    pub async fn rows_on(&self, ns: &str, pod: &str, table: &str, rows: u32, wait: Duration) {
        let sql = format!("select count(*) from {table}");
        wait_until(
            &format!("{rows} rows in {table} on {pod}"),
            wait,
            || async {
                let (ok, out, _) = self.local_psql(ns, pod, &sql);
                (ok && out.trim() == rows.to_string()).then_some(())
            },
        )
        .await;
    }

    /// Waits until `pod` runs as a standby whose WAL receiver streams.
    /// On a timeout it panics with the pod's story (`pod_story`): why it does not stream.
    pub async fn streaming_standby(&self, ns: &str, pod: &str, wait: Duration) {
        let streaming = wait_until_or_none(wait, || async {
            let (ok, out, _) = self.local_psql(
                ns,
                pod,
                "select pg_is_in_recovery()::text || ':' || coalesce((select status from pg_stat_wal_receiver), '')",
            );
            (ok && out.trim() == "true:streaming").then_some(())
        })
        .await;
        if streaming.is_none() {
            panic!(
                "timed out after {wait:?} waiting for {pod} streaming as a standby\n{}",
                self.pod_story(ns, pod)
            );
        }
    }

    /// What happened to `pod`: its containers' restarts and states (the last termination's
    /// message is the manager's reason), and its instance manager's last log lines before and
    /// since its last restart.
    pub fn pod_story(&self, ns: &str, pod: &str) -> String {
        let statuses = "jsonpath={range .status.containerStatuses[*]}{.name}: restarts \
                        {.restartCount}, state {.state}, last {.lastState}{\"\\n\"}{end}";
        let (_, containers, err) = self.kubectl(&["-n", ns, "get", "pod", pod, "-o", statuses]);
        let logs = |previous: bool| {
            let mut args = vec!["-n", ns, "logs", pod, "-c", "postgres", "--tail", "60"];
            if previous {
                args.push("--previous");
            }
            let (_, out, err) = self.kubectl(&args);
            if out.is_empty() { err } else { out }
        };
        format!(
            "--- {pod}'s containers{err}:\n{containers}\n--- its manager before its last restart:\n{}\n--- since:\n{}",
            logs(true),
            logs(false)
        )
    }
}
