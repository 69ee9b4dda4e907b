//! The backup Job's contract with the agent, proven for real: the Job is built by dbop's own
//! builder, its container command, arguments and environment are taken from it as they are,
//! its Secret volumes are written as files with known values (as the kubelet would; no
//! environment variable may refer to a Secret), and the real
//! `dbop-backup` binary runs with exactly that against a local PostgreSQL and an S3 server
//! (s3s-fs; both from `dbop_contract::test_support`, which the agent's tests use too). The
//! result it writes where the termination message goes is then read back by the
//! `DatabaseBackup` controller's own decision. Both methods: the logical dump (as the
//! Database's own user) and the physical base backup (as the replication role, whose pg_hba
//! allows it replication connections only).
//!
//! Only what a cluster provides is substituted: the Service DNS name and port (PGHOST/PGPORT →
//! the local server), the agent's path (the init container's copy → the built binary), the
//! Secret volumes' mount paths (→ directories of files), and `/dev/termination-log` (→ a file). A missing dependency fails the test; nothing is skipped.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chrono::{DateTime, TimeZone, Utc};
use dbop::api::{
    BackupMethod, BackupPhase, BackupReason, Database, DatabaseBackup, DatabaseBackupSpec,
    DatabaseBackupStatus, DatabaseSpec, DatabaseStatus,
};
use dbop::backup::job::backup_job;
use dbop::database_backup::decide::decide;
use dbop::database_backup::facts::{BackupFacts, JobFacts};
use dbop::objects::JobState;
use dbop::resources::backup_job::{AGENT_PATH, TERMINATION_LOG};
use dbop::settings::Settings;
use dbop_contract::test_support::{
    BUCKET, PG_PASSWORD, PG_USER, Pg, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs, built_agent, pg_bin_dir,
};
use dbop_contract::topology::{REPLICATION_PASSWORD_FILE, REPLICATION_ROLE};
use dbop_contract::{Outcome, parse_termination_message};
use k8s_openapi::api::batch::v1::Job;

mod kubelet;
use kubelet::resolve;

/// Two keys of the encryption Secret, as after a rotation: backups are encrypted with the one
/// the spec names (k2).
const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const K2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

/// The Database `shop/orders`, backing up into the local S3 server (encrypted with k2); with
/// `spec.backup.walArchiving` when `archives_wal`.
fn database(s3_port: u16, archives_wal: bool) -> Database {
    let mut spec = serde_json::json!({
        "version": "16.4",
        "storage": {"size": "1Gi"},
        "backup": {
            "schedule": "0 2 * * *",
            "s3": {
                "endpoint": format!("http://127.0.0.1:{s3_port}"),
                "bucket": BUCKET,
                "prefix": "contract",
                "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds", "accessKeyIdKey": "id", "secretAccessKeyKey": "key"}
            },
            "encryption": {"secretName": "backup-keys", "keyName": "k2"},
            "retention": {"keepLast": 2}
        }
    });
    if archives_wal {
        spec["backup"]["walArchiving"] = serde_json::json!({});
    }
    let spec: DatabaseSpec = serde_json::from_value(spec).unwrap();
    let mut db = Database::new("orders", spec);
    db.metadata.namespace = Some("shop".into());
    db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
    db.status = Some(DatabaseStatus {
        current_version: Some("16.4".into()),
        ..DatabaseStatus::default()
    });
    db
}

fn backup(name: &str, method: BackupMethod, reason: BackupReason) -> DatabaseBackup {
    let mut b = DatabaseBackup::new(
        name,
        DatabaseBackupSpec {
            database: "orders".into(),
            reason,
            method,
        },
    );
    b.metadata.namespace = Some("shop".into());
    b.metadata.uid = Some("b-uid".into());
    b
}

/// The Secrets every backup Job of `database` mounts: the S3 key and the encryption keys.
fn storage_secrets() -> BTreeMap<(&'static str, &'static str), &'static str> {
    BTreeMap::from([
        (("s3-creds", "id"), S3_ACCESS_KEY),
        (("s3-creds", "key"), S3_SECRET_KEY),
        (("backup-keys", "k1"), K1),
        (("backup-keys", "k2"), K2),
    ])
}

/// A backup Job's container as it runs here: the kubelet's part done (`resolve`: the Secret
/// volumes written as files under `root`), and what a cluster provides provided locally.
struct LocalJob {
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Where `/dev/termination-log` is written.
    result_file: PathBuf,
    tmp: PathBuf,
    /// The Secrets' values (but user names), which never show: not on the command line, in
    /// the environment or in any output.
    secrets: Vec<String>,
}

