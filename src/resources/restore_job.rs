//! The restore Job of `spec.bootstrap.fromBackup`: one pod that runs `dbop-backup restore` from
//! the Database's own image (so `pg_restore` matches the server), with the agent copied in by an
//! init container from dbop's image, against the `-rw` Service. The agent recreates the
//! backup's roles, then restores the dump into the application database in one transaction.
//!
//! Like the backup Job, the database and S3 credentials and the encryption keys reach the
//! container only as files of read-only Secret volumes (never in the environment, on the command
//! line or in the operator), and the agent's JSON result goes to the termination message.
//!
//! Pure: a function of the Database, the resolved source and the operator's settings.

use k8s_openapi::api::batch::v1::Job;

use super::agent::{CA_FILE, TERMINATION_LOG, agent_env, agent_secrets, encryption_env};
use super::job::{AgentRun, JobParts, JobPod, agent_pod, job};
use super::placement::JobClass;
use super::{Names, image, job_pod_labels, owned_meta};
use crate::api::{Database, RecoveryTarget, S3Spec};
use crate::settings::Settings;

/// The name of the restore container (the one whose termination message holds the result).
pub const RESTORE_CONTAINER: &str = "restore";
/// A retry covers a pod lost with its node; the restore is one transaction, and recreating
/// the roles is idempotent, so a second run starts from the same empty database.
pub const BACKOFF_LIMIT: i32 = 1;
/// A restore that hangs (a lock, an S3 server that stops answering) fails instead.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 6 * 3600;

/// Where the backup to restore is, resolved from `spec.bootstrap.fromBackup`.
#[derive(Clone, Debug, PartialEq)]
pub struct RestoreSource {
    /// The bucket and its credentials (the Secret and CA in the Database's namespace).
    pub s3: S3Spec,
    /// The key prefix the backups were written under: `<s3 prefix>/<namespace>/<database>`.
    pub prefix: String,
    /// A backup id, or `latest`.
    pub backup: String,
    /// The database name inside that prefix (the source's application database); `None`:
    /// the agent takes the target's own name.
    pub source_database: Option<String>,
    /// The Secret holding the keys an encrypted backup may need (mounted whole; the agent
    /// picks the key the manifest names).
    pub encryption_secret: Option<String>,
    /// With a target, a physical recovery (`recovery_job`) instead of a dump's restore.
    pub target: Option<RecoveryTarget>,
}

/// The key prefix of a Database's backups in a bucket: `<prefix>/<namespace>/<database>`.
pub fn storage_prefix(s3: &S3Spec, namespace: &str, database: &str) -> String {
    dbop_contract::layout::storage_prefix(s3.prefix.as_deref(), namespace, database)
}

/// The restore Job of a Database, owned by it (deleting the Database stops the restore).
pub fn restore_job(db: &Database, source: &RestoreSource, settings: &Settings) -> Job {
    let keys = source.encryption_secret.as_deref();
    let mut env = agent_env(db, &source.s3, "dbop-restore");
    env.extend(encryption_env(keys));
    let run = AgentRun {
        container: RESTORE_CONTAINER,
        image: image(db, settings),
        args: agent_args(source),
        env,
        s3: &source.s3,
        database_ca: super::tls::client_ca(db),
        secrets: agent_secrets(db, &source.s3, keys),
    };
    job(
        db,
        settings,
        restore_job_parts(db, agent_pod(settings, run), BACKOFF_LIMIT),
    )
}

/// The Job `<name>-restore` around `pod`, owned by the Database, with the restore's deadline:
/// a dump's restore and a point-in-time recovery are both this Job.
pub fn restore_job_parts(db: &Database, pod: JobPod, backoff_limit: i32) -> JobParts {
    JobParts {
        metadata: owned_meta(db, Names::of(db).restore_job(), "restore"),
        pod_labels: job_pod_labels(db, "restore"),
        backoff_limit,
        active_deadline_seconds: ACTIVE_DEADLINE_SECONDS,
        ttl_seconds_after_finished: None,
        class: JobClass::Database,
        pod,
    }
}

