//! The backup Job's contract with the agent, proven for real: the Job is built by dbop's own
//! builder, its container command, arguments and environment are taken from it as they are,
//! its Secret volumes are written as files with known values (as the kubelet would; no
//! environment variable may refer to a Secret), and the real
//! `dbop-backup` binary runs with exactly that against a local PostgreSQL and an S3 server
//! (s3s-fs; both from `dbop_contract::test_support`, which the agent's tests use too). The
//! result it writes where the termination message goes is then read back by the
//! `DatabaseBackup` controller's own decision.
//!
//! Only what a cluster provides is substituted: the Service DNS name and port (PGHOST/PGPORT →
//! the local server), the agent's path (the init container's copy → the built binary), the
//! Secret volumes' mount paths (→ directories of files), and `/dev/termination-log` (→ a file). A missing dependency fails the test; nothing is skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chrono::{TimeZone, Utc};
use dbop::api::{
    BackupPhase, BackupReason, Database, DatabaseBackup, DatabaseBackupSpec, DatabaseSpec,
    DatabaseStatus,
};
use dbop::backup::job::backup_job;
use dbop::database_backup::decide::decide;
use dbop::database_backup::facts::{BackupFacts, JobFacts};
use dbop::objects::JobState;
use dbop::resources::backup_job::{AGENT_PATH, TERMINATION_LOG};
use dbop::settings::Settings;
use dbop_contract::test_support::{
    BUCKET, PG_PASSWORD, PG_USER, Pg, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs, pg_bin_dir,
};
use dbop_contract::{Outcome, parse_termination_message};

mod kubelet;
use kubelet::resolve;

/// The agent binary as `cargo test --workspace` builds it (beside this test's directory), or
/// `DBOP_BACKUP_BIN`.
fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_BACKUP_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = profile_dir.join("dbop-backup");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p dbop-backup` (make test-unit does) or set \
         DBOP_BACKUP_BIN",
        bin.display()
    );
    bin
}

fn database(s3_port: u16) -> Database {
    let spec: DatabaseSpec = serde_json::from_value(serde_json::json!({
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
    }))
    .unwrap();
    let mut db = Database::new("orders", spec);
    db.metadata.namespace = Some("shop".into());
    db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
    db.status = Some(DatabaseStatus {
        current_version: Some("16.4".into()),
        ..DatabaseStatus::default()
    });
    db
}

fn backup(name: &str) -> DatabaseBackup {
    let mut b = DatabaseBackup::new(
        name,
        DatabaseBackupSpec {
            database: "orders".into(),
            reason: BackupReason::Scheduled,
            method: dbop::api::BackupMethod::Logical,
        },
    );
    b.metadata.namespace = Some("shop".into());
    b.metadata.uid = Some("b-uid".into());
    b
}

#[test]
fn the_backup_job_runs_the_agent_for_real() {
    let dir = tempfile::Builder::new()
        .prefix("dbop-contract-")
        .tempdir()
        .unwrap();
    let pg = Pg::start();
    // The application database (named after the user, as dbop-instance makes it) is the one
    // backups dump: a table of rows in it.
    pg.psql("postgres", &format!("CREATE DATABASE {PG_USER}"));
    pg.psql(
        PG_USER,
        "CREATE TABLE orders (id int primary key, item text); \
         INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 1000) g",
    );
    let pg_port = pg.port;
    let s3 = S3sFs::start();
    let (s3_root, s3_port) = (s3.root.clone(), s3.port);

    let db = database(s3_port);
    let created = Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 3).unwrap();
    let job = backup_job(
        &db,
        &backup("orders-202505010200"),
        created,
        &Settings::default(),
    )
    .expect("a Job");
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

    // Two keys, as after a rotation: the backup is encrypted with the one the spec names.
    const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const K2: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    let secrets = BTreeMap::from([
        (("orders-credentials", "username"), PG_USER),
        (("orders-credentials", "password"), PG_PASSWORD),
        (("s3-creds", "id"), S3_ACCESS_KEY),
        (("s3-creds", "key"), S3_SECRET_KEY),
        (("backup-keys", "k1"), K1),
        (("backup-keys", "k2"), K2),
    ]);
    let (argv, env) = resolve(&pod, &dir.path().join("secrets"), &secrets);
    assert_eq!(argv[0], AGENT_PATH);
    let result_file = dir.path().join("termination-log");
    let result_arg = format!("--result-file={TERMINATION_LOG}");
    assert!(argv.contains(&result_arg), "{argv:?}");
    for arg in &argv {
        for secret in [PG_PASSWORD, S3_SECRET_KEY, K2] {
            assert!(!arg.contains(secret), "a secret on the command line");
        }
    }
    for (name, value) in &env {
        for secret in [PG_PASSWORD, S3_SECRET_KEY, S3_ACCESS_KEY, K1, K2] {
            assert!(!value.contains(secret), "a secret in {name}");
        }
    }

    // What a cluster provides, provided locally.
    let args: Vec<String> = argv[1..]
        .iter()
        .map(|a| {
            if *a == result_arg {
                format!("--result-file={}", result_file.display())
            } else {
                a.clone()
            }
        })
        .collect();
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "PGHOST" => (k, "127.0.0.1".to_string()),
            "PGPORT" => (k, pg_port.to_string()),
            _ => (k, v),
        })
        .collect();
    let run = || {
        let out = Command::new(agent_binary())
            .args(&args)
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("the agent runs");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        for secret in [PG_PASSWORD, S3_SECRET_KEY, K1, K2] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "a secret in the output"
            );
        }
        assert!(
            out.status.success(),
            "the agent failed:\n{stdout}\n{stderr}"
        );
        std::fs::read_to_string(&result_file).expect("the termination message")
    };

    let message = run();
    assert!(
        message.len() <= 4096,
        "a termination message is at most 4 KiB"
    );
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
    let stored = std::fs::read(s3_root.join(BUCKET).join(&key)).expect("the dump is in the bucket");
    assert_eq!(&stored[..8], b"DBOPENC1", "encrypted");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            s3_root
                .join(BUCKET)
                .join(result.manifest_key.as_ref().unwrap()),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["encryption"]["keyName"], "k2");

    // The DatabaseBackup controller turns that termination message into the status.
    let facts = BackupFacts {
        now: Utc::now(),
        database: None,
        ahead: vec![],
        job: Some(JobFacts {
            state: JobState::Succeeded,
            start_time: None,
            completion_time: None,
            termination_message: Some(message.clone()),
        }),
        stale_job: false,
    };
    let status = decide(&backup("orders-202505010200"), &facts).status;
    assert_eq!(status.phase, Some(BackupPhase::Succeeded));
    assert_eq!(status.key.as_deref(), Some(key.as_str()));
    assert_eq!(status.bucket.as_deref(), Some(BUCKET));
    assert!(status.size_bytes.unwrap() > 0);
    assert_eq!(status.sha256.as_ref().map(String::len), Some(64));
    assert!(status.engine_version.is_some());

    // A retried Job (same DatabaseBackup, same backup id) makes no second backup.
    let again = parse_termination_message(&run()).unwrap();
    assert_eq!(again.outcome, Outcome::Succeeded);
    assert_eq!(again.key.as_deref(), Some(key.as_str()));
    assert_eq!(again.sha256, result.sha256);
    let backups = std::fs::read_dir(
        s3_root
            .join(BUCKET)
            .join(format!("contract/shop/orders/{PG_USER}")),
    )
    .unwrap()
    .count();
    assert_eq!(backups, 1, "one backup id, one backup");
}
