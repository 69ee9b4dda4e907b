//! Physical base backups and point-in-time restore through real PostgreSQL and s3s-fs: a
//! server archives its WAL through the agent (`wal-push`), `base-backup` stores the instance,
//! more rows are written with their commit times, and `base-restore` into a new data directory
//! plus PostgreSQL's own recovery (WAL through `wal-fetch`) gives exactly the rows committed
//! before the target (a time, an LSN, a restore point), or all of them for the latest point. A
//! base backup taken from a standby restores; an encrypted one only with its key. A target
//! before the oldest base backup fails naming the earliest restorable point; a tampered object
//! is refused and the data directory left empty; a non-empty data directory is refused; a
//! failed pg_basebackup leaves no record and no unfinished upload; one killed mid-upload leaves
//! nothing restorable, and its retry completes. `recover` leaves a promoted
//! primary on timeline 2 with exactly the rows before the target and no recovery settings,
//! cleans a killed run's scratch, reports a finished directory again without touching it, and
//! refuses a target before the oldest base backup, one past the archived WAL and an occupied
//! directory. `base-backup --keep-last` deletes the older base backups and the WAL before the
//! oldest kept one's start segment, and no more: the oldest kept one still recovers.
mod common;
use common::*;
use dbop_backup::BackupResult;

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DATABASE: &str = "app";
const PREFIX: &str = "pfx";

/// The agent and its settings in a directory PostgreSQL (the `postgres` user when the tests run
/// as root) can read: `agent.sh` runs the agent with the test server's settings, the S3 key in
/// files (nothing secret in a command line or PostgreSQL's environment).
fn agent_script(dir: &Path, s3: &S3Server) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let id = file("access-key-id", S3_ACCESS_KEY);
    let secret = file("secret-access-key", S3_SECRET_KEY);
    let agent = dir.join("dbop-backup");
    std::fs::copy(env!("CARGO_BIN_EXE_dbop-backup"), &agent).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!(
        "#!/bin/sh\nexec env -i PATH=/usr/bin:/bin AWS_ENDPOINT_URL={} AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true DBOP_BACKUP_BUCKET={BUCKET} DBOP_BACKUP_PATH_STYLE=true DBOP_BACKUP_PREFIX={PREFIX} DBOP_BACKUP_DATABASE={DATABASE} DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE={id} DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE={secret} {} \"$@\"\n",
        s3.endpoint(),
        agent.display(),
    );
    PathBuf::from(file("agent.sh", &script))
}

/// A server that archives through the agent, its S3 server and the agent's directory.
struct Source {
    s3: S3Server,
    _dir: tempfile::TempDir,
    script: PathBuf,
    pg: Pg,
}

