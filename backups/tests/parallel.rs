//! Parallel dumps (`--jobs`): one database dumped in several pg_dump streams on one exported
//! snapshot, stored in parts, restored in one transaction or in steps (`restore --jobs`).
//! Against real PostgreSQL and an S3 server: a hostile schema comes back identical both ways;
//! money moved between two tables in different streams while the dump runs adds up after the
//! restore (one snapshot); a tampered or missing part refuses the restore in one transaction
//! and leaves the target as it was; in steps, a tampered stream's rows never commit, a
//! non-empty target is refused, and an object swapped for another backup's commits nothing.

mod common;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use dbop_backup::Manifest;

/// Objects pg_dump sorts into every section, with names that need quoting everywhere.
const HOSTILE: &str = r#"
CREATE SCHEMA "Sp ace ""q"".s";
CREATE TYPE "Sp ace ""q"".s"."mood" AS ENUM ('sad', 'ok', 'it''s fine');
CREATE DOMAIN "Sp ace ""q"".s".positive AS int CHECK (VALUE > 0);
CREATE TABLE "Sp ace ""q"".s"."T a*b?" (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  m "Sp ace ""q"".s"."mood", p "Sp ace ""q"".s".positive, note text);
INSERT INTO "Sp ace ""q"".s"."T a*b?" (m, p, note)
  SELECT (ARRAY['sad','ok','it''s fine'])[1 + i % 3]::"Sp ace ""q"".s"."mood", i, E'n\n\t' || i
  FROM generate_series(1, 30000) i;
CREATE TABLE child_rows (id serial PRIMARY KEY,
  parent int REFERENCES "Sp ace ""q"".s"."T a*b?" (id), body text);
INSERT INTO child_rows (parent, body) SELECT 1 + i % 30000, repeat('x', i % 200)
  FROM generate_series(1, 60000) i;
CREATE TABLE parted (id int, k int) PARTITION BY RANGE (k);
CREATE TABLE parted_a PARTITION OF parted FOR VALUES FROM (0) TO (50);
CREATE TABLE parted_b PARTITION OF parted FOR VALUES FROM (50) TO (100);
INSERT INTO parted SELECT i, i % 100 FROM generate_series(1, 40000) i;
CREATE TABLE audited (id int);
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE 'no'; END $$;
INSERT INTO audited SELECT generate_series(1, 100);
CREATE TRIGGER no_more BEFORE INSERT ON audited FOR EACH ROW EXECUTE FUNCTION refuse();
CREATE INDEX ON child_rows (parent);
CREATE MATERIALIZED VIEW mv AS SELECT parent, count(*) FROM child_rows GROUP BY parent;
CREATE SEQUENCE lonely START 40;
SELECT nextval('lonely'), nextval('lonely');
SELECT lo_from_bytea(0, decode(repeat('0a5c', 50000), 'hex'));
CREATE TABLE empty_one (id int);
"#;

/// A server whose database `app` holds `sql`, and an S3 server.
fn servers(sql: &str) -> (Pg, S3Server) {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    pg.psql("app", sql);
    (pg, s3)
}

/// `dump --jobs`, slicing tables from 1 MiB (these tables are small; the default is 64 MiB).
fn dump(env: &[(String, String)], prefix: &str, jobs: &str) -> AgentRun {
    let split = ["--split-tables-larger-than", "1MiB"];
    agent(
        &[&["dump", "--prefix", prefix, "--jobs", jobs][..], &split].concat(),
        env,
    )
}

fn manifest(s3: &S3Server, run: &AgentRun) -> Manifest {
    let key = run.ok().manifest_key.clone().expect("a manifest key");
    Manifest::parse(&s3.get(&key)).expect("a manifest")
}

/// The manifest of an encrypted backup, opened with `key` (its base64 text).
fn sealed_manifest(s3: &S3Server, run: &AgentRun, key: &str) -> Manifest {
    use dbop_backup::manifest::Stored;
    let stored = s3.get(run.ok().manifest_key.as_deref().expect("a manifest key"));
    let Ok(Stored::Sealed(sealed)) = Stored::parse(&stored) else {
        panic!("the manifest is not sealed")
    };
    let key = dbop_backup::crypto::Key::parse("k1", key.as_bytes()).expect("a key");
    sealed.open(&key).expect("the manifest opens")
}

fn restore(pg: &Pg, s3: &S3Server, prefix: &str, target: &str) -> AgentRun {
    restore_jobs(pg, s3, prefix, target, "1")
}

