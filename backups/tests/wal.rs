//! Continuous WAL archiving through real PostgreSQL and s3s-fs: `wal-push` and `wal-fetch` run
//! as child processes on real WAL segments, the way PostgreSQL calls them (`%p` relative to
//! the data directory). A round trip is byte-identical; a second push uploads nothing; a
//! different or truncated object under the same name is refused and left intact; a corrupted
//! object is refused on fetch with nothing written, exiting with the code that stops recovery;
//! a missing file gives its own exit code
//! quietly; history files round-trip; read-ahead stores the other ready files and leaves
//! markers that their own calls trust only for the same bytes; a stopped server fails within
//! the deadline and leaves nothing; and PostgreSQL itself archives through the agent.

mod common;
use common::*;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine as _;

const DATABASE: &str = "app";
const PREFIX: &str = "pfx";
/// `wal-fetch`'s exit code for a file the archive does not have.
const NOT_FOUND: i32 = dbop_backup::run::WAL_NOT_FOUND;
/// `wal-fetch`'s exit code for every other failure: PostgreSQL stops recovery on it.
const FETCH_FAILED: i32 = dbop_backup::run::WAL_FETCH_FAILED;

/// Whole WAL segments written by a real PostgreSQL, made once per test process.
struct Segments {
    dir: PathBuf,
    names: Vec<String>,
}

/// Writes rows into `count` segments, closing each with `pg_switch_wal()`: the data
/// directory and the names of the segments completed.
fn write_and_switch(pg: &Pg, count: u32) -> (PathBuf, Vec<String>) {
    let data = PathBuf::from(pg.psql("postgres", "SHOW data_directory"));
    pg.psql("postgres", "CREATE TABLE t (id int, v text)");
    let names = (1..=count)
        .map(|i| {
            let rows = 1000 * i;
            let insert =
                format!("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, {rows}) g");
            pg.psql("postgres", &insert);
            let name = pg.psql("postgres", "SELECT pg_walfile_name(pg_current_wal_lsn())");
            pg.psql("postgres", "SELECT pg_switch_wal()");
            name
        })
        .collect();
    (data, names)
}

/// Three real segments, each with rows written into it, closed by `pg_switch_wal()`.
fn segments() -> &'static Segments {
    static SEGMENTS: OnceLock<Segments> = OnceLock::new();
    SEGMENTS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wal-segments");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pg = Pg::start();
        let (data, names) = write_and_switch(&pg, 3);
        for name in &names {
            std::fs::copy(data.join("pg_wal").join(name), dir.join(name)).unwrap();
        }
        Segments { dir, names }
    })
}

fn segment_bytes(name: &str) -> Vec<u8> {
    std::fs::read(segments().dir.join(name)).unwrap()
}

/// A data directory as the archiver sees it: `pg_wal/` with the given segments, those of
/// `ready` marked in `pg_wal/archive_status/`.
fn data_dir(files: &[(&str, Vec<u8>)], ready: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("pg_wal/archive_status");
    std::fs::create_dir_all(&status).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join("pg_wal").join(name), bytes).unwrap();
    }
    for name in ready {
        std::fs::write(status.join(format!("{name}.ready")), "").unwrap();
    }
    dir
}

fn wal_env(s3: &S3Server) -> Vec<(String, String)> {
    let mut env = s3.env();
    env.extend([
        ("DBOP_BACKUP_DATABASE".into(), DATABASE.into()),
        ("DBOP_BACKUP_PREFIX".into(), PREFIX.into()),
    ]);
    env
}

/// `wal-push pg_wal/<name> <name>` from the data directory, as PostgreSQL runs it.
fn push(env: &[(String, String)], data: &Path, name: &str) -> AgentRun {
    let path = format!("pg_wal/{name}");
    let mut cmd = agent_command(&["wal-push", &path, name], env);
    cmd.current_dir(data);
    let run = parse_run(cmd.output().expect("run agent"));
    run.assert_no_secrets();
    run
}

fn fetch(env: &[(String, String)], name: &str, target: &Path) -> AgentRun {
    let target = target.display().to_string();
    let run = agent(&["wal-fetch", name, &target], env);
    run.assert_no_secrets();
    run
}

fn key_of(name: &str) -> String {
    format!("{PREFIX}/{DATABASE}/wal/{}/{name}.zst", &name[..8])
}

/// The file s3s-fs keeps an object in.
fn object_file(s3: &S3Server, key: &str) -> PathBuf {
    s3.root.join(BUCKET).join(key)
}

