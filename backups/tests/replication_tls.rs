//! The agent's own replication connection over TLS, against a real PostgreSQL serving a
//! certificate from a private CA and accepting replication by client certificate only:
//! `verify-full` connects with the right CA and the certificate's name, and refuses another CA
//! and another name; `require` encrypts without checking; a client certificate is presented;
//! a password from a pgpass file gets in by SCRAM-SHA-256 over TLS (where the server also
//! offers channel binding) and a wrong one does not; a plain connection to a TLS-only
//! `pg_hba.conf` is refused. Then a whole base backup by
//! certificate, taken by the agent's own connection.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dbop_backup::replication::conninfo::{Address, Settings, SslMode, TargetSession};
use dbop_backup::replication::wire;

/// A CA, a server certificate for `localhost` (not 127.0.0.1), a client certificate for the
/// test superuser, and a second CA that signed nothing here.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("dbop-pgtls-")
            .tempdir()
            .unwrap();
        for ca in ["ca", "other-ca"] {
            openssl_ca(dir.path(), ca, &format!("/CN=dbop test {ca}"));
        }
        openssl_signed(
            dir.path(),
            ("server", "/CN=localhost"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        );
        openssl_signed(
            dir.path(),
            ("client", &format!("/CN={PG_USER}")),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        );
        std::fs::write(
            dir.path().join("pg_hba.conf"),
            "hostssl replication dbop_scram 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 cert\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        for key in ["server.key", "client.key"] {
            std::fs::set_permissions(
                dir.path().join(key),
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            )
            .unwrap();
        }
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A server copy of the files, owned by PostgreSQL's user (the client keeps its own).
    fn server_files(&self) -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("dbop-pgtls-srv-")
            .tempdir()
            .unwrap();
        for f in ["server.pem", "server.key", "ca.pem", "pg_hba.conf"] {
            std::fs::copy(self.path(f), dir.path().join(f)).unwrap();
        }
        give_to_postgres(dir.path());
        dir
    }
}

fn tls_pg(server: &Path) -> Pg {
    let file = |n: &str| server.join(n).display().to_string();
    Pg::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", &file("server.pem")),
        ("ssl_key_file", &file("server.key")),
        ("ssl_ca_file", &file("ca.pem")),
        ("hba_file", &file("pg_hba.conf")),
    ])
}

fn settings(
    host: &str,
    port: u16,
    mode: SslMode,
    root: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
) -> Settings {
    Settings {
        addresses: vec![Address::Tcp {
            host: host.into(),
            port,
        }],
        user: PG_USER.into(),
        ssl_mode: mode,
        root_cert: root,
        client_cert: client,
        target: TargetSession::Any,
        connect_timeout: Some(std::time::Duration::from_secs(10)),
        application_name: Some("dbop-backup test".into()),
        password_file: None,
    }
}

fn connect(s: &Settings) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = wire::connect(s).await?;
        assert!(!c.standby, "the primary is no standby");
        assert!(c.server_version.starts_with(|ch: char| ch.is_ascii_digit()));
        c.close().await;
        Ok(())
    })
}

