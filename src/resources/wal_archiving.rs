//! Continuous WAL archiving in the database pods (`spec.backup.walArchiving`): the server
//! parameters that make PostgreSQL hand every completed WAL file to the agent
//! (`archive_mode`, `archive_command`, `archive_timeout`), the agent copied into the pod, and
//! what it needs to reach the bucket: its non-secret settings in the `postgres` container's
//! environment (the instance manager starts the server with it, and the server passes it to
//! `archive_command`), the S3 key, the CA and the encryption keys as the same read-only Secret
//! files the backup Jobs read.
//!
//! Where the WAL goes: `<the Database's prefix>/physical/wal/<timeline>/<file>.zst`, beside
//! the dumps (whose keys are one level shallower, so neither is mistaken for the other).
//!
//! Pure: plain functions of the Database and the operator's settings.

use std::collections::BTreeMap;
use std::time::Duration;

use dbop_contract::units::parse_duration;
use k8s_openapi::api::core::v1::{EnvVar, PodTemplateSpec, Volume};

use super::agent::{
    CA_DIR, CA_FILE, ENCRYPTION_KEYS_DIR, PHYSICAL_FOLDER, ca_volume, s3_env, storage_secrets,
};
use super::backup_job::AGENT_PATH;
use super::pod::{copy_binary, env, mount};
use crate::api::{BackupSpec, Database, WalArchivingSpec};
use crate::settings::Settings;

/// `archive_timeout` when the spec does not say.
pub const DEFAULT_ARCHIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest `archive_timeout` (each forced switch stores a whole 16 MiB file's object).
pub const MIN_ARCHIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Uploads at once when the spec does not say.
pub const DEFAULT_PARALLEL: u16 = 4;

/// The backup spec and its archiving settings, when the Database archives its WAL.
pub fn enabled(db: &Database) -> Option<(&BackupSpec, &WalArchivingSpec)> {
    let backup = db.spec.backup.as_ref()?;
    Some((backup, backup.wal_archiving.as_ref()?))
}

/// The bound on a quiet server's archive delay: the spec's, never under the minimum.
pub fn archive_timeout(spec: &WalArchivingSpec) -> Duration {
    spec.archive_timeout
        .as_deref()
        .and_then(|t| parse_duration(t).ok())
        .unwrap_or(DEFAULT_ARCHIVE_TIMEOUT)
        .max(MIN_ARCHIVE_TIMEOUT)
}

/// The parameters dbop manages for archiving (none when it is off): the spec may not set
/// them (`postgresql::MANAGED_PARAMETERS`).
pub fn parameters(db: &Database) -> BTreeMap<String, String> {
    let Some((_, spec)) = enabled(db) else {
        return BTreeMap::new();
    };
    BTreeMap::from([
        ("archive_mode".into(), "on".into()),
        (
            "archive_command".into(),
            format!("{AGENT_PATH} wal-push %p %f"),
        ),
        (
            "archive_timeout".into(),
            format!("{}s", archive_timeout(spec).as_secs()),
        ),
    ])
}

/// The agent's settings in the `postgres` container: where the WAL goes and how the bucket is
/// reached. Nothing secret: the keys are files.
pub fn agent_env(db: &Database, backup: &BackupSpec, spec: &WalArchivingSpec) -> Vec<EnvVar> {
    let s3 = &backup.s3;
    let mut vars = vec![
        env("DBOP_BACKUP_BUCKET", &s3.bucket),
        env(
            "DBOP_BACKUP_PREFIX",
            &super::backup_job::storage_prefix(db, backup),
        ),
        env("DBOP_BACKUP_DATABASE", PHYSICAL_FOLDER),
        env(
            "DBOP_BACKUP_WAL_PARALLEL",
            &spec.parallel.unwrap_or(DEFAULT_PARALLEL).to_string(),
        ),
    ];
    if s3.force_path_style {
        vars.push(env("DBOP_BACKUP_PATH_STYLE", "true"));
    }
    if s3.ca.is_some() {
        vars.push(env("DBOP_BACKUP_CA_FILE", CA_FILE));
    }
    if let Some(sse) = &s3.server_side_encryption {
        vars.push(env("DBOP_BACKUP_SSE", sse.algorithm.as_arg()));
        if let Some(key) = &sse.kms_key_id {
            vars.push(env("DBOP_BACKUP_SSE_KMS_KEY_ID", key));
        }
    }
    if let Some(encryption) = &backup.encryption {
        vars.push(env("DBOP_BACKUP_ENCRYPTION_KEY_DIR", ENCRYPTION_KEYS_DIR));
        vars.push(env("DBOP_BACKUP_ENCRYPTION_KEY", &encryption.key_name));
    }
    vars.extend(s3_env(s3));
    vars
}

/// Puts archiving into the database pod template when the Database archives its WAL: the
/// init container that copies the agent, its environment and its Secrets' files.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database, settings: &Settings) {
    let Some((backup, spec)) = enabled(db) else {
        return;
    };
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    let (copy, _) = copy_binary(settings, "dbop-backup");
    pod.init_containers.get_or_insert_with(Vec::new).push(copy);
    let keys = backup.encryption.as_ref().map(|e| e.secret_name.as_str());
    let mut secrets = storage_secrets(&backup.s3, keys);
    if let Some(ca) = &backup.s3.ca {
        secrets.push((ca_volume(ca), mount("s3-ca", CA_DIR, true)));
    }
    for (volume, _) in &mut secrets {
        optional(volume);
    }
    let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") else {
        return;
    };
    postgres
        .env
        .get_or_insert_with(Vec::new)
        .extend(agent_env(db, backup, spec));
    for (volume, volume_mount) in secrets {
        postgres
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(volume_mount);
        pod.volumes.get_or_insert_with(Vec::new).push(volume);
    }
}