impl LocalJob {
    fn new(
        job: &Job,
        root: &Path,
        secrets: &BTreeMap<(&str, &str), &str>,
        pg_port: u16,
    ) -> LocalJob {
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        assert_eq!(
            pod.init_containers.as_ref().unwrap()[0]
                .command
                .as_ref()
                .unwrap()
                .last()
                .map(String::as_str),
            Some(AGENT_PATH),
            "the init container copies the agent where the container runs it from"
        );
        std::fs::create_dir_all(root).unwrap();
        let (argv, env) = resolve(&pod, &root.join("secrets"), secrets);
        assert_eq!(argv[0], AGENT_PATH);
        let values: Vec<String> = secrets
            .iter()
            .filter(|((_, key), _)| *key != "username")
            .map(|(_, value)| value.to_string())
            .collect();
        for arg in &argv {
            for secret in &values {
                assert!(
                    !arg.contains(secret.as_str()),
                    "a secret on the command line"
                );
            }
        }
        for (name, value) in &env {
            for secret in &values {
                assert!(!value.contains(secret.as_str()), "a secret in {name}");
            }
        }
        let result_file = root.join("termination-log");
        let result_arg = format!("--result-file={TERMINATION_LOG}");
        assert!(argv.contains(&result_arg), "{argv:?}");
        let args = argv[1..]
            .iter()
            .map(|a| {
                if *a == result_arg {
                    format!("--result-file={}", result_file.display())
                } else {
                    a.clone()
                }
            })
            .collect();
        let env = env
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "PGHOST" => (k, "127.0.0.1".to_string()),
                "PGPORT" => (k, pg_port.to_string()),
                _ => (k, v),
            })
            .collect();
        LocalJob {
            args,
            env,
            result_file,
            tmp: root.to_path_buf(),
            secrets: values,
        }
    }

    /// Runs the container once (a new pod: no termination message yet), expecting it to
    /// succeed or not: its termination message.
    fn run(&self, succeeds: bool) -> String {
        let _ = std::fs::remove_file(&self.result_file);
        let out = Command::new(built_agent())
            .args(&self.args)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("TMPDIR", &self.tmp)
            .stdin(Stdio::null())
            .output()
            .expect("the agent runs");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let message = std::fs::read_to_string(&self.result_file).expect("the termination message");
        for secret in &self.secrets {
            for text in [&stdout, &stderr, &message] {
                assert!(!text.contains(secret.as_str()), "a secret in the output");
            }
        }
        assert_eq!(
            out.status.success(),
            succeeds,
            "the agent's exit ({}):\n{stdout}\n{stderr}",
            out.status
        );
        assert!(
            message.len() <= 4096,
            "a termination message is at most 4 KiB"
        );
        message
    }
}

/// The status the `DatabaseBackup` controller makes of `backup`'s Job ended as `state` with
/// the termination message `message`.
fn decision(backup: &DatabaseBackup, state: JobState, message: &str) -> DatabaseBackupStatus {
    let facts = BackupFacts {
        now: Utc::now(),
        database: None,
        ahead: vec![],
        job: Some(JobFacts {
            state,
            start_time: None,
            completion_time: None,
            termination_message: Some(message.to_string()),
        }),
        stale_job: false,
    };
    decide(backup, &facts).status
}

/// When the `DatabaseBackup`s were made: their backup ids start with `20250501T020003Z`.
fn created() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 3).unwrap()
}

/// The `DatabaseBackup` `name` of `orders` (backing up into `s3`; archiving its WAL for a
/// physical backup, which needs it) and the Job dbop builds for it.
fn backup_and_job(
    s3: &S3sFs,
    name: &str,
    method: BackupMethod,
    reason: BackupReason,
) -> (DatabaseBackup, Job) {
    let db = database(s3.port, method == BackupMethod::Physical);
    let backup = backup(name, method, reason);
    let job = backup_job(&db, &backup, created(), &Settings::default()).expect("a Job");
    (backup, job)
}

fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("dbop-contract-")
        .tempdir()
        .unwrap()
}

#[test]
fn the_backup_job_runs_the_agent_for_real() {
    let dir = scratch_dir();
    let pg = Pg::start();
    // The application database (named after the user, as dbop-instance makes it) is the one
    // backups dump: a table of rows in it.
    pg.psql("postgres", &format!("CREATE DATABASE {PG_USER}"));
    pg.psql(
        PG_USER,
        "CREATE TABLE orders (id int primary key, item text); \
         INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 1000) g",
    );
    let s3 = S3sFs::start();

    let (backup, job) = backup_and_job(
        &s3,
        "orders-202505010200",
        BackupMethod::Logical,
        BackupReason::Scheduled,
    );
    let mut secrets = storage_secrets();
    secrets.insert(("orders-credentials", "username"), PG_USER);
    secrets.insert(("orders-credentials", "password"), PG_PASSWORD);
    let local = LocalJob::new(&job, dir.path(), &secrets, pg.port);

    let message = local.run(true);
    let result =
        parse_termination_message(&message).expect("the operator reads the agent's result");
    assert_eq!(result.outcome, Outcome::Succeeded);
    let key = result.key.clone().expect("a key");
    assert!(
        key.starts_with(&format!(
            "contract/shop/orders/{PG_USER}/20250501T020003Z-orders-202505010200/"
        )),
        "{key}"
    );
    let stored = std::fs::read(s3.root.join(BUCKET).join(&key)).expect("the dump is in the bucket");
    assert_eq!(&stored[..8], b"DBOPENC1", "encrypted");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            s3.root
                .join(BUCKET)
                .join(result.manifest_key.as_ref().unwrap()),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["encryption"]["keyName"], "k2");

    // The DatabaseBackup controller turns that termination message into the status.
    let status = decision(&backup, JobState::Succeeded, &message);
    assert_eq!(status.phase, Some(BackupPhase::Succeeded));
    assert_eq!(status.key.as_deref(), Some(key.as_str()));
    assert_eq!(status.bucket.as_deref(), Some(BUCKET));
    assert!(status.size_bytes.unwrap() > 0);
    assert_eq!(status.sha256.as_ref().map(String::len), Some(64));
    assert!(status.engine_version.is_some());

    // A retried Job (same DatabaseBackup, same backup id) makes no second backup.
    let again = parse_termination_message(&local.run(true)).unwrap();
    assert_eq!(again.outcome, Outcome::Succeeded);
    assert_eq!(again.key.as_deref(), Some(key.as_str()));
    assert_eq!(again.sha256, result.sha256);
    let backups = std::fs::read_dir(
        s3.root
            .join(BUCKET)
            .join(format!("contract/shop/orders/{PG_USER}")),
    )
    .unwrap()
    .count();
    assert_eq!(backups, 1, "one backup id, one backup");
}