/// The agent's arguments: where the backup is and which one. Nothing secret.
fn agent_args(source: &RestoreSource) -> Vec<String> {
    let s3 = &source.s3;
    // The backup first: after `--path-style` (whose value is optional) it would be taken for
    // that flag's value.
    let mut args: Vec<String> = vec![
        "restore".into(),
        source.backup.clone(),
        format!("--bucket={}", s3.bucket),
        format!("--prefix={}", source.prefix),
        format!("--result-file={TERMINATION_LOG}"),
    ];
    if let Some(database) = &source.source_database {
        args.push(format!("--source-database={database}"));
    }
    if s3.force_path_style {
        args.push("--path-style".into());
    }
    if s3.ca.is_some() {
        args.push(format!("--ca-file={CA_FILE}"));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use k8s_openapi::api::core::v1::Container;

    fn s3(extra: serde_json::Value) -> S3Spec {
        let mut v = serde_json::json!({
            "endpoint": "http://minio.storage.svc:9000", "bucket": "backups", "prefix": "team/",
            "forcePathStyle": true, "credentials": {"secretName": "s3-creds"}
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn source(s3: S3Spec) -> RestoreSource {
        RestoreSource {
            prefix: storage_prefix(&s3, "shop", "orders-old"),
            s3,
            backup: "latest".into(),
            source_database: Some("postgres".into()),
            encryption_secret: None,
            target: None,
        }
    }

    fn container(job: &Job) -> Container {
        job.spec.clone().unwrap().template.spec.unwrap().containers[0].clone()
    }

    #[test]
    fn prefixes_follow_the_backup_layout() {
        assert_eq!(
            storage_prefix(&s3(serde_json::json!({})), "shop", "orders"),
            "team/shop/orders"
        );
        let no_prefix = s3(serde_json::json!({"prefix": null}));
        assert_eq!(storage_prefix(&no_prefix, "a", "b"), "a/b");
    }

    #[test]
    fn the_job_runs_the_agent_restore_from_the_databases_image() {
        let db = testing::minimal();
        let job = restore_job(
            &db,
            &source(s3(serde_json::json!({}))),
            &Settings::default(),
        );
        assert_eq!(job.metadata.name.as_deref(), Some("orders-restore"));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Database", Some(true))
        );
        let c = container(&job);
        assert_eq!(c.image.as_deref(), Some("docker.io/library/postgres:16.4"));
        assert_eq!(c.command.unwrap(), vec!["/dbop/dbop-backup".to_string()]);
        assert_eq!(
            c.args.unwrap(),
            [
                "restore",
                "latest",
                "--bucket=backups",
                "--prefix=team/shop/orders-old",
                "--result-file=/dev/termination-log",
                "--source-database=postgres",
                "--path-style",
            ]
        );
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.init_containers.unwrap()[0].name, "copy-dbop-backup");
    }

    #[test]
    fn secrets_reach_the_job_only_as_files() {
        let db = testing::minimal();
        let s3 = s3(serde_json::json!({
            "credentials": {"secretName": "s3", "accessKeyIdKey": "id", "secretAccessKeyKey": "key"},
            "ca": {"secretKeyRef": {"name": "ca", "key": "root.pem"}}
        }));
        let mut source = source(s3);
        source.encryption_secret = Some("backup-keys".into());
        let job = restore_job(&db, &source, &Settings::default());
        let c = container(&job);
        let env = c.env.clone().unwrap();
        assert!(env.iter().all(|e| e.value_from.is_none()), "{env:?}");
        let value = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        for (name, want) in [
            (
                "DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE",
                "/etc/dbop/s3-credentials/access-key-id",
            ),
            (
                "DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE",
                "/etc/dbop/s3-credentials/secret-access-key",
            ),
            (
                "DBOP_BACKUP_PASSWORD_FILE",
                "/etc/dbop/pg-credentials/password",
            ),
            ("DBOP_BACKUP_USER_FILE", "/etc/dbop/pg-credentials/username"),
            (
                "DBOP_BACKUP_ENCRYPTION_KEY_DIR",
                "/etc/dbop/encryption-keys",
            ),
        ] {
            assert_eq!(value(name).as_deref(), Some(want), "{name}");
        }
        let pod = job.spec.clone().unwrap().template.spec.unwrap();
        let secret_of = |volume: &str| {
            pod.volumes
                .iter()
                .flatten()
                .find(|v| v.name == volume)
                .and_then(|v| v.secret.clone())
                .unwrap()
        };
        let items: Vec<(String, String)> = secret_of("s3-credentials")
            .items
            .unwrap()
            .into_iter()
            .map(|i| (i.key, i.path))
            .collect();
        assert_eq!(
            items,
            [
                ("id".to_string(), "access-key-id".to_string()),
                ("key".into(), "secret-access-key".into())
            ]
        );
        assert_eq!(
            secret_of("encryption-keys").secret_name.as_deref(),
            Some("backup-keys")
        );
        assert_eq!(
            secret_of("pg-credentials").secret_name.as_deref(),
            Some("orders-credentials")
        );
        assert!(env.iter().all(|e| e.name != "PGDATABASE"));
        assert!(c.args.unwrap().contains(&format!("--ca-file={CA_FILE}")));
        let pod = job.spec.unwrap().template.spec.unwrap();
        let ca = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "s3-ca")
            .unwrap();
        assert!(ca.empty_dir.is_none());
        assert_eq!(ca.secret.unwrap().items.unwrap()[0].key, "root.pem");
    }
}