#[test]
fn verify_full_checks_the_chain_and_the_name_and_certificates_and_scram_passwords_get_in() {
    let certs = Certs::new();
    let server = certs.server_files();
    let pg = tls_pg(server.path());
    let client = Some((certs.path("client.pem"), certs.path("client.key")));
    let ca = Some(certs.path("ca.pem"));

    // The right CA, the certificate's name, the client certificate: in.
    connect(&settings(
        "localhost",
        pg.port,
        SslMode::VerifyFull,
        ca.clone(),
        client.clone(),
    ))
    .expect("verify-full with the right CA");
    // Another CA: refused before a byte of the startup is sent.
    let e = connect(&settings(
        "localhost",
        pg.port,
        SslMode::VerifyFull,
        Some(certs.path("other-ca.pem")),
        client.clone(),
    ))
    .expect_err("another CA");
    assert!(
        e.contains("TLS") && e.to_lowercase().contains("certificate"),
        "{e}"
    );
    // The same server by a name its certificate does not hold (127.0.0.1): refused.
    let e = connect(&settings(
        "127.0.0.1",
        pg.port,
        SslMode::VerifyFull,
        ca.clone(),
        client.clone(),
    ))
    .expect_err("a name the certificate does not hold");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // require: encrypted, nothing checked (libpq's require without a root certificate).
    connect(&settings(
        "localhost",
        pg.port,
        SslMode::Require,
        None,
        client.clone(),
    ))
    .expect("require");
    // No client certificate: pg_hba.conf's cert method refuses the replication connection.
    let e = connect(&settings(
        "localhost",
        pg.port,
        SslMode::VerifyFull,
        ca.clone(),
        None,
    ))
    .expect_err("no client certificate");
    assert!(e.contains("FATAL"), "{e}");
    // A password over TLS, by SCRAM-SHA-256, from a pgpass file: the server offers
    // SCRAM-SHA-256-PLUS too, and the client says it does not bind the channel (not that it
    // thinks the server cannot, which the server would take for a downgrade).
    pg.psql(
        "postgres",
        "CREATE ROLE dbop_scram LOGIN REPLICATION PASSWORD 'scram-Secr3t'",
    );
    let pgpass = certs.path("pgpass");
    std::fs::write(&pgpass, "localhost:*:replication:dbop_scram:scram-Secr3t\n").unwrap();
    let mut scram = settings("localhost", pg.port, SslMode::VerifyFull, ca.clone(), None);
    scram.user = "dbop_scram".into();
    scram.password_file = Some(pgpass.clone());
    connect(&scram).expect("SCRAM over TLS");
    std::fs::write(&pgpass, "localhost:*:replication:dbop_scram:wrong\n").unwrap();
    let e = connect(&scram).expect_err("a wrong password");
    assert!(e.contains("password authentication failed"), "{e}");
    assert!(!e.contains("wrong"), "no password in the message: {e}");
    // Without TLS: no hostssl line matches.
    let e = connect(&settings(
        "localhost",
        pg.port,
        SslMode::Disable,
        None,
        client,
    ))
    .expect_err("no TLS");
    assert!(e.contains("pg_hba.conf"), "{e}");
}

#[test]
fn a_base_backup_by_client_certificate_is_taken_by_the_agent_s_own_connection() {
    let certs = Certs::new();
    let server = certs.server_files();
    let pg = tls_pg(server.path());
    let s3 = S3Server::start(S3Kind::S3sFs);
    let mut env = env_of(&pg, "postgres", &s3);
    env.retain(|(k, _)| k != "PGPASSWORD" && k != "PGHOST");
    let file = |n: &str| certs.path(n).display().to_string();
    env.extend(
        [
            ("PGHOST", "localhost".to_string()),
            ("PGSSLMODE", "verify-full".into()),
            ("PGSSLROOTCERT", file("ca.pem")),
            ("PGSSLCERT", file("client.pem")),
            ("PGSSLKEY", file("client.key")),
            ("DBOP_BACKUP_DATABASE", "app".into()),
            ("DBOP_BACKUP_LOG_FORMAT", "json".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let run = agent(&["base-backup", "--fast-checkpoint"], &env);
    let result = run.ok();
    assert!(run.stderr.contains(r#""direct":true"#), "{}", run.stderr);
    assert!(
        !run.stderr.contains("pg_basebackup takes the backup"),
        "{}",
        run.stderr
    );
    assert!(result.raw_bytes.unwrap() > result.size_bytes.unwrap());
    let keys = s3.keys("");
    assert!(
        keys.iter().any(|k| k.ends_with("/backup_manifest.zst")),
        "{keys:?}"
    );
    run.assert_no_secrets();
}