/// `restore --jobs N` of the latest backup of `app` into `target`.
fn restore_jobs(pg: &Pg, s3: &S3Server, prefix: &str, target: &str, jobs: &str) -> AgentRun {
    agent(
        &[
            "restore",
            "latest",
            "--prefix",
            prefix,
            "--source-database",
            "app",
            "--database",
            "app",
            "--jobs",
            jobs,
        ],
        &env_of(pg, target, s3),
    )
}

#[test]
fn a_hostile_schema_dumped_in_parts_comes_back_identical() {
    let (pg, s3) = servers(HOSTILE);
    let env = env_of(&pg, "app", &s3);

    let run = dump(&env, "par", "3");
    let m = manifest(&s3, &run);
    assert_eq!(m.format, dbop_backup::manifest::FORMAT_SLICED);
    let files: Vec<String> = m.parts.iter().map(|p| p.file.clone()).collect();
    assert_eq!(
        files,
        [
            "dump.pgc.zst",
            "dump.data-1.pgc.zst",
            "dump.data-2.pgc.zst",
            "dump.slice-3.copy.zst",
            "dump.slice-4.copy.zst",
            "dump.slice-5.copy.zst",
            "dump.rest.pgc.zst"
        ],
        "pre-data; 3 lanes: child_rows (over half the dump) in 3 slices, the other tables \
         in 2 data streams and the rest"
    );
    let sliced: Vec<&str> = (m.parts.iter())
        .filter_map(|p| p.copy.as_ref().map(|c| c.table.as_str()))
        .collect();
    assert_eq!(sliced, ["child_rows"; 3]);
    let id = m.backup_id.clone();
    for part in &m.parts {
        let stored = s3.get(&format!("par/app/{id}/{}", part.file));
        use sha2::Digest;
        assert_eq!(hex::encode(sha2::Sha256::digest(&stored)), part.sha256);
    }
    let counts: u64 = m.row_counts.values().sum();
    assert_eq!(counts, 30_000 + 60_000 + 40_000 + 100, "{:?}", m.row_counts);
    assert_eq!(
        m.row_counts.get("\"Sp ace \"\"q\"\".s\".\"T a*b?\""),
        Some(&30_000)
    );

    pg.create_db("copy");
    let restored = restore(&pg, &s3, "par", "copy");
    restored.ok();
    restored.assert_no_secrets();
    assert_eq!(pg.content_hash("app"), pg.content_hash("copy"));
    assert_eq!(pg.psql("copy", "SELECT nextval('lonely')"), "42");
    assert_eq!(
        pg.psql(
            "copy",
            "SELECT id FROM \"Sp ace \"\"q\"\".s\".\"T a*b?\" ORDER BY id DESC LIMIT 1"
        ),
        "30000"
    );

    assert_verified(&pg, &s3, "par");

    // In steps, three sessions at once: the same database.
    pg.create_db("steps");
    let restored = restore_jobs(&pg, &s3, "par", "steps", "3");
    let message = restored.ok_message();
    assert!(message.contains("1 in steps with 3 sessions"), "{message}");
    restored.assert_no_secrets();
    // child_rows' slices load at once, so its rows' physical order is theirs: put both in the
    // key's order before comparing (in one transaction above, the order was kept).
    for db in ["app", "steps"] {
        pg.psql(db, "CLUSTER child_rows USING child_rows_pkey");
    }
    assert_eq!(pg.content_hash("app"), pg.content_hash("steps"));
    assert_eq!(pg.psql("steps", "SELECT nextval('lonely')"), "42");
    assert_verified_with(&pg, &s3, "par", &["--jobs", "3"]);
}

/// Accounts split over two tables, each large enough to get a stream of its own; a writer
/// moves money between them in small transactions as fast as one session can.
const BANK: &str = "
CREATE TABLE left_accounts (id int PRIMARY KEY, balance bigint NOT NULL, pad text);
CREATE TABLE right_accounts (id int PRIMARY KEY, balance bigint NOT NULL, pad text);
INSERT INTO left_accounts SELECT i, 1000, repeat('l', 200) FROM generate_series(1, 150000) i;
INSERT INTO right_accounts SELECT i, 1000, repeat('r', 200) FROM generate_series(1, 150000) i;
CREATE TABLE transfers (n bigint);
INSERT INTO transfers VALUES (0);
";

