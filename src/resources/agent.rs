//! What every pod that runs the backup agent shares (the backup, verify and restore Jobs): its
//! environment (libpq and the AWS SDK, nothing secret), the Secrets it reads as files (the
//! database credentials, the S3 key, the encryption keys: Secret volumes readable by the pod's
//! group, whose paths the agent's `DBOP_BACKUP_*_FILE` variables name; never a value or a
//! `secretKeyRef` in the environment), its mounts, the `s3.ca` volume and where the result and
//! the CA are found.
//!
//! Pure builders; `backup::job` and `resources::restore_job` put them into their pods.

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EnvVar, KeyToPath, SecretVolumeSource, Volume, VolumeMount,
};

use super::credentials::{PASSWORD_KEY, USERNAME_KEY, secret_name};
use super::pod::{DBOP_BIN_DIR, DBOP_BIN_VOLUME, env, mount, scratch, secret_volume};
use super::{Names, POSTGRES_PORT};
use crate::api::{BackupReason, CaSource, Database, InstanceRole, S3Spec};
use dbop_contract::topology::{REPLICATION_DIR, REPLICATION_PASSWORD_FILE, REPLICATION_ROLE};

/// The file Kubernetes turns into the container's termination message: the agent's result.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Where the `s3.ca` volume is mounted, and the CA file in it.
pub const CA_DIR: &str = "/etc/dbop/s3-ca";
pub const CA_FILE: &str = "/etc/dbop/s3-ca/ca.pem";
/// Where the database credentials Secret is mounted (its `username` and `password` files).
pub const PG_CREDENTIALS_DIR: &str = "/etc/dbop/pg-credentials";
/// The folder of the Database's prefix that holds what is not one database's dump: the WAL
/// (and the instance's physical base backups).
pub const PHYSICAL_FOLDER: &str = "physical";
/// Where the S3 key is mounted, as `access-key-id`, `secret-access-key` and `session-token`.
pub const S3_CREDENTIALS_DIR: &str = "/etc/dbop/s3-credentials";
/// Where the encryption keys' Secret is mounted: one file per key name.
pub const ENCRYPTION_KEYS_DIR: &str = "/etc/dbop/encryption-keys";

/// The environment of a backup's dump: the agent's, reading from a standby when it may
/// ([`prefer_standby`]).
pub fn dump_env(db: &Database, s3: &S3Spec, reason: BackupReason) -> Vec<EnvVar> {
    let mut vars = agent_env(db, s3, "dbop-backup");
    prefer_standby(db, reason, &mut vars);
    vars
}

/// The environment of a physical backup: the agent's connection ([`connection_env`]), a
/// standby preferred as for a dump, and the replication role's name and password file instead
/// of the Database's credentials (`base-backup` makes replication connections only).
pub fn base_backup_env(db: &Database, s3: &S3Spec, reason: BackupReason) -> Vec<EnvVar> {
    let mut vars = connection_env(db, s3, "dbop-backup");
    prefer_standby(db, reason, &mut vars);
    vars.push(env("PGUSER", REPLICATION_ROLE));
    vars.push(env(
        "DBOP_BACKUP_PASSWORD_FILE",
        &format!("{REPLICATION_DIR}/{REPLICATION_PASSWORD_FILE}"),
    ));
    vars
}

/// Points the agent at a standby when the Database has one that was ready at the last pass
/// (`status.instances`) and the backup is a scheduled or manual one, which takes the backup's
/// load off the primary. The standby is named by its own pod's name, not `-ro`: the agent's
/// session that exports the snapshot and `pg_dump`, which reads it, must reach the same server.
/// The primary comes second (libpq's `prefer-standby`), for when that standby does not answer.
/// A pre-upgrade or final backup reads the primary: it must hold every commit.
fn prefer_standby(db: &Database, reason: BackupReason, vars: &mut Vec<EnvVar>) {
    let from_standby = matches!(reason, BackupReason::Scheduled | BackupReason::Manual);
    let standby = db
        .status
        .as_ref()
        .and_then(|s| {
            s.instances
                .iter()
                .find(|i| i.role == InstanceRole::Standby && i.ready)
        })
        .filter(|_| from_standby && db.spec.instances > 1);
    let Some(standby) = standby else {
        return;
    };
    let names = Names::of(db);
    let ns = db.namespace_or_default();
    let hosts = format!(
        "{}.{}.{ns}.svc,{}",
        standby.name,
        names.headless_service(),
        names.endpoint(&ns)
    );
    for var in vars.iter_mut().filter(|v| v.name == "PGHOST") {
        var.value = Some(hosts.clone());
    }
    vars.push(env("PGTARGETSESSIONATTRS", "prefer-standby"));
}

