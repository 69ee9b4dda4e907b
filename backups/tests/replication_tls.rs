//! The agent's own replication connection over TLS, against a real PostgreSQL serving a
//! certificate from a private CA and accepting replication by client certificate only:
//! `verify-full` connects with the right CA and the certificate's name, and refuses another CA
//! and another name; `require` encrypts without checking; a client certificate is presented;
//! a password from a pgpass file gets in by SCRAM-SHA-256-PLUS over TLS (bound to the server's
//! certificate) and a wrong one does not; a plain connection to a TLS-only `pg_hba.conf` is
//! refused. A relay that ends TLS with a certificate of its own (from the same CA, for the same
//! name) and opens its own to the server is stopped by the channel binding, where without it
//! the exchange passes. Then a whole base backup by certificate, taken by the agent's own
//! connection.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dbop_backup::replication::conninfo::{
    Address, ChannelBinding, Settings, SslMode, TargetSession,
};
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
            ("relay", "/CN=localhost"),
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
        for key in ["server.key", "client.key", "relay.key"] {
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
        channel_binding: ChannelBinding::Prefer,
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
    // A client certificate lets the client in without SCRAM: PGCHANNELBINDING=require
    // does not take that (libpq neither).
    let mut must_bind = settings(
        "localhost",
        pg.port,
        SslMode::VerifyFull,
        ca.clone(),
        client.clone(),
    );
    must_bind.channel_binding = ChannelBinding::Require;
    let e = connect(&must_bind).expect_err("in without channel binding");
    assert!(e.contains("without it"), "{e}");
    // A password over TLS, by SCRAM-SHA-256-PLUS, from a pgpass file: bound to the server's
    // certificate by default, and with binding required.
    let (scram, pgpass) = scram_settings(&certs, &pg, pg.port);
    connect(&scram).expect("SCRAM over TLS");
    connect(&ChannelBinding::Require.on(&scram)).expect("SCRAM over TLS, binding required");
    connect(&ChannelBinding::Disable.on(&scram)).expect("SCRAM over TLS, not bound");
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

/// The role `dbop_scram` (created here), its password in a pgpass file for `localhost`, and
/// settings for it at `port` (`require`: the certificate is not checked).
fn scram_settings(certs: &Certs, pg: &Pg, port: u16) -> (Settings, PathBuf) {
    pg.psql(
        "postgres",
        "DO $$ BEGIN CREATE ROLE dbop_scram LOGIN REPLICATION PASSWORD 'scram-Secr3t'; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    );
    let pgpass = certs.path("pgpass");
    std::fs::write(&pgpass, "localhost:*:replication:dbop_scram:scram-Secr3t\n").unwrap();
    let mut scram = settings("localhost", port, SslMode::Require, None, None);
    scram.user = "dbop_scram".into();
    scram.password_file = Some(pgpass.clone());
    (scram, pgpass)
}

trait On {
    fn on(self, s: &Settings) -> Settings;
}

impl On for ChannelBinding {
    fn on(self, s: &Settings) -> Settings {
        Settings {
            channel_binding: self,
            ..s.clone()
        }
    }
}

#[test]
fn channel_binding_stops_a_relay_that_ends_tls_with_a_certificate_of_its_own() {
    let certs = Certs::new();
    let server = certs.server_files();
    let pg = tls_pg(server.path());
    // The relay's certificate is from the server's own CA and for the same name: verify-full
    // takes it too. Only the binding tells the two certificates apart.
    let relay = tls_relay(
        pg.port,
        (certs.path("relay.pem"), certs.path("relay.key")),
        certs.path("ca.pem"),
    );
    let (through_relay, _) = scram_settings(&certs, &pg, relay);
    let verified = Settings {
        ssl_mode: SslMode::VerifyFull,
        root_cert: Some(certs.path("ca.pem")),
        ..through_relay.clone()
    };
    // Not bound: the relay reads and passes on the whole exchange, and the client is in.
    connect(&ChannelBinding::Disable.on(&through_relay)).expect("not bound, through the relay");
    connect(&ChannelBinding::Disable.on(&verified))
        .expect("verified, not bound, through the relay");
    // Bound (the default, and required): the server's certificate is not the one the client
    // saw, and the server refuses the proof.
    for s in [
        through_relay.clone(),
        verified.clone(),
        ChannelBinding::Require.on(&verified),
    ] {
        let e = connect(&s).expect_err("bound, through the relay");
        assert!(e.contains("channel binding"), "{e}");
        assert!(
            !e.contains("scram-Secr3t"),
            "no password in the message: {e}"
        );
    }
}

#[test]
fn the_binding_hashes_the_certificate_as_the_server_does_for_each_kind_of_signature() {
    let certs = Certs::new();
    // The operator's certificates are ECDSA P-256 with SHA-256 (rcgen's default); SHA-224,
    // SHA-384 and SHA-512 signatures are hashed with their own hash, not SHA-256.
    for (kind, key, digest) in [
        ("p256-sha256", "ec:prime256v1", "-sha256"),
        ("p256-sha224", "ec:prime256v1", "-sha224"),
        ("p384-sha384", "ec:secp384r1", "-sha384"),
        ("rsa-sha512", "rsa:2048", "-sha512"),
    ] {
        let server = certs.server_files();
        let dir = server.path();
        // -newkey rsa:2048, or -newkey ec -pkeyopt ec_paramgen_curve:<curve>.
        let new_key = match key.split_once(':') {
            Some(("ec", curve)) => format!("-newkey ec -pkeyopt ec_paramgen_curve:{curve}"),
            _ => format!("-newkey {key}"),
        };
        let ca = format!("-CA {kind}-ca.pem -CAkey {kind}-ca.key -CAcreateserial");
        std::fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:localhost\n").unwrap();
        for command in [
            format!(
                "req -x509 {new_key} -nodes -days 2 {digest} -subj /CN={kind}-CA -keyout {kind}-ca.key -out {kind}-ca.pem"
            ),
            format!("req {new_key} -nodes -subj /CN=localhost -keyout server.key -out {kind}.csr"),
            format!(
                "x509 -req {digest} -in {kind}.csr {ca} -days 2 -extfile ext.cnf -out server.pem"
            ),
        ] {
            openssl(dir, &command.split_whitespace().collect::<Vec<_>>());
        }
        give_to_postgres(dir);
        std::fs::set_permissions(
            dir.join("server.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let pg = tls_pg(dir);
        let (scram, _) = scram_settings(&certs, &pg, pg.port);
        connect(&ChannelBinding::Require.on(&scram))
            .unwrap_or_else(|e| panic!("{kind}: bound to the server's certificate: {e}"));
    }
}

/// A relay on a port of its own that answers the client's TLS request itself, with `identity`
/// (a certificate and its key), and makes its own TLS connection to PostgreSQL at `upstream`
/// (checked against `ca`), then passes everything on both ways: a man in the middle who reads
/// the whole conversation.
fn tls_relay(upstream: u16, identity: (PathBuf, PathBuf), ca: PathBuf) -> u16 {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_file_iter(&identity.0)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&identity.1).unwrap();
    let as_server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let as_client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(as_server));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(as_client));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((mut client, _)) = listener.accept().await {
                let (acceptor, connector) = (acceptor.clone(), connector.clone());
                tokio::spawn(async move {
                    let mut request = [0u8; 8];
                    client.read_exact(&mut request).await?;
                    client.write_all(b"S").await?;
                    let mut client = acceptor.accept(client).await?;
                    let mut server =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await?;
                    server.write_all(&request).await?;
                    let mut answer = [0u8; 1];
                    server.read_exact(&mut answer).await?;
                    let name = ServerName::try_from("localhost").unwrap();
                    let mut server = connector.connect(name, server).await?;
                    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
                    Ok::<_, std::io::Error>(())
                });
            }
        });
    });
    port
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
