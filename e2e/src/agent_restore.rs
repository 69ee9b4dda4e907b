//! A restore by hand on the real node, as a user following docs/restore.md would do it:
//! `dbop-backup restore` copied from dbop's image (as the backup Job does) and run in the
//! operand image against a Database's `-rw` Service, into a new database `restored`. The
//! data-plane suites compare what it restored with the source by fingerprint.

use serde_json::json;

use crate::TestBed;
use crate::node::{DBOP_IMAGE, POSTGRES_15_20, small_resources};

impl TestBed {
    /// Restores `backup` (an id or `latest`) of the backups under `prefix` in bucket `backups`
    /// at `s3_endpoint` into database `restored` on Database `host`'s server, with `host`'s
    /// credentials and the namespace's `s3-creds`; panics with the agent's output if it fails.
    pub async fn restore_with_agent(
        &self,
        ns: &str,
        host: &str,
        prefix: &str,
        backup: &str,
        s3_endpoint: &str,
    ) {
        // createdb is tried a few times: the real node's DNS does not always answer at once
        // (the agent retries its own connections).
        let script = "for i in 1 2 3 4 5; do createdb restored && break; sleep 2; done; \
                      exec /dbop/dbop-backup restore --bucket backups \
                      --prefix \"$0\" --source-database postgres --database app --path-style=true \"$1\"";
        let from_secret = |name: &str, secret: &str, key: &str| json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
        let credentials = format!("{host}-credentials");
        let env = json!([
            {"name": "PGHOST", "value": format!("{host}-rw")},
            {"name": "PGDATABASE", "value": "restored"},
            from_secret("PGUSER", &credentials, "username"),
            from_secret("PGPASSWORD", &credentials, "password"),
            from_secret("AWS_ACCESS_KEY_ID", "s3-creds", "AWS_ACCESS_KEY_ID"),
            from_secret("AWS_SECRET_ACCESS_KEY", "s3-creds", "AWS_SECRET_ACCESS_KEY"),
            {"name": "AWS_ENDPOINT_URL", "value": s3_endpoint},
            {"name": "AWS_REGION", "value": "us-east-1"},
        ]);
        let bin = json!([{"name": "bin", "mountPath": "/dbop"}]);
        let spec = json!({
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 999, "runAsGroup": 999},
            "initContainers": [{"name": "copy", "image": DBOP_IMAGE,
                "resources": small_resources(),
                "command": ["cp", "/usr/local/bin/dbop-backup", "/dbop/dbop-backup"],
                "volumeMounts": bin}],
            "containers": [{"name": "restore", "image": POSTGRES_15_20,
                "resources": small_resources(),
                "command": ["sh", "-c", script, prefix, backup], "env": env,
                "volumeMounts": bin}],
            "volumes": [{"name": "bin", "emptyDir": {}}],
        });
        self.create_pod(ns, "restore", json!({}), spec).await;
        let pod = self
            .wait_pod_phase(ns, "restore", &["Succeeded", "Failed"])
            .await;
        let phase = pod.status.and_then(|s| s.phase);
        assert_eq!(
            phase.as_deref(),
            Some("Succeeded"),
            "dbop-backup restore: {}",
            self.logs(ns, "restore")
        );
    }
}
