//! The pod of an agent Job that starts a PostgreSQL server of its own from the Database's
//! image, on a socket nobody else reaches: the recovery Job (`recover`, into the first data
//! claim: `recovery_job`) and the verify Job of base backups (`verify-base`, into a scratch
//! volume of the pod's own: `verify_pod` here, used by `backup_job`). The S3 key and encryption
//! keys reach it only as files of read-only Secret volumes; of the database's credentials only
//! the superuser's name is mounted.
//!
//! Pure: a function of the Database, where its physical backups are and the operator's settings.

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::agent::{
    CA_FILE, PG_CREDENTIALS_DIR, PHYSICAL_FOLDER, TERMINATION_LOG, encryption_env, s3_env,
    storage_secrets,
};
use super::credentials::{USERNAME_KEY, secret_name};
use super::job::{AgentRun, JobPod, agent_pod};
use super::pod::{env, mount, secret_volume, shared_memory};
use crate::api::{Database, S3Spec};
use crate::settings::Settings;

/// Where the Database's physical backups are, as the agent reads them.
pub struct Bucket<'a> {
    pub s3: &'a S3Spec,
    /// The Database's key prefix (`restore_job::storage_prefix`).
    pub prefix: &'a str,
    pub encryption_secret: Option<&'a str>,
}

/// Where the verify Job of a base backup recovers into: a scratch volume of the pod's own,
/// deleted with it (never the Database's volume or server).
pub const VERIFY_SCRATCH_MOUNT: &str = "/var/lib/dbop-verify";
const VERIFY_SCRATCH_VOLUME: &str = "verify-scratch";

/// The pod of the verify Job of a base backup: `verify-base` recovers the newest base backup
/// and its WAL into a scratch volume (an emptyDir no larger than the Database's storage) from
/// the running image, reads every table, and deletes it.
/// The agent's result is read from `container`'s termination message.
pub fn verify_pod(
    db: &Database,
    bucket: &Bucket<'_>,
    (container, image): (&'static str, String),
    settings: &Settings,
) -> JobPod {
    let mut args = vec!["verify-base".into(), format!("{VERIFY_SCRATCH_MOUNT}/data")];
    args.extend(bucket_args(bucket));
    let mut pod = private_server_pod(db, bucket, (container, args), image, settings);
    pod.volumes.push(Volume {
        name: VERIFY_SCRATCH_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(db.spec.storage.size.clone())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    });
    pod.container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount(VERIFY_SCRATCH_VOLUME, VERIFY_SCRATCH_MOUNT, false));
    pod
}

/// The pod of an agent that starts a PostgreSQL server of its own from `image` (`recover`,
/// `verify-base`): the S3 key and encryption keys as files, of the database's credentials the
/// superuser's name only (the role it connects to its own server as), shared memory for the
/// server. Nothing connects to a server but the one it starts on its own socket. `run` is the
/// container's name and the agent's arguments.
pub fn private_server_pod(
    db: &Database,
    bucket: &Bucket<'_>,
    run: (&'static str, Vec<String>),
    image: String,
    settings: &Settings,
) -> JobPod {
    let (container, args) = run;
    let keys = bucket.encryption_secret;
    let mut vars = s3_env(bucket.s3);
    vars.push(env("DBOP_BACKUP_LOG_FORMAT", "json"));
    vars.extend(encryption_env(keys));
    // The agent connects to the server it starts as the superuser this Database will have
    // (the role initdb made in the source, `postgres` unless its credentials named another):
    // the user name only, from the credentials Secret's `username` item.
    let user_file = format!("{PG_CREDENTIALS_DIR}/{USERNAME_KEY}");
    vars.push(env("DBOP_BACKUP_USER_FILE", &user_file));
    let mut secrets = storage_secrets(bucket.s3, keys);
    secrets.push((
        secret_volume(
            "pg-credentials",
            &secret_name(db),
            Some(vec![(USERNAME_KEY.into(), USERNAME_KEY.into())]),
        ),
        mount("pg-credentials", PG_CREDENTIALS_DIR, true),
    ));
    let run = AgentRun {
        container,
        image,
        args,
        env: vars,
        s3: bucket.s3,
        database_ca: None,
        secrets,
    };
    let mut pod = agent_pod(settings, run);
    pod.volumes.push(shared_memory());
    pod.container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount("shm", "/dev/shm", false));
    pod
}

/// Where the base backups and WAL are, for `recover` and `verify-base`. Nothing secret.
pub fn bucket_args(bucket: &Bucket<'_>) -> Vec<String> {
    let mut args: Vec<String> = vec![
        format!("--bucket={}", bucket.s3.bucket),
        format!("--prefix={}", bucket.prefix),
        format!("--database={PHYSICAL_FOLDER}"),
        format!("--result-file={TERMINATION_LOG}"),
    ];
    if bucket.s3.force_path_style {
        args.push("--path-style".into());
    }
    if bucket.s3.ca.is_some() {
        args.push(format!("--ca-file={CA_FILE}"));
    }
    args
}
