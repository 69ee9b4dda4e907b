//! Every database of the instance is backed up, verified and restored: the application
//! database plus databases made with `CREATE DATABASE` (one with a hostile name, one owned by
//! another role with a setting and a grant) go through dump → restore into a new server →
//! equal content, owner, settings and grants; a tampered dump of one database is refused by
//! restore and verify before anything is created; a backup in the old single-database format
//! still restores and verifies. Real PostgreSQL servers and s3s-fs.

mod common;
use common::*;

const HOSTILE: &str = "we\"ird / näme = x 'q' ü";
const OWNED: &str = "owned";

/// A source server with three databases (and `postgres`), backed up; returns the result.
fn source_with_three_databases(s3: &S3Server) -> (Pg, dbop_backup::BackupResult) {
    let pg = Pg::start();
    pg.create_db("app");
    pg.psql(
        "app",
        "CREATE TABLE a (id int PRIMARY KEY, v text);
         INSERT INTO a SELECT i, md5(i::text) FROM generate_series(1, 300) i;",
    );
    pg.psql(
        "postgres",
        "CREATE ROLE owner_role NOLOGIN; CREATE ROLE reader NOLOGIN;",
    );
    pg.psql("postgres", &format!("CREATE DATABASE {}", ident(HOSTILE)));
    pg.psql(
        HOSTILE,
        "CREATE SCHEMA \"S p\"; CREATE TABLE \"S p\".t (id int, b bytea);
         INSERT INTO \"S p\".t SELECT i, decode(md5(i::text), 'hex') FROM generate_series(1, 123) i;",
    );
    pg.psql(
        "postgres",
        &format!("CREATE DATABASE {OWNED} OWNER owner_role"),
    );
    pg.psql(
        "postgres",
        &format!(
            "ALTER DATABASE {OWNED} SET work_mem = '7MB';
             ALTER DATABASE {OWNED} SET search_path = \"$user\", public;
             GRANT CREATE ON DATABASE {OWNED} TO reader;"
        ),
    );
    pg.psql(
        OWNED,
        "SET ROLE owner_role; CREATE TABLE o (id int); INSERT INTO o SELECT generate_series(1, 77);",
    );
    let r = agent(&["dump", "--prefix", "p"], &env_of(&pg, "app", s3))
        .ok()
        .clone();
    (pg, r)
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Owner, settings and ACL of a database, as one comparable text.
fn database_facts(pg: &Pg, name: &str) -> String {
    pg.psql(
        "postgres",
        &format!(
            "SELECT concat_ws(' | ', pg_get_userbyid(d.datdba), pg_encoding_to_char(d.encoding), d.datcollate, d.datacl::text,
               (SELECT setconfig::text FROM pg_db_role_setting s WHERE s.setdatabase = d.oid AND s.setrole = 0))
             FROM pg_database d WHERE d.datname = {}",
            literal(name)
        ),
    )
}

fn databases_of(pg: &Pg) -> Vec<String> {
    pg.psql(
        "postgres",
        "SELECT string_agg(datname, E'\\n' ORDER BY datname) FROM pg_database WHERE NOT datistemplate",
    )
    .lines()
    .map(str::to_string)
    .collect()
}

fn restore_into_new_server(s3: &S3Server) -> (Pg, AgentRun) {
    let target = Pg::start();
    target.create_db("app");
    let run = agent(
        &[
            "restore",
            "latest",
            "--prefix",
            "p",
            "--source-database",
            "app",
        ],
        &env_of(&target, "app", s3),
    );
    (target, run)
}

fn manifest_of(s3: &S3Server, r: &dbop_backup::BackupResult) -> serde_json::Value {
    serde_json::from_slice(&s3.get(r.manifest_key.as_deref().unwrap())).unwrap()
}

