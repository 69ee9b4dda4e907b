//! The recovery Job's contract with the agent, proven for real: a server archives its WAL
//! through the real `dbop-backup wal-push`, with exactly the settings and environment dbop gives
//! a database pod for `spec.backup.walArchiving` (its layout `<namespace>/<database>/physical/`),
//! and a base backup is taken with that same environment; a new Database with
//! `spec.bootstrap.fromBackup.recoveryTarget` then gets the Job dbop builds, whose command,
//! arguments and environment run the real agent's `recover` (its Secret volumes written as
//! files, as the kubelet would). The result it writes where the termination message goes is
//! read back by dbop's own restore decision (`RecoveredToTarget`, `status.bootstrap`), and a
//! server started on the recovered directory holds exactly the rows committed before the
//! target.
//!
//! Only what a cluster provides is substituted: the agent's path (the init container's copy →
//! the built binary), the data volume (`PGDATA` → a directory that does not exist yet), the
//! pod's `/tmp` (→ TMPDIR), `/dev/termination-log` (→ a file), the image's PATH (→ the local
//! PostgreSQL), and the pod's non-root user (→ `postgres` when the tests run as root: the agent
//! starts a server, which refuses root). A missing dependency fails the test; nothing is skipped.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chrono::{DateTime, Utc};
use dbop::api::{BootstrapStatus, Database, DatabaseSpec};
use dbop::database::restore::{
    self, BootstrapFact, RestoreDecision, RestoreJobFact, RestoreObjects,
};
use dbop::objects::JobState;
use dbop::resources::backup_job::AGENT_PATH;
use dbop::resources::recovery_job::recovery_job;
use dbop::resources::statefulset::PGDATA;
use dbop::resources::wal_archiving;
use dbop::settings::Settings;
use dbop_contract::parse_termination_message;
use dbop_contract::test_support::{
    BUCKET, PG_PASSWORD, PG_USER, Pg, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs, agent_for_postgres,
    built_agent, free_port, give_to_postgres, pg_bin_dir, run_as_postgres, wait_until,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, Secret};

mod kubelet;
use kubelet::resolve;

/// The source Database, `shop/orders`, whose archived WAL and base backup are recovered.
const SOURCE_NS: &str = "shop";
const SOURCE_NAME: &str = "orders";

/// Where the test's copy of the agent is (`install_agent`).
static AGENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Copies the built agent into `dir`, where PostgreSQL's user can run it: as `archive_command`,
/// and as the pod's user. The build's own directory may be closed to other users (a clone in a
/// private temporary directory, as CI makes one); there PostgreSQL could not archive, and the
/// base backup waited for its WAL forever.
fn install_agent(dir: &Path) {
    let copy = agent_for_postgres(dir, &built_agent());
    AGENT.set(copy).expect("one test installs the agent");
}

fn agent_binary() -> PathBuf {
    AGENT.get().expect("install_agent first").clone()
}

/// The agent with exactly `args` and `env` (plus the image's PATH), as the pod's user; its
/// output holds no secret.
fn run_agent(args: &[String], env: &[(String, String)], as_postgres: bool) -> Output {
    let mut cmd = Command::new(agent_binary());
    cmd.args(args)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if as_postgres {
        run_as_postgres(&mut cmd);
    }
    let out = cmd.output().expect("the agent runs");
    for text in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(text);
        for secret in [PG_PASSWORD, S3_SECRET_KEY] {
            assert!(!text.contains(secret), "a secret in the agent's output");
        }
    }
    out
}

fn s3_json(s3_port: u16) -> serde_json::Value {
    serde_json::json!({
        "endpoint": format!("http://127.0.0.1:{s3_port}"), "bucket": BUCKET,
        "forcePathStyle": true, "credentials": {"secretName": "s3-creds"}
    })
}

fn database(namespace: &str, name: &str, spec: serde_json::Value) -> Database {
    let spec: DatabaseSpec = serde_json::from_value(spec).unwrap();
    let mut db = Database::new(name, spec);
    db.metadata.namespace = Some(namespace.into());
    db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
    db
}