/// The agent's environment: its connection ([`connection_env`]) as the Database's credentials,
/// whose files it reads. `app_name` tells the sessions apart in `pg_stat_activity`.
pub fn agent_env(db: &Database, s3: &S3Spec, app_name: &str) -> Vec<EnvVar> {
    let mut vars = connection_env(db, s3, app_name);
    // The agent sets PGUSER (and PGDATABASE, when unset, to the same name: libpq's default)
    // from the first and writes the second into a pgpass file of its own.
    vars.extend([
        env(
            "DBOP_BACKUP_USER_FILE",
            &format!("{PG_CREDENTIALS_DIR}/{USERNAME_KEY}"),
        ),
        env(
            "DBOP_BACKUP_PASSWORD_FILE",
            &format!("{PG_CREDENTIALS_DIR}/{PASSWORD_KEY}"),
        ),
    ]);
    vars
}

/// Where the agent connects, as whom not said: the Database's `-rw` Service (TLS, verified once
/// the pods serve it: `tls::client_env`), and the paths of the S3 key's files (or no S3 key:
/// the SDK's credential chain), never a value.
pub fn connection_env(db: &Database, s3: &S3Spec, app_name: &str) -> Vec<EnvVar> {
    let mut vars = vec![
        env(
            "PGHOST",
            &Names::of(db).endpoint(&db.namespace_or_default()),
        ),
        env("PGPORT", &POSTGRES_PORT.to_string()),
        env("PGCONNECT_TIMEOUT", "10"),
        env("PGAPPNAME", app_name),
    ];
    vars.extend(s3_env(s3));
    vars.push(env("DBOP_BACKUP_LOG_FORMAT", "json"));
    vars.extend(super::tls::client_env(db));
    vars
}

/// How the AWS SDK in the agent reaches the bucket: the key's files (or the SDK's chain), the
/// region and the endpoint. Nothing secret.
pub fn s3_env(s3: &S3Spec) -> Vec<EnvVar> {
    let mut vars = s3_credentials_env(s3);
    vars.extend([
        env("AWS_REGION", s3.region.as_deref().unwrap_or("us-east-1")),
        // No shared files: a static key from the Secret, or the chain's other sources.
        env("AWS_CONFIG_FILE", "/dev/null"),
        env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
    ]);
    if let Some(endpoint) = &s3.endpoint {
        vars.push(env("AWS_ENDPOINT_URL", endpoint));
    }
    vars
}

