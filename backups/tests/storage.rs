//! Storage behaviour against real servers: idempotent backup ids, list, prune (policy,
//! the newest kept, incomplete backups and unfinished uploads), private-CA TLS, the explicit
//! checksum modes, and the result file / JSON logs.

mod common;
use std::time::Duration;

use common::*;

fn app(pg: &Pg) {
    pg.create_db("app");
    fill_varied(pg, "app", 1_000, 1);
}

#[test]
fn a_backup_id_is_dumped_once() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    app(&pg);
    let env = env_of(&pg, "app", &s3);
    let first = agent(&["dump", "--backup-id", "nightly-7"], &env)
        .ok()
        .clone();
    pg.psql("app", "INSERT INTO empty_one VALUES (1)");
    let again = agent(&["dump", "--backup-id", "nightly-7"], &env);
    let second = again.ok();
    assert!(
        second
            .message
            .as_deref()
            .unwrap()
            .contains("already complete"),
        "{:?}",
        second.message
    );
    assert_eq!(second.sha256, first.sha256);
    assert_eq!(second.key, first.key);
    // The two dumps (app and postgres), the roles script and the manifest, once.
    assert_eq!(s3.keys("app/nightly-7/").len(), 4);
    let bad = agent(&["dump", "--backup-id", "../x"], &env);
    bad.failed();
}

fn dump_as(pg: &Pg, s3: &S3Server, id: &str, extra: &[&str]) -> dbop_backup::BackupResult {
    let mut args = vec!["dump", "--prefix", "p", "--backup-id", id];
    args.extend_from_slice(extra);
    let r = agent(&args, &env_of(pg, "app", s3)).ok().clone();
    // Distinct manifest times (servers keep whole seconds).
    std::thread::sleep(Duration::from_millis(1100));
    r
}

fn ids(s3: &S3Server) -> Vec<String> {
    let mut ids: Vec<String> = s3
        .keys("p/app/")
        .iter()
        .map(|k| k.split('/').nth(2).unwrap().to_string())
        .collect();
    ids.dedup();
    ids
}

fn prune(kind: S3Kind) {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    app(&pg);
    for id in ["b1", "b2", "b3"] {
        dump_as(&pg, &s3, id, &[]);
    }
    // An incomplete backup (dump object, no manifest) and, where listable, an unfinished upload.
    s3.put("p/app/b0/dump.pgc.zst", b"partial".to_vec());
    if kind == S3Kind::Moto {
        s3.sdk(|c| async move {
            c.create_multipart_upload()
                .bucket(BUCKET)
                .key("p/app/b9/dump.pgc.zst")
                .send()
                .await
                .unwrap();
        });
    }
    let env = env_of(&pg, "app", &s3);
    let listed = agent(&["list", "--prefix", "p"], &env);
    assert_eq!(listed.code, Some(0));
    assert!(
        listed.stdout.contains("b0") && listed.stdout.contains("incomplete"),
        "{}",
        listed.stdout
    );

    // Without a policy, prune refuses.
    agent(&["prune", "--prefix", "p"], &env).failed();
    // Within the grace period the incomplete backup stays. (moto reports every upload as
    // initiated in 2010, so its unfinished upload is already past the grace period.)
    let first = agent(&["prune", "--prefix", "p", "--keep-last", "2"], &env)
        .ok()
        .message
        .clone()
        .unwrap();
    assert_eq!(ids(&s3), vec!["b0", "b2", "b3"]);
    if kind == S3Kind::Moto {
        assert!(s3.uploads().is_empty(), "{first}");
        assert!(first.contains("aborted 1 unfinished"), "{first}");
    }
    // Past it, it goes, and the unfinished upload is aborted.
    let r = agent(
        &[
            "prune",
            "--prefix",
            "p",
            "--keep-last",
            "2",
            "--incomplete-grace",
            "0s",
        ],
        &env,
    );
    let msg = r.ok().message.clone().unwrap();
    assert_eq!(ids(&s3), vec!["b2", "b3"]);
    if kind == S3Kind::S3sFs {
        assert!(msg.contains("cannot list uploads"), "{msg}");
    }
    // max-age deletes everything older, but never the newest complete backup.
    std::thread::sleep(Duration::from_secs(2));
    agent(&["prune", "--prefix", "p", "--max-age", "1s"], &env).ok();
    assert_eq!(ids(&s3), vec!["b3"]);
    // Retention after a successful dump.
    dump_as(&pg, &s3, "b4", &[]);
    let r = dump_as(&pg, &s3, "b5", &["--keep-last", "1"]);
    assert!(r.message.unwrap().contains("deleted 2"));
    assert_eq!(ids(&s3), vec!["b5"]);
}