/// `shop/orders`, archiving its WAL to the bucket.
fn archiving_database(s3_port: u16) -> Database {
    database(
        SOURCE_NS,
        SOURCE_NAME,
        serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "backup": {"schedule": "0 3 * * *", "s3": s3_json(s3_port), "walArchiving": {}}
        }),
    )
}

/// `staging/copy`, recovered from `shop/orders` to `time`.
fn recovering_database(s3_port: u16, time: &str) -> Database {
    database(
        "staging",
        "copy",
        serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "bootstrap": {"fromBackup": {
                "s3": s3_json(s3_port), "database": SOURCE_NAME, "namespace": SOURCE_NS,
                "recoveryTarget": {"time": time}
            }}
        }),
    )
}

fn s3_secret() -> Secret {
    let keys = [
        ("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY),
    ];
    Secret {
        data: Some(
            keys.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Every Secret item the Jobs and pods may mount: the S3 key, and the new Database's
/// credentials (its superuser is the source's: the recovered server has the source's roles).
fn secrets() -> BTreeMap<(&'static str, &'static str), &'static str> {
    BTreeMap::from([
        (("copy-credentials", "username"), PG_USER),
        (("s3-creds", "AWS_ACCESS_KEY_ID"), S3_ACCESS_KEY),
        (("s3-creds", "AWS_SECRET_ACCESS_KEY"), S3_SECRET_KEY),
    ])
}

/// A server that archives its WAL as a database pod of `db` does: dbop's archiving parameters
/// and the `postgres` container's environment (its Secret files under `dir`), the agent's path
/// being a script that runs the built agent with that environment.
struct Source {
    pg: Pg,
    /// The agent's environment in the database pod.
    env: Vec<(String, String)>,
}

impl Source {
    fn start(db: &Database, dir: &Path) -> Source {
        let mut template = PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "postgres".into(),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..PodTemplateSpec::default()
        };
        wal_archiving::add_to_pod_template(&mut template, db, &Settings::default());
        let (_, env) = resolve(template.spec.as_ref().unwrap(), dir, &secrets());
        let script = archive_script(dir, &env);
        let params = wal_archiving::parameters(db);
        let command = params["archive_command"].replace(AGENT_PATH, &script);
        let pg = Pg::start_with(&[
            ("archive_mode", params["archive_mode"].as_str()),
            ("archive_command", &command),
            ("archive_timeout", params["archive_timeout"].as_str()),
            ("full_page_writes", "on"),
        ]);
        pg.psql(
            "postgres",
            "CREATE TABLE t (id int PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
        );
        Source { pg, env }
    }

    /// Inserts one row per id, each in its own transaction.
    fn insert(&self, ids: std::ops::RangeInclusive<u32>) {
        for id in ids {
            self.pg
                .psql("postgres", &format!("INSERT INTO t (id) VALUES ({id})"));
        }
    }

    /// `base-backup` with the pod's environment: its backup id.
    fn base_backup(&self) -> String {
        let mut env = self.env.clone();
        env.extend(self.pg.env("postgres"));
        let args = ["base-backup", "--fast-checkpoint"].map(String::from);
        let out = run_agent(&args, &env, false);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "base-backup failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let record: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("a record");
        record["backupId"]
            .as_str()
            .expect("a backup id")
            .to_string()
    }

    /// The server's clock, as RFC 3339 in UTC.
    fn now(&self) -> String {
        self.pg.psql(
            "postgres",
            r#"SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#,
        )
    }

    /// Waits until the server's clock is past `time`, so the next commit is later.
    fn wait_past(&self, time: &str) {
        wait_until(5, "the server's clock to pass the target", || {
            self.pg.psql(
                "postgres",
                &format!("SELECT clock_timestamp() > '{time}'::timestamptz"),
            ) == "t"
        });
    }

    /// Closes the current segment and waits until it is archived.
    fn switch_and_wait(&self) {
        let current = self
            .pg
            .psql("postgres", "SELECT pg_walfile_name(pg_current_wal_lsn())");
        self.pg.psql("postgres", "SELECT pg_switch_wal()");
        wait_until(30, "the last segment to be archived", || {
            self.pg.psql(
                "postgres",
                "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver",
            ) >= current
        });
    }
}

/// `archive.sh`: the built agent with exactly `env` (what the server passes `archive_command`
/// in the database pod); readable by PostgreSQL's user.
fn archive_script(dir: &Path, env: &[(String, String)]) -> String {
    let vars: Vec<String> = env.iter().map(|(k, v)| format!("'{k}={v}'")).collect();
    let script = dir.join("archive.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec env -i PATH=/usr/bin:/bin {} '{}' \"$@\"\n",
            vars.join(" "),
            agent_binary().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

/// The recovery Job's command line and environment, with what a cluster provides substituted:
/// the data volume under `dir/volume`, the pod's `/tmp`, and the termination log `result`.
fn job_command(db: &Database, dir: &Path, result: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let snap = RestoreObjects {
        s3_secret: Some(s3_secret()),
        ..RestoreObjects::default()
    };
    let source = restore::source(db, &snap).expect("a source");
    let job = recovery_job(db, &source, &Settings::default());
    let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let (argv, env) = resolve(&pod, &dir.join("secrets"), &secrets());
    let data = dir.join("volume").join("pgdata");
    let args = argv[1..]
        .iter()
        .map(|a| match a.strip_prefix("--result-file=") {
            Some(_) => format!("--result-file={}", result.display()),
            None if a == PGDATA => data.display().to_string(),
            None => a.clone(),
        })
        .collect();
    let mut env = env;
    env.push(("TMPDIR".into(), dir.join("tmp").display().to_string()));
    (args, env)
}

/// The volume, the pod's `/tmp` and the termination log, writable by the pod's user.
fn prepare_pod_dirs(dir: &Path, result: &Path) {
    give_to_postgres(dir);
    for sub in ["volume", "tmp"] {
        std::fs::create_dir(dir.join(sub)).unwrap();
        give_to_postgres(&dir.join(sub));
    }
    std::fs::write(result, "").unwrap();
    give_to_postgres(result);
}

/// dbop's decision on the finished Job whose termination message is `message`.
fn decide(
    db: &Database,
    message: &str,
) -> (RestoreDecision, Option<dbop_contract::result::BackupResult>) {
    let snap = RestoreObjects {
        s3_secret: Some(s3_secret()),
        ..RestoreObjects::default()
    };
    let fact = restore::fact(db, &snap).expect("a bootstrap fact");
    assert!(
        restore::decide_restore(db, &fact, false, false).create_job,
        "dbop starts the recovery Job"
    );
    let result = parse_termination_message(message);
    let fact = BootstrapFact {
        job: Some(RestoreJobFact {
            state: JobState::Succeeded,
            result: result.clone(),
            output: None,
        }),
        ..fact
    };
    (restore::decide_restore(db, &fact, false, false), result)
}

/// PostgreSQL started on the recovered data directory as the database pod would start it.
struct Recovered {
    data: PathBuf,
    port: u16,
}

impl Recovered {
    fn start(data: &Path) -> Recovered {
        let port = free_port();
        let sockets = data.parent().unwrap();
        let log = sockets.join("recovered.log");
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={}",
            sockets.display()
        );
        let out = run_as_postgres(
            Command::new(pg_bin_dir().join("pg_ctl")).args(["start", "-w", "-t", "30"]),
        )
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(&log)
        .args(["-o", &options])
        .output()
        .expect("pg_ctl");
        assert!(
            out.status.success(),
            "the recovered server did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Recovered {
            data: data.to_path_buf(),
            port,
        }
    }

    fn psql(&self, sql: &str) -> String {
        let out = Command::new(pg_bin_dir().join("psql"))
            .args([
                "-X",
                "-w",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .env_clear()
            .envs([
                ("PGHOST", "127.0.0.1".to_string()),
                ("PGPORT", self.port.to_string()),
                ("PGUSER", PG_USER.into()),
                ("PGPASSWORD", PG_PASSWORD.into()),
                ("PGDATABASE", "postgres".into()),
            ])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Recovered {
    fn drop(&mut self) {
        let _ = run_as_postgres(
            Command::new(pg_bin_dir().join("pg_ctl")).args(["stop", "-m", "fast", "-D"]),
        )
        .arg(&self.data)
        .output();
    }
}

fn assert_recovered_to_target(
    decision: &RestoreDecision,
    target: DateTime<Utc>,
    backup_id: &str,
) -> BootstrapStatus {
    let c = &decision.condition;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (true, "RecoveredToTarget"),
        "{}",
        c.message
    );
    let status = decision.status.clone().expect("status.bootstrap");
    assert_eq!(status.restored_backup_id.as_deref(), Some(backup_id));
    assert_eq!(status.timeline, Some(2), "{status:?}");
    let reached = status.recovered_to.expect("a replayed commit");
    assert!(reached <= target, "recovered to {reached}, past {target}");
    assert!(status.recovered_lsn.is_some(), "{status:?}");
    assert_eq!(
        status.recovery_target,
        Some(format!(
            "time {}",
            target.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        ))
    );
    status
}

#[test]
fn the_recovery_job_runs_the_agent_for_real_to_a_point_in_time() {
    let dir = tempfile::Builder::new()
        .prefix("dbop-recovery-")
        .tempdir()
        .unwrap();
    give_to_postgres(dir.path());
    install_agent(dir.path());
    let s3 = S3sFs::start();

    // The source: rows 1–3, a base backup, rows 4–5, the target, rows 6–7, all archived under
    // the layout dbop gives the database pod.
    let archive_dir = dir.path().join("archive");
    std::fs::create_dir(&archive_dir).unwrap();
    give_to_postgres(&archive_dir);
    let source = Source::start(&archiving_database(s3.port), &archive_dir);
    source.insert(1..=3);
    let backup_id = source.base_backup();
    source.insert(4..=5);
    let time = source.now();
    source.wait_past(&time);
    source.insert(6..=7);
    source.switch_and_wait();
    let physical = s3
        .root
        .join(BUCKET)
        .join(SOURCE_NS)
        .join(SOURCE_NAME)
        .join("physical");
    assert!(
        physical.join("wal").is_dir() && physical.join("base").is_dir(),
        "{}",
        physical.display()
    );

    // The recovery Job of `staging/copy`, run for real.
    let db = recovering_database(s3.port, &time);
    let job_dir = dir.path().join("job");
    let result = job_dir.join("termination-log");
    std::fs::create_dir(&job_dir).unwrap();
    prepare_pod_dirs(&job_dir, &result);
    let (args, env) = job_command(&db, &job_dir, &result);
    let data = job_dir.join("volume").join("pgdata");
    assert!(!data.exists());
    let out = run_agent(&args, &env, true);
    assert!(
        out.status.success(),
        "recover {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );

    // dbop reads the termination message back: RecoveredToTarget, with the point reached.
    let message = std::fs::read_to_string(&result).expect("the termination message");
    let (decision, parsed) = decide(&db, &message);
    assert!(parsed.is_some(), "no result in {message:?}");
    let target: DateTime<Utc> = time.parse().unwrap();
    assert_recovered_to_target(&decision, target, &backup_id);

    // The database pod's server starts on it: a primary with exactly the rows before the target.
    let server = Recovered::start(&data);
    assert_eq!(server.psql("SELECT pg_is_in_recovery()"), "f");
    assert_eq!(
        server.psql("SELECT string_agg(id::text, ',' ORDER BY id) FROM t"),
        "1,2,3,4,5"
    );
    assert_eq!(
        server.psql("SELECT timeline_id FROM pg_control_checkpoint()"),
        "2"
    );
}
