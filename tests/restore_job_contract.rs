//! The restore Job's contract with the agent, proven for real: a backup of one server (roles,
//! owned tables, grants) is restored into another by the real `dbop-backup` binary run with
//! exactly the command, arguments and environment of the Job dbop builds for
//! `spec.bootstrap.fromBackup` (its Secret volumes written as files, as the kubelet would; the
//! backup is encrypted, its key read from the Secret `fromBackup.encryption` names); the result it
//! writes where the termination message goes is then read back by dbop's own restore decision.
//!
//! Only what a cluster provides is substituted: the `-rw` Service (PGHOST/PGPORT → the local
//! target server), the agent's path (the init container's copy → the built binary), and
//! `/dev/termination-log` (→ a file). A missing dependency fails the test; nothing is skipped.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};

use dbop::api::{Database, DatabaseSpec};
use dbop::database::restore::{self, BootstrapFact, RestoreJobFact, RestoreObjects};
use dbop::objects::JobState;
use dbop::resources::restore_job::restore_job;
use dbop::settings::Settings;
use dbop_contract::parse_termination_message;
use dbop_contract::test_support::{
    BUCKET, PG_PASSWORD, PG_USER, Pg, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs, built_agent, pg_bin_dir,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

mod kubelet;
use kubelet::resolve;

const APP_SQL: &str = "CREATE ROLE app_owner NOLOGIN; CREATE ROLE app_reader NOLOGIN;
  CREATE TABLE orders (id int PRIMARY KEY, item text); ALTER TABLE orders OWNER TO app_owner;
  INSERT INTO orders SELECT g, 'item ' || g FROM generate_series(1, 1000) g;
  GRANT SELECT ON orders TO app_reader;";

/// The backup's key, and an older one the Secret still holds.
const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const OLD_KEY: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

fn run_agent(args: &[String], env: &[(String, String)]) -> Output {
    let out = Command::new(built_agent())
        .args(args)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("the agent runs");
    for text in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(text);
        for secret in [PG_PASSWORD, S3_SECRET_KEY, KEY, OLD_KEY] {
            assert!(!text.contains(secret), "a secret in the agent's output");
        }
    }
    out
}

/// The Database `copy` in namespace `staging`, restored from the backups of `shop/orders`.
fn restoring_database(s3_port: u16) -> Database {
    let spec: DatabaseSpec = serde_json::from_value(serde_json::json!({
        "version": "16.4", "storage": {"size": "1Gi"},
        "bootstrap": {"fromBackup": {
            "s3": {"endpoint": format!("http://127.0.0.1:{s3_port}"), "bucket": BUCKET,
                   "prefix": "contract", "forcePathStyle": true,
                   "credentials": {"secretName": "s3-creds", "accessKeyIdKey": "id", "secretAccessKeyKey": "key"}},
            "database": "orders", "namespace": "shop",
            "encryption": {"secretName": "backup-keys"}
        }}
    }))
    .unwrap();
    let mut db = Database::new("copy", spec);
    db.metadata.namespace = Some("staging".into());
    db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
    db
}

