//! Every fault, each its own test: a non-zero exit, a Failed result naming what failed (and no
//! secret), the multipart upload aborted, no manifest; restores that commit nothing. A server
//! not listening yet is waited for, not a fault.

mod common;
use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;

fn app(pg: &Pg) {
    pg.create_db("app");
    fill_varied(pg, "app", 2_000, 2);
}

fn assert_nothing_complete(s3: &S3Server) {
    let keys = s3.keys("");
    assert!(
        keys.iter()
            .all(|k| !k.ends_with("manifest.json") && !k.ends_with("dump.pgc.zst")),
        "{keys:?}"
    );
}

#[test]
fn dump_fails_when_s3_is_unreachable() {
    let pg = Pg::start();
    app(&pg);
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let mut env = pg.env("app");
    env.extend(s3_env(&endpoint));
    let run = agent(&["dump"], &env);
    let r = run.failed();
    let m = run.message();
    assert!(
        m.contains(&endpoint) && m.contains("bucket 'backups'"),
        "{m}"
    );
    assert_eq!(r.database.as_deref(), Some("app"));
}

#[test]
fn dump_fails_with_wrong_s3_credentials() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    app(&pg);
    let env = with_env(
        env_of(&pg, "app", &s3),
        "AWS_SECRET_ACCESS_KEY",
        "wrong-s3-secret",
    );
    let run = agent(&["dump"], &env);
    run.failed();
    let m = run.message();
    assert!(
        m.contains("bucket 'backups'") && m.contains(&s3.endpoint()),
        "{m}"
    );
    assert!(
        m.contains("AWS_SECRET_ACCESS_KEY") || m.contains("Forbidden") || m.contains("denied"),
        "{m}"
    );
    assert_nothing_complete(&s3);
}

fn missing_bucket(kind: S3Kind) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    app(&pg);
    let run = agent(
        &["dump", "--bucket", "no-such-bucket"],
        &env_of(&pg, "app", &s3),
    );
    run.failed();
    let m = run.message();
    assert!(
        m.contains("no-such-bucket") && m.contains("does not exist"),
        "{m}"
    );
}

#[test]
fn dump_fails_for_a_missing_bucket_s3s_fs() {
    missing_bucket(S3Kind::S3sFs);
}

#[test]
fn dump_fails_for_a_missing_bucket_moto() {
    missing_bucket(S3Kind::Moto);
}

#[test]
fn dump_fails_for_a_wrong_database_password() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    app(&pg);
    let env = with_env(
        env_of(&pg, "app", &s3),
        "PGPASSWORD",
        "wrong-pw-also-secret",
    );
    let run = agent(&["dump"], &env);
    run.failed();
    let m = run.message();
    assert!(
        m.contains("database 'app'") && m.contains("password authentication failed"),
        "{m}"
    );
    assert!(m.contains(&format!("127.0.0.1:{}", pg.port)), "{m}");
    assert_nothing_complete(&s3);
}

/// Forwards every connection to 127.0.0.1:`from` to 127.0.0.1:`to`, for the test's life.
fn forward(from: u16, to: u16) {
    let listener = TcpListener::bind(("127.0.0.1", from)).expect("bind the forwarded port");
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let pipe = |mut a: TcpStream, mut b: TcpStream| {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a, &mut b);
                    let _ = b.shutdown(Shutdown::Write);
                })
            };
            pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
            pipe(server, client);
        }
    });
}

/// A server that does not listen yet (its pod restarting behind the Service, a name server that
/// did not answer) is tried again: once it listens, the dump goes ahead.
#[test]
fn dump_waits_for_a_server_that_is_not_listening_yet() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    app(&pg);
    let port = free_port();
    let env = with_env(env_of(&pg, "app", &s3), "PGPORT", &port.to_string());
    let mut child = agent_command(&["dump"], &env).spawn().expect("agent");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (lines, said) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = lines.send(line);
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = said.recv_timeout(left) else {
            panic!(
                "the agent did not say it retries: {}",
                reader.join().unwrap()
            );
        };
        if line.contains("psql could not connect") && line.contains("Connection refused") {
            break;
        }
    }
    forward(port, pg.port);
    let mut out = child.wait_with_output().unwrap();
    out.stderr = reader.join().unwrap().into_bytes();
    let run = parse_run(out);
    let key = run.ok().key.clone().unwrap_or_default();
    assert!(key.ends_with("/dump.pgc.zst"), "{}", run.stdout);
    assert!(run.stderr.contains("retrying in"), "{}", run.stderr);
    run.assert_no_secrets();
}