/// A password no other run shares (std's randomly seeded hasher; hex, so it quotes in SQL).
fn random_password() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    format!("repl-{:016x}", h.finish())
}

#[test]
fn the_physical_backup_job_runs_base_backup_as_the_replication_role_for_real() {
    let dir = scratch_dir();
    let s3 = S3sFs::start();
    let pg = Pg::start_with(&[("wal_level", "replica"), ("max_wal_senders", "4")]);
    let password = random_password();
    pg.replication_only_role(REPLICATION_ROLE, &password);
    pg.psql(
        "postgres",
        "CREATE TABLE orders AS SELECT g AS id FROM generate_series(1, 1000) g",
    );

    let (backup, job) = backup_and_job(
        &s3,
        "orders-manual",
        BackupMethod::Physical,
        BackupReason::Manual,
    );
    let replication_secret = "orders-replication";
    let mut secrets = storage_secrets();

    // First with a password the role does not have (the Secret not yet what the server
    // knows): the Job fails, the status says so, and no password shows.
    let wrong = random_password();
    secrets.insert((replication_secret, REPLICATION_PASSWORD_FILE), &wrong);
    let local = LocalJob::new(&job, &dir.path().join("wrong"), &secrets, pg.port);
    assert!(
        local
            .env
            .contains(&("PGUSER".into(), REPLICATION_ROLE.into())),
        "{:?}",
        local.env
    );
    assert!(
        !local
            .env
            .iter()
            .any(|(k, _)| k == "PGPASSWORD" || k == "DBOP_BACKUP_USER_FILE"),
        "{:?}",
        local.env
    );
    assert!(
        local.args.contains(&"--fast-checkpoint".to_string()),
        "a manual backup asks for an immediate checkpoint: {:?}",
        local.args
    );
    let message = local.run(false);
    let status = decision(
        &backup,
        JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "Job has reached the specified backoff limit".into(),
        },
        &message,
    );
    assert_eq!(status.phase, Some(BackupPhase::Failed), "{status:?}");
    let failure = status.message.unwrap_or_default();
    assert!(
        failure.contains("password authentication failed"),
        "{failure}"
    );
    assert!(!failure.contains(&wrong) && !failure.contains(&password));
    let bucket = s3.root.join(BUCKET);
    assert_eq!(
        std::fs::read_dir(&bucket).unwrap().count(),
        0,
        "nothing stored"
    );

    // The same Job with the role's password: a base backup, its result read back.
    secrets.insert((replication_secret, REPLICATION_PASSWORD_FILE), &password);
    let local = LocalJob::new(&job, &dir.path().join("right"), &secrets, pg.port);
    let message = local.run(true);
    let status = decision(&backup, JobState::Succeeded, &message);
    assert_eq!(status.phase, Some(BackupPhase::Succeeded), "{status:?}");
    let id = "20250501T020003Z-orders-manual";
    let key = format!("contract/shop/orders/physical/base/{id}/base.tar.zst");
    assert_eq!(status.key.as_deref(), Some(key.as_str()));
    assert_eq!(status.backup_id.as_deref(), Some(id));
    assert_eq!(status.bucket.as_deref(), Some(BUCKET));
    let stored = std::fs::read(bucket.join(&key)).expect("the base backup is in the bucket");
    assert!(status.size_bytes.unwrap() > 0);
    assert_eq!(status.size_bytes, Some(stored.len() as i64));
    assert_eq!(&stored[..8], b"DBOPENC1", "encrypted");
    assert_eq!(status.sha256.as_ref().map(String::len), Some(64));
    let version = pg.psql("postgres", "SHOW server_version");
    assert!(
        version.starts_with(status.engine_version.as_deref().unwrap()),
        "{version}"
    );
}