const TOTAL: &str = "SELECT (SELECT sum(balance) FROM left_accounts) \
                     + (SELECT sum(balance) FROM right_accounts)";

/// The `i`th transfer between the two tables: from a left account to a right one (or back).
fn left_to_right(i: u64) -> String {
    let (id, amount) = (
        1 + i * 7919 % 150_000,
        if i.is_multiple_of(2) { 5 } else { -3 },
    );
    format!(
        "UPDATE left_accounts SET balance = balance - {amount} WHERE id = {id};\n\
         UPDATE right_accounts SET balance = balance + {amount} WHERE id = {id};\n"
    )
}

/// Runs transfers from one psql session until `stop`: each moves money as `transfer` says and
/// counts itself, committed on its own.
fn spawn_writer(
    pg: &Pg,
    stop: Arc<AtomicBool>,
    transfer: fn(u64) -> String,
) -> std::thread::JoinHandle<()> {
    let mut child = Command::new(pg.bin.join("psql"))
        .args(["-X", "-w", "-q", "-v", "ON_ERROR_STOP=1"])
        .env_clear()
        .envs(pg.env("app"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("psql");
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let mut i: u64 = 0;
        while !stop.load(Ordering::SeqCst) {
            let sql = format!(
                "BEGIN; {}UPDATE transfers SET n = n + 1; COMMIT;\n",
                transfer(i)
            );
            if stdin.write_all(sql.as_bytes()).is_err() {
                break;
            }
            i += 1;
        }
        drop(stdin);
        assert!(child.wait().unwrap().success(), "the writer failed");
    })
}

/// `dump --jobs` while `transfer`s commit one after another; the transfers counted before and
/// after it, some of them while it ran.
fn dump_while_moving_money(
    pg: &Pg,
    env: &[(String, String)],
    transfer: fn(u64) -> String,
    (prefix, jobs): (&str, &str),
) -> (AgentRun, u64, u64) {
    let transfers = || -> u64 { pg.psql("app", "SELECT n FROM transfers").parse().unwrap() };
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(pg, stop.clone(), transfer);
    wait_until(30, "the writer's first transfers", || transfers() > 100);
    let before = transfers();
    let run = dump(env, prefix, jobs);
    let after = transfers();
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(
        after > before,
        "no transfer committed while the dump ran ({before} → {after})"
    );
    (run, before, after)
}

#[test]
fn money_moved_during_a_parallel_dump_adds_up_after_the_restore() {
    let (pg, s3) = servers(BANK);
    let total = pg.psql("app", TOTAL);
    let env = env_of(&pg, "app", &s3);
    let (run, before, after) = dump_while_moving_money(&pg, &env, left_to_right, ("bank", "2"));

    let m = manifest(&s3, &run);
    let files: Vec<&str> = m.parts.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(
        files,
        ["dump.pgc.zst", "dump.data-1.pgc.zst", "dump.rest.pgc.zst"]
    );
    pg.create_db("copy");
    restore(&pg, &s3, "bank", "copy").ok();
    assert_eq!(
        pg.psql("copy", TOTAL),
        total,
        "the accounts' total changed: the streams did not read one snapshot"
    );
    pg.create_db("steps");
    restore_jobs(&pg, &s3, "bank", "steps", "2").ok();
    assert_eq!(pg.psql("steps", TOTAL), total, "restored in steps");
    let restored_transfers: u64 = pg.psql("copy", "SELECT n FROM transfers").parse().unwrap();
    assert!(
        (before..=after).contains(&restored_transfers),
        "{restored_transfers} transfers restored, {before}..{after} expected"
    );
}

