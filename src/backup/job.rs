//! The backup Job: one pod that runs `dbop-backup dump` from the database image of the running
//! version (so `pg_dump` matches the server), with the agent binary copied in by an init
//! container from the operator's image.
//!
//! The S3 and database credentials reach the container only as environment variables read from
//! their Secrets (never on the command line, never in the operator); the agent writes its JSON
//! result to the termination message, which the `DatabaseBackup` controller reads back.
//!
//! Pure: a function of the Database, the `DatabaseBackup` and the operator's settings.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use dbop_contract::layout;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::schedule::format_duration;
use super::settings::BackupSettings;
use crate::api::{BackupSpec, Database, DatabaseBackup};
pub use crate::resources::agent::{CA_DIR, TERMINATION_LOG};
use crate::resources::agent::{CA_FILE, agent_env};
use crate::resources::credentials::{USERNAME_KEY, secret_name};
use crate::resources::job::{AgentRun, JobParts, agent_pod, job};
use crate::resources::pod::secret_env;
use crate::resources::{Settings, job_pod_labels, labels, owned_meta};

/// Where the init container puts the agent, and where the backup container runs it from.
pub const AGENT_PATH: &str = "/dbop/dbop-backup";
/// A retry covers a pod lost with its node; a dump that fails twice fails for a reason.
pub const BACKOFF_LIMIT: i32 = 1;
/// The name of the backup container (the one whose termination message holds the result).
pub const BACKUP_CONTAINER: &str = "backup";
/// Kubernetes label values and Job names are at most 63 characters.
const MAX_JOB_NAME: usize = 63;
/// The agent accepts backup ids of at most 128 characters.
const MAX_BACKUP_ID: usize = 128;

/// Why no Job can be built for a backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobProblem {
    /// The Database has no `spec.backup`: there is nowhere to store the dump.
    NoBackupSpec,
    /// The Database has never run, so there is no version to dump with.
    NoRunningVersion,
    /// `spec.backup` holds a value that does not parse (the message says which and what to fix).
    InvalidSpec(String),
}

/// The Job's name: the `DatabaseBackup`'s name, shortened with a hash when it is too long.
pub fn job_name(backup_name: &str) -> String {
    shorten(backup_name, MAX_JOB_NAME)
}

/// The backup id in object storage: the `DatabaseBackup`'s creation time (the agent's own id
/// format, so ids sort by time) and name, so a retried Job (same `DatabaseBackup`) finds the
/// backup it already made.
pub fn backup_id(backup_name: &str, created: DateTime<Utc>) -> String {
    let stamp = layout::backup_id_at(created);
    shorten(&format!("{stamp}-{backup_name}"), MAX_BACKUP_ID)
}

/// The key prefix of one Database's backups: `<prefix>/<namespace>/<database>`.
pub fn storage_prefix(db: &Database, spec: &BackupSpec) -> String {
    crate::resources::restore_job::storage_prefix(&spec.s3, &db.namespace_or_default(), &db.name())
}

/// The image of the version the server runs: `spec.image` when it is for that version, else
/// the repository tagged with the running version.
pub fn running_image(db: &Database, settings: &Settings) -> Option<String> {
    let current = db.status.as_ref()?.current_version.clone()?;
    Some(match &db.spec.image {
        Some(image) if current == db.spec.version => image.clone(),
        _ => settings.postgres_image(&current),
    })
}

