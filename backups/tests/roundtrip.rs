//! Round trips through real PostgreSQL and both S3 servers: dump → list → restore into a fresh
//! database → identical content (hash of a plain dump), and verify.

mod common;
use common::*;

fn round_trip(kind: S3Kind, rows: u64, tables: u32) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    pg.create_db("app");
    fill_varied(&pg, "app", rows, tables);
    let env = env_of(&pg, "app", &s3);

    let dumped = agent(
        &["dump", "--prefix", "team/prod", "--compression-level", "3"],
        &env,
    );
    let r = dumped.ok().clone();
    dumped.assert_no_secrets();
    let id = r.backup_id.clone().unwrap();
    assert_eq!(r.operation, dbop_backup::Operation::Dump);
    assert_eq!(
        r.key.as_deref(),
        Some(format!("team/prod/app/{id}/dump.pgc.zst").as_str())
    );
    assert_eq!(
        r.manifest_key.as_deref(),
        Some(format!("team/prod/app/{id}/manifest.json").as_str())
    );
    assert_eq!(
        r.engine_version.as_deref().map(|v| v.split('.').count()),
        Some(2)
    );
    assert!(r.size_bytes.unwrap() > 0 && r.raw_bytes.unwrap() > r.size_bytes.unwrap());
    assert_eq!(
        s3.keys("team/prod/app/"),
        vec![
            // The server's other database, `postgres`, is backed up too (hex-encoded name).
            format!("team/prod/app/{id}/db-001-706f737467726573.pgc.zst"),
            r.key.clone().unwrap(),
            format!("team/prod/app/{id}/globals.sql"),
            r.manifest_key.clone().unwrap()
        ]
    );

    // The manifest describes the object and counts rows in the dump's snapshot.
    let m = dbop_backup::Manifest::parse(&s3.get(r.manifest_key.as_ref().unwrap())).unwrap();
    let object = s3.get(r.key.as_ref().unwrap());
    use sha2::Digest;
    assert_eq!(hex::encode(sha2::Sha256::digest(&object)), m.sha256);
    assert_eq!(object.len() as u64, m.size_bytes);
    assert_eq!(m.row_counts.get("public.varied"), Some(&rows));
    assert_eq!(
        m.row_counts.get("\"Other Schema\".\"Mixed Case\""),
        Some(&10)
    );
    assert_eq!(m.row_counts.get("public.parted_a"), Some(&500));
    assert_eq!(
        m.row_counts.get("public.parted"),
        None,
        "partitioned parents hold no rows"
    );
    assert_eq!(m.row_counts.get("public.empty_one"), Some(&0));
    // One zstd frame with a content checksum (frame header descriptor bit 2).
    assert_eq!(&object[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    assert_ne!(object[4] & 0x04, 0, "zstd content checksum flag");

    let listed = agent(&["list", "--prefix", "team/prod", "--json"], &env);
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    let doc: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(doc["backups"][0]["backupId"], id.as_str());
    assert_eq!(doc["backups"][0]["complete"], true);

    pg.create_db("copy");
    let restored = agent(
        &[
            "restore",
            "latest",
            "--prefix",
            "team/prod",
            "--source-database",
            "app",
        ],
        &env_of(&pg, "copy", &s3),
    );
    let rr = restored.ok();
    assert_eq!(rr.backup_id.as_deref(), Some(id.as_str()));
    assert_eq!(pg.content_hash("app"), pg.content_hash("copy"));

    let env_pg = env_of(&pg, "postgres", &s3);
    let verified = agent(
        &[
            "verify",
            &id,
            "--prefix",
            "team/prod",
            "--source-database",
            "app",
        ],
        &env_pg,
    );
    assert!(
        verified
            .ok()
            .message
            .as_deref()
            .unwrap()
            .contains("row counts match")
    );
    let leftovers = pg.psql(
        "postgres",
        "SELECT count(*) FROM pg_database WHERE datname LIKE 'dbop_verify_%'",
    );
    assert_eq!(leftovers, "0", "scratch database dropped");
}

#[test]
fn round_trip_s3s_fs() {
    round_trip(S3Kind::S3sFs, 20_000, 5);
}

#[test]
fn round_trip_moto() {
    round_trip(S3Kind::Moto, 20_000, 5);
}

/// About a million rows in many tables, against the fast server.
#[test]
fn round_trip_a_million_rows() {
    round_trip(S3Kind::S3sFs, 500_000, 50);
}
