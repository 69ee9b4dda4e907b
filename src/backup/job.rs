//! Whether a backup or verify Job can be built for a Database, and the Job: `spec.backup` is
//! there and parses (`settings`), and the server has run (the Job runs the running version's
//! image). The Job itself is built by `resources::backup_job`, on the one Job skeleton.
//!
//! Pure: a function of the Database, the `DatabaseBackup` and the operator's settings.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;

use super::settings::BackupSettings;
use crate::api::{BackupSpec, Database, DatabaseBackup};
use crate::resources::backup_job::{self, AgentLimits, running_image};
use crate::settings::Settings;

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

/// The backup Job of `backup`, owned by it.
pub fn backup_job(
    db: &Database,
    backup: &DatabaseBackup,
    created: DateTime<Utc>,
    settings: &Settings,
) -> Result<Job, JobProblem> {
    let (spec, limits, image) = checked(db, settings)?;
    Ok(backup_job::backup_job(
        db, spec, &limits, image, backup, created, settings,
    ))
}

/// The verify Job `name`, owned by the Database (`resources::backup_job::verify_job`).
pub fn verify_job(db: &Database, name: &str, settings: &Settings) -> Result<Job, JobProblem> {
    let (spec, limits, image) = checked(db, settings)?;
    Ok(backup_job::verify_job(
        db, spec, &limits, image, name, settings,
    ))
}

