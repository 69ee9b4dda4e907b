//! Client-side encryption through real PostgreSQL and s3s-fs: an encrypted backup's objects
//! hold no plaintext (no row value, table or database name), restore and verify need the key
//! the manifest names and refuse a missing, other or changed key (creating nothing), keys
//! rotate, unencrypted backups keep restoring, and a changed byte is refused. The credentials
//! reach the agent as files (`--user-file`, `--password-file`, `--s3-*-file`), as in dbop's Jobs.

mod common;
use common::*;

use base64::Engine as _;
use std::path::Path;

/// A row value, a table name and a database name that must never be readable in the bucket.
const MARKER: &str = "plaintext-marker-Zq8vW3";
const TABLE: &str = "tbl_secret_name_k4";
const OTHER_DB: &str = "db_secret_name_p9";

fn random_key() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A key directory (a Secret volume) with these keys.
fn key_dir(keys: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, value) in keys {
        std::fs::write(dir.path().join(name), format!("{value}\n")).unwrap();
    }
    dir
}

/// The agent's environment with the secrets as files only: no PGUSER, PGPASSWORD or AWS keys.
fn file_env(pg: &Pg, db: &str, s3: &S3Server, files: &Path) -> Vec<(String, String)> {
    let write = |name: &str, value: &str| {
        let p = files.join(name);
        std::fs::write(&p, value).unwrap();
        p.display().to_string()
    };
    let mut env: Vec<(String, String)> = env_of(pg, db, s3)
        .into_iter()
        .filter(|(k, _)| {
            ![
                "PGUSER",
                "PGPASSWORD",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
            ]
            .contains(&k.as_str())
        })
        .collect();
    env.extend([
        ("DBOP_BACKUP_USER_FILE".into(), write("username", PG_USER)),
        (
            "DBOP_BACKUP_PASSWORD_FILE".into(),
            write("password", PG_PASSWORD),
        ),
        (
            "DBOP_BACKUP_S3_ACCESS_KEY_ID_FILE".into(),
            write("access", S3_ACCESS_KEY),
        ),
        (
            "DBOP_BACKUP_S3_SECRET_ACCESS_KEY_FILE".into(),
            write("secret", S3_SECRET_KEY),
        ),
        ("TMPDIR".into(), files.display().to_string()),
    ]);
    env
}

fn fill(pg: &Pg, db: &str, rows: u32) {
    pg.psql(
        db,
        &format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (id int PRIMARY KEY, v text);
             INSERT INTO {TABLE} SELECT i, '{MARKER}-' || i FROM generate_series(
               (SELECT coalesce(max(id), 0) + 1 FROM {TABLE}),
               (SELECT coalesce(max(id), 0) + {rows} FROM {TABLE})) i;"
        ),
    );
}

fn dump(env: &[(String, String)], keys: &Path, key: &str) -> String {
    let dir = keys.display().to_string();
    let r = agent(
        &[
            "dump",
            "--prefix",
            "p",
            "--encryption-key-dir",
            &dir,
            "--encryption-key",
            key,
        ],
        env,
    );
    r.assert_no_secrets();
    r.ok().backup_id.clone().unwrap()
}