/// The backup Job of `backup`, owned by it.
pub fn backup_job(
    db: &Database,
    backup: &DatabaseBackup,
    created: DateTime<Utc>,
    settings: &Settings,
) -> Result<Job, JobProblem> {
    let spec = db.spec.backup.as_ref().ok_or(JobProblem::NoBackupSpec)?;
    let parsed = BackupSettings::parse(spec).map_err(JobProblem::InvalidSpec)?;
    let image = running_image(db, settings).ok_or(JobProblem::NoRunningVersion)?;
    let backup_name = backup.metadata.name.clone().unwrap_or_default();
    let run = AgentRun {
        container: BACKUP_CONTAINER,
        image,
        args: agent_args(db, spec, &parsed, &backup_id(&backup_name, created)),
        env: agent_env(db, &spec.s3, "dbop-backup"),
        s3: &spec.s3,
    };
    let parts = JobParts {
        metadata: job_meta(db, backup, &backup_name),
        pod_labels: with_backup_label(job_pod_labels(db, "backup"), &backup_name),
        backoff_limit: BACKOFF_LIMIT,
        active_deadline_seconds: job_deadline(&parsed),
        ttl_seconds_after_finished: None,
        pod: agent_pod(settings, run),
    };
    Ok(job(db, settings, parts))
}

/// How long a finished verify Job stays (its outcome is in the Database's status by then).
const VERIFY_JOB_TTL_SECONDS: i32 = 86_400;

/// The verify Job `name`, owned by the Database: `dbop-backup verify latest` restores the
/// latest backup into a scratch database on the server (created and dropped by the agent) and
/// compares the row counts with the manifest's. Same image, agent, credentials and S3 settings
/// as a backup Job.
pub fn verify_job(db: &Database, name: &str, settings: &Settings) -> Result<Job, JobProblem> {
    let spec = db.spec.backup.as_ref().ok_or(JobProblem::NoBackupSpec)?;
    let parsed = BackupSettings::parse(spec).map_err(JobProblem::InvalidSpec)?;
    let image = running_image(db, settings).ok_or(JobProblem::NoRunningVersion)?;
    let credentials = secret_name(db);
    let mut env = agent_env(db, &spec.s3, "dbop-backup");
    // The application database (named after the superuser): the scratch database is made from
    // a connection to it, and its backups are the ones verified.
    env.push(secret_env("PGDATABASE", &credentials, USERNAME_KEY, true));
    env.push(secret_env(
        "DBOP_BACKUP_SOURCE_DATABASE",
        &credentials,
        USERNAME_KEY,
        true,
    ));
    let mut args = vec!["verify".to_string(), "latest".to_string()];
    args.extend(s3_args(db, spec));
    let run = AgentRun {
        container: BACKUP_CONTAINER,
        image,
        args,
        env,
        s3: &spec.s3,
    };
    let parts = JobParts {
        metadata: owned_meta(db, name.to_string(), "verify"),
        pod_labels: job_pod_labels(db, "verify"),
        backoff_limit: BACKOFF_LIMIT,
        active_deadline_seconds: job_deadline(&parsed),
        ttl_seconds_after_finished: Some(VERIFY_JOB_TTL_SECONDS),
        pod: agent_pod(settings, run),
    };
    Ok(job(db, settings, parts))
}

/// An agent Job's deadline: `spec.backup.timeout`, at least a minute.
fn job_deadline(parsed: &BackupSettings) -> i64 {
    i64::try_from(parsed.timeout.as_secs().max(60)).unwrap_or(i64::MAX)
}

/// Where the backups are and how to reach them, for every agent command. Nothing secret.
fn s3_args(db: &Database, spec: &BackupSpec) -> Vec<String> {
    let s3 = &spec.s3;
    let mut args = vec![
        format!("--bucket={}", s3.bucket),
        format!("--prefix={}", storage_prefix(db, spec)),
        format!("--result-file={TERMINATION_LOG}"),
    ];
    if s3.force_path_style {
        args.push("--path-style".into());
    }
    if s3.ca.is_some() {
        args.push(format!("--ca-file={CA_FILE}"));
    }
    args
}

/// The agent's arguments: where the dump goes, its id, retention. Nothing secret.
fn agent_args(db: &Database, spec: &BackupSpec, parsed: &BackupSettings, id: &str) -> Vec<String> {
    let mut args = vec!["dump".to_string()];
    args.extend(s3_args(db, spec));
    args.push(format!("--backup-id={id}"));
    args.push(format!("--keep-last={}", parsed.history.keep_last));
    if let Some(max_age) = parsed.history.max_age {
        args.push(format!("--max-age={}", format_duration(max_age)));
    }
    args
}