#[test]
fn a_tampered_or_missing_part_refuses_the_restore_and_leaves_the_target_alone() {
    let (pg, s3) = servers(BANK);
    // A backup of `app` alone (`postgres` takes no connections, so it is not backed up):
    // nothing checks its objects before the restore, each part is checked as it streams.
    pg.psql("app", "ALTER DATABASE postgres ALLOW_CONNECTIONS false");
    let run = dump(&env_of(&pg, "app", &s3), "tamper", "2");
    let m = manifest(&s3, &run);
    assert!(m.other_databases.is_empty(), "{:?}", m.other_databases);
    let id = m.backup_id.clone();
    pg.psql("app", "CREATE DATABASE copy");
    pg.psql("copy", "CREATE TABLE before_restore (id int)");
    let untouched = pg.content_hash("copy");

    // The last part: everything before it has already run inside the transaction.
    let rest = format!("tamper/app/{id}/dump.rest.pgc.zst");
    let good = s3.get(&rest);
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0x01;
    s3.put(&rest, bad);
    let refused = restore(&pg, &s3, "tamper", "copy");
    let message = refused.failure_message();
    // Refused by the checksum at the end, or earlier by pg_restore choking on what the flipped
    // byte decoded to: either way before any COMMIT.
    assert!(
        message.contains("stopped before committing") || message.contains("nothing was committed"),
        "{message}"
    );
    assert_eq!(pg.content_hash("copy"), untouched, "the target changed");

    let data = format!("tamper/app/{id}/dump.data-1.pgc.zst");
    s3.put(&rest, good);
    let removed = s3.get(&data);
    s3.sdk(|c| {
        let data = data.clone();
        async move {
            c.delete_object()
                .bucket(BUCKET)
                .key(data)
                .send()
                .await
                .unwrap()
        }
    });
    restore(&pg, &s3, "tamper", "copy").failed();
    assert_eq!(pg.content_hash("copy"), untouched, "the target changed");

    s3.put(&data, removed);
    // Intact parts whose last fails on the target: the primary key's index (post-data, in
    // the last part) collides with a table there, after the tables were created and filled.
    pg.psql("copy", "CREATE TABLE left_accounts_pkey (id int)");
    let untouched = pg.content_hash("copy");
    let refused = restore(&pg, &s3, "tamper", "copy");
    let message = refused.failure_message();
    assert!(
        message.contains("nothing was committed") && message.contains("left_accounts_pkey"),
        "{message}"
    );
    assert_eq!(pg.content_hash("copy"), untouched, "the target changed");

    pg.psql("copy", "DROP TABLE left_accounts_pkey");
    restore(&pg, &s3, "tamper", "copy").ok();
    assert_eq!(pg.psql("copy", TOTAL), pg.psql("app", TOTAL));
}

#[test]
fn a_restore_in_steps_loads_only_an_empty_database_and_commits_no_unchecked_part() {
    let (pg, s3) = servers(BANK);
    pg.psql("app", "ALTER DATABASE postgres ALLOW_CONNECTIONS false");
    let run = dump(&env_of(&pg, "app", &s3), "steps", "2");
    let id = manifest(&s3, &run).backup_id.clone();

    pg.psql("app", "CREATE DATABASE busy");
    pg.psql("busy", "CREATE TABLE before_restore (id int)");
    let untouched = pg.content_hash("busy");
    let refused = restore_jobs(&pg, &s3, "steps", "busy", "2");
    let message = refused.failure_message();
    assert!(message.contains("is not empty"), "{message}");
    assert_eq!(pg.content_hash("busy"), untouched, "the target changed");

    // A flipped byte in the data stream: its rows are never committed, and the error says
    // what the target holds.
    let data = format!("steps/app/{id}/dump.data-1.pgc.zst");
    let good = s3.get(&data);
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0x01;
    s3.put(&data, bad);
    pg.psql("app", "CREATE DATABASE copy");
    let failed = restore_jobs(&pg, &s3, "steps", "copy", "2");
    let message = failed.failure_message();
    assert!(
        message.contains("holds the backup's schema and some of its rows"),
        "{message}"
    );
    let rows =
        "SELECT (SELECT count(*) FROM left_accounts) + (SELECT count(*) FROM right_accounts)";
    let restored: u64 = pg.psql("copy", rows).parse().unwrap();
    assert!(
        restored <= 150_000,
        "{restored} rows: the tampered stream's rows were committed"
    );
    let again = restore_jobs(&pg, &s3, "steps", "copy", "2");
    let message = again.failure_message();
    assert!(message.contains("is not empty"), "{message}");

    s3.put(&data, good);
    pg.psql("app", "DROP DATABASE copy");
    pg.psql("app", "CREATE DATABASE copy");
    restore_jobs(&pg, &s3, "steps", "copy", "2").ok();
    assert_eq!(pg.psql("copy", TOTAL), pg.psql("app", TOTAL));
}

/// Two tables with indexes, and a trigger function that a later backup uses.
const INDEXED: &str = "
CREATE TABLE wide (id int PRIMARY KEY, a int, b int, pad text);
INSERT INTO wide SELECT i, i % 97, i % 89, repeat('w', 100) FROM generate_series(1, 20000) i;
CREATE TABLE narrow (id int PRIMARY KEY);
INSERT INTO narrow SELECT generate_series(1, 1000);
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE 'no'; END $$;
DO $$ BEGIN FOR i IN 1..20 LOOP
  EXECUTE format('CREATE INDEX ON wide (a, b) WHERE a > %s', i);
