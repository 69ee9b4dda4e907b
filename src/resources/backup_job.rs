//! The agent's Jobs of a Database's backups: the backup Job (`dbop-backup dump`) of a
//! `DatabaseBackup`, owned by it, and the verify Job (`dbop-backup verify latest`, or
//! `verify-base` for base backups), owned by the Database. Both run the agent from the database
//! image of the running version (so `pg_dump` and `pg_restore` match the server), copied in by
//! an init container from the operator's image, on the `job` skeleton.
//!
//! The S3 and database credentials (and the encryption keys) reach the container only as files
//! of read-only Secret volumes (`agent::agent_secrets`: never in the environment, on the command
//! line or in the operator); the agent writes its JSON
//! result to the termination message, which the `DatabaseBackup` controller reads back.
//!
//! Pure: a function of the Database, its parsed `spec.backup` limits (`AgentLimits`, from
//! `backup::settings`), the image and the operator's settings. Whether a Job can be built at
//! all is `backup::job`'s question.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dbop_contract::layout;
use dbop_contract::units::format_duration;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::Names;
pub use super::agent::{CA_DIR, TERMINATION_LOG};
use super::agent::{
    CA_FILE, agent_env, agent_secrets, base_backup_env, dump_env, encryption_env, storage_secrets,
};
use super::job::{AgentRun, JobParts, agent_pod, job};
use super::placement::JobClass;
use super::pod::{mount, secret_volume};
use super::private_server::{Bucket, verify_pod};
use super::{job_pod_labels, labels, owned_meta};
use crate::api::{BackupMethod, BackupReason, BackupSpec, Database, DatabaseBackup};
use crate::settings::Settings;
use dbop_contract::topology::REPLICATION_DIR;

/// What `spec.backup` sets on an agent Job, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentLimits {
    /// How long the Job may run (`spec.backup.timeout`; at least a minute).
    pub timeout: Duration,
    /// The agent's retention in object storage.
    pub keep_last: u32,
    pub max_age: Option<Duration>,
}

impl AgentLimits {
    fn deadline_seconds(&self) -> i64 {
        i64::try_from(self.timeout.as_secs().max(60)).unwrap_or(i64::MAX)
    }
}

/// The backup Job of `backup` (made at `created`), owned by it, running `image`: the agent's
/// `dump` for a logical backup, its `base-backup` for a physical one.
pub fn backup_job(
    db: &Database,
    spec: &BackupSpec,
    limits: &AgentLimits,
    image: String,
    backup: &DatabaseBackup,
    created: DateTime<Utc>,
    settings: &Settings,
) -> Job {
    let backup_name = backup.metadata.name.clone().unwrap_or_default();
    let id = backup_id(&backup_name, created);
    let (args, env, secrets) = match backup.spec.method {
        BackupMethod::Logical => dump_run(db, spec, limits, backup, id),
        BackupMethod::Physical => base_backup_run(db, spec, limits, backup, id),
    };
    let run = server_agent(db, spec, image, (args, env, secrets));
    let parts = JobParts {
        metadata: job_meta(db, backup, &backup_name),
        pod_labels: with_backup_label(job_pod_labels(db, "backup"), &backup_name),
        backoff_limit: BACKOFF_LIMIT,
        active_deadline_seconds: limits.deadline_seconds(),
        ttl_seconds_after_finished: None,
        class: JobClass::Backup,
        pod: agent_pod(settings, run),
    };
    job(db, settings, parts)
}

/// What a Job's agent container runs: its arguments, environment and Secret volumes.
type Run = (Vec<String>, Vec<EnvVar>, Vec<(Volume, VolumeMount)>);

/// The agent's `--jobs` for `spec.backup.dumpStreams` > 1.
fn jobs_arg(spec: &BackupSpec) -> Option<String> {
    spec.dump_streams
        .filter(|n| *n > 1)
        .map(|streams| format!("--jobs={streams}"))
}

/// `dump` with the Database's credentials, pruning its dumps by `spec.backup`'s retention.
fn dump_run(
    db: &Database,
    spec: &BackupSpec,
    limits: &AgentLimits,
    backup: &DatabaseBackup,
    id: String,
) -> Run {
    let mut args = vec!["dump".to_string()];
    args.extend(s3_args(db, spec));
    args.push(format!("--backup-id={id}"));
    args.extend(retention_args(limits));
    args.extend(encryption_arg(spec));
    args.extend(jobs_arg(spec));
    let keys = encryption_secret(spec);
    let mut env = dump_env(db, &spec.s3, backup.spec.reason);
    env.extend(encryption_env(keys));
    (args, env, agent_secrets(db, &spec.s3, keys))
}

/// `base-backup` into `<prefix>/physical/base/<id>/`, as the replication role (a replication
/// connection, from a ready standby when there is one): its password is the only credential
/// mounted. A backup someone waits for (not the schedule's) asks for an immediate checkpoint.
/// `spec.backup`'s retention applies to the base backups, and the agent then deletes the WAL
/// only they needed.
fn base_backup_run(
    db: &Database,
    spec: &BackupSpec,
    limits: &AgentLimits,
    backup: &DatabaseBackup,
    id: String,
) -> Run {
    let mut args = vec!["base-backup".to_string()];
    args.extend(s3_args(db, spec));
    args.push(format!("--database={}", super::agent::PHYSICAL_FOLDER));
    args.push(format!("--backup-id={id}"));
    args.extend(retention_args(limits));
    if backup.spec.reason != BackupReason::Scheduled {
        args.push("--fast-checkpoint".into());
    }
    args.extend(encryption_arg(spec));
    let keys = encryption_secret(spec);
    let mut env = base_backup_env(db, &spec.s3, backup.spec.reason);
    env.extend(encryption_env(keys));
    let mut secrets = storage_secrets(&spec.s3, keys);
    secrets.push((
        secret_volume("replication", &Names::of(db).replication_secret(), None),
        mount("replication", REPLICATION_DIR, true),
    ));
    (args, env, secrets)
}

