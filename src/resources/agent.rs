//! What every pod that runs the backup agent shares (the backup, verify and restore Jobs): its
//! environment (libpq and the AWS SDK, credentials only as Secret references, never values),
//! its mounts, the `s3.ca` volume and where the result and the CA are found.
//!
//! Pure builders; `backup::job` and `resources::restore_job` put them into their pods.

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EnvVar, KeyToPath, SecretVolumeSource, Volume, VolumeMount,
};

use super::credentials::{PASSWORD_KEY, USERNAME_KEY, secret_name};
use super::pod::{DBOP_BIN_DIR, DBOP_BIN_VOLUME, env, mount, scratch, secret_env};
use super::{Names, POSTGRES_PORT};
use crate::api::{CaSource, Database, S3Spec};

/// The file Kubernetes turns into the container's termination message: the agent's result.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Where the `s3.ca` volume is mounted, and the CA file in it.
pub const CA_DIR: &str = "/etc/dbop/s3-ca";
pub const CA_FILE: &str = "/etc/dbop/s3-ca/ca.pem";

/// The agent's environment: the Database's `-rw` Service (TLS, verified once the pods serve
/// it: `tls::client_env`), its credentials and the S3 ones as Secret references, the SDK kept away from any other source of credentials. `app_name`
/// tells the sessions apart in `pg_stat_activity`.
pub fn agent_env(db: &Database, s3: &S3Spec, app_name: &str) -> Vec<EnvVar> {
    let credentials = secret_name(db);
    let keys = &s3.credentials;
    let mut vars = vec![
        env(
            "PGHOST",
            &Names::of(db).endpoint(&db.namespace_or_default()),
        ),
        env("PGPORT", &POSTGRES_PORT.to_string()),
        env("PGCONNECT_TIMEOUT", "10"),
        env("PGAPPNAME", app_name),
        secret_env("PGUSER", &credentials, USERNAME_KEY, true),
        secret_env("PGPASSWORD", &credentials, PASSWORD_KEY, false),
        secret_env(
            "AWS_ACCESS_KEY_ID",
            &keys.secret_name,
            keys.access_key_id_key(),
            false,
        ),
        secret_env(
            "AWS_SECRET_ACCESS_KEY",
            &keys.secret_name,
            keys.secret_access_key_key(),
            false,
        ),
        env("AWS_REGION", s3.region.as_deref().unwrap_or("us-east-1")),
        // Credentials come from the Secret only: no instance metadata, no shared files.
        env("AWS_EC2_METADATA_DISABLED", "true"),
        env("AWS_CONFIG_FILE", "/dev/null"),
        env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        env("DBOP_BACKUP_LOG_FORMAT", "json"),
    ];
    if let Some(endpoint) = &s3.endpoint {
        vars.push(env("AWS_ENDPOINT_URL", endpoint));
    }
    vars.extend(super::tls::client_env(db));
    vars
}

/// The agent's mounts: the copied binaries, a writable `/tmp`, and the CA when there is one.
pub fn agent_mounts(with_ca: bool) -> Vec<VolumeMount> {
    let mut mounts = vec![
        mount(DBOP_BIN_VOLUME, DBOP_BIN_DIR, true),
        mount("tmp", "/tmp", false),
    ];
    if with_ca {
        mounts.push(mount("s3-ca", CA_DIR, true));
    }
    mounts
}

/// The `s3.ca` source as a volume holding `ca.pem`.
pub fn ca_volume(ca: &CaSource) -> Volume {
    let items = |key: &str| {
        Some(vec![KeyToPath {
            key: key.into(),
            path: "ca.pem".into(),
            ..KeyToPath::default()
        }])
    };
    match (&ca.secret_key_ref, &ca.config_map_key_ref) {
        (Some(r), _) => Volume {
            name: "s3-ca".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(r.name.clone()),
                items: items(&r.key),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        (None, Some(r)) => Volume {
            name: "s3-ca".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: r.name.clone(),
                items: items(&r.key),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        (None, None) => scratch("s3-ca"),
    }
}