#[test]
fn prune_s3s_fs() {
    prune(S3Kind::S3sFs);
}

#[test]
fn prune_moto() {
    prune(S3Kind::Moto);
}

#[test]
fn private_ca_over_tls() {
    let pg = Pg::start();
    let s3 = S3Server::start_moto_tls();
    app(&pg);
    let env = env_of(&pg, "app", &s3);
    let ca = s3
        .tls
        .as_ref()
        .unwrap()
        .ca_file
        .to_str()
        .unwrap()
        .to_string();
    let without = agent(&["dump"], &env);
    without.failed();
    assert!(
        without.message().contains(&s3.endpoint()),
        "{}",
        without.message()
    );
    let r = agent(&["dump", "--ca-file", &ca], &env).ok().clone();
    pg.create_db("copy");
    agent(
        &["restore", "latest", "--source-database", "app"],
        &with_env(env_of(&pg, "copy", &s3), "DBOP_BACKUP_CA_FILE", &ca),
    )
    .ok();
    assert_eq!(pg.content_hash("app"), pg.content_hash("copy"));
    assert!(r.size_bytes.unwrap() > 0);
}

/// The SDK's default (`when-supported`: CRC32 in aws-chunked bodies with trailers) against
/// each server; the agent's default (`when-required`) is what every other test uses.
fn when_supported(kind: S3Kind) -> AgentRun {
    let pg = Pg::start();
    let s3 = S3Server::start(kind);
    app(&pg);
    let env = env_of(&pg, "app", &s3);
    let run = agent(&["dump", "--s3-checksums", "when-supported"], &env);
    if run.code == Some(0) {
        pg.create_db("copy");
        agent(
            &[
                "restore",
                "latest",
                "--source-database",
                "app",
                "--s3-checksums",
                "when-supported",
            ],
            &env_of(&pg, "copy", &s3),
        )
        .ok();
        assert_eq!(pg.content_hash("app"), pg.content_hash("copy"));
    }
    run
}

#[test]
fn sdk_default_checksums_s3s_fs() {
    let run = when_supported(S3Kind::S3sFs);
    run.ok();
}

#[test]
fn sdk_default_checksums_moto() {
    let run = when_supported(S3Kind::Moto);
    run.ok();
}

#[test]
fn result_file_and_json_logs() {
    let pg = Pg::start();
    let s3 = S3Server::start(S3Kind::S3sFs);
    app(&pg);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("termination-log");
    let mut env = env_of(&pg, "app", &s3);
    env.push((
        "DBOP_BACKUP_RESULT_FILE".into(),
        file.to_str().unwrap().into(),
    ));
    env = with_env(env, "DBOP_BACKUP_LOG_FORMAT", "json");
    let run = agent(&["dump"], &env);
    run.ok();
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written, run.stdout.trim());
    assert!(written.len() <= 4096);
    assert_eq!(run.stdout.lines().count(), 1);
    for line in run.stderr.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    // Failures are summarised the same way.
    let run = agent(&["dump", "--bucket", "nope"], &env);
    run.failed();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), run.stdout.trim());
}