/// A Secret or ConfigMap the database pod may start without: a missing S3 key or CA must not
/// keep the server down (archiving fails, and says so, until it appears; the kubelet then
/// fills the volume in).
fn optional(volume: &mut Volume) {
    if let Some(secret) = volume.secret.as_mut() {
        secret.optional = Some(true);
    }
    if let Some(config_map) = volume.config_map.as_mut() {
        config_map.optional = Some(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::statefulset::statefulset;
    use crate::resources::testing;
    use serde_json::json;

    fn db(backup: serde_json::Value) -> Database {
        testing::database(json!({
            "version": "16.4",
            "storage": {"size": "1Gi"},
            "backup": backup,
        }))
    }

    fn archiving() -> serde_json::Value {
        json!({
            "schedule": "@daily",
            "s3": {
                "bucket": "backups",
                "prefix": "team-a",
                "endpoint": "http://s3.local:9000",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-key"},
                "ca": {"configMapKeyRef": {"name": "s3-ca", "key": "ca.crt"}},
            },
            "encryption": {"secretName": "backup-keys", "keyName": "k1"},
            "walArchiving": {"archiveTimeout": "5m", "parallel": 8},
        })
    }

    fn postgres(template: &PodTemplateSpec) -> &k8s_openapi::api::core::v1::Container {
        let pod = template.spec.as_ref().unwrap();
        pod.containers
            .iter()
            .find(|c| c.name == "postgres")
            .unwrap()
    }

    #[test]
    fn archiving_sets_the_server_parameters_only_when_asked() {
        let on = db(archiving());
        let p = parameters(&on);
        assert_eq!(p["archive_mode"], "on");
        assert_eq!(p["archive_command"], "/dbop/dbop-backup wal-push %p %f");
        assert_eq!(p["archive_timeout"], "300s");
        let mut off = archiving();
        off.as_object_mut().unwrap().remove("walArchiving");
        assert!(parameters(&db(off)).is_empty());
        // The default, and the floor.
        let mut spec = WalArchivingSpec::default();
        assert_eq!(archive_timeout(&spec), Duration::from_secs(60));
        spec.archive_timeout = Some("1s".into());
        assert_eq!(archive_timeout(&spec), MIN_ARCHIVE_TIMEOUT);
        // archive_mode is read at start: enabling archiving restarts the pods.
        let restart = super::super::server_config::restart_annotation(&on).unwrap();
        assert!(restart.contains("archive_mode"), "{restart}");
    }

    #[test]
    fn the_database_pod_gets_the_agent_its_settings_and_its_secrets_as_files() {
        let on = db(archiving());
        let sts = statefulset(&on, &Settings::default(), None);
        let template = &sts.spec.template;
        let pod = template.spec.as_ref().unwrap();
        let copies: Vec<_> = pod
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(copies, ["copy-dbop-instance", "copy-dbop-backup"]);
        let c = postgres(template);
        let vars: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.as_str(), v.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(vars["DBOP_BACKUP_BUCKET"], "backups");
        assert_eq!(vars["DBOP_BACKUP_PREFIX"], "team-a/shop/orders");
        assert_eq!(vars["DBOP_BACKUP_DATABASE"], "physical");
        assert_eq!(vars["DBOP_BACKUP_WAL_PARALLEL"], "8");
        assert_eq!(vars["DBOP_BACKUP_PATH_STYLE"], "true");
        assert_eq!(vars["DBOP_BACKUP_CA_FILE"], CA_FILE);
        assert_eq!(vars["DBOP_BACKUP_ENCRYPTION_KEY"], "k1");
        assert_eq!(vars["AWS_ENDPOINT_URL"], "http://s3.local:9000");
        assert_eq!(
            vars["DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE"],
            "/etc/dbop/s3-credentials/secret-access-key"
        );
        // No secret in the environment: every value is a plain string, none from a Secret.
        assert!(c.env.iter().flatten().all(|v| v.value_from.is_none()));
        // No libpq variable that would send the instance manager's own sessions elsewhere.
        assert!(!vars.contains_key("PGHOST"), "{vars:?}");
        let mounts: BTreeMap<_, _> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), (m.mount_path.as_str(), m.read_only)))
            .collect();
        for (name, path) in [
            ("s3-credentials", "/etc/dbop/s3-credentials"),
            ("encryption-keys", ENCRYPTION_KEYS_DIR),
            ("s3-ca", CA_DIR),
        ] {
            assert_eq!(mounts[name], (path, Some(true)), "{name}");
        }
        // The server starts even while the S3 key, the keys or the CA are missing.
        for name in ["s3-credentials", "encryption-keys", "s3-ca"] {
            let volume = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == name)
                .unwrap();
            let optional = volume
                .secret
                .as_ref()
                .and_then(|s| s.optional)
                .or(volume.config_map.as_ref().and_then(|c| c.optional));
            assert_eq!(optional, Some(true), "{name}");
        }
        let volumes: Vec<_> = pod.volumes.iter().flatten().map(|v| &v.name).collect();
        let unique: std::collections::BTreeSet<_> = volumes.iter().collect();
        assert_eq!(unique.len(), volumes.len(), "{volumes:?}");
    }

    #[test]
    fn without_archiving_the_pod_is_unchanged() {
        let mut off = archiving();
        off.as_object_mut().unwrap().remove("walArchiving");
        let off = db(off);
        let sts = statefulset(&off, &Settings::default(), None);
        let template = &sts.spec.template;
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(pod.init_containers.as_ref().map(Vec::len), Some(1));
        assert!(
            postgres(template)
                .env
                .iter()
                .flatten()
                .all(|v| !v.name.starts_with("DBOP_BACKUP_"))
        );
    }
}
