//! The restore Job of `spec.bootstrap.fromBackup`: one pod that runs `dbop-backup restore` from
//! the Database's own image (so `pg_restore` matches the server), with the agent copied in by an
//! init container from dbop's image, against the `-rw` Service. The agent recreates the
//! backup's roles, then restores the dump into the application database in one transaction
//! (or, with `restoreStreams`, in steps with several sessions).
//!
//! Like the backup Job, the database and S3 credentials and the encryption keys reach the
//! container only as files of read-only Secret volumes (never in the environment, on the command
//! line or in the operator), and the agent's JSON result goes to the termination message.
//!
//! Pure: a function of the Database, the resolved source and the operator's settings.

use dbop_contract::result::{EXIT_PERMANENT, EXIT_USAGE};
use k8s_openapi::api::batch::v1::{
    Job, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};

use super::agent::{CA_FILE, TERMINATION_LOG, agent_env, agent_secrets, encryption_env};
use super::job::{AgentRun, JobParts, JobPod, agent_pod, job};
use super::placement::JobClass;
use super::{Names, image, job_pod_labels, owned_meta};
use crate::api::{Database, RecoveryTarget, S3Spec};
use crate::settings::Settings;

/// The name of the restore container (the one whose termination message holds the result).
pub const RESTORE_CONTAINER: &str = "restore";
/// A retry covers a pod that failed for a reason that may pass; the restore is one
/// transaction, and recreating the roles is idempotent, so a second run starts from the same
/// empty database. (After a restore in steps failed, the agent exits with a final code: the
/// database holds part of the backup, which a second run would refuse.)
pub const BACKOFF_LIMIT: i32 = 1;
/// The agent's exit codes for bad usage and for a failure no retry can fix (a target outside
/// the archive, a missing or damaged backup, a wrong key, a database partly restored).
const FINAL_EXIT_CODES: [i32; 2] = [EXIT_USAGE, EXIT_PERMANENT];
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
    /// Sessions restoring a dump in parts at once (`fromBackup.restoreStreams`).
    pub streams: Option<u32>,
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
    let mut job = job(
        db,
        settings,
        restore_job_parts(db, agent_pod(settings, run), BACKOFF_LIMIT),
    );
    if let Some(spec) = job.spec.as_mut() {
        spec.pod_failure_policy = Some(retry_policy(RESTORE_CONTAINER));
    }
    job
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

/// Which failed pods count against the back-off limit: an exit with [`FINAL_EXIT_CODES`]
/// fails the Job at once (the agent's message says why, and retrying would only hide it for
/// minutes); a pod evicted, preempted or lost with its node is not counted; any other failure
/// is retried.
pub fn retry_policy(container: &str) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(container.into()),
                    operator: "In".into(),
                    values: FINAL_EXIT_CODES.to_vec(),
                }),
                ..PodFailurePolicyRule::default()
            },
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: Some("True".into()),
                }]),
                ..PodFailurePolicyRule::default()
            },
        ],
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
    if let Some(streams) = source.streams.filter(|n| *n > 1) {
        args.push(format!("--jobs={streams}"));
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
            streams: None,
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
        let rules = job.spec.clone().unwrap().pod_failure_policy.unwrap().rules;
        assert_eq!(
            rules[0].on_exit_codes.as_ref().map(|c| c.values.clone()),
            Some(vec![2, 4]),
            "bad usage and what no retry can fix fail the Job at once"
        );
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.init_containers.unwrap()[0].name, "copy-dbop-backup");
    }

    #[test]
    fn restore_streams_become_the_agents_jobs() {
        let db = testing::minimal();
        let args = |streams| {
            let source = RestoreSource {
                streams,
                ..source(s3(serde_json::json!({})))
            };
            container(&restore_job(&db, &source, &Settings::default()))
                .args
                .unwrap()
        };
        assert!(args(Some(4)).contains(&"--jobs=4".to_string()));
        for one in [None, Some(1)] {
            assert!(!args(one).iter().any(|a| a.starts_with("--jobs")));
        }
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