#[test]
fn dump_fails_for_a_missing_database() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    let run = agent(&["dump"], &env_of(&pg, "nosuchdb", &s3));
    run.failed();
    let m = run.message();
    assert!(
        m.contains("database 'nosuchdb'") && m.contains("does not exist"),
        "{m}"
    );
    assert_nothing_complete(&s3);
}

/// A dump slow enough to interrupt: hard-to-compress data at zstd level 19, 5 MiB parts.
fn slow_dump(pg: &Pg, s3: &S3Server, extra: &[&str]) -> std::process::Child {
    slow_dump_of(pg, s3, 32, extra)
}

/// A dump of `megabytes` of hard-to-compress rows at a slow compression level.
fn slow_dump_of(pg: &Pg, s3: &S3Server, megabytes: u64, extra: &[&str]) -> std::process::Child {
    pg.create_db("app");
    fill_bulky(pg, "app", megabytes);
    let mut args = vec!["dump", "--compression-level", "12", "--part-size", "5MiB"];
    args.extend_from_slice(extra);
    agent_command(&args, &env_of(pg, "app", s3))
        .spawn()
        .expect("agent")
}

fn wait_first_part(s3: &S3Server) {
    match s3.kind {
        S3Kind::S3sFs => wait_until(120, "the first part", || {
            s3.s3s_upload_files()
                .iter()
                .any(|f| f.starts_with(".upload_id-"))
        }),
        S3Kind::Moto => {
            wait_until(120, "the upload to start", || !s3.uploads().is_empty());
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
}

#[test]
fn dump_fails_when_s3_dies_mid_upload() {
    let pg = Pg::start();
    let mut s3 = S3Server::start(S3Kind::S3sFs);
    let child = slow_dump(&pg, &s3, &[]);
    wait_first_part(&s3);
    s3.kill();
    let run = parse_run(child.wait_with_output().unwrap());
    run.failed();
    let m = run.message();
    assert!(
        m.contains(&s3.endpoint()) && m.contains("bucket 'backups'"),
        "{m}"
    );
    s3.restart();
    assert_nothing_complete(&s3);
}

fn pg_dump_dies(kind: S3Kind) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    // Larger than everything the agent buffers (parts in flight, the channel, the compressor,
    // pipes: ~20 MiB compressed), so pg_dump's COPY is still running when its backend dies.
    let child = slow_dump_of(&pg, &s3, 128, &[]);
    wait_first_part(&s3);
    let killed = pg.psql(
        "postgres",
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query ILIKE 'COPY %'",
    );
    assert_eq!(killed, "1", "pg_dump's COPY was running");
    let run = parse_run(child.wait_with_output().unwrap());
    run.failed();
    let m = run.message();
    assert!(m.contains("pg_dump failed for database 'app'"), "{m}");
    assert_nothing_complete(&s3);
    match kind {
        S3Kind::Moto => assert!(s3.uploads().is_empty(), "upload aborted"),
        S3Kind::S3sFs => assert!(s3.s3s_upload_files().is_empty(), "upload aborted"),
    }
}

#[test]
fn dump_fails_when_pg_dump_dies_s3s_fs() {
    pg_dump_dies(S3Kind::S3sFs);
}

#[test]
fn dump_fails_when_pg_dump_dies_moto() {
    pg_dump_dies(S3Kind::Moto);
}

fn sigterm(kind: S3Kind) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    let dir = tempfile::tempdir().unwrap();
    let result_file = dir.path().join("termination-log");
    let rf = result_file.to_str().unwrap().to_string();
    let child = slow_dump(&pg, &s3, &["--result-file", &rf]);
    wait_first_part(&s3);
    // No secret on any command line while the dump runs (pg_dump, psql, the agent).
    for line in all_command_lines().iter().filter(|l| !l.contains("s3s-fs")) {
        assert!(
            !line.contains(PG_PASSWORD) && !line.contains(S3_SECRET_KEY),
            "secret on a command line: {line}"
        );
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let run = parse_run(child.wait_with_output().unwrap());
    assert_eq!(run.code, Some(143), "{}", run.stderr);
    run.failed();
    assert!(
        run.message().contains("interrupted by SIGTERM"),
        "{}",
        run.message()
    );
    let written = std::fs::read_to_string(&result_file).unwrap();
    assert_eq!(written.trim(), run.stdout.trim());
    assert_nothing_complete(&s3);
    match kind {
        S3Kind::Moto => assert!(s3.uploads().is_empty(), "upload aborted"),
        S3Kind::S3sFs => assert!(s3.s3s_upload_files().is_empty(), "upload aborted"),
    }
    // pg_dump and the snapshot session are gone.
    wait_until(10, "pg_dump's session to end", || {
        pg.psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dbop-backup'",
        ) == "0"
    });
}