fn job_meta(db: &Database, backup: &DatabaseBackup, backup_name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(job_name(backup_name)),
        namespace: backup.metadata.namespace.clone(),
        labels: Some(with_backup_label(labels(&db.name(), "backup"), backup_name)),
        owner_references: backup.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// Adds the label naming the `DatabaseBackup` when the name fits in a label value.
fn with_backup_label(
    mut labels: BTreeMap<String, String>,
    backup_name: &str,
) -> BTreeMap<String, String> {
    if backup_name.len() <= MAX_JOB_NAME {
        labels.insert(BACKUP_LABEL.into(), backup_name.into());
    }
    labels
}

/// The label naming the `DatabaseBackup` a Job or pod belongs to.
pub const BACKUP_LABEL: &str = "dbop.dev/backup";

/// `text` if it fits in `max` characters, else its head, a dash and a hash of the whole.
fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let hash = fnv1a(text.as_bytes());
    let mut head = max - 9;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let head = text[..head].trim_end_matches(['-', '.']);
    format!("{head}-{:08x}", hash as u32)
}

/// FNV-1a: a stable hash for shortened names (not for security).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{BackupPhase, DatabaseBackupSpec};
    use crate::resources::pod::pod_security_context;
    use crate::resources::testing;
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::Container;

    pub(crate) fn with_backup(extra: serde_json::Value) -> Database {
        let mut spec = serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "podMetadata": {"labels": {"testbed.dbop.dev/hold": "true"}},
            "backup": {
                "schedule": "0 2 * * *",
                "s3": {
                    "endpoint": "http://minio.storage.svc:9000",
                    "bucket": "backups",
                    "prefix": "team-a/",
                    "forcePathStyle": true,
                    "credentials": {"secretName": "s3-creds"}
                }
            }
        });
        if let (Some(b), Some(e)) = (spec["backup"].as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        let mut db = testing::database(spec);
        db.status = Some(crate::api::DatabaseStatus {
            current_version: Some("16.4".into()),
            ..Default::default()
        });
        db
    }

    fn backup(name: &str) -> DatabaseBackup {
        let mut b = DatabaseBackup::new(
            name,
            DatabaseBackupSpec {
                database: "orders".into(),
                reason: crate::api::BackupReason::Scheduled,
            },
        );
        b.metadata.namespace = Some("shop".into());
        b.metadata.uid = Some("u-1".into());
        let _ = BackupPhase::ALL;
        b
    }

    fn created() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 3, 1, 2, 0, 3).unwrap()
    }

    fn container(job: &Job) -> Container {
        job.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .clone()
    }

    #[test]
    fn the_job_runs_the_agent_from_the_running_version_image() {
        let db = with_backup(serde_json::json!({}));
        let job = backup_job(
            &db,
            &backup("orders-202503010200"),
            created(),
            &Settings::default(),
        )
        .unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("orders-202503010200"));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("DatabaseBackup", Some(true))
        );
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(BACKOFF_LIMIT));
        assert_eq!(spec.active_deadline_seconds, Some(6 * 3600));
        let pod = spec.template.spec.as_ref().unwrap();
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.image.as_deref(),
            Some(crate::resources::DEFAULT_AGENT_IMAGE)
        );
        assert_eq!(
            init.command.as_ref().unwrap(),
            &vec![
                "cp".to_string(),
                "/usr/local/bin/dbop-backup".into(),
                AGENT_PATH.into()
            ]
        );
        assert!(
            init.resources.is_some(),
            "a ResourceQuota refuses a pod without"
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
        let c = container(&job);
        let resources = c.resources.clone().unwrap();
        assert!(resources.requests.unwrap().contains_key("memory"));
        assert!(resources.limits.unwrap().contains_key("memory"));
        // The application database is libpq's default (the user's name), not a fixed one.
        assert!(
            c.env
                .as_ref()
                .unwrap()
                .iter()
                .all(|e| e.name != "PGDATABASE")
        );
        let labels = job
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .clone()
            .unwrap()
            .labels
            .unwrap();
        assert_eq!(labels[crate::resources::LABEL_NAME], "dbop-backup");
        assert_eq!(c.image.as_deref(), Some("docker.io/library/postgres:16.4"));
        assert_eq!(c.command.as_ref().unwrap(), &vec![AGENT_PATH.to_string()]);
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let args = c.args.unwrap();
        for want in [
            "dump",
            "--bucket=backups",
            "--prefix=team-a/shop/orders",
            "--backup-id=20250301T020003Z-orders-202503010200",
            "--result-file=/dev/termination-log",
            "--path-style",
            "--keep-last=7",
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
        // The pod carries the Database's podMetadata (tests hold pods with it) and dbop's labels.
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        assert_eq!(labels["testbed.dbop.dev/hold"], "true");
        assert_eq!(labels["app.kubernetes.io/component"], "backup");
        assert_eq!(labels[BACKUP_LABEL], "orders-202503010200");
        assert_eq!(pod.security_context, Some(pod_security_context()));
    }

    #[test]
    fn secrets_reach_the_job_only_through_secret_references() {
        let db = with_backup(serde_json::json!({
            "s3": {
                "bucket": "b", "region": "eu-west-1",
                "credentials": {"secretName": "s3", "accessKeyIdKey": "id", "secretAccessKeyKey": "key"},
                "ca": {"configMapKeyRef": {"name": "ca", "key": "root.pem"}}
            }
        }));
        let job = backup_job(&db, &backup("b1"), created(), &Settings::default()).unwrap();
        let c = container(&job);
        let env = c.env.clone().unwrap();
        let get = |n: &str| env.iter().find(|e| e.name == n).cloned().unwrap();
        for (name, secret, key) in [
            ("AWS_ACCESS_KEY_ID", "s3", "id"),
            ("AWS_SECRET_ACCESS_KEY", "s3", "key"),
            ("PGPASSWORD", "orders-credentials", "password"),
        ] {
            let e = get(name);
            assert!(e.value.is_none(), "{name} must not be a literal");
            let r = e.value_from.unwrap().secret_key_ref.unwrap();
            assert_eq!((r.name.as_str(), r.key.as_str()), (secret, key), "{name}");
        }
        assert_eq!(get("AWS_REGION").value.as_deref(), Some("eu-west-1"));
        assert!(env.iter().all(|e| e.name != "AWS_ENDPOINT_URL"));
        assert!(
            c.args
                .unwrap()
                .iter()
                .any(|a| a == "--ca-file=/etc/dbop/s3-ca/ca.pem")
        );
        assert!(
            c.volume_mounts
                .unwrap()
                .iter()
                .any(|m| m.mount_path == CA_DIR)
        );
        let pod = job.spec.unwrap().template.spec.unwrap();
        let ca = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "s3-ca")
            .unwrap();
        assert_eq!(ca.config_map.unwrap().items.unwrap()[0].key, "root.pem");
    }

    #[test]
    fn retention_and_timeout_follow_the_spec() {
        let db = with_backup(serde_json::json!({
            "timeout": "90m",
            "retention": {"keepLast": 3, "maxAge": "30d"}
        }));
        let job = backup_job(&db, &backup("b"), created(), &Settings::default()).unwrap();
        assert_eq!(
            job.spec.as_ref().unwrap().active_deadline_seconds,
            Some(5400)
        );
        let args = container(&job).args.unwrap();
        assert!(args.contains(&"--keep-last=3".to_string()));
        assert!(args.contains(&"--max-age=30d".to_string()));
        assert!(
            !args.contains(&"--path-style".to_string())
                || db.spec.backup.unwrap().s3.force_path_style
        );
    }

    #[test]
    fn no_job_without_a_backup_spec_or_a_running_version() {
        let mut db = with_backup(serde_json::json!({}));
        db.status = None;
        assert_eq!(
            backup_job(&db, &backup("b"), created(), &Settings::default()),
            Err(JobProblem::NoRunningVersion)
        );
        let db = testing::minimal();
        assert_eq!(
            backup_job(&db, &backup("b"), created(), &Settings::default()),
            Err(JobProblem::NoBackupSpec)
        );
    }

    #[test]
    fn a_value_that_does_not_parse_is_a_problem_not_a_default() {
        // Before the spec was parsed once, a bad timeout silently became the 6 h default here.
        let db = with_backup(serde_json::json!({"timeout": "soon"}));
        match backup_job(&db, &backup("b"), created(), &Settings::default()) {
            Err(JobProblem::InvalidSpec(message)) => {
                assert!(message.contains("spec.backup.timeout"), "{message}")
            }
            other => panic!("expected InvalidSpec, got {other:?}"),
        }
    }

    #[test]
    fn the_verify_job_restores_the_latest_backup_of_the_application_database() {
        let db = with_backup(serde_json::json!({}));
        let job = verify_job(&db, "orders-verify-202505010300", &Settings::default()).unwrap();
        assert_eq!(
            job.metadata.owner_references.as_ref().unwrap()[0].kind,
            "Database"
        );
        assert_eq!(
            job.metadata.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            "verify"
        );
        let spec = job.spec.as_ref().unwrap();
        assert!(spec.ttl_seconds_after_finished.is_some());
        let c = container(&job);
        let args = c.args.clone().unwrap();
        assert_eq!(&args[..2], ["verify", "latest"]);
        for want in [
            "--bucket=backups",
            "--prefix=team-a/shop/orders",
            "--result-file=/dev/termination-log",
            "--path-style",
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
        let env = c.env.unwrap();
        for name in ["PGDATABASE", "DBOP_BACKUP_SOURCE_DATABASE"] {
            let e = env.iter().find(|e| e.name == name).unwrap();
            let r = e.value_from.clone().unwrap().secret_key_ref.unwrap();
            assert_eq!(
                (r.name.as_str(), r.key.as_str()),
                ("orders-credentials", "username")
            );
        }
        assert!(
            env.iter()
                .all(|e| e.name != "PGPASSWORD" || e.value.is_none())
        );
    }

    #[test]
    fn backup_ids_are_ids_the_agent_accepts() {
        for name in ["b", "orders-202505010200", &"x".repeat(300), "a.b_c-d"] {
            let id = backup_id(name, created());
            dbop_contract::layout::validate_backup_id(&id)
                .unwrap_or_else(|e| panic!("{name}: {id}: {e}"));
        }
    }

    #[test]
    fn image_is_the_running_version_during_a_version_change() {
        let mut db = with_backup(serde_json::json!({}));
        db.spec.version = "16.5".into();
        db.spec.image = Some("mirror/pg:16.5".into());
        assert_eq!(
            running_image(&db, &Settings::default()).as_deref(),
            Some("docker.io/library/postgres:16.4")
        );
        db.status.as_mut().unwrap().current_version = Some("16.5".into());
        assert_eq!(
            running_image(&db, &Settings::default()).as_deref(),
            Some("mirror/pg:16.5")
        );
    }

    #[test]
    fn long_names_are_shortened_deterministically() {
        let long = "a".repeat(200);
        let name = job_name(&long);
        assert_eq!(name.len(), MAX_JOB_NAME);
        assert_eq!(name, job_name(&long));
        assert_ne!(name, job_name(&"a".repeat(201)));
        let id = backup_id(&long, created());
        assert!(id.len() <= MAX_BACKUP_ID && id.starts_with("20250301T020003Z-"));
        assert_eq!(job_name("short"), "short");
    }
}