fn assert_ok(run: &AgentRun) {
    assert_eq!(run.code, Some(0), "agent failed:\n{}", run.stderr);
}

fn assert_failed(run: &AgentRun, code: i32) {
    assert_eq!(run.code, Some(code), "exit code; stderr:\n{}", run.stderr);
}

/// Files in `dir` other than the ones named.
fn leftovers(dir: &Path, except: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !except.contains(&n.as_str()))
        .collect()
}

#[test]
fn push_then_fetch_is_byte_identical_and_a_second_push_uploads_nothing() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let env = wal_env(&s3);
    let name = &segments().names[0];
    let bytes = segment_bytes(name);
    let data = data_dir(&[(name, bytes.clone())], &[name]);

    assert_ok(&push(&env, data.path(), name));
    let key = key_of(name);
    assert_eq!(
        s3.keys(&format!("{PREFIX}/{DATABASE}/wal/")),
        vec![key.clone()]
    );
    let meta = s3.metadata(&key);
    assert_eq!(
        meta.get("dbop-sha256").map(String::as_str),
        Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)).as_str())
    );
    let stored = std::fs::metadata(object_file(&s3, &key)).unwrap();
    assert!(
        stored.len() < bytes.len() as u64 / 4,
        "compressed: {}",
        stored.len()
    );

    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("RECOVERYXLOG");
    assert_ok(&fetch(&env, name, &target));
    assert!(
        std::fs::read(&target).unwrap() == bytes,
        "fetched bytes differ"
    );
    assert_eq!(
        leftovers(out.path(), &["RECOVERYXLOG"]),
        Vec::<String>::new()
    );

    // Again: success, and the stored object is the very same file (not rewritten).
    let again = push(&env, data.path(), name);
    assert_ok(&again);
    assert!(
        again.stderr.contains("nothing uploaded"),
        "{}",
        again.stderr
    );
    let after = std::fs::metadata(object_file(&s3, &key)).unwrap();
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (stored.ino(), stored.mtime_nsec())
    );
}

#[test]
fn a_different_or_truncated_object_under_the_same_name_is_refused_and_left_intact() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let env = wal_env(&s3);
    let names = &segments().names;
    let name = &names[0];
    // Another cluster's segment of the same name: other bytes.
    let theirs = data_dir(&[(name, segment_bytes(&names[1]))], &[]);
    assert_ok(&push(&env, theirs.path(), name));
    let key = key_of(name);
    let stored = s3.get(&key);

    let ours = data_dir(&[(name, segment_bytes(name))], &[]);
    let refused = push(&env, ours.path(), name);
    assert_failed(&refused, dbop_backup::error::PERMANENT);
    assert!(
        refused.stderr.contains(&key),
        "names the key: {}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("refusing to overwrite"),
        "{}",
        refused.stderr
    );
    assert!(s3.get(&key) == stored, "the stored object was changed");

    // A body cut short (an interrupted write) with the right checksum in its metadata is not
    // "the same file" either.
    let fresh = data_dir(&[(&names[2], segment_bytes(&names[2]))], &[]);
    assert_ok(&push(&env, fresh.path(), &names[2]));
    let key2 = key_of(&names[2]);
    let full = s3.get(&key2);
    let meta = s3.metadata(&key2);
    s3.put_with_metadata(&key2, full[..full.len() / 2].to_vec(), meta);
    let refused = push(&env, fresh.path(), &names[2]);
    assert_failed(&refused, dbop_backup::error::PERMANENT);
    assert!(
        refused.stderr.contains("were written"),
        "{}",
        refused.stderr
    );

    // An object without the agent's metadata counts only if its contents are the same.
    s3.put_with_metadata(&key2, full.clone(), Default::default());
    assert_ok(&push(&env, fresh.path(), &names[2]));
    s3.put_with_metadata(&key2, stored.clone(), Default::default());
    assert_failed(
        &push(&env, fresh.path(), &names[2]),
        dbop_backup::error::PERMANENT,
    );
    assert!(s3.get(&key2) == stored);
}