impl Source {
    fn start() -> Source {
        let s3 = S3Server::start(S3Kind::S3sFs);
        let dir = tempfile::tempdir().unwrap();
        let script = agent_script(dir.path(), &s3);
        let command = format!("{} wal-push %p %f", script.display());
        // A standby's base backup needs the primary's full-page writes (the harness turns them off).
        let pg = Pg::start_with(&[
            ("archive_mode", "on"),
            ("archive_command", &command),
            ("full_page_writes", "on"),
        ]);
        pg.psql(
            "postgres",
            "CREATE TABLE t (id int PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
        );
        Source {
            s3,
            _dir: dir,
            script,
            pg,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = env_of(&self.pg, "postgres", &self.s3);
        env.extend([
            ("DBOP_BACKUP_DATABASE".into(), DATABASE.into()),
            ("DBOP_BACKUP_PREFIX".into(), PREFIX.into()),
        ]);
        env
    }

    /// `base-backup` with an immediate checkpoint: its record.
    fn base_backup(&self) -> serde_json::Value {
        let run = self.base_backup_with(&[]);
        stored_record(&self.s3, &run)
    }

    /// `base-backup --fast-checkpoint <args…>`.
    fn base_backup_with(&self, args: &[&str]) -> AgentRun {
        let mut all = vec!["base-backup", "--fast-checkpoint"];
        all.extend_from_slice(args);
        let run = agent(&all, &self.env());
        run.assert_no_secrets();
        run
    }

    /// Inserts one row per id, each in its own transaction.
    fn insert(&self, ids: std::ops::RangeInclusive<u32>) {
        for id in ids {
            self.pg
                .psql("postgres", &format!("INSERT INTO t (id) VALUES ({id})"));
        }
    }

    /// The server's clock, as RFC 3339 in UTC.
    fn now(&self) -> String {
        self.pg.psql(
            "postgres",
            r#"SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#,
        )
    }

    /// Waits until the server's clock is past `time` (RFC 3339), so the next commit is later.
    fn wait_past(&self, time: &str) {
        wait_until(5, "the server's clock to pass the recorded time", || {
            self.pg.psql(
                "postgres",
                &format!("SELECT clock_timestamp() > '{time}'::timestamptz"),
            ) == "t"
        });
    }

    /// `recover <data dir> <args…>`, run as PostgreSQL's user when the tests run as root (the
    /// agent starts a server, which refuses root), by the agent's copy that user can run.
    fn recover(&self, data: &Path, args: &[&str]) -> AgentRun {
        give_to_postgres(data.parent().unwrap());
        self.recover_as(data, args, postgres_ids())
    }

    /// `recover` as `ids` (uid, gid), or as this process when `None`.
    fn recover_as(&self, data: &Path, args: &[&str], ids: Option<(u32, u32)>) -> AgentRun {
        self.run_recovery("recover", data, args, ids)
    }

    /// `verify-base <scratch data dir> <args…>`, as PostgreSQL's user (see `recover`).
    fn verify_base(&self, data: &Path, args: &[&str]) -> AgentRun {
        give_to_postgres(data.parent().unwrap());
        self.run_recovery("verify-base", data, args, postgres_ids())
    }

    /// `recover` or `verify-base` as `ids`, or as this process when `None`.
    fn run_recovery(
        &self,
        command: &str,
        data: &Path,
        args: &[&str],
        ids: Option<(u32, u32)>,
    ) -> AgentRun {
        let data = data.display().to_string();
        let script = self.script.display().to_string();
        let mut all = vec![command, &data, "--agent-path", &script];
        all.extend_from_slice(args);
        let mut cmd = agent_command_at(
            &self.script.with_file_name("dbop-backup"),
            &all,
            &self.env(),
        );
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        let run = parse_run(cmd.output().expect("run agent"));
        run.assert_no_secrets();
        run
    }

    /// Closes the current segment and waits until it is archived.
    fn switch_and_wait(&self) {
        let current = self.pg.psql(
            "postgres",
            "SELECT pg_walfile_name(pg_current_wal_insert_lsn())",
        );
        self.pg.psql("postgres", "SELECT pg_switch_wal()");
        wait_until(30, "the last segment to be archived", || {
            self.pg.psql(
                "postgres",
                "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver",
            ) >= current
        });
    }

    /// `base-restore <data dir> <args…>` with the agent script as `restore_command`.
    fn restore(&self, data: &Path, args: &[&str]) -> AgentRun {
        let data = data.display().to_string();
        let script = self.script.display().to_string();
        let mut all = vec!["base-restore", &data, "--agent-path", &script];
        all.extend_from_slice(args);
        let run = agent(&all, &self.env());
        run.assert_no_secrets();
        run
    }
}

/// The record of the base backup a successful `base-backup` run reports, as stored.
fn stored_record(s3: &S3Server, run: &AgentRun) -> serde_json::Value {
    let result = run.ok();
    assert_eq!(result.operation, dbop_backup::Operation::BaseBackup);
    let id = result.backup_id.as_deref().expect("a backup id");
    let record = s3.get(&format!("{PREFIX}/{DATABASE}/base/{id}/backup.json"));
    serde_json::from_slice(&record).expect("a record")
}

/// PostgreSQL started on a restored data directory: it recovers through `wal-fetch`.
struct Restored {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Restored {
    fn start(data: &Path) -> Restored {
        let parent = data.parent().unwrap();
        give_to_postgres(parent);
        let ids = postgres_ids();
        let port = free_port();
        let log = parent.join("restored.log");
        let mut cmd = Command::new(pg_bin_dir().join("postgres"));
        cmd.arg("-D")
            .arg(data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", parent.display()))
            .args(["-c", "archive_mode=off", "-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .current_dir(parent);
        if let Some((uid, gid)) = ids {
            cmd.uid(uid).gid(gid);
        }
        let child = cmd.spawn().expect("postgres");
        Restored { child, port, log }
    }

    fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(pg_bin_dir().join("psql"))
            .args(["-X", "-w", "-q", "-A", "-t", "-c", sql])
            .env_clear()
            .envs([
                ("PGHOST", "127.0.0.1".to_string()),
                ("PGPORT", self.port.to_string()),
                ("PGUSER", PG_USER.into()),
                ("PGPASSWORD", PG_PASSWORD.into()),
                ("PGDATABASE", "postgres".into()),
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    /// Waits until `sql` answers `want`.
    fn wait_for(&mut self, sql: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.try_psql(sql).as_deref() != Ok(want) {
            let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "exited:\n{}",
                log()
            );
            assert!(Instant::now() < deadline, "{sql} ≠ {want}:\n{}", log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until recovery ended and the server promoted; the ids in `t`.
    fn ids_after_promotion(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if self.try_psql("SELECT pg_is_in_recovery()").as_deref() == Ok("f") {
                return self
                    .try_psql("SELECT string_agg(id::text, ',' ORDER BY id) FROM t")
                    .unwrap();
            }
            let exited = self.child.try_wait().unwrap();
            let log = || std::fs::read_to_string(&self.log).unwrap_or_default();
            assert!(exited.is_none(), "the restored server exited:\n{}", log());
            assert!(
                Instant::now() < deadline,
                "no promotion within 40 s:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Restored {
    fn drop(&mut self) {
        // SAFETY: signalling our own child (SIGINT: a fast shutdown).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory for a data directory to restore into (not created).
fn new_data_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    (dir, data)
}

/// `base-restore` with `args`, PostgreSQL started on the result: the ids it has once promoted.
fn restore_and_start(src: &Source, args: &[&str]) -> String {
    let (_keep, data) = new_data_dir();
    let run = src.restore(&data, args);
    assert_eq!(
        run.code,
        Some(0),
        "base-restore {args:?} failed:\n{}",
        run.stderr
    );
    let auto = std::fs::read_to_string(data.join("postgresql.auto.conf")).unwrap();
    assert!(
        auto.contains("recovery_target_timeline = 'latest'"),
        "{auto}"
    );
    assert!(data.join("recovery.signal").exists());
    let mut restored = Restored::start(&data);
    restored.ids_after_promotion()
}

#[test]
fn a_restore_to_a_moment_between_two_commits_has_exactly_the_rows_committed_before_it() {
    let src = Source::start();
    src.insert(1..=3);
    let record = src.base_backup();
    assert!(record["backupId"].is_string(), "{record}");
    src.insert(4..=5);
    // Three ways to name the moment after the fifth commit: the server's clock, the WAL
    // position, a restore point.
    let time = src.now();
    let lsn = src
        .pg
        .psql("postgres", "SELECT pg_current_wal_insert_lsn()");
    src.pg
        .psql("postgres", "SELECT pg_create_restore_point('after-5')");
    src.wait_past(&time);
    src.insert(6..=7);
    src.switch_and_wait();

    let cases: [(&[&str], &str); 4] = [
        (&["--target-time", &time], "1,2,3,4,5"),
        (&["--target-lsn", &lsn], "1,2,3,4,5"),
        (&["--target-name", "after-5"], "1,2,3,4,5"),
        (&[], "1,2,3,4,5,6,7"),
    ];
    // Each into its own directory and server, at once.
    let got: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = cases
            .iter()
            .map(|(args, _)| scope.spawn(|| restore_and_start(&src, args)))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for ((args, want), got) in cases.iter().zip(got) {
        assert_eq!(got, *want, "{args:?}");
    }
}

#[test]
fn the_record_holds_the_wal_range_and_bad_targets_objects_and_directories_are_refused() {
    let src = Source::start();
    src.insert(1..=2);
    let record = src.base_backup();
    let id = record["backupId"].as_str().unwrap().to_string();
    let sysid = src.pg.psql(
        "postgres",
        "SELECT system_identifier FROM pg_control_system()",
    );
    assert_eq!(record["systemIdentifier"], sysid.as_str());
    assert_eq!(
        (record["timeline"].as_u64(), record["backupFrom"].as_str()),
        (Some(1), Some("primary"))
    );
    assert!(record["startLsn"].as_str().unwrap() <= record["stopLsn"].as_str().unwrap());
    let tar_key = format!("{PREFIX}/{DATABASE}/base/{id}/base.tar.zst");
    let keys = src.s3.keys(&format!("{PREFIX}/{DATABASE}/base/"));
    assert_eq!(
        keys,
        vec![
            format!("{PREFIX}/{DATABASE}/base/{id}/backup.json"),
            format!("{PREFIX}/{DATABASE}/base/{id}/backup_manifest.zst"),
            tar_key.clone()
        ]
    );
    // The server compressed the tar: the manifest is stored beside it (record version 2), and
    // the record's sizes are the stored tar's: its bytes before compression (the server's
    // last progress report) and its files (the manifest's count).
    assert_eq!(record["recordVersion"].as_u64(), Some(2));
    assert!(
        record["manifest"]["sizeBytes"].as_u64().unwrap() > 0,
        "{record}"
    );
    let tar = zstd::decode_all(src.s3.get(&tar_key).as_slice()).expect("a zstd stream");
    assert_eq!(record["rawBytes"].as_u64(), Some(tar.len() as u64));
    let manifest_key = format!("{PREFIX}/{DATABASE}/base/{id}/backup_manifest.zst");
    let manifest = zstd::decode_all(src.s3.get(&manifest_key).as_slice()).unwrap();
    let listed = serde_json::from_slice::<serde_json::Value>(&manifest).unwrap()["Files"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(record["files"].as_u64(), Some(listed as u64));
    assert!(listed > 900, "{listed} files");

    // A target before the oldest base backup names the earliest restorable point.
    let (_keep, data) = new_data_dir();
    let run = src.restore(&data, &["--target-time", "2001-01-01T00:00:00Z"]);
    assert_eq!(
        run.code,
        Some(dbop_backup::error::PERMANENT),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("the earliest restorable point is"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!("base backup {id}")),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(record["stopLsn"].as_str().unwrap()),
        "{}",
        run.stderr
    );

    // A data directory that is not empty is refused, and left as it was.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("PG_VERSION"), "15\n").unwrap();
    let run = src.restore(&data, &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("is not empty"), "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(data.join("PG_VERSION")).unwrap(),
        "15\n"
    );

    // Without pg_verifybackup, the files are checked against the manifest's sizes.
    let no_tools = tempfile::tempdir().unwrap();
    let no_tools = no_tools.path().display().to_string();
    let (_keep, unchecked) = new_data_dir();
    let run = src.restore(&unchecked, &["--pg-bin-dir", &no_tools]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("pg_verifybackup not found"),
        "{}",
        run.stderr
    );

    // A flipped byte in the stored tar is refused, and nothing is left in the directory.
    let file = src.s3.root.join(BUCKET).join(&tar_key);
    let mut body = std::fs::read(&file).unwrap();
    let mid = body.len() / 2;
    body[mid] ^= 0x55;
    std::fs::write(&file, &body).unwrap();
    let (_keep, data) = new_data_dir();
    let run = src.restore(&data, &[]);
    assert_eq!(
        run.code,
        Some(dbop_backup::error::PERMANENT),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("integrity check failed"),
        "{}",
        run.stderr
    );
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "the data directory was emptied"
    );
}

#[test]
fn a_base_backup_taken_from_a_standby_restores() {
    let src = Source::start();
    src.insert(1..=2);
    // A streaming standby of the source, made the usual way.
    let (_keep_standby, standby_data) = new_data_dir();
    let out = Command::new(pg_bin_dir().join("pg_basebackup"))
        .arg("-D")
        .arg(&standby_data)
        .args(["-R", "-X", "stream", "-c", "fast", "-w"])
        .env_clear()
        .envs(src.pg.env("postgres"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut standby = Restored::start(&standby_data);
    src.insert(3..=3);
    standby.wait_for("SELECT count(*) FROM t", "3");
    standby.wait_for("SELECT pg_is_in_recovery()", "t");

    // Both servers, the primary first, as libpq's prefer-standby takes them: the standby is
    // chosen (by the agent's own connection, which the server's compression shows).
    let env = with_env(src.env(), "PGHOST", "127.0.0.1,127.0.0.1");
    let env = with_env(env, "PGPORT", &format!("{},{}", src.pg.port, standby.port));
    let env = with_env(env, "PGTARGETSESSIONATTRS", "prefer-standby");
    let run = agent(&["base-backup", "--fast-checkpoint"], &env);
    let record = stored_record(&src.s3, &run);
    assert_eq!(record["backupFrom"], "standby");
    assert!(
        run.ok_message().contains("compressed by the server"),
        "{}",
        run.stderr
    );
    src.insert(4..=4);
    src.switch_and_wait();

    let (_keep, data) = new_data_dir();
    let run = src.restore(&data, &[]);
    assert_eq!(run.code, Some(0), "base-restore failed:\n{}", run.stderr);
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2,3,4");
}

#[test]
fn an_encrypted_base_backup_is_unreadable_and_restores_only_with_its_key() {
    let src = Source::start();
    src.pg.psql(
        "postgres",
        "INSERT INTO t (id, at) SELECT 1, now(); CREATE TABLE secret (v text); INSERT INTO secret VALUES ('visible-only-with-the-key')",
    );
    let keys = tempfile::tempdir().unwrap();
    let raw: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(29) ^ 0xa5).collect();
    let key_text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, raw);
    std::fs::write(keys.path().join("k1"), &key_text).unwrap();
    let key_dir = keys.path().display().to_string();
    let env = with_env(src.env(), "DBOP_BACKUP_ENCRYPTION_KEY_DIR", &key_dir);
    let run = agent(
        &["base-backup", "--fast-checkpoint", "--encryption-key", "k1"],
        &env,
    );
    assert!(!run.stderr.contains(&key_text) && !run.stdout.contains(&key_text));
    let record = stored_record(&src.s3, &run);
    assert_eq!(record["encryption"]["keyName"], "k1");
    let id = record["backupId"].as_str().unwrap();
    let stored = src
        .s3
        .get(&format!("{PREFIX}/{DATABASE}/base/{id}/base.tar.zst"));
    assert!(stored.starts_with(b"DBOPENC1"), "encrypted");
    assert!(
        !stored
            .windows(25)
            .any(|w| w == b"visible-only-with-the-key"),
        "no plaintext"
    );

    // Without the key: refused, naming it, nothing left behind.
    let (_keep, data) = new_data_dir();
    let run = src.restore(&data, &[]);
    assert_eq!(
        run.code,
        Some(dbop_backup::error::PERMANENT),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("\"k1\""), "{}", run.stderr);
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    // With it: unpacked and accepted by pg_verifybackup.
    let data_arg = data.display().to_string();
    let script = src.script.display().to_string();
    let run = agent(&["base-restore", &data_arg, "--agent-path", &script], &env);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(data.join("PG_VERSION").is_file() && data.join("recovery.signal").is_file());
    let auto = std::fs::read_to_string(data.join("postgresql.auto.conf")).unwrap();
    assert!(
        auto.contains(&format!("--encryption-key-dir {key_dir}")),
        "{auto}"
    );
}

#[test]
fn a_failed_base_backup_leaves_no_record_and_no_unfinished_upload() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let pg = Pg::start();
    // The server answers, then pg_basebackup fails after the upload has begun.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(pg_bin_dir().join("psql"), bin.path().join("psql")).unwrap();
    let fake = bin.path().join("pg_basebackup");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec {} --version\necho 'pg_basebackup: error: the connection broke' >&2\nexit 1\n",
            pg_bin_dir().join("pg_basebackup").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut env = env_of(&pg, "postgres", &s3);
    env.extend([
        ("DBOP_BACKUP_DATABASE".into(), DATABASE.into()),
        ("DBOP_BACKUP_PREFIX".into(), PREFIX.into()),
        (
            "DBOP_BACKUP_PG_BIN_DIR".into(),
            bin.path().display().to_string(),
        ),
        // pg_basebackup's path (the agent's own connection is broken below, by a proxy).
        ("DBOP_BACKUP_BASE_CLIENT".into(), "pg_basebackup".into()),
    ]);
    let run = agent(&["base-backup", "--fast-checkpoint"], &env);
    let result = run.failed();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(result.failure_kind.as_deref(), Some("postgres"));
    assert!(
        run.stderr.contains("pg_basebackup failed") && run.message().contains("connection broke"),
        "{}",
        run.stderr
    );
    assert_nothing_left(&run, &s3);
}

#[test]
fn an_instance_with_a_second_tablespace_is_refused_before_anything_is_stored() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let pg = Pg::start();
    let location = tempfile::Builder::new()
        .prefix("dbop-ts-")
        .tempdir()
        .unwrap();
    give_to_postgres(location.path());
    pg.psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE extra LOCATION '{}'",
            location.path().display()
        ),
    );
    let mut env = env_of(&pg, "postgres", &s3);
    env.extend([
        ("DBOP_BACKUP_DATABASE".into(), DATABASE.into()),
        ("DBOP_BACKUP_PREFIX".into(), PREFIX.into()),
    ]);
    let run = agent(&["base-backup", "--fast-checkpoint"], &env);
    run.failed();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.message().contains("BASE_BACKUP")
            && run
                .message()
                .contains(&format!("tablespace at {}", location.path().display())),
        "{}",
        run.stderr
    );
    assert_nothing_left(&run, &s3);
}

/// A failed base backup aborted its multipart upload and stored nothing.
fn assert_nothing_left(run: &AgentRun, s3: &S3Server) {
    assert!(
        run.stderr.contains("multipart upload aborted"),
        "{}",
        run.stderr
    );
    assert_eq!(s3.keys(""), Vec::<String>::new(), "nothing stored");
    assert_eq!(
        s3.s3s_upload_files(),
        Vec::<String>::new(),
        "no unfinished upload"
    );
}

/// A TCP proxy to `upstream` that closes each connection once the server has sent
/// `cut_after` bytes on it (psql's identity query gets far less than a base backup).
fn cutting_proxy(upstream: u16, cut_after: u64) -> u16 {
    use std::io::{Read, Write};
    use std::net::Shutdown;
    tcp_proxy(upstream, move |mut client, mut server| {
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut c_in, &mut s_out));
        let mut sent = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = server.read(&mut buf) {
            if n == 0 || client.write_all(&buf[..n]).is_err() {
                break;
            }
            sent += n as u64;
            if sent >= cut_after {
                break;
            }
        }
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    })
}

#[test]
fn a_replication_connection_broken_mid_archive_leaves_no_record_and_no_unfinished_upload() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let pg = Pg::start();
    let port = cutting_proxy(pg.port, 1 << 20);
    let mut env = with_env(env_of(&pg, "postgres", &s3), "PGPORT", &port.to_string());
    env.extend([
        ("DBOP_BACKUP_DATABASE".into(), DATABASE.into()),
        ("DBOP_BACKUP_PREFIX".into(), PREFIX.into()),
        // Small parts, so some are uploaded before the break.
        ("DBOP_BACKUP_PART_SIZE".into(), "5MiB".into()),
    ]);
    let run = agent(&["base-backup", "--fast-checkpoint"], &env);
    let result = run.failed();
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert_eq!(result.failure_kind.as_deref(), Some("postgres"));
    assert!(
        run.message().contains("BASE_BACKUP") && run.message().contains("closed the connection"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("pg_basebackup takes the backup"),
        "the agent's own connection took it: {}",
        run.stderr
    );
    assert_nothing_left(&run, &s3);
}

/// Every file below `dir` with its size and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, i64, i64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            }
            out.push((e.path(), m.len(), m.mtime(), m.mtime_nsec()));
        }
    }
    out.sort();
    out
}

#[test]
fn recover_to_a_moment_between_two_commits_leaves_a_promoted_primary_and_reruns_change_nothing() {
    let src = Source::start();
    src.insert(1..=3);
    let record = src.base_backup();
    src.insert(4..=5);
    let time = src.now();
    src.wait_past(&time);
    src.insert(6..=7);
    src.switch_and_wait();

    // A killed run left its scratch: it is deleted first.
    let (_keep, data) = new_data_dir();
    let scratch = data.with_file_name("data.recovering");
    std::fs::create_dir_all(scratch.join("base/1")).unwrap();
    std::fs::write(scratch.join("PG_VERSION"), "15\n").unwrap();
    std::fs::write(scratch.join("base/1/1259"), "half").unwrap();
    // An empty data directory (a volume's subdirectory made by an init step) is fine.
    std::fs::create_dir(&data).unwrap();

    let run = src.recover(&data, &["--target-time", &time]);
    let result = run.ok().clone();
    assert_eq!(result.operation, dbop_backup::Operation::Recover);
    assert_eq!(result.backup_id.as_deref(), record["backupId"].as_str());
    assert_eq!(result.timeline, Some(2), "{}", run.stdout);
    let target = chrono::DateTime::parse_from_rfc3339(&time).unwrap();
    let reached = result.recovered_to.expect("a replayed commit");
    assert!(reached <= target, "{reached} > {target}");
    assert!(result.recovered_lsn.is_some(), "{}", run.stdout);
    let line = run.stdout.lines().last().unwrap().to_string();
    for field in [
        r#""operation":"recover""#,
        r#""timeline":2"#,
        r#""recoveredTo":"#,
        r#""recoveredLsn":"#,
    ] {
        assert!(line.contains(field), "{line}");
    }
    assert!(!scratch.exists(), "the scratch was renamed into place");
    let marker = std::fs::read_to_string(data.join("dbop-recovery.json")).unwrap();
    assert_eq!(marker, line);
    let auto = std::fs::read_to_string(data.join("postgresql.auto.conf")).unwrap();
    assert!(
        !auto.contains("restore_command") && !auto.contains("recovery_target"),
        "{auto}"
    );
    assert!(!data.join("recovery.signal").exists());

    // Again on the finished directory: the same result, nothing touched.
    let before = snapshot(&data);
    let again = src.recover(&data, &["--target-time", &time]);
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert_eq!(again.stdout.lines().last(), Some(line.as_str()));
    assert_eq!(
        snapshot(&data),
        before,
        "the rerun changed the data directory"
    );
    assert!(!scratch.exists());

    // Started as the database's pod would: a primary with exactly the rows before the target,
    // that fetches nothing from the archive.
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2,3,4,5");
    assert_eq!(
        restored.try_psql("SELECT timeline_id FROM pg_control_checkpoint()"),
        Ok("2".to_string())
    );
    let log = std::fs::read_to_string(&restored.log).unwrap();
    assert!(!log.contains("restored log file"), "{log}");
}

#[test]
fn recover_refuses_targets_outside_the_archive_and_occupied_directories_and_recovers_the_latest() {
    let src = Source::start();
    src.insert(1..=2);
    let record = src.base_backup();
    src.insert(3..=3);
    src.switch_and_wait();

    // Before the oldest base backup: refused before the backup is downloaded.
    let (_keep, data) = new_data_dir();
    let run = src.recover(&data, &["--target-time", "2001-01-01T00:00:00Z"]);
    let failed = run.failed();
    assert_eq!(
        failed.failure_kind.as_deref(),
        Some("target-before-backups")
    );
    let stop_time = chrono::DateTime::parse_from_rfc3339(record["stopTime"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let earliest = format!(
        "the earliest restorable point is {} (LSN {}, base backup {})",
        dbop_backup::result::format_time(&stop_time),
        record["stopLsn"].as_str().unwrap(),
        record["backupId"].as_str().unwrap()
    );
    let message = run.message();
    assert!(message.contains(&earliest), "{message}");
    assert!(
        message.contains("the newest base backup ends at"),
        "{message}"
    );
    assert!(!data.exists() && !data.with_file_name("data.recovering").exists());

    // Past the end of the archived WAL: PostgreSQL stops, and the message says how far it got.
    let run = src.recover(&data, &["--target-time", "2100-01-01T00:00:00Z"]);
    let failed = run.failed();
    assert_eq!(
        failed.failure_kind.as_deref(),
        Some("target-unreachable"),
        "{}",
        run.stdout
    );
    let message = run.message();
    assert!(
        message.contains("without reaching time 2100-01-01T00:00:00Z"),
        "{message}"
    );
    assert!(
        message.contains("the last replayed commit was at"),
        "{message}"
    );
    assert!(!data.exists() && !data.with_file_name("data.recovering").exists());

    // A data directory with anything else in it is refused and left alone.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("PG_VERSION"), "15\n").unwrap();
    let run = src.recover(&data, &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert_eq!(run.failed().failure_kind.as_deref(), Some("usage"));
    assert!(
        run.message().contains("holds PG_VERSION"),
        "{}",
        run.message()
    );
    assert_eq!(
        std::fs::read_to_string(data.join("PG_VERSION")).unwrap(),
        "15\n"
    );

    // The latest point: every row.
    let (_keep, data) = new_data_dir();
    let run = src.recover(&data, &[]);
    assert_eq!(run.ok().timeline, Some(2), "{}", run.stdout);
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2,3");
}

/// The latest point of a base backup with no commit after it (a quiet database, a backup just
/// taken): PostgreSQL has no last replayed commit to report, and the recovery still succeeds.
#[test]
fn recover_to_the_latest_point_of_a_base_backup_with_no_later_commit() {
    let src = Source::start();
    src.insert(1..=2);
    src.base_backup();
    let (_keep, data) = new_data_dir();
    let run = src.recover(&data, &[]);
    let result = run.ok();
    assert_eq!(result.timeline, Some(2), "{}", run.stdout);
    assert!(result.recovered_lsn.is_some(), "{}", run.stdout);
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2");
}

#[test]
fn a_wal_file_that_cannot_be_fetched_stops_recovery_instead_of_ending_it_early() {
    let src = Source::start();
    src.insert(1..=2);
    src.base_backup();
    src.insert(3..=3);
    let damaged = src.pg.psql(
        "postgres",
        "SELECT pg_walfile_name(pg_current_wal_insert_lsn())",
    );
    src.switch_and_wait();
    src.insert(4..=4);
    src.switch_and_wait();

    // The segment holding row 3 is stored, with its checksum, but no longer decodes.
    let key = src
        .s3
        .keys(&format!("{PREFIX}/{DATABASE}/"))
        .into_iter()
        .find(|k| k.ends_with(&format!("/{damaged}.zst")))
        .unwrap_or_else(|| panic!("{damaged} is not archived"));
    let metadata = src.s3.metadata(&key);
    let mut body = src.s3.get(&key);
    let middle = body.len() / 2;
    body[middle] ^= 0xff;
    src.s3.put_with_metadata(&key, body, metadata);

    // Taken as a missing file, recovery would end before row 3 and promote with rows 1 and 2.
    let (_keep, data) = new_data_dir();
    let run = src.recover(&data, &[]);
    run.failed();
    let message = run.message();
    assert!(
        message.contains(&format!(
            "fetching WAL file {damaged} from the archive failed"
        )),
        "{message}"
    );
    assert!(!data.exists() && !data.with_file_name("data.recovering").exists());
}

/// The password of the replication role of the tests below.
const REPLICATION_PASSWORD: &str = "repl-Secr3t-never-printed";

/// A server whose `dbop_replication` role (LOGIN REPLICATION, no superuser) may open only
/// replication connections, as dbop's pg_hba allows it, and the environment of dbop's
/// base-backup Job: libpq variables for that role over TCP and its password in a file.
struct ReplicationSource {
    s3: S3Server,
    pg: Pg,
    dir: tempfile::TempDir,
}

impl ReplicationSource {
    fn start() -> ReplicationSource {
        let s3 = S3Server::start(S3Kind::S3sFs);
        let pg = Pg::start();
        pg.replication_only_role("dbop_replication", REPLICATION_PASSWORD);
        ReplicationSource {
            s3,
            pg,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The Job's environment, with `password` in the password file.
    fn env(&self, password: &str) -> Vec<(String, String)> {
        let file = self.dir.path().join("password");
        std::fs::write(&file, password).unwrap();
        let mut env = self.s3.env();
        env.retain(|(k, _)| !k.starts_with("DBOP_BACKUP_"));
        env.extend(
            [
                // A standby's host, then the -rw Service's, as dbop gives them.
                ("PGHOST", "127.0.0.1,127.0.0.1".to_string()),
                ("PGTARGETSESSIONATTRS", "prefer-standby".into()),
                ("PGCONNECT_TIMEOUT", "10".into()),
                ("PGPORT", self.pg.port.to_string()),
                ("PGUSER", "dbop_replication".into()),
                ("PGAPPNAME", "dbop-backup".into()),
                ("DBOP_BACKUP_PASSWORD_FILE", file.display().to_string()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        env
    }

    /// `base-backup` as the Job runs it, with `password`: the run and its result file's text.
    fn base_backup(&self, id: &str, password: &str) -> (AgentRun, String) {
        let result_file = self.dir.path().join("termination-log");
        let _ = std::fs::remove_file(&result_file);
        let args = [
            "base-backup".to_string(),
            format!("--bucket={BUCKET}"),
            "--prefix=shop/orders".into(),
            "--database=physical".into(),
            format!("--backup-id={id}"),
            format!("--result-file={}", result_file.display()),
            "--fast-checkpoint".into(),
            "--path-style".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = agent(&args, &self.env(password));
        run.assert_no_secrets();
        let written = std::fs::read_to_string(&result_file).unwrap_or_default();
        for text in [&run.stdout, &run.stderr, &written] {
            assert!(
                !text.contains(REPLICATION_PASSWORD) && !text.contains(password),
                "a password in the output:\n{text}"
            );
        }
        (run, written)
    }
}

#[test]
fn a_replication_role_backs_up_into_its_result_file_and_a_rerun_reports_the_same_backup() {
    let src = ReplicationSource::start();
    let id = "20261204T000000Z";
    let (run, written) = src.base_backup(id, REPLICATION_PASSWORD);
    assert_eq!(run.code, Some(0), "base-backup failed:\n{}", run.stderr);
    let result = dbop_backup::result::parse_termination_message(&written).expect("a result");
    assert_eq!(run.result.as_ref(), Some(&result), "stdout's last line");
    assert_eq!(
        (result.outcome, result.operation),
        (
            dbop_backup::Outcome::Succeeded,
            dbop_backup::Operation::BaseBackup
        )
    );
    assert!(
        written.contains(r#""operation":"base-backup""#),
        "{written}"
    );
    let key = format!("shop/orders/physical/base/{id}/base.tar.zst");
    assert_eq!(
        (
            result.backup_id.as_deref(),
            result.database.as_deref(),
            result.bucket.as_deref(),
            result.key.as_deref()
        ),
        (Some(id), Some("physical"), Some(BUCKET), Some(key.as_str()))
    );
    let stored = src.s3.get(&key);
    assert_eq!(result.size_bytes, Some(stored.len() as u64));
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&stored));
    assert_eq!(result.sha256.as_deref(), Some(sha.as_str()));
    assert!(result.raw_bytes.unwrap() > result.size_bytes.unwrap());
    let version = src.pg.psql("postgres", "SHOW server_version");
    assert!(
        version.starts_with(result.engine_version.as_deref().unwrap()),
        "{version}"
    );
    assert!(result.started_at.unwrap() <= result.completed_at.unwrap());
    let message = result.message.clone().unwrap();
    assert!(
        message.contains("timeline 1")
            && message.contains(" taken")
            && message.contains("compressed by the server"),
        "{message}"
    );
    let record_key = format!("shop/orders/physical/base/{id}/backup.json");
    let record = src.s3.get(&record_key);

    // Again with the same id: the same backup, nothing taken or stored again.
    let (again, written) = src.base_backup(id, REPLICATION_PASSWORD);
    assert_eq!(again.code, Some(0), "the rerun failed:\n{}", again.stderr);
    let rerun = dbop_backup::result::parse_termination_message(&written).expect("a result");
    assert_eq!(
        rerun
            .message
            .as_deref()
            .map(|m| m.contains("already complete")),
        Some(true),
        "{written}"
    );
    assert_eq!(
        BackupResult {
            message: None,
            ..rerun
        },
        BackupResult {
            message: None,
            ..result
        }
    );
    assert_eq!(src.s3.get(&key), stored, "the stored backup is untouched");
    assert_eq!(src.s3.get(&record_key), record);
    let manifest_key = format!("shop/orders/physical/base/{id}/backup_manifest.zst");
    assert_eq!(
        src.s3.keys("shop/"),
        vec![record_key.clone(), manifest_key, key.clone()],
        "nothing else stored"
    );
}

#[test]
fn a_wrong_replication_password_fails_as_postgres_without_the_password() {
    let src = ReplicationSource::start();
    let wrong = "wrong-pw-also-secret";
    let (run, written) = src.base_backup("20261204T000001Z", wrong);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let result = dbop_backup::result::parse_termination_message(&written).expect("a result");
    assert_eq!(run.result.as_ref(), Some(&result), "stdout's last line");
    assert_eq!(
        (
            result.outcome,
            result.operation,
            result.failure_kind.as_deref()
        ),
        (
            dbop_backup::Outcome::Failed,
            dbop_backup::Operation::BaseBackup,
            Some("postgres")
        )
    );
    let message = result.message.unwrap_or_default();
    assert!(
        message.contains("password authentication failed"),
        "{message}"
    );
    assert_eq!(src.s3.keys(""), Vec::<String>::new(), "nothing stored");
    assert_eq!(src.s3.s3s_upload_files(), Vec::<String>::new());
}

/// The position `XXXXXXXXYYYYYYYY` of a WAL segment object's name, whatever its timeline;
/// `None` for every other object (history files, partial segments, odd names).
fn segment_position(key: &str) -> Option<String> {
    let name = key.rsplit('/').next()?.strip_suffix(".zst")?;
    let hex = name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| name[8..].to_string())
}

/// Deletes objects through the S3 API.
fn delete_objects(s3: &S3Server, keys: &[String]) {
    for key in keys {
        let key = key.clone();
        s3.sdk(|c| async move {
            c.delete_object()
                .bucket(BUCKET)
                .key(key)
                .send()
                .await
                .expect("delete")
        });
    }
}

#[test]
fn keep_last_prunes_the_oldest_base_backup_and_only_the_wal_before_the_oldest_kept_one() {
    let src = Source::start();
    let wal = format!("{PREFIX}/{DATABASE}/wal/");
    let base = |id: &str| src.s3.keys(&format!("{PREFIX}/{DATABASE}/base/{id}/"));
    // Three base backups, rows and archived WAL before and between them.
    let mut records = Vec::new();
    for (row, id) in [(1, "b1"), (2, "b2")] {
        src.insert(row..=row);
        src.switch_and_wait();
        records.push(stored_record(
            &src.s3,
            &src.base_backup_with(&["--backup-id", id]),
        ));
    }
    src.insert(3..=3);
    src.switch_and_wait();
    // Objects retention must leave alone, and an old segment of another timeline.
    let fakes = [
        (format!("{wal}00000002/00000002.history.zst"), true),
        (
            format!("{wal}00000001/000000010000000000000001.partial.zst"),
            true,
        ),
        (format!("{wal}00000001/notes.txt"), true),
        (format!("{wal}00000002/000000020000000000000001.zst"), false),
    ];
    for (key, _) in &fakes {
        src.s3.put(key, b"x".to_vec());
    }
    let before = src.s3.keys(&wal);

    let run = src.base_backup_with(&["--backup-id", "b3", "--keep-last", "2"]);
    let message = run.message();
    let b2_start = records[1]["startWalFile"]
        .as_str()
        .expect("a start segment");
    let boundary = &b2_start[8..];
    let gone: Vec<&String> = before
        .iter()
        .filter(|k| segment_position(k).is_some_and(|p| p.as_str() < boundary))
        .collect();
    assert!(gone.len() >= 2, "{before:?}");
    assert!(
        message.contains("pruned 1 base backups [b1]")
            && message.contains(&format!("pruned {} WAL files", gone.len())),
        "{message}"
    );
    assert!(base("b1").is_empty(), "{:?}", base("b1"));
    assert_eq!(base("b2").len(), 3, "record, tar, manifest");
    assert_eq!(base("b3").len(), 3);
    let after = src.s3.keys(&wal);
    for key in &before {
        assert_eq!(after.contains(key), !gone.contains(&key), "{key}");
    }
    assert!(
        after.contains(&format!("{wal}00000001/{b2_start}.zst")),
        "the segment holding b2's start is kept: {after:?}"
    );
    for (key, kept) in &fakes {
        assert_eq!(after.contains(key), *kept, "{key}");
    }

    // A re-run finds b3 complete and has nothing left to prune.
    let again = src.base_backup_with(&["--backup-id", "b3", "--keep-last", "2"]);
    let message = again.message();
    assert!(
        message.contains("already complete")
            && message.contains("pruned 0 base backups")
            && message.contains("pruned 0 WAL files"),
        "{message}"
    );

    // Nothing b2 needs was deleted: it recovers to the latest point.
    let fake_keys: Vec<String> = fakes.into_iter().map(|(k, _)| k).collect();
    delete_objects(&src.s3, &fake_keys);
    src.insert(4..=4);
    src.switch_and_wait();
    let (_keep, data) = new_data_dir();
    let run = src.recover(&data, &["--backup-id", "b2"]);
    assert_eq!(run.ok().backup_id.as_deref(), Some("b2"), "{}", run.stdout);
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2,3,4");
}

/// A base backup killed mid-upload (SIGKILL to the whole process group, as the kubelet ends a
/// Job pod past its deadline, or a node that is lost) leaves no record, so nothing restores from
/// it; the Job's retry, with the same id, takes it anew and completes, and its prune counts the
/// killed run as no backup. (Aborting the unfinished upload after the grace period is the
/// shared prune's, tested against a server that lists uploads in `storage.rs`: s3s-fs does
/// not, and the agent says so.)
#[test]
fn a_base_backup_killed_mid_upload_leaves_nothing_restorable_and_its_retry_completes() {
    let src = Source::start();
    // Incompressible rows (~40 MB of tar), so parts are uploaded while the backup streams.
    src.pg.psql(
        "postgres",
        "CREATE TABLE noise AS SELECT decode(md5(g::text || random()::text) || \
         md5(random()::text), 'hex') AS b FROM generate_series(1, 600000) g",
    );
    src.insert(1..=3);
    // pg_basebackup whose stream stalls after 24 MiB: the agent is mid-upload when killed.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(pg_bin_dir().join("psql"), bin.path().join("psql")).unwrap();
    let real = pg_bin_dir().join("pg_basebackup");
    let stalling = bin.path().join("pg_basebackup");
    std::fs::write(
        &stalling,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec {real} --version\n{real} \"$@\" | {{ head -c 25165824; sleep 600; }}\n",
            real = real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stalling, std::fs::Permissions::from_mode(0o755)).unwrap();
    let id = "20261205T060000Z";
    let mut env = src.env();
    env.push((
        "DBOP_BACKUP_PG_BIN_DIR".into(),
        bin.path().display().to_string(),
    ));
    let mut killed = agent_command(
        &["base-backup", "--fast-checkpoint", "--backup-id", id],
        &env,
    );
    killed.process_group(0);
    let child = killed.spawn().unwrap();
    wait_until(60, "an upload begun", || {
        !src.s3.s3s_upload_files().is_empty()
    });
    // Parts stored: the data object's upload is under way, not only begun.
    wait_until(60, "parts stored", || dir_size(&src.s3.root) >= 16 << 20);
    // SAFETY: kill has no memory effects; the group is the agent's own (process_group(0)).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let folder = format!("{PREFIX}/{DATABASE}/base/{id}/");
    assert_eq!(
        src.s3.keys(&folder),
        Vec::<String>::new(),
        "the killed backup stored an object"
    );
    assert!(
        !src.s3.s3s_upload_files().is_empty(),
        "the kill left the upload unfinished"
    );
    let (_keep, data) = new_data_dir();
    let restore = src.restore(&data, &[]);
    assert_ne!(restore.code, Some(0), "restored a killed backup");

    // The Job's retry: the same id, the real pg_basebackup, a prune with no grace left.
    let run = agent(
        &[
            "base-backup",
            "--fast-checkpoint",
            "--backup-id",
            id,
            "--keep-last",
            "5",
            "--incomplete-grace",
            "0s",
        ],
        &src.env(),
    );
    assert_eq!(run.code, Some(0), "the retry failed:\n{}", run.stderr);
    assert!(
        run.stderr
            .contains("does not implement ListMultipartUploads"),
        "{}",
        run.stderr
    );
    let record = stored_record(&src.s3, &run);
    assert_eq!(record["backupId"], id);
    let records: Vec<String> = src
        .s3
        .keys(&format!("{PREFIX}/{DATABASE}/base/"))
        .into_iter()
        .filter(|k| k.ends_with("backup.json"))
        .collect();
    assert_eq!(records, vec![format!("{folder}backup.json")]);
    assert_eq!(restore_and_start(&src, &["--backup-id", id]), "1,2,3");
}

/// The bytes stored below `dir`, which the S3 server is writing: a file or folder that goes
/// away between its listing and its reading (an upload's temporary file) counts as nothing.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue; // gone since it was listed
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {} // gone since it was listed
            }
        }
    }
    total
}

/// A uid the image's /etc/passwd does not list (OpenShift assigns one from the namespace's
/// range; Bitnami's images run as 1001): the server `recover` starts looks its uid up, so the
/// agent gives it an entry with nss_wrapper (libnss-wrapper, which scripts/install-deps.sh
/// installs, as the official Debian images have it) and the recovery finishes.
#[test]
fn recover_runs_as_a_uid_the_image_does_not_list() {
    let (_, gid) = postgres_ids().expect("the tests run as root, to run the agent as another uid");
    let uid = 1_000_650_000;
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(
        !passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some("1000650000"))
    );
    let src = Source::start();
    src.insert(1..=3);
    src.base_backup();
    src.insert(4..=5);
    src.switch_and_wait();

    let (keep, data) = new_data_dir();
    std::fs::set_permissions(keep.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(keep.path(), Some(uid), Some(gid)).unwrap();
    let run = src.recover_as(&data, &[], Some((uid, gid)));
    assert_eq!(run.ok().timeline, Some(2), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("nss_wrapper"), "{}", run.stderr);
    assert_eq!(
        std::fs::metadata(data.join("PG_VERSION")).unwrap().uid(),
        uid
    );
    give_to_postgres(keep.path());
    let mut restored = Restored::start(&data);
    assert_eq!(restored.ids_after_promotion(), "1,2,3,4,5");
}

/// A base backup verified in a scratch instance: recovered with all its WAL into a directory of
/// its own, every table of every database read, the directory deleted, the live server left
/// alone, the recovery time measured. With a WAL segment gone from the bucket, a plain
/// recovery to the latest point ends early and promotes without the later commits; the
/// verification finds that it did not reach the newest archived segment and fails, naming both.
#[test]
fn verify_base_restores_into_a_scratch_it_deletes_and_finds_a_wal_segment_gone() {
    let src = Source::start();
    src.pg.psql("postgres", "CREATE DATABASE shop");
    src.pg.psql(
        "shop",
        "CREATE TABLE o AS SELECT generate_series(1, 10) AS i",
    );
    src.insert(1..=3);
    src.base_backup();
    src.insert(4..=5);
    src.switch_and_wait();

    let (_keep, data) = new_data_dir();
    let run = src.verify_base(&data, &[]);
    let result = run.ok().clone();
    assert_eq!(result.operation, dbop_backup::Operation::Verify);
    assert!(
        result.recovery_millis.is_some_and(|ms| ms > 0),
        "{}",
        run.stdout
    );
    assert_eq!(result.databases, Some(2), "{}", run.stdout);
    let message = run.message();
    assert!(
        message.contains("every archived WAL file replayed")
            && message.contains("2 databases read whole: 2 tables, 15 rows"),
        "{message}"
    );
    assert!(!data.exists() && !data.with_file_name("data.recovering").exists());
    assert_eq!(
        src.pg.psql("postgres", "SELECT count(*) FROM t"),
        "5",
        "the live server is untouched"
    );

    // The segment holding row 6 goes missing from the bucket; row 7 is archived after it.
    src.insert(6..=6);
    let gone = src.pg.psql(
        "postgres",
        "SELECT pg_walfile_name(pg_current_wal_insert_lsn())",
    );
    src.switch_and_wait();
    src.insert(7..=7);
    src.switch_and_wait();
    let key = src
        .s3
        .keys(&format!("{PREFIX}/{DATABASE}/wal/"))
        .into_iter()
        .find(|k| k.ends_with(&format!("/{gone}.zst")))
        .unwrap_or_else(|| panic!("{gone} is not archived"));
    delete_objects(&src.s3, &[key]);

    // What a recovery to the latest point makes of it: rows 1 to 5, promoted, no error.
    let (_keep2, silent) = new_data_dir();
    src.recover(&silent, &[]).ok();
    assert_eq!(Restored::start(&silent).ids_after_promotion(), "1,2,3,4,5");

    let run = src.verify_base(&data, &[]);
    let failed = run.failed();
    assert_eq!(
        failed.failure_kind.as_deref(),
        Some("verify"),
        "{}",
        run.stdout
    );
    let message = run.message();
    assert!(
        message.contains("held WAL up to segment") && message.contains("missing"),
        "{message}"
    );
    assert!(!data.exists() && !data.with_file_name("data.recovering").exists());
}