#[test]
fn sigterm_during_dump_s3s_fs() {
    sigterm(S3Kind::S3sFs);
}

#[test]
fn sigterm_during_dump_moto() {
    sigterm(S3Kind::Moto);
}

/// A good backup of `app` and an empty `target` database.
fn backed_up(kind: S3Kind) -> (Pg, S3Server, dbop_backup::BackupResult) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    app(&pg);
    // Enough data that pg_restore gets far into the archive before the end is held back.
    pg.psql(
        "app",
        "CREATE TABLE filler AS SELECT i, md5(i::text) AS h FROM generate_series(1, 100000) i",
    );
    let r = agent(&["dump"], &env_of(&pg, "app", &s3)).ok().clone();
    pg.create_db("target");
    (pg, s3, r)
}

fn restore_into_target(pg: &Pg, s3: &S3Server) -> AgentRun {
    agent(
        &["restore", "latest", "--source-database", "app"],
        &env_of(pg, "target", s3),
    )
}

fn edit_manifest(
    s3: &S3Server,
    r: &dbop_backup::BackupResult,
    f: impl FnOnce(&mut dbop_backup::Manifest),
) {
    let key = r.manifest_key.clone().unwrap();
    let mut m = dbop_backup::Manifest::parse(&s3.get(&key)).unwrap();
    f(&mut m);
    s3.put(&key, m.to_json());
}

fn assert_target_untouched(pg: &Pg) {
    assert_eq!(
        pg.table_count("target"),
        0,
        "nothing committed into the target"
    );
}

#[test]
fn restore_with_a_checksum_mismatch_commits_nothing() {
    // The object decodes perfectly; only the SHA-256, known at the very end, disagrees. The
    // held-back end of the archive must never reach pg_restore.
    let (pg, s3, r) = backed_up(S3Kind::S3sFs);
    edit_manifest(&s3, &r, |m| m.sha256 = "ab".repeat(32));
    let run = restore_into_target(&pg, &s3);
    run.failed();
    assert!(run.message().contains("sha256"), "{}", run.message());
    // Every object of a backup of several databases (here app and postgres) is checked before
    // anything is created; the held-back end (unit-tested in `restore`) guards the stream too.
    assert!(
        run.message().contains("before committing")
            || run.message().contains("nothing was restored"),
        "{}",
        run.message()
    );
    assert_target_untouched(&pg);
}