END LOOP; END $$;
";

#[test]
fn a_rest_swapped_for_another_backups_is_refused_before_any_of_it_commits() {
    let (pg, s3) = servers(INDEXED);
    pg.psql("app", "ALTER DATABASE postgres ALLOW_CONNECTIONS false");
    let env = env_of(&pg, "app", &s3);
    let original = manifest(&s3, &dump(&env, "swap", "3"));
    // Another valid backup of the same schema whose post-data adds a trigger.
    pg.psql(
        "app",
        "CREATE TRIGGER planted BEFORE INSERT ON narrow FOR EACH ROW EXECUTE FUNCTION refuse()",
    );
    let other = manifest(&s3, &dump(&env, "other", "3"));
    let rest = |m: &Manifest, prefix: &str| {
        let part = m.parts.last().expect("a rest part");
        assert_eq!(part.file, "dump.rest.pgc.zst");
        format!("{prefix}/app/{}/{}", m.backup_id, part.file)
    };
    let swapped = s3.get(&rest(&other, "other"));
    s3.put(&rest(&original, "swap"), swapped);

    pg.psql("app", "CREATE DATABASE copy");
    let refused = restore_jobs(&pg, &s3, "swap", "copy", "3");
    let message = refused.failure_message();
    assert!(message.contains("integrity check failed"), "{message}");
    assert_eq!(
        pg.psql(
            "copy",
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'planted'"
        ),
        "0",
        "the swapped object's trigger was committed"
    );
}

/// One table of accounts, most of the dump: with 3 jobs it is dumped in 3 slices at once.
const ONE_BANK: &str = "
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, pad text);
INSERT INTO accounts SELECT i, 1000, repeat('p', 200) FROM generate_series(1, 200000) i;
CREATE TABLE transfers (n bigint NOT NULL);
INSERT INTO transfers VALUES (0);
";

const ONE_TOTAL: &str = "SELECT sum(balance) FROM accounts";

/// The `i`th transfer between an account in the first half of the table and one in the
/// second: an update writes the row's new version where there is room, often in another
/// slice's pages than the old one, which the snapshot still sees.
fn across_slices(i: u64) -> String {
    let (low, amount) = (
        1 + i * 7919 % 100_000,
        if i.is_multiple_of(2) { 7 } else { -2 },
    );
    let high = 200_001 - low;
    format!(
        "UPDATE accounts SET balance = balance - {amount} WHERE id = {low};\n\
         UPDATE accounts SET balance = balance + {amount} WHERE id = {high};\n"
    )
}

#[test]
fn money_moved_across_the_slices_of_one_table_adds_up_after_the_restore() {
    let (pg, s3) = servers(ONE_BANK);
    let total = pg.psql("app", ONE_TOTAL);
    // Encrypted, so every slice is also decrypted on its way into the restore's COPY.
    let keys = tempfile::tempdir().unwrap();
    let key = "AwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISI=";
    std::fs::write(keys.path().join("k1"), format!("{key}\n")).unwrap();
    let key_dir = keys.path().display().to_string();
    let mut env = env_of(&pg, "app", &s3);
    env.extend([
        ("DBOP_BACKUP_ENCRYPTION_KEY_DIR".into(), key_dir.clone()),
        ("DBOP_BACKUP_ENCRYPTION_KEY".into(), "k1".into()),
    ]);
    let (run, before, after) = dump_while_moving_money(&pg, &env, across_slices, ("one", "3"));

    let m = sealed_manifest(&s3, &run, key);
    assert_eq!(m.format, dbop_backup::manifest::FORMAT_SLICED);
    let sliced: Vec<&str> = (m.parts.iter())
        .filter_map(|p| p.copy.as_ref().map(|c| c.table.as_str()))
        .collect();
    assert_eq!(sliced, ["accounts"; 3], "{:?}", m.parts);
    assert_eq!(m.row_counts.get("public.accounts"), Some(&200_000));

    pg.create_db("copy");
    let restore_into = |target: &str, jobs: &str| {
        let args = [
            "restore",
            "latest",
            "--prefix",
            "one",
            "--source-database",
            "app",
        ];
        let keys = ["--encryption-key-dir", &key_dir, "--jobs", jobs];
        agent(&[&args[..], &keys].concat(), &env_of(&pg, target, &s3))
    };
    restore_into("copy", "1").ok();
    let rows = "SELECT count(*), count(DISTINCT id) FROM accounts";
    assert_eq!(pg.psql("copy", rows), "200000|200000");
    assert_eq!(
        pg.psql("copy", ONE_TOTAL),
        total,
        "the accounts' total changed: the slices did not read one snapshot"
    );
    let restored_transfers: u64 = pg.psql("copy", "SELECT n FROM transfers").parse().unwrap();
    assert!(
        (before..=after).contains(&restored_transfers),
        "{restored_transfers} transfers restored, {before}..{after} expected"
    );
    pg.create_db("steps");
    restore_into("steps", "3").ok();
    assert_eq!(pg.psql("steps", rows), "200000|200000");
    assert_eq!(pg.psql("steps", ONE_TOTAL), total, "restored in steps");
    assert_verified_with(
        &pg,
        &s3,
        "one",
        &["--jobs", "3", "--encryption-key-dir", &key_dir],
    );
}