/// The agent's retention of what the Job stores: the newest `keep_last`, none older than
/// `max_age`.
fn retention_args(limits: &AgentLimits) -> Vec<String> {
    let mut args = vec![format!("--keep-last={}", limits.keep_last)];
    if let Some(max_age) = limits.max_age {
        args.push(format!("--max-age={}", format_duration(max_age)));
    }
    args
}

/// The key's name, not the key: the agent reads it from the mounted Secret.
fn encryption_arg(spec: &BackupSpec) -> Option<String> {
    spec.encryption
        .as_ref()
        .map(|e| format!("--encryption-key={}", e.key_name))
}

/// The verify Job `name`, owned by the Database. For dumps, `dbop-backup verify latest`
/// restores the latest backup into a scratch database on the server (created and dropped by
/// the agent) and compares the row counts with the manifest's: same image, agent, credentials
/// and S3 settings as a backup Job. For base backups, `verify-base` recovers the newest one and
/// its WAL into a scratch instance of the Job's own (`private_server::verify_pod`), never
/// touching the server.
pub fn verify_job(
    db: &Database,
    spec: &BackupSpec,
    limits: &AgentLimits,
    image: String,
    name: &str,
    settings: &Settings,
) -> Job {
    // The application database (named after the superuser): the agent connects to it (its
    // PGDATABASE defaults to the user's name from the credentials file), makes the scratch
    // database from there, and verifies its backups.
    let keys = encryption_secret(spec);
    let pod = match spec.method {
        BackupMethod::Physical => {
            let prefix = storage_prefix(db, spec);
            let bucket = Bucket {
                s3: &spec.s3,
                prefix: &prefix,
                encryption_secret: keys,
            };
            verify_pod(db, &bucket, (BACKUP_CONTAINER, image), settings)
        }
        BackupMethod::Logical => {
            let mut env = agent_env(db, &spec.s3, "dbop-backup");
            env.extend(encryption_env(keys));
            let mut args = vec!["verify".to_string(), "latest".to_string()];
            args.extend(s3_args(db, spec));
            // The scratch database is new and dropped whatever happens: a dump in parts is
            // restored into it in steps, as many at once as it was dumped.
            args.extend(jobs_arg(spec));
            let secrets = agent_secrets(db, &spec.s3, keys);
            agent_pod(
                settings,
                server_agent(db, spec, image, (args, env, secrets)),
            )
        }
    };
    let parts = JobParts {
        metadata: owned_meta(db, name.to_string(), "verify"),
        pod_labels: job_pod_labels(db, "verify"),
        backoff_limit: BACKOFF_LIMIT,
        active_deadline_seconds: limits.deadline_seconds(),
        ttl_seconds_after_finished: Some(VERIFY_JOB_TTL_SECONDS),
        class: JobClass::Backup,
        pod,
    };
    job(db, settings, parts)
}

/// The backup container of a Job whose agent connects to the Database's server (a dump, a base
/// backup, a dump's verification), trusting the Database's CA.
fn server_agent<'a>(
    db: &Database,
    spec: &'a BackupSpec,
    image: String,
    (args, env, secrets): Run,
) -> AgentRun<'a> {
    AgentRun {
        container: BACKUP_CONTAINER,
        image,
        args,
        env,
        s3: &spec.s3,
        database_ca: super::tls::client_ca(db),
        secrets,
    }
}

/// The Secret of `spec.backup.encryption`, mounted into the backup and verify Jobs.
fn encryption_secret(spec: &BackupSpec) -> Option<&str> {
    spec.encryption.as_ref().map(|e| e.secret_name.as_str())
}

/// Where the init container puts the agent, and where the backup container runs it from.
pub const AGENT_PATH: &str = "/dbop/dbop-backup";

/// A retry covers a pod lost with its node; a dump that fails twice fails for a reason.
pub const BACKOFF_LIMIT: i32 = 1;

/// The name of the backup container (the one whose termination message holds the result).
pub const BACKUP_CONTAINER: &str = "backup";

/// Kubernetes label values and Job names are at most 63 characters.
pub(crate) const MAX_JOB_NAME: usize = 63;

/// The agent accepts backup ids of at most 128 characters.
pub(crate) const MAX_BACKUP_ID: usize = 128;

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
    super::restore_job::storage_prefix(&spec.s3, &db.namespace_or_default(), &db.name())
}

/// The image the server runs: the one the status recorded when its rollout settled; for a
/// status from before that was recorded, `spec.image` when it is for the running version, else
/// the repository tagged with the running version.
pub fn running_image(db: &Database, settings: &Settings) -> Option<String> {
    let status = db.status.as_ref()?;
    if let Some(image) = &status.current_image {
        return Some(image.clone());
    }
    let current = status.current_version.clone()?;
    Some(match &db.spec.image {
        Some(image) if current == db.spec.version => image.clone(),
        _ => settings.postgres_image(&current),
    })
}

/// How long a finished verify Job stays (its outcome is in the Database's status by then).
const VERIFY_JOB_TTL_SECONDS: i32 = 86_400;

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
    args.extend(super::agent::sse_args(s3));
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