#[test]
fn restore_of_a_truncated_object_commits_nothing() {
    let (pg, s3, r) = backed_up(S3Kind::Moto);
    let key = r.key.clone().unwrap();
    let object = s3.get(&key);
    let cut = object[..object.len() * 3 / 4].to_vec();
    s3.put(&key, cut.clone());
    // The announced length already disagrees with the manifest.
    let run = restore_into_target(&pg, &s3);
    run.failed();
    assert!(
        run.message().contains("integrity check failed"),
        "{}",
        run.message()
    );
    assert_target_untouched(&pg);
    // With the manifest's size made to match, the truncation is found by decoding.
    use sha2::Digest;
    edit_manifest(&s3, &r, |m| {
        m.size_bytes = cut.len() as u64;
        m.sha256 = hex::encode(sha2::Sha256::digest(&cut));
    });
    let run = restore_into_target(&pg, &s3);
    run.failed();
    assert!(
        run.message().contains("corrupted or truncated"),
        "{}",
        run.message()
    );
    assert_target_untouched(&pg);
}

#[test]
fn restore_of_a_corrupted_object_commits_nothing() {
    let (pg, s3, r) = backed_up(S3Kind::S3sFs);
    let key = r.key.clone().unwrap();
    let mut object = s3.get(&key);
    let at = object.len() * 9 / 10;
    object[at] ^= 0xff;
    s3.put(&key, object);
    let run = restore_into_target(&pg, &s3);
    run.failed();
    assert!(
        run.message().contains("integrity check failed"),
        "{}",
        run.message()
    );
    assert_target_untouched(&pg);
}

#[test]
fn restore_error_leaves_the_target_as_it_was() {
    let (pg, s3, _) = backed_up(S3Kind::S3sFs);
    pg.psql(
        "target",
        "CREATE TABLE filler (i int); INSERT INTO filler VALUES (42)",
    );
    let run = restore_into_target(&pg, &s3);
    run.failed();
    let m = run.message();
    assert!(
        m.contains("pg_restore failed for database 'target'")
            && m.contains("nothing was committed"),
        "{m}"
    );
    assert_eq!(pg.table_count("target"), 1);
    assert_eq!(
        pg.psql("target", "SELECT string_agg(i::text, ',') FROM filler"),
        "42"
    );
}

#[test]
fn restore_of_a_missing_backup_fails_clearly() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("target");
    let run = agent(&["restore", "latest"], &env_of(&pg, "target", &s3));
    run.failed();
    assert!(
        run.message()
            .contains("no complete backup of database 'target'"),
        "{}",
        run.message()
    );
    let run = agent(
        &["restore", "20200101T000000Z"],
        &env_of(&pg, "target", &s3),
    );
    run.failed();
    assert!(
        run.message().contains("has no manifest"),
        "{}",
        run.message()
    );
}

#[test]
fn verify_reports_the_first_difference() {
    let (pg, s3, r) = backed_up(S3Kind::S3sFs);
    edit_manifest(&s3, &r, |m| {
        m.row_counts.insert("public.filler".into(), 99_999);
    });
    let run = agent(
        &["verify", "latest", "--source-database", "app"],
        &env_of(&pg, "postgres", &s3),
    );
    run.failed();
    let m = run.message();
    assert!(
        m.contains("table public.filler: manifest has 99999 rows, restored database has 100000"),
        "{m}"
    );
    let leftovers = pg.psql(
        "postgres",
        "SELECT count(*) FROM pg_database WHERE datname LIKE 'dbop_verify_%'",
    );
    assert_eq!(leftovers, "0", "scratch database dropped");
}

#[test]
fn verify_refuses_a_tampered_object() {
    // One flipped byte in the stored dump: verify fails on integrity before any row is counted,
    // and the scratch database is dropped.
    let (pg, s3, r) = backed_up(S3Kind::S3sFs);
    let key = r.key.clone().unwrap();
    let mut object = s3.get(&key);
    let at = object.len() / 2;
    object[at] ^= 0x01;
    s3.put(&key, object);
    let run = agent(
        &["verify", "latest", "--source-database", "app"],
        &env_of(&pg, "postgres", &s3),
    );
    run.failed();
    let m = run.message();
    assert!(m.contains("integrity check failed"), "{m}");
    assert!(!m.contains("row counts match"), "{m}");
    let leftovers = pg.psql(
        "postgres",
        "SELECT count(*) FROM pg_database WHERE datname LIKE 'dbop_verify_%'",
    );
    assert_eq!(leftovers, "0", "scratch database dropped");
}