fn restore(env: &[(String, String)], id: &str, keys: Option<&Path>) -> AgentRun {
    let dir = keys.map(|k| k.display().to_string());
    let mut args = vec!["restore", id, "--prefix", "p", "--source-database", "app"];
    if let Some(d) = &dir {
        args.extend(["--encryption-key-dir", d]);
    }
    agent(&args, env)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The server has the databases it had, and the target `refused` no table.
fn nothing_restored(pg: &Pg, before: &str) {
    assert_eq!(databases(pg), before, "nothing created");
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
    assert_eq!(pg.psql("refused", tables), "0", "nothing restored");
}

fn databases(pg: &Pg) -> String {
    pg.psql(
        "postgres",
        "SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database",
    )
}

#[test]
fn an_encrypted_backup_is_unreadable_and_restores_only_with_its_key() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    let files = tempfile::tempdir().unwrap();
    pg.create_db("app");
    pg.create_db(OTHER_DB);
    fill(&pg, "app", 2000);
    fill(&pg, OTHER_DB, 10);
    let (k1, k2) = (random_key(), random_key());
    let keys = key_dir(&[("k1", &k1)]);
    let env = file_env(&pg, "app", &s3, files.path());
    let id = dump(&env, keys.path(), "k1");

    // Nothing of the data, the table or the other database's name is readable in the bucket.
    let objects = s3.keys("p/");
    assert_eq!(objects.len(), 5, "{objects:?}");
    for key in &objects {
        let body = s3.get(key);
        for plain in [MARKER, TABLE, OTHER_DB] {
            assert!(!contains(&body, plain), "{plain} readable in {key}");
            assert!(
                !key.contains(plain) && !key.contains(&hex::encode(plain)),
                "{key}"
            );
        }
        if !key.ends_with("manifest.json") {
            assert_eq!(&body[..8], b"DBOPENC1", "{key} is not encrypted");
        }
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&s3.get(&format!("p/app/{id}/manifest.json"))).unwrap();
    assert_eq!(manifest["encryption"]["keyName"], "k1");
    assert_eq!(manifest["manifestVersion"], 3);
    assert!(manifest.get("rowCounts").is_none() && manifest.get("sha256").is_none());

    // The right key restores the same rows into a new server (every database of the backup,
    // the other one created), and verify works on it.
    let pg2 = Pg::start();
    pg2.create_db("app");
    let ok = restore(
        &file_env(&pg2, "app", &s3, files.path()),
        &id,
        Some(keys.path()),
    );
    ok.assert_no_secrets();
    ok.ok();
    assert_eq!(pg.content_hash("app"), pg2.content_hash("app"));
    assert_eq!(pg.content_hash(OTHER_DB), pg2.content_hash(OTHER_DB));
    let verified = agent(
        &[
            "verify",
            &id,
            "--prefix",
            "p",
            "--source-database",
            "app",
            "--encryption-key-dir",
            &keys.path().display().to_string(),
        ],
        &file_env(&pg, "postgres", &s3, files.path()),
    );
    assert!(
        verified
            .ok()
            .message
            .as_deref()
            .unwrap()
            .contains("row counts match")
    );

    // No key, another key, another key's bytes under the same name: refused before anything
    // is created, saying which key to give, and never showing a key.
    let pg3 = Pg::start();
    pg3.create_db("refused");
    let before = databases(&pg3);
    let other_name = key_dir(&[("k2", &k2)]);
    let same_name = key_dir(&[("k1", &k2)]);
    let cases: [(Option<&Path>, &str); 3] = [
        (None, "no key was given"),
        (Some(other_name.path()), "has no key \"k1\" (it has: k2)"),
        (Some(same_name.path()), "holds other bytes"),
    ];
    for (dir, want) in cases {
        let run = restore(&file_env(&pg3, "refused", &s3, files.path()), &id, dir);
        let r = run.failed();
        let message = run.message();
        assert_eq!(
            r.failure_kind.as_deref(),
            Some("encryption-key"),
            "{message}"
        );
        assert!(message.contains(want), "{message}");
        assert!(message.contains("encrypted with key \"k1\""), "{message}");
        for key in [&k1, &k2] {
            assert!(!run.stdout.contains(key.as_str()) && !run.stderr.contains(key.as_str()));
        }
        nothing_restored(&pg3, &before);
    }
    // The same refusal for verify.
    let refused = agent(
        &["verify", &id, "--prefix", "p", "--source-database", "app"],
        &file_env(&pg, "postgres", &s3, files.path()),
    );
    assert_eq!(
        refused.failed().failure_kind.as_deref(),
        Some("encryption-key")
    );

    // A changed byte of the dump is refused even when the manifest is made to match the
    // changed object (which takes the key): the cipher's tags refuse it, nothing is committed.
    let dump_key = format!("p/app/{id}/dump.pgc.zst");
    let mut body = s3.get(&dump_key);
    let mid = body.len() / 2;
    body[mid] ^= 0x20;
    let key = dbop_backup::crypto::Key::parse("k1", k1.as_bytes()).unwrap();
    let manifest_key = format!("p/app/{id}/manifest.json");
    let dbop_backup::manifest::Stored::Sealed(sealed) =
        dbop_backup::manifest::Stored::parse(&s3.get(&manifest_key)).unwrap()
    else {
        panic!("not sealed")
    };
    let original = s3.get(&manifest_key);
    let mut m = sealed.open(&key).unwrap();
    {
        use sha2::Digest;
        m.sha256 = hex::encode(sha2::Sha256::digest(&body));
    }
    s3.put(&manifest_key, m.to_stored(Some(&key)));
    let original_dump = s3.get(&dump_key);
    s3.put(&dump_key, body);
    let run = restore(
        &file_env(&pg3, "refused", &s3, files.path()),
        &id,
        Some(keys.path()),
    );
    let message = run.message();
    assert_eq!(run.failed().failure_kind.as_deref(), Some("integrity"));
    assert!(
        message.contains("does not decrypt with key \"k1\""),
        "{message}"
    );
    nothing_restored(&pg3, &before);
    s3.put(&manifest_key, original);
    s3.put(&dump_key, original_dump);

    // A changed byte of the dump is refused, and nothing is committed.
    let dump_key = format!("p/app/{id}/dump.pgc.zst");
    let mut body = s3.get(&dump_key);
    let mid = body.len() / 2;
    body[mid] ^= 0x20;
    s3.put(&dump_key, body);
    let tampered = restore(
        &file_env(&pg3, "refused", &s3, files.path()),
        &id,
        Some(keys.path()),
    );
    assert_eq!(tampered.failed().failure_kind.as_deref(), Some("integrity"));
    nothing_restored(&pg3, &before);
}