/// What an agent Job of `db` is built from: its `spec.backup`, parsed, and the running image.
fn checked<'a>(
    db: &'a Database,
    settings: &Settings,
) -> Result<(&'a BackupSpec, AgentLimits, String), JobProblem> {
    let spec = db.spec.backup.as_ref().ok_or(JobProblem::NoBackupSpec)?;
    let parsed = BackupSettings::parse(spec).map_err(JobProblem::InvalidSpec)?;
    let image = running_image(db, settings).ok_or(JobProblem::NoRunningVersion)?;
    let limits = AgentLimits {
        timeout: parsed.timeout,
        keep_last: parsed.history.keep_last,
        max_age: parsed.history.max_age,
    };
    Ok((spec, limits, image))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{BackupPhase, DatabaseBackupSpec};
    use crate::resources::backup_job::{
        AGENT_PATH, BACKOFF_LIMIT, BACKUP_LABEL, CA_DIR, MAX_BACKUP_ID, MAX_JOB_NAME, backup_id,
        job_name,
    };
    use crate::resources::pod::{RunAs, pod_security_context};
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
                method: crate::api::BackupMethod::Logical,
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
            Some(crate::settings::DEFAULT_AGENT_IMAGE)
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
        let ids = RunAs {
            user: Some(999),
            group: Some(999),
            fs_group: Some(999),
        };
        assert_eq!(pod.security_context, Some(pod_security_context(ids)));
    }

    /// A physical backup: the agent's base-backup into the physical folder, connecting as the
    /// replication role with only that role's password mounted (not the superuser's).
    #[test]
    fn a_physical_backup_runs_base_backup_as_the_replication_role() {
        let db = with_backup(serde_json::json!({"walArchiving": {}}));
        let mut b = backup("orders-base");
        b.spec.method = crate::api::BackupMethod::Physical;
        b.spec.reason = crate::api::BackupReason::Manual;
        let job = backup_job(&db, &b, created(), &Settings::default()).unwrap();
        let c = container(&job);
        let args = c.args.clone().unwrap();
        assert_eq!(args[0], "base-backup");
        for want in [
            "--database=physical",
            "--prefix=team-a/shop/orders",
            "--backup-id=20250301T020003Z-orders-base",
            "--result-file=/dev/termination-log",
            "--fast-checkpoint",
        ] {
            assert!(
                args.iter().any(|a| a == want),
                "{want} missing from {args:?}"
            );
        }
        // spec.backup's retention applies to the base backups (and so to the WAL they need).
        assert!(args.iter().any(|a| a == "--keep-last=7"), "{args:?}");
        let env = c.env.clone().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("PGUSER").as_deref(), Some("dbop_replication"));
        assert_eq!(
            value("DBOP_BACKUP_PASSWORD_FILE").as_deref(),
            Some("/etc/dbop/replication/password")
        );
        assert_eq!(value("DBOP_BACKUP_USER_FILE"), None);
        let pod = job.spec.unwrap().template.spec.unwrap();
        let secrets: Vec<String> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect();
        assert!(
            secrets.contains(&"orders-replication".to_string()),
            "{secrets:?}"
        );
        assert!(
            !secrets.contains(&"orders-credentials".to_string()),
            "{secrets:?}"
        );
        // The schedule's base backups take a spread checkpoint, gentler on a busy server.
        b.spec.reason = crate::api::BackupReason::Scheduled;
        let job = backup_job(&db, &b, created(), &Settings::default()).unwrap();
        assert!(
            !container(&job)
                .args
                .unwrap()
                .iter()
                .any(|a| a == "--fast-checkpoint")
        );
    }

    #[test]
    fn secrets_reach_the_job_only_as_files() {
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
        assert!(env.iter().all(|e| e.value_from.is_none()), "{env:?}");
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "PGPASSWORD",
            "PGUSER",
        ] {
            assert!(
                env.iter().all(|e| e.name != name),
                "{name} in the environment"
            );
        }
        assert_eq!(
            get("DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE")
                .value
                .as_deref(),
            Some("/etc/dbop/s3-credentials/secret-access-key")
        );
        // Not encrypted: no key flag, no key volume.
        assert!(
            env.iter()
                .all(|e| e.name != "DBOP_BACKUP_ENCRYPTION_KEY_DIR")
        );
        assert!(
            !c.args
                .clone()
                .unwrap()
                .iter()
                .any(|a| a.starts_with("--encryption"))
        );
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
    fn dump_streams_become_the_agents_jobs() {
        let args = |extra: serde_json::Value| {
            let db = with_backup(extra);
            container(&backup_job(&db, &backup("b"), created(), &Settings::default()).unwrap())
                .args
                .unwrap()
        };
        assert!(args(serde_json::json!({"dumpStreams": 3})).contains(&"--jobs=3".to_string()));
        for one in [serde_json::json!({}), serde_json::json!({"dumpStreams": 1})] {
            let args = args(one);
            assert!(!args.iter().any(|a| a.starts_with("--jobs")), "{args:?}");
        }
        // The verify Job restores such a dump into its scratch database as many at once.
        let verify_args = |extra: serde_json::Value| {
            let db = with_backup(extra);
            container(&verify_job(&db, "orders-verify-1", &Settings::default()).unwrap())
                .args
                .unwrap()
        };
        assert!(verify_args(serde_json::json!({"dumpStreams": 3})).contains(&"--jobs=3".into()));
        let one = verify_args(serde_json::json!({}));
        assert!(!one.iter().any(|a| a.starts_with("--jobs")), "{one:?}");
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
    fn an_encrypted_backup_and_its_verification_mount_the_keys_and_name_the_key() {
        let db = with_backup(serde_json::json!({
            "encryption": {"secretName": "backup-keys", "keyName": "k2"}
        }));
        let backup_job = backup_job(&db, &backup("b1"), created(), &Settings::default()).unwrap();
        let verify = verify_job(&db, "orders-verify-1", &Settings::default()).unwrap();
        for (job, flag) in [(&backup_job, true), (&verify, false)] {
            let c = container(job);
            let args = c.args.clone().unwrap();
            // The key's name only, for the dump; a verification takes the manifest's key.
            assert_eq!(
                args.iter().any(|a| a == "--encryption-key=k2"),
                flag,
                "{args:?}"
            );
            let env = c.env.clone().unwrap();
            assert!(env.iter().all(|e| e.value_from.is_none()), "{env:?}");
            let dir = env
                .iter()
                .find(|e| e.name == "DBOP_BACKUP_ENCRYPTION_KEY_DIR")
                .unwrap();
            assert_eq!(dir.value.as_deref(), Some("/etc/dbop/encryption-keys"));
            let pod = job.spec.clone().unwrap().template.spec.unwrap();
            let keys = pod
                .volumes
                .unwrap()
                .into_iter()
                .find(|v| v.name == "encryption-keys")
                .unwrap()
                .secret
                .unwrap();
            assert_eq!(keys.secret_name.as_deref(), Some("backup-keys"));
            assert_eq!((keys.items, keys.default_mode), (None, Some(0o440)));
            let mount = c
                .volume_mounts
                .unwrap()
                .into_iter()
                .find(|m| m.name == "encryption-keys")
                .unwrap();
            assert_eq!(
                (mount.mount_path.as_str(), mount.read_only),
                ("/etc/dbop/encryption-keys", Some(true))
            );
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
        // The application database is the user's name, which the agent reads from the
        // credentials file (PGDATABASE and the source default to it): no reference needed.
        let env = c.env.unwrap();
        assert!(env.iter().all(|e| e.value_from.is_none()), "{env:?}");
        for name in ["PGDATABASE", "DBOP_BACKUP_SOURCE_DATABASE", "PGPASSWORD"] {
            assert!(env.iter().all(|e| e.name != name), "{name}");
        }
        let user = env
            .iter()
            .find(|e| e.name == "DBOP_BACKUP_USER_FILE")
            .unwrap();
        assert_eq!(
            user.value.as_deref(),
            Some("/etc/dbop/pg-credentials/username")
        );
    }

    #[test]
    fn the_verify_job_of_base_backups_recovers_into_a_scratch_volume_and_connects_nowhere() {
        let db = with_backup(serde_json::json!({
            "method": "Physical", "walArchiving": {},
            "encryption": {"secretName": "backup-keys", "keyName": "k2"}
        }));
        let job = verify_job(&db, "orders-verify-1", &Settings::default()).unwrap();
        let c = container(&job);
        assert_eq!(c.name, "backup", "where the operator reads the result from");
        let args = c.args.clone().unwrap();
        assert_eq!(
            args,
            [
                "verify-base",
                "/var/lib/dbop-verify/data",
                "--bucket=backups",
                "--prefix=team-a/shop/orders",
                "--database=physical",
                "--result-file=/dev/termination-log",
                "--path-style",
            ]
        );
        let pod = job.spec.clone().unwrap().template.spec.unwrap();
        let scratch = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "verify-scratch")
            .and_then(|v| v.empty_dir.clone())
            .expect("a scratch volume of its own");
        assert_eq!(scratch.size_limit.map(|q| q.0), Some("1Gi".to_string()));
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .all(|v| v.persistent_volume_claim.is_none()),
            "never the Database's volume"
        );
        let mounts = c.volume_mounts.clone().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == "/var/lib/dbop-verify")
        );
        // Nothing to connect to but its own server: no PGHOST, no password; the key ring.
        let env = c.env.clone().unwrap();
        assert!(
            env.iter()
                .all(|e| !e.name.starts_with("PG") && e.value_from.is_none()),
            "{env:?}"
        );
        assert!(
            env.iter()
                .any(|e| e.name == "DBOP_BACKUP_ENCRYPTION_KEY_DIR")
        );
        assert_eq!(
            job.metadata.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            "verify"
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

    /// The pre-upgrade backup of an air-gapped Database runs the mirrored image its server
    /// runs, not the public repository's tag of the running version.
    #[test]
    fn image_is_the_recorded_running_image_in_every_state() {
        let mut db = with_backup(serde_json::json!({}));
        db.spec.image = Some("mirror/pg:16.4".into());
        db.status.as_mut().unwrap().current_image = Some("mirror/pg:16.4".into());
        db.spec.version = "16.5".into();
        db.spec.image = Some("mirror/pg:16.5".into());
        let settings = Settings::default();
        assert_eq!(
            running_image(&db, &settings).as_deref(),
            Some("mirror/pg:16.4")
        );
        let job = backup_job(&db, &backup("orders-1"), created(), &settings).unwrap();
        assert_eq!(container(&job).image.as_deref(), Some("mirror/pg:16.4"));
        let verify = verify_job(&db, "orders-verify-1", &settings).unwrap();
        assert_eq!(container(&verify).image.as_deref(), Some("mirror/pg:16.4"));
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