#[test]
fn a_corrupted_object_is_refused_on_fetch_and_nothing_is_written() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let env = wal_env(&s3);
    let names = &segments().names;
    let data = data_dir(
        &[
            (&names[0], segment_bytes(&names[0])),
            (&names[1], segment_bytes(&names[1])),
        ],
        &[],
    );
    for name in &names[..2] {
        assert_ok(&push(&env, data.path(), name));
    }
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("RECOVERYXLOG");

    // A flipped byte in the stored body.
    let file = object_file(&s3, &key_of(&names[0]));
    let mut body = std::fs::read(&file).unwrap();
    let mid = body.len() / 2;
    body[mid] ^= 0x55;
    std::fs::write(&file, &body).unwrap();
    // A well-formed object of other contents under the checksum of the first.
    let other = s3.get(&key_of(&names[1]));
    s3.put_with_metadata(
        &key_of(&names[1]),
        other.clone(),
        s3.metadata(&key_of(&names[0])),
    );

    for name in &names[..2] {
        let run = fetch(&env, name, &target);
        assert_failed(&run, FETCH_FAILED);
        assert!(
            run.stderr.contains("integrity check failed"),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains(&key_of(name)), "{}", run.stderr);
        assert_eq!(
            leftovers(out.path(), &[]),
            Vec::<String>::new(),
            "nothing written"
        );
    }
}

#[test]
fn a_missing_file_exits_with_the_not_found_code_quietly() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let env = wal_env(&s3);
    let out = tempfile::tempdir().unwrap();
    for name in ["000000010000000000000007", "00000002.history"] {
        let run = fetch(&env, name, &out.path().join("RECOVERYXLOG"));
        assert_failed(&run, NOT_FOUND);
        assert!(
            !run.stderr.contains("ERROR") && !run.stderr.contains("WARN"),
            "{}",
            run.stderr
        );
    }
    assert_eq!(leftovers(out.path(), &[]), Vec::<String>::new());
    // A name that is no WAL file is a usage error, whatever the archive holds.
    let run = fetch(&env, "../../etc/passwd", &out.path().join("x"));
    assert_failed(&run, FETCH_FAILED);
    assert!(run.stderr.contains("not a WAL file name"), "{}", run.stderr);
}

#[test]
fn a_timeline_history_file_round_trips_and_encrypted_wal_needs_its_key() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let history = b"1\t0/3000060\tno recovery target specified\n".to_vec();
    let name = "00000002.history";
    let keys = tempfile::tempdir().unwrap();
    let mut raw = [0u8; 32];
    raw.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i as u8).wrapping_mul(37) ^ 0x5a);
    let key_text = base64::engine::general_purpose::STANDARD.encode(raw);
    std::fs::write(keys.path().join("k1"), &key_text).unwrap();
    let plain_env = wal_env(&s3);
    let mut env = plain_env.clone();
    env.extend([
        (
            "DBOP_BACKUP_ENCRYPTION_KEY_DIR".into(),
            keys.path().display().to_string(),
        ),
        ("DBOP_BACKUP_ENCRYPTION_KEY".into(), "k1".into()),
    ]);

    let data = data_dir(&[(name, history.clone())], &[]);
    assert_ok(&push(&env, data.path(), name));
    let key = format!("{PREFIX}/{DATABASE}/wal/00000002/{name}.zst");
    let stored = s3.get(&key);
    assert!(stored.starts_with(b"DBOPENC1"), "encrypted");
    assert!(
        !stored.windows(12).any(|w| w == b"no recovery "),
        "no plaintext"
    );
    assert_eq!(
        s3.metadata(&key)
            .get("dbop-encryption-key")
            .map(String::as_str),
        Some("k1")
    );

    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("RECOVERYHISTORY");
    let without = fetch(&plain_env, name, &target);
    assert_failed(&without, FETCH_FAILED);
    assert!(without.stderr.contains("k1"), "{}", without.stderr);
    assert!(!without.stderr.contains(&key_text));
    assert!(!target.exists());
    assert_ok(&fetch(&env, name, &target));
    assert_eq!(std::fs::read(&target).unwrap(), history);
}