#[test]
fn keys_rotate_and_unencrypted_backups_keep_restoring() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    let files = tempfile::tempdir().unwrap();
    pg.create_db("app");
    fill(&pg, "app", 100);
    let env = file_env(&pg, "app", &s3, files.path());
    // An unencrypted backup (as before encryption), then one with k1, then one with k2 (the
    // Secret gained k2 and the spec points at it; k1 stays for the older backups).
    let plain = agent(&["dump", "--prefix", "p"], &env)
        .ok()
        .backup_id
        .clone()
        .unwrap();
    next_second_after(chrono::Utc::now());
    fill(&pg, "app", 100);
    let (k1, k2) = (random_key(), random_key());
    let a = dump(&env, key_dir(&[("k1", &k1)]).path(), "k1");
    let hash_a = pg.content_hash("app");
    next_second_after(chrono::Utc::now());
    fill(&pg, "app", 100);
    let both = key_dir(&[("k1", &k1), ("k2", &k2)]);
    let b = dump(&env, both.path(), "k2");
    let hash_b = pg.content_hash("app");
    let manifest = |id: &str| -> serde_json::Value {
        serde_json::from_slice(&s3.get(&format!("p/app/{id}/manifest.json"))).unwrap()
    };
    assert_eq!(manifest(&a)["encryption"]["keyName"], "k1");
    assert_eq!(manifest(&b)["encryption"]["keyName"], "k2");
    assert!(manifest(&plain).get("encryption").is_none());

    for (id, want) in [(&a, &hash_a), (&b, &hash_b)] {
        let target = format!("copy_{}", id.to_lowercase().replace(['-', '.'], "_"));
        pg.create_db(&target);
        restore(
            &file_env(&pg, &target, &s3, files.path()),
            id,
            Some(both.path()),
        )
        .ok();
        assert_eq!(&pg.content_hash(&target), want, "backup {id}");
    }
    // The unencrypted backup restores with or without a key directory.
    for (n, dir) in [(0, None), (1, Some(both.path()))] {
        let target = format!("plain_{n}");
        pg.create_db(&target);
        restore(&file_env(&pg, &target, &s3, files.path()), &plain, dir).ok();
        assert_eq!(
            pg.psql(&target, &format!("SELECT count(*) FROM {TABLE}")),
            "100"
        );
    }
    // A dump with a key that is not 32 random bytes is refused before anything is written.
    let bad = key_dir(&[("k3", "c2hvcnQ=")]);
    let before = s3.keys("p/");
    let run = agent(
        &[
            "dump",
            "--prefix",
            "p",
            "--encryption-key-dir",
            &bad.path().display().to_string(),
            "--encryption-key",
            "k3",
        ],
        &env,
    );
    let message = run.message();
    assert_eq!(run.failed().failure_kind.as_deref(), Some("encryption-key"));
    assert!(message.contains("openssl rand -base64 32"), "{message}");
    assert_eq!(s3.keys("p/"), before);
    // The pgpass file was the agent's own, and is gone.
    let leftovers: Vec<_> = std::fs::read_dir(files.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("dbop-backup-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