/// The ids of the rows in a stored slice (not encrypted): its first column.
fn ids_in_slice(object: &[u8]) -> Vec<u64> {
    let text = zstd::decode_all(object).expect("a zstd object");
    String::from_utf8(text)
        .expect("text")
        .lines()
        .map(|line| {
            line.split('\t')
                .next()
                .unwrap_or_default()
                .parse()
                .expect("an id")
        })
        .collect()
}

#[test]
fn a_tampered_slice_refuses_the_restore_and_none_of_its_rows_commit() {
    let (pg, s3) = servers(ONE_BANK);
    pg.psql("app", "ALTER DATABASE postgres ALLOW_CONNECTIONS false");
    let run = dump(&env_of(&pg, "app", &s3), "tslice", "3");
    let m = manifest(&s3, &run);
    let middle = m
        .parts
        .iter()
        .filter(|p| p.copy.is_some())
        .nth(1)
        .expect("a middle slice")
        .file
        .clone();
    let key = format!("tslice/app/{}/{middle}", m.backup_id);
    let good = s3.get(&key);
    // Written once in order and never changed: the middle slice holds one run of ids.
    let its_ids = ids_in_slice(&good);
    let (low, high) = (its_ids[0], its_ids[its_ids.len() - 1]);
    assert!(its_ids.len() > 10_000, "{} rows in {middle}", its_ids.len());
    assert_eq!(its_ids, (low..=high).collect::<Vec<u64>>());
    let mut bad = good.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x01;
    s3.put(&key, bad);

    // In one transaction: refused, the target as it was.
    pg.psql("app", "CREATE DATABASE copy");
    pg.psql("copy", "CREATE TABLE before_restore (id int)");
    let untouched = pg.content_hash("copy");
    let message = restore(&pg, &s3, "tslice", "copy").failure_message();
    assert!(
        message.contains("stopped before committing") || message.contains("nothing was committed"),
        "{message}"
    );
    assert_eq!(pg.content_hash("copy"), untouched, "the target changed");

    // In steps: the other slices may commit, not one row of the tampered one.
    pg.psql("app", "CREATE DATABASE steps");
    let message = restore_jobs(&pg, &s3, "tslice", "steps", "3").failure_message();
    assert!(
        message.contains("holds the backup's schema and some of its rows"),
        "{message}"
    );
    let count = |range: &str| pg.psql("steps", &format!("SELECT count(*) FROM accounts {range}"));
    assert_eq!(
        count(&format!("WHERE id BETWEEN {low} AND {high}")),
        "0",
        "rows of the tampered slice were committed"
    );
    assert_ne!(count(""), "0", "the other slices should have committed");

    // A slice that is not the part the manifest names (another slice's object): refused.
    let first = (m.parts.iter().find(|p| p.copy.is_some()))
        .expect("a slice")
        .file
        .clone();
    s3.put(&key, s3.get(&format!("tslice/app/{}/{first}", m.backup_id)));
    restore(&pg, &s3, "tslice", "copy").failed();
    assert_eq!(pg.content_hash("copy"), untouched, "the target changed");

    s3.put(&key, good);
    restore(&pg, &s3, "tslice", "copy").ok();
    assert_eq!(pg.psql("copy", ONE_TOTAL), pg.psql("app", ONE_TOTAL));
}