fn s3_secret() -> Secret {
    Secret {
        data: Some(
            [("id", S3_ACCESS_KEY), ("key", S3_SECRET_KEY)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

#[test]
fn the_restore_job_runs_the_agent_for_real_into_another_server() {
    let dir = tempfile::Builder::new()
        .prefix("dbop-restore-")
        .tempdir()
        .unwrap();
    let s3 = S3sFs::start();
    // The source: its application database (named after the user) with roles, owners, grants,
    // backed up by the agent under the layout backup Jobs use (`<prefix>/<ns>/<database>`).
    let source = Pg::start();
    source.psql("postgres", &format!("CREATE DATABASE {PG_USER}"));
    source.psql(PG_USER, APP_SQL);
    let mut env: Vec<(String, String)> = source.env(PG_USER);
    env.extend([
        (
            "AWS_ENDPOINT_URL".into(),
            format!("http://127.0.0.1:{}", s3.port),
        ),
        ("AWS_REGION".into(), "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID".into(), S3_ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET_KEY.into()),
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
    ]);
    let dump: Vec<String> = [
        "dump",
        "--bucket",
        BUCKET,
        "--prefix",
        "contract/shop/orders",
        "--path-style",
        "--encryption-key",
        "k1",
    ]
    .map(String::from)
    .to_vec();
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("k1"), KEY).unwrap();
    env.push((
        "DBOP_BACKUP_ENCRYPTION_KEY_DIR".into(),
        keys.display().to_string(),
    ));
    let dumped = run_agent(&dump, &env);
    assert!(
        dumped.status.success(),
        "{}",
        String::from_utf8_lossy(&dumped.stderr)
    );

    // The target: a new server whose application database is empty, as a new Database's is.
    let target = Pg::start();
    target.psql("postgres", &format!("CREATE DATABASE {PG_USER}"));
    let db = restoring_database(s3.port);
    let snap = RestoreObjects {
        s3_secret: Some(s3_secret()),
        ..RestoreObjects::default()
    };
    let fact = restore::fact(&db, &snap).expect("a bootstrap fact");
    let decided = restore::decide_restore(&db, &fact, true, false);
    assert!(decided.create_job, "{decided:?}");
    let source_spec = restore::source(&db, &snap).expect("a source");
    let job = restore_job(&db, &source_spec, &Settings::default());
    let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let secrets = BTreeMap::from([
        (("copy-credentials", "username"), PG_USER),
        (("copy-credentials", "password"), PG_PASSWORD),
        (("s3-creds", "id"), S3_ACCESS_KEY),
        (("s3-creds", "key"), S3_SECRET_KEY),
        (("backup-keys", "k0"), OLD_KEY),
        (("backup-keys", "k1"), KEY),
    ]);
    let (argv, env) = resolve(&pod, &dir.path().join("secrets"), &secrets);
    let env: Vec<(String, String)> = env
        .into_iter()
        .chain([("TMPDIR".to_string(), dir.path().display().to_string())])
        .collect();
    let result_file = dir.path().join("termination-log");
    let args: Vec<String> = argv[1..]
        .iter()
        .map(|a| match a.strip_prefix("--result-file=") {
            Some(_) => format!("--result-file={}", result_file.display()),
            None => a.clone(),
        })
        .collect();
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "PGHOST" => (k, "127.0.0.1".to_string()),
            "PGPORT" => (k, target.port.to_string()),
            _ => (k, v),
        })
        .collect();
    let restored = run_agent(&args, &env);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );

    // The data, its owner and its grant, as in the source.
    assert_eq!(target.content_hash(PG_USER), source.content_hash(PG_USER));
    let facts = "SELECT tableowner || ' ' || has_table_privilege('app_reader', 'orders', 'SELECT') FROM pg_tables WHERE tablename = 'orders'";
    assert_eq!(target.psql(PG_USER, facts), "app_owner true");

    // dbop reads the termination message back: Initialized, with the backup's id.
    let message = std::fs::read_to_string(&result_file).expect("the termination message");
    let result = parse_termination_message(&message).expect("a result");
    let fact = BootstrapFact {
        job: Some(RestoreJobFact {
            state: JobState::Succeeded,
            result: Some(result.clone()),
            output: None,
        }),
        ..fact
    };
    let d = restore::decide_restore(&db, &fact, true, false);
    assert_eq!(
        (d.condition.status, d.condition.reason.as_str()),
        (true, "RestoredFromBackup")
    );
    let status = d.status.expect("status.bootstrap");
    assert!(status.restored_backup_id.is_some());
    assert_eq!(status.restored_backup_id, result.backup_id);
    assert!(
        status
            .restored_key
            .as_deref()
            .unwrap_or("")
            .starts_with(&format!("contract/shop/orders/{PG_USER}/")),
        "{status:?}"
    );
}
