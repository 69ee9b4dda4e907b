//! The manifest's row counts, now read from the dump stream (`archive`), against the server's
//! own `count(*)` in the same database (`pg::ROW_COUNT_SQL`, what `verify` uses) for data that
//! is hard to count: empty tables, a table without columns, newlines, tabs, backslashes and
//! `\.` inside text and bytea, leaf partitions, inheritance, schemas and tables whose names need
//! quotes (or are keywords), unlogged tables, large objects, a table spanning many chunks and
//! reads; and the fallback to counting in the snapshot when the archive cannot be read.

mod common;
use std::collections::BTreeMap;

use common::*;
use dbop_backup::pg::ROW_COUNT_SQL;

const TRICKY: &str = r#"
CREATE TABLE empty_one (id int);
CREATE TABLE no_columns ();
INSERT INTO no_columns SELECT FROM generate_series(1, 7);
CREATE TABLE escapes (id int, t text, b bytea);
INSERT INTO escapes VALUES
  (1, E'line one\nline two\r\n', '\x0a0a0d5c2e0a'::bytea),
  (2, E'tab\there\\back\\slash', '\x'::bytea),
  (3, E'\\.', E'\\x5c2e0a0a0a'::bytea),
  (4, E'\n\n\n', NULL),
  (5, '', ''),
  (6, NULL, NULL),
  (7, repeat(E'x\n', 100000), decode(repeat('0a', 100000), 'hex'));
CREATE TABLE parted (id int, k int, note text) PARTITION BY RANGE (k);
CREATE TABLE parted_low PARTITION OF parted FOR VALUES FROM (0) TO (10) PARTITION BY LIST (id);
CREATE TABLE parted_low_even PARTITION OF parted_low FOR VALUES IN (0, 2, 4, 6, 8);
CREATE TABLE parted_low_rest PARTITION OF parted_low DEFAULT;
CREATE TABLE parted_high PARTITION OF parted FOR VALUES FROM (10) TO (100);
INSERT INTO parted SELECT i, i % 100, E'n\n' || i FROM generate_series(1, 3000) i;
CREATE TABLE parent_t (id int);
CREATE TABLE child_t (extra text) INHERITS (parent_t);
INSERT INTO parent_t SELECT generate_series(1, 5);
INSERT INTO child_t SELECT i, 'c' FROM generate_series(1, 9) i;
CREATE SCHEMA "Odd ""Schema"".x";
CREATE TABLE "Odd ""Schema"".x"."select" ("from" text);
INSERT INTO "Odd ""Schema"".x"."select" SELECT 'v' || i FROM generate_series(1, 12) i;
CREATE TABLE public."user" (id int);
INSERT INTO public."user" VALUES (1), (2);
CREATE TABLE "MiXeD" (id int);
INSERT INTO "MiXeD" VALUES (1);
CREATE SCHEMA ünï;
CREATE TABLE ünï."tâble" (id int);
INSERT INTO ünï."tâble" VALUES (1), (2), (3);
CREATE UNLOGGED TABLE scratchpad (id int);
INSERT INTO scratchpad SELECT generate_series(1, 4);
CREATE TABLE big (id bigint, body text);
INSERT INTO big SELECT i, md5(i::text) || E'\t' || repeat('z', i % 300) FROM generate_series(1, 200000) i;
SELECT lo_from_bytea(0, E'\\x5c2e0a0a0a'::bytea);
SELECT lo_from_bytea(0, decode(repeat('0a', 70000), 'hex'));
CREATE MATERIALIZED VIEW mv AS SELECT id FROM big WHERE id < 100;
CREATE SEQUENCE seq_alone;
"#;

fn server_counts(pg: &Pg, db: &str) -> BTreeMap<String, u64> {
    serde_json::from_str(&pg.psql(db, ROW_COUNT_SQL)).expect("row count JSON")
}

fn manifest_counts(s3: &S3Server, run: &AgentRun) -> BTreeMap<String, u64> {
    let key = run.ok().manifest_key.clone().expect("a manifest key");
    dbop_backup::Manifest::parse(&s3.get(&key))
        .expect("a manifest")
        .row_counts
}

#[test]
fn stream_counts_equal_count_star_for_tricky_data() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    pg.psql("app", TRICKY);
    let env = env_of(&pg, "app", &s3);

    let run = agent(&["dump", "--prefix", "rc"], &env);
    let counts = manifest_counts(&s3, &run);
    assert!(
        !run.stderr.contains("counting them in the snapshot"),
        "the stream was not read: {}",
        run.stderr
    );
    assert_eq!(counts, server_counts(&pg, "app"));
    // Spot checks, so an agreeing mistake in both counts still shows.
    for (table, rows) in [
        ("public.empty_one", 0),
        ("public.no_columns", 7),
        ("public.escapes", 7),
        ("public.parted_low_even", 4),
        ("\"ünï\".\"tâble\"", 3),
        ("public.parent_t", 5),
        ("public.child_t", 9),
        ("\"Odd \"\"Schema\"\".x\".\"select\"", 12),
        ("public.\"user\"", 2),
        ("public.\"MiXeD\"", 1),
        ("public.scratchpad", 4),
        ("public.big", 200_000),
    ] {
        assert_eq!(counts.get(table), Some(&rows), "{table} in {counts:?}");
    }
    for absent in ["public.parted", "public.parted_low", "public.mv"] {
        assert!(!counts.contains_key(absent), "{absent} counted");
    }

    assert_verified(&pg, &s3, "rc");
}

/// A pg_dump whose archive the counter cannot read (here `--inserts`: table data as INSERT
/// statements, not COPY): the dump still succeeds, with counts taken in the snapshot.
#[test]
fn an_unreadable_stream_falls_back_to_counting_in_the_snapshot() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    pg.create_db("app");
    pg.psql(
        "app",
        "CREATE TABLE t (v text); INSERT INTO t SELECT E'a\\nb' FROM generate_series(1, 25);",
    );
    let bin = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&pg.bin).unwrap() {
        let path = entry.unwrap().path();
        let link = bin.path().join(path.file_name().unwrap());
        if link.file_name().unwrap() != "pg_dump" {
            std::os::unix::fs::symlink(&path, link).unwrap();
        }
    }
    let wrapper = bin.path().join("pg_dump");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} \"$@\" --inserts\n",
            pg.bin.join("pg_dump").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = with_env(
        env_of(&pg, "app", &s3),
        "DBOP_BACKUP_PG_BIN_DIR",
        bin.path().to_str().unwrap(),
    );

    let run = agent(&["dump", "--prefix", "rc"], &env);
    let counts = manifest_counts(&s3, &run);
    assert!(
        run.stderr.contains("counting them in the snapshot") && run.stderr.contains("not a COPY"),
        "{}",
        run.stderr
    );
    assert_eq!(counts.get("public.t"), Some(&25));
    assert_eq!(counts, server_counts(&pg, "app"));
}