#[test]
fn read_ahead_stores_the_other_ready_files_and_their_calls_trust_only_a_matching_marker() {
    let mut s3 = S3Server::start(S3Kind::S3sFs);
    // The default deadline while the server is up (three segments on a loaded machine can
    // take longer than 3 s), a short one once it is gone.
    let up = wal_env(&s3);
    let env = with_env(wal_env(&s3), "DBOP_BACKUP_WAL_DEADLINE", "3s");
    let names = &segments().names;
    let files: Vec<(&str, Vec<u8>)> = names
        .iter()
        .map(|n| (n.as_str(), segment_bytes(n)))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let data = data_dir(&files, &refs);

    assert_ok(&push(&up, data.path(), &names[0]));
    let mut want: Vec<String> = names.iter().map(|n| key_of(n)).collect();
    want.sort();
    assert_eq!(
        s3.keys(&format!("{PREFIX}/")),
        want,
        "all three stored by one call"
    );
    let spool = data.path().join("dbop-wal-spool");
    let mut markers = leftovers(&spool, &[]);
    markers.sort();
    assert_eq!(
        markers,
        [
            format!("{}.archived", names[1]),
            format!("{}.archived", names[2])
        ]
    );

    // With the server gone, the call for the second returns at once on its marker alone…
    s3.kill();
    assert_ok(&push(&env, data.path(), &names[1]));
    assert!(
        !spool.join(format!("{}.archived", names[1])).exists(),
        "marker used up"
    );
    // …but a marker for other bytes under the same name proves nothing.
    std::fs::write(
        data.path().join("pg_wal").join(&names[2]),
        segment_bytes(&names[0]),
    )
    .unwrap();
    let run = push(&env, data.path(), &names[2]);
    assert_failed(&run, 1);
    assert!(
        run.stderr.contains("spool marker that does not match"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_stopped_server_fails_within_the_deadline_and_leaves_nothing_counted_as_archived() {
    let mut s3 = S3Server::start(S3Kind::S3sFs);
    let env = with_env(wal_env(&s3), "DBOP_BACKUP_WAL_DEADLINE", "2s");
    let names = &segments().names;
    let files: Vec<(&str, Vec<u8>)> = names[..2]
        .iter()
        .map(|n| (n.as_str(), segment_bytes(n)))
        .collect();
    let data = data_dir(&files, &[&names[0], &names[1]]);

    s3.kill();
    let started = Instant::now();
    let run = push(&env, data.path(), &names[0]);
    assert_failed(&run, 1);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        !data
            .path()
            .join("dbop-wal-spool")
            .join(format!("{}.archived", names[1]))
            .exists()
    );

    s3.restart();
    assert_eq!(s3.keys(""), Vec::<String>::new(), "nothing stored");
    let env = wal_env(&s3);
    assert_ok(&push(&env, data.path(), &names[0]));
    let out = tempfile::tempdir().unwrap();
    for name in &names[..2] {
        let target = out.path().join(name);
        assert_ok(&fetch(&env, name, &target));
        assert!(std::fs::read(&target).unwrap() == segment_bytes(name));
    }
}

/// A script PostgreSQL runs as `archive_command`: the agent with the test server's settings,
/// the S3 key in files (nothing secret in the command or its environment).
fn archive_script(dir: &Path, s3: &S3Server) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let id = file("access-key-id", S3_ACCESS_KEY);
    let secret = file("secret-access-key", S3_SECRET_KEY);
    // The agent from here: PostgreSQL runs as the postgres user when the tests run as root, and
    // the build's own directory may sit in one only root can enter (a clone in `mktemp -d`).
    let agent = dir.join("dbop-backup");
    std::fs::copy(env!("CARGO_BIN_EXE_dbop-backup"), &agent).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!(
        "#!/bin/sh\nexec env -i PATH=/usr/bin:/bin AWS_ENDPOINT_URL={} AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true DBOP_BACKUP_BUCKET={BUCKET} DBOP_BACKUP_PATH_STYLE=true DBOP_BACKUP_PREFIX={PREFIX} DBOP_BACKUP_DATABASE={DATABASE} DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE={id} DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE={secret} {} wal-push \"$1\" \"$2\"\n",
        s3.endpoint(),
        agent.display(),
    );
    PathBuf::from(file("archive.sh", &script))
}

#[test]
fn postgresql_archives_every_segment_through_the_agent() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let dir = tempfile::tempdir().unwrap();
    let script = archive_script(dir.path(), &s3);
    let command = format!("{} %p %f", script.display());
    let pg = Pg::start_with(&[("archive_mode", "on"), ("archive_command", &command)]);
    let (data, names) = write_and_switch(&pg, 5);
    let last = names.last().unwrap().clone();
    wait_until(30, "PostgreSQL to archive every segment", || {
        pg.psql(
            "postgres",
            "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver",
        ) >= last
    });
    let failed = pg.psql("postgres", "SELECT failed_count FROM pg_stat_archiver");
    assert_eq!(failed, "0", "pg_stat_archiver.failed_count");
    let keys = s3.keys(&format!("{PREFIX}/{DATABASE}/wal/"));
    for name in &names {
        assert!(keys.contains(&key_of(name)), "{name} missing from {keys:?}");
        let target = dir.path().join(format!("fetched-{name}"));
        assert_ok(&fetch(&wal_env(&s3), name, &target));
        let original = std::fs::read(data.join("pg_wal").join(name)).unwrap();
        assert!(
            std::fs::read(&target).unwrap() == original,
            "{name} differs"
        );
    }
}