#[test]
fn three_databases_round_trip_into_a_new_server() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let (source, r) = source_with_three_databases(&s3);
    assert_eq!(
        r.databases,
        Some(4),
        "app, owned, postgres, the hostile one"
    );
    let m = manifest_of(&s3, &r);
    assert_eq!(m["manifestVersion"], 2);
    let names: Vec<&str> = m["otherDatabases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(m["database"], "app");
    assert_eq!(names, [OWNED, "postgres", HOSTILE]);
    assert_eq!(m["otherDatabases"][0]["definition"]["owner"], "owner_role");
    assert_eq!(m["otherDatabases"][2]["rowCounts"]["\"S p\".t"], 123);

    let (target, run) = restore_into_new_server(&s3);
    let rr = run.ok();
    run.assert_no_secrets();
    assert_eq!(rr.databases, Some(4));
    for db in ["app", OWNED, HOSTILE] {
        assert_eq!(source.content_hash(db), target.content_hash(db), "{db}");
        assert_eq!(
            database_facts(&source, db),
            database_facts(&target, db),
            "{db}"
        );
    }
    let facts = database_facts(&target, OWNED);
    assert!(facts.starts_with("owner_role"), "{facts}");
    assert!(facts.contains("reader=C/owner_role"), "{facts}");
    assert!(facts.contains("work_mem=7MB"), "{facts}");
    assert!(
        facts.contains(r#"search_path=\"$user\", public"#),
        "{facts}"
    );
    assert_eq!(target.psql(OWNED, "SELECT count(*) FROM o"), "77");

    let verified = agent(
        &[
            "verify",
            "latest",
            "--prefix",
            "p",
            "--source-database",
            "app",
        ],
        &env_of(&source, "postgres", &s3),
    );
    let message = verified.ok().message.clone().unwrap();
    assert!(message.contains("4 databases"), "{message}");
    assert!(message.contains("row counts match"), "{message}");
    assert!(
        !databases_of(&source)
            .iter()
            .any(|d| d.starts_with("dbop_verify_"))
    );
}

#[test]
fn a_tampered_dump_of_another_database_is_refused_before_anything_is_created() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let (source, r) = source_with_three_databases(&s3);
    let m = manifest_of(&s3, &r);
    let file = m["otherDatabases"][0]["dumpFile"]
        .as_str()
        .unwrap()
        .to_string();
    let key = format!("p/app/{}/{file}", r.backup_id.as_deref().unwrap());
    let mut object = s3.get(&key);
    let mid = object.len() / 2;
    object[mid] ^= 0x01;
    s3.put(&key, object);

    let (target, run) = restore_into_new_server(&s3);
    let failed = run.failed();
    assert_eq!(failed.failure_kind.as_deref(), Some("integrity"));
    let message = run.message();
    assert!(message.contains(&key), "{message}");
    assert!(message.contains("database \"owned\""), "{message}");
    assert_eq!(
        databases_of(&target),
        ["app", "postgres"],
        "nothing created"
    );
    assert_eq!(target.table_count("app"), 0, "nothing restored");
    assert_eq!(
        target.psql(
            "postgres",
            "SELECT count(*) FROM pg_roles WHERE rolname = 'owner_role'"
        ),
        "0",
        "not even the roles"
    );

    let before = databases_of(&source);
    let verified = agent(
        &[
            "verify",
            "latest",
            "--prefix",
            "p",
            "--source-database",
            "app",
        ],
        &env_of(&source, "postgres", &s3),
    );
    let failed = verified.failed();
    assert_eq!(failed.failure_kind.as_deref(), Some("integrity"));
    assert!(verified.message().contains(&key), "{}", verified.message());
    assert_eq!(databases_of(&source), before, "no scratch database made");
}

#[test]
fn an_old_single_database_backup_still_restores_and_verifies() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let (source, r) = source_with_three_databases(&s3);
    // What an older agent wrote: version 1, no database list, the one dump beside it.
    let mut m = manifest_of(&s3, &r);
    let id = r.backup_id.clone().unwrap();
    for d in m["otherDatabases"].as_array().unwrap() {
        let key = format!("p/app/{id}/{}", d["dumpFile"].as_str().unwrap());
        s3.sdk(|c| async move { c.delete_object().bucket(BUCKET).key(key).send().await })
            .unwrap();
    }
    let object = m.as_object_mut().unwrap();
    object.remove("otherDatabases");
    object.remove("definition");
    object.insert("manifestVersion".into(), 1.into());
    s3.put(
        r.manifest_key.as_deref().unwrap(),
        serde_json::to_vec_pretty(&m).unwrap(),
    );
    assert_eq!(s3.keys("p/app/").len(), 3, "dump, globals, manifest");

    let (target, run) = restore_into_new_server(&s3);
    let rr = run.ok();
    assert_eq!(rr.databases, Some(1));
    assert_eq!(source.content_hash("app"), target.content_hash("app"));
    assert_eq!(databases_of(&target), ["app", "postgres"]);

    let verified = agent(
        &["verify", &id, "--prefix", "p", "--source-database", "app"],
        &env_of(&source, "postgres", &s3),
    );
    let message = verified.ok().message.clone().unwrap();
    assert!(message.contains("1 databases"), "{message}");
}

/// `restore --database NAME` restores that one database of the backup into the target, beside
/// the source on the same server (as a user restoring by hand does), and names what a backup
/// holds when asked for a database it lacks, restoring nothing.
#[test]
fn one_database_of_a_backup_restores_into_another_name_on_the_same_server() {
    let s3 = S3Server::start(S3Kind::S3sFs);
    let (source, _) = source_with_three_databases(&s3);
    source.create_db("copy");
    let restore = |database: &str| {
        agent(
            &[
                "restore",
                "latest",
                "--prefix",
                "p",
                "--source-database",
                "app",
                "--database",
                database,
            ],
            &env_of(&source, "copy", &s3),
        )
    };
    restore(OWNED).ok();
    assert_eq!(source.psql("copy", "SELECT count(*) FROM o"), "77");
    assert_eq!(source.table_count("copy"), 1, "only that database's tables");
    let missing = restore("nope");
    let result = missing.failed();
    let message = result.message.clone().unwrap_or_default();
    assert!(
        message.contains("no database \"nope\"") && message.contains(OWNED),
        "{message}"
    );
}