/// The S3 credentials: a static key (and session token) from the Secret's files, with the
/// instance metadata kept out; or nothing, so the SDK's chain finds web identity (IRSA),
/// container credentials (EKS Pod Identity) or the node's role.
fn s3_credentials_env(s3: &S3Spec) -> Vec<EnvVar> {
    let Some(keys) = &s3.credentials else {
        return Vec::new();
    };
    let file = |name: &str| format!("{S3_CREDENTIALS_DIR}/{name}");
    let mut vars = vec![
        env(
            "DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE",
            &file(ACCESS_KEY_ID_FILE),
        ),
        env(
            "DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE",
            &file(SECRET_ACCESS_KEY_FILE),
        ),
        env("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    if keys.session_token_key.is_some() {
        vars.push(env(
            "DBOP_BACKUP_S3_SESSION_TOKEN_FILE",
            &file(SESSION_TOKEN_FILE),
        ));
    }
    vars
}

const ACCESS_KEY_ID_FILE: &str = "access-key-id";
const SECRET_ACCESS_KEY_FILE: &str = "secret-access-key";
const SESSION_TOKEN_FILE: &str = "session-token";

/// The Secrets an agent pod reads, as volumes and their mounts: the database credentials
/// (whole: `username` may be absent from a user's Secret, and the agent then leaves PGUSER to
/// libpq), the S3 key's items under fixed file names, and the encryption keys' Secret (whole:
/// a restore picks the key its manifest names). Read-only, mode 0440.
pub fn agent_secrets(
    db: &Database,
    s3: &S3Spec,
    encryption_keys: Option<&str>,
) -> Vec<(Volume, VolumeMount)> {
    let mut out = vec![(
        secret_volume("pg-credentials", &secret_name(db), None),
        mount("pg-credentials", PG_CREDENTIALS_DIR, true),
    )];
    out.extend(storage_secrets(s3, encryption_keys));
    out
}

/// The Secrets that reach the bucket, as volumes and their mounts: the S3 key's items under
/// fixed file names and the encryption keys' Secret (whole). Read-only, mode 0440.
pub fn storage_secrets(s3: &S3Spec, encryption_keys: Option<&str>) -> Vec<(Volume, VolumeMount)> {
    let mut out = Vec::new();
    if let Some(keys) = &s3.credentials {
        let mut items = vec![
            (
                keys.access_key_id_key().to_string(),
                ACCESS_KEY_ID_FILE.to_string(),
            ),
            (
                keys.secret_access_key_key().to_string(),
                SECRET_ACCESS_KEY_FILE.to_string(),
            ),
        ];
        if let Some(token) = &keys.session_token_key {
            items.push((token.clone(), SESSION_TOKEN_FILE.to_string()));
        }
        out.push((
            secret_volume("s3-credentials", &keys.secret_name, Some(items)),
            mount("s3-credentials", S3_CREDENTIALS_DIR, true),
        ));
    }
    if let Some(secret) = encryption_keys {
        out.push((
            secret_volume("encryption-keys", secret, None),
            mount("encryption-keys", ENCRYPTION_KEYS_DIR, true),
        ));
    }
    out
}

/// The agent's variable naming the encryption keys' directory, when there is one.
pub fn encryption_env(encryption_keys: Option<&str>) -> Option<EnvVar> {
    encryption_keys.map(|_| env("DBOP_BACKUP_ENCRYPTION_KEY_DIR", ENCRYPTION_KEYS_DIR))
}

/// The agent's server-side encryption flags (`s3.serverSideEncryption`).
pub fn sse_args(s3: &S3Spec) -> Vec<String> {
    let Some(sse) = &s3.server_side_encryption else {
        return Vec::new();
    };
    let mut args = vec![format!("--sse={}", sse.algorithm.as_arg())];
    if let Some(key) = &sse.kms_key_id {
        args.push(format!("--sse-kms-key-id={key}"));
    }
    args
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduled_dump_of_a_database_with_standbys_reads_a_ready_standby() {
        let s3: S3Spec = serde_json::from_value(json!({"bucket": "b"})).unwrap();
        let mut db = testing::minimal();
        db.metadata.namespace = Some("shop".into());
        let host = |vars: &[EnvVar]| {
            let get = |n: &str| {
                vars.iter()
                    .find(|v| v.name == n)
                    .and_then(|v| v.value.clone())
            };
            (get("PGHOST"), get("PGTARGETSESSIONATTRS"))
        };
        let primary = || (Some("orders-rw.shop.svc".to_string()), None);
        // One instance: the primary, as before.
        assert_eq!(
            host(&dump_env(&db, &s3, BackupReason::Scheduled)),
            primary()
        );
        db.spec.instances = 3;
        let line = |n: i32, role, ready| crate::api::InstanceStatus {
            name: format!("orders-{n}"),
            role,
            ready,
            ..Default::default()
        };
        db.status = Some(crate::api::DatabaseStatus {
            instances: vec![
                line(0, InstanceRole::Primary, true),
                line(1, InstanceRole::Standby, false),
                line(2, InstanceRole::Standby, true),
            ],
            ..Default::default()
        });
        // The ready standby by its own name (one server for the snapshot and pg_dump).
        assert_eq!(
            host(&dump_env(&db, &s3, BackupReason::Scheduled)),
            (
                Some("orders-2.orders-hl.shop.svc,orders-rw.shop.svc".into()),
                Some("prefer-standby".into())
            )
        );
        // What must hold every commit reads the primary.
        for reason in [BackupReason::PreUpgrade, BackupReason::Final] {
            assert_eq!(host(&dump_env(&db, &s3, reason)), primary());
        }
        // A physical backup reads the same standby, as the replication role and nothing else.
        let physical = base_backup_env(&db, &s3, BackupReason::Scheduled);
        assert_eq!(
            host(&physical),
            host(&dump_env(&db, &s3, BackupReason::Scheduled))
        );
        let value = |n: &str| {
            let mut found = physical.iter().filter(|v| v.name == n);
            let first = found.next().and_then(|v| v.value.clone());
            assert!(found.next().is_none(), "{n} twice");
            first
        };
        assert_eq!(value("PGUSER").as_deref(), Some(REPLICATION_ROLE));
        assert_eq!(
            value("DBOP_BACKUP_PASSWORD_FILE"),
            Some(format!("{REPLICATION_DIR}/{REPLICATION_PASSWORD_FILE}"))
        );
        assert_eq!(value("DBOP_BACKUP_USER_FILE"), None);
        assert!(
            physical.iter().all(|v| !v
                .value
                .as_deref()
                .unwrap_or("")
                .starts_with(PG_CREDENTIALS_DIR)),
            "{physical:?}"
        );
        // No ready standby: the primary.
        if let Some(s) = db.status.as_mut() {
            s.instances[2].ready = false;
        }
        assert_eq!(host(&dump_env(&db, &s3, BackupReason::Manual)), primary());
    }
    use crate::resources::testing;
    use serde_json::json;

    fn s3(extra: serde_json::Value) -> S3Spec {
        let mut spec = json!({"bucket": "backups", "endpoint": "http://s3.local:9000"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(spec).unwrap()
    }

    fn names(vars: &[EnvVar]) -> Vec<&str> {
        vars.iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn a_static_key_comes_from_the_secrets_files_and_keeps_the_instance_metadata_out() {
        let db = testing::minimal();
        let spec = s3(json!({"credentials": {
            "secretName": "keys", "accessKeyIdKey": "id", "sessionTokenKey": "token"
        }}));
        let vars = agent_env(&db, &spec, "dbop-backup");
        let value = |n: &str| {
            vars.iter()
                .find(|v| v.name == n)
                .and_then(|v| v.value.clone())
        };
        assert_eq!(
            value("DBOP_BACKUP_S3_SESSION_TOKEN_FILE").as_deref(),
            Some("/etc/dbop/s3-credentials/session-token")
        );
        assert_eq!(
            value("DBOP_BACKUP_PASSWORD_FILE").as_deref(),
            Some("/etc/dbop/pg-credentials/password")
        );
        assert_eq!(value("AWS_EC2_METADATA_DISABLED").as_deref(), Some("true"));
        for v in &vars {
            assert!(v.value_from.is_none(), "{} read from a reference", v.name);
        }
        for secret in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "PGPASSWORD",
            "PGUSER",
        ] {
            assert!(
                !names(&vars).contains(&secret),
                "{secret} in the environment"
            );
        }
        // The Secrets as volumes: the credentials whole, the S3 key's items under fixed names,
        // the encryption keys whole; all read-only, mode 0440.
        let secrets = agent_secrets(&db, &spec, Some("backup-keys"));
        let shown: Vec<_> = secrets
            .iter()
            .map(|(v, m)| {
                let s = v.secret.as_ref().unwrap();
                assert_eq!(s.default_mode, Some(0o440));
                assert_eq!(m.read_only, Some(true));
                assert_eq!(m.name, v.name);
                let items: Vec<(String, String)> = s
                    .items
                    .iter()
                    .flatten()
                    .map(|i| (i.key.clone(), i.path.clone()))
                    .collect();
                (s.secret_name.clone().unwrap(), m.mount_path.clone(), items)
            })
            .collect();
        let pair = |k: &str, p: &str| (k.to_string(), p.to_string());
        assert_eq!(
            shown,
            vec![
                (
                    "orders-credentials".into(),
                    PG_CREDENTIALS_DIR.into(),
                    vec![]
                ),
                (
                    "keys".into(),
                    S3_CREDENTIALS_DIR.into(),
                    vec![
                        pair("id", "access-key-id"),
                        pair("AWS_SECRET_ACCESS_KEY", "secret-access-key"),
                        pair("token", "session-token"),
                    ]
                ),
                ("backup-keys".into(), ENCRYPTION_KEYS_DIR.into(), vec![]),
            ]
        );
        // No static key, no encryption: the credentials alone.
        assert_eq!(agent_secrets(&db, &s3(json!({})), None).len(), 1);
    }

    #[test]
    fn without_a_key_the_sdk_chain_is_left_open() {
        let db = testing::minimal();
        let vars = agent_env(&db, &s3(json!({})), "dbop-backup");
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_EC2_METADATA_DISABLED",
        ] {
            assert!(!names(&vars).contains(&name), "{name} set");
        }
        assert!(names(&vars).contains(&"AWS_REGION"));
    }

    #[test]
    fn encryption_becomes_the_agents_flags() {
        assert!(sse_args(&s3(json!({}))).is_empty());
        let kms =
            s3(json!({"serverSideEncryption": {"algorithm": "aws:kms", "kmsKeyId": "alias/x"}}));
        assert_eq!(
            sse_args(&kms),
            ["--sse=aws-kms", "--sse-kms-key-id=alias/x"]
        );
        let aes = s3(json!({"serverSideEncryption": {"algorithm": "AES256"}}));
        assert_eq!(sse_args(&aes), ["--sse=aes256"]);
    }
}
