//! Test harness: real PostgreSQL and s3s-fs from `dbop_contract::test_support` (shared with the
//! operator's tests), moto_server and SDK helpers on top, and the agent binary run as a child
//! process. A missing dependency fails the test with a message
//! naming `backups/install-test-deps.sh`; nothing is skipped.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use dbop_backup::BackupResult;
pub use dbop_contract::test_support::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Kind {
    S3sFs,
    Moto,
}

/// An S3-compatible server of our own on a free port.
pub struct S3Server {
    pub kind: S3Kind,
    child: Option<Child>,
    pub port: u16,
    pub root: PathBuf,
    _dir: Option<tempfile::TempDir>,
    pub tls: Option<Tls>,
}

pub struct Tls {
    pub ca_file: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl S3Server {
    pub fn start(kind: S3Kind) -> S3Server {
        Self::start_inner(kind, None, None)
    }

    /// moto_server speaking HTTPS with a certificate from a private CA.
    pub fn start_moto_tls() -> S3Server {
        let dir = tempfile::Builder::new()
            .prefix("dbop-tls-")
            .tempdir()
            .unwrap();
        let p = |n: &str| dir.path().join(n);
        openssl_ca(dir.path(), "ca", "/CN=dbop test CA");
        openssl_signed(
            dir.path(),
            ("server", "/CN=localhost"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        );
        let tls = Tls {
            ca_file: p("ca.pem"),
            cert: p("server.pem"),
            key: p("server.key"),
        };
        let mut s = Self::start_inner(S3Kind::Moto, None, Some(tls));
        s._dir = Some(dir);
        s
    }

    /// Starts s3s-fs again on the same directory and port (after [`S3Server::kill`]).
    pub fn restart(&mut self) {
        assert_eq!(self.kind, S3Kind::S3sFs);
        let child = spawn_s3s(&self.root, self.port);
        self.child = Some(child);
        wait_for_port(self.port, self.child.as_mut().unwrap(), "s3s-fs");
    }

    fn start_inner(kind: S3Kind, _unused: Option<()>, tls: Option<Tls>) -> S3Server {
        let port = free_port();
        match kind {
            S3Kind::S3sFs => {
                let dir = tempfile::Builder::new()
                    .prefix("dbop-s3s-")
                    .tempdir()
                    .unwrap();
                let root = dir.path().to_path_buf();
                std::fs::create_dir(root.join(BUCKET)).unwrap();
                let mut child = spawn_s3s(&root, port);
                wait_for_port(port, &mut child, "s3s-fs");
                S3Server {
                    kind,
                    child: Some(child),
                    port,
                    root,
                    _dir: Some(dir),
                    tls,
                }
            }
            S3Kind::Moto => {
                let bin = find_in_path("moto_server", &[]).unwrap_or_else(|| {
                    panic!(
                        "{}",
                        install_hint("moto_server (pip install 'moto[server]')")
                    )
                });
                let mut cmd = Command::new(bin);
                cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                if let Some(t) = &tls {
                    cmd.arg("-c").arg(&t.cert).arg("-k").arg(&t.key);
                }
                let mut child = cmd.spawn().expect("moto_server");
                wait_for_port(port, &mut child, "moto_server");
                let s = S3Server {
                    kind,
                    child: Some(child),
                    port,
                    root: PathBuf::new(),
                    _dir: None,
                    tls,
                };
                s.sdk(|c| async move { c.create_bucket().bucket(BUCKET).send().await.map(|_| ()) })
                    .expect("create bucket on moto");
                s
            }
        }
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let host = if self.tls.is_some() {
            "localhost"
        } else {
            "127.0.0.1"
        };
        format!("{scheme}://{host}:{}", self.port)
    }

    pub fn env(&self) -> Vec<(String, String)> {
        s3_env(&self.endpoint())
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs an SDK call against this server (path style, test credentials).
    pub fn sdk<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce(aws_sdk_s3::Client) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut trust = aws_smithy_http_client::tls::TrustStore::default();
            if let Some(t) = &self.tls {
                trust = trust.with_pem_certificate(std::fs::read(&t.ca_file).unwrap());
            }
            let http = aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .tls_context(
                    aws_smithy_http_client::tls::TlsContext::builder()
                        .with_trust_store(trust)
                        .build()
                        .unwrap(),
                )
                .build_https();
            let conf = aws_sdk_s3::Config::builder()
                .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
                .region(aws_sdk_s3::config::Region::new("us-east-1"))
                .endpoint_url(self.endpoint())
                .force_path_style(true)
                .http_client(http)
                .request_checksum_calculation(
                    aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
                )
                .credentials_provider(aws_sdk_s3::config::Credentials::new(
                    S3_ACCESS_KEY,
                    S3_SECRET_KEY,
                    None,
                    None,
                    "test",
                ))
                .build();
            f(aws_sdk_s3::Client::from_conf(conf)).await
        })
    }

    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.sdk(|c| async move {
            let out = c
                .list_objects_v2()
                .bucket(BUCKET)
                .prefix(prefix)
                .send()
                .await
                .expect("list");
            let mut keys: Vec<String> = out
                .contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_string))
                .collect();
            keys.sort();
            keys
        })
    }

    pub fn get(&self, key: &str) -> Vec<u8> {
        let key = key.to_string();
        self.sdk(|c| async move {
            let out = c
                .get_object()
                .bucket(BUCKET)
                .key(key)
                .send()
                .await
                .expect("get");
            out.body.collect().await.unwrap().into_bytes().to_vec()
        })
    }

    pub fn put(&self, key: &str, body: Vec<u8>) {
        self.put_with_metadata(key, body, Default::default())
    }

    /// Stores `body` under `key` with user metadata (`x-amz-meta-*`).
    pub fn put_with_metadata(&self, key: &str, body: Vec<u8>, metadata: HashMap<String, String>) {
        let key = key.to_string();
        self.sdk(|c| async move {
            c.put_object()
                .bucket(BUCKET)
                .key(key)
                .set_metadata(Some(metadata))
                .body(body.into())
                .send()
                .await
                .expect("put");
        })
    }

    /// An object's user metadata.
    pub fn metadata(&self, key: &str) -> HashMap<String, String> {
        let key = key.to_string();
        self.sdk(|c| async move {
            let out = c.head_object().bucket(BUCKET).key(key).send().await;
            out.expect("head").metadata().cloned().unwrap_or_default()
        })
    }

    /// Unfinished multipart uploads (moto only; s3s-fs answers NotImplemented).
    pub fn uploads(&self) -> Vec<String> {
        self.sdk(|c| async move {
            let out = c
                .list_multipart_uploads()
                .bucket(BUCKET)
                .send()
                .await
                .expect("list uploads");
            out.uploads()
                .iter()
                .filter_map(|u| u.key().map(str::to_string))
                .collect()
        })
    }

    /// s3s-fs keeps one `.upload-<id>.json` per unfinished upload and parts beside it.
    pub fn s3s_upload_files(&self) -> Vec<String> {
        std::fs::read_dir(&self.root)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with(".upload"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one run of the agent printed.
#[derive(Debug)]
pub struct AgentRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub result: Option<BackupResult>,
}

impl AgentRun {
    pub fn ok(&self) -> &BackupResult {
        assert_eq!(
            self.code,
            Some(0),
            "agent failed:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self.result.as_ref().expect("a result line")
    }

    pub fn failed(&self) -> &BackupResult {
        assert_ne!(
            self.code,
            Some(0),
            "agent unexpectedly succeeded:\n{}",
            self.stdout
        );
        let r = self
            .result
            .as_ref()
            .unwrap_or_else(|| panic!("no result line: {}\n{}", self.stdout, self.stderr));
        assert_eq!(r.outcome, dbop_backup::Outcome::Failed);
        self.assert_no_secrets();
        r
    }

    /// The message of a run that must have succeeded.
    pub fn ok_message(&self) -> String {
        self.ok().message.clone().unwrap_or_default()
    }

    /// The message of a run that must have failed (and kept its secrets).
    pub fn failure_message(&self) -> String {
        self.failed().message.clone().unwrap_or_default()
    }

    pub fn message(&self) -> String {
        self.result
            .as_ref()
            .and_then(|r| r.message.clone())
            .unwrap_or_default()
    }

    pub fn assert_no_secrets(&self) {
        for secret in [
            PG_PASSWORD,
            S3_SECRET_KEY,
            "wrong-pw-also-secret",
            "wrong-s3-secret",
        ] {
            assert!(!self.stdout.contains(secret), "secret in stdout");
            assert!(!self.stderr.contains(secret), "secret in stderr");
        }
    }
}

pub fn agent_command(args: &[&str], env: &[(String, String)]) -> Command {
    agent_command_at(env!("CARGO_BIN_EXE_dbop-backup").as_ref(), args, env)
}

/// The agent at `bin` (a copy another user can run), with `args` and only `env`.
pub fn agent_command_at(bin: &std::path::Path, args: &[&str], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DBOP_BACKUP_LOG_FORMAT", "text")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

pub fn parse_run(out: Output) -> AgentRun {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let result = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok());
    AgentRun {
        code: out.status.code(),
        stdout,
        stderr,
        result,
    }
}

pub fn agent(args: &[&str], env: &[(String, String)]) -> AgentRun {
    parse_run(agent_command(args, env).output().expect("run agent"))
}

/// Environment for both servers.
/// Runs `verify` of the latest backup of `app` under `prefix` and asserts the row counts matched.
pub fn assert_verified(pg: &Pg, s3: &S3Server, prefix: &str) {
    assert_verified_with(pg, s3, prefix, &[]);
}

/// [`assert_verified`] with more flags for `verify` (e.g. `--jobs 2`).
pub fn assert_verified_with(pg: &Pg, s3: &S3Server, prefix: &str, flags: &[&str]) {
    let mut args = vec![
        "verify",
        "latest",
        "--prefix",
        prefix,
        "--source-database",
        "app",
    ];
    args.extend_from_slice(flags);
    let run = agent(&args, &env_of(pg, "postgres", s3));
    let message = run.ok().message.clone().unwrap_or_default();
    assert!(message.contains("row counts match"), "{message}");
}

pub fn env_of(pg: &Pg, db: &str, s3: &S3Server) -> Vec<(String, String)> {
    let mut e = pg.env(db);
    e.extend(s3.env());
    e
}

/// Tables with varied types: bytea, jsonb, numeric, arrays, large (TOASTed) text, and
/// `tables` small tables; about `rows` rows in the main table.
pub fn fill_varied(pg: &Pg, db: &str, rows: u64, tables: u32) {
    pg.psql(db, &format!(
        "CREATE TABLE varied (id bigint PRIMARY KEY, b bytea, j jsonb, n numeric(30,8), a int[], t text, ts timestamptz, f float8, ok boolean);
         INSERT INTO varied SELECT i, decode(md5(i::text), 'hex'),
           jsonb_build_object('i', i, 'tags', jsonb_build_array('x', i % 7), 'nested', jsonb_build_object('k', md5(i::text))),
           (i * 1.12345678)::numeric(30,8), ARRAY[i, i % 10, NULL], repeat(md5(i::text), 1 + (i % 5)),
           timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', i / 3.0, i % 2 = 0
         FROM generate_series(1, {rows}) i;
         CREATE INDEX ON varied USING gin (j);
         CREATE TABLE big_text (id int PRIMARY KEY, body text);
         INSERT INTO big_text SELECT i, repeat(md5(i::text), 400) FROM generate_series(1, 50) i;
         CREATE SCHEMA \"Other Schema\";
         CREATE TABLE \"Other Schema\".\"Mixed Case\" (id serial PRIMARY KEY, v text);
         INSERT INTO \"Other Schema\".\"Mixed Case\" (v) SELECT 'v' || i FROM generate_series(1, 10) i;
         CREATE TABLE parted (id int, k int) PARTITION BY RANGE (k);
         CREATE TABLE parted_a PARTITION OF parted FOR VALUES FROM (0) TO (50);
         CREATE TABLE parted_b PARTITION OF parted FOR VALUES FROM (50) TO (100);
         INSERT INTO parted SELECT i, i % 100 FROM generate_series(1, 1000) i;
         CREATE TABLE empty_one (id int);
         CREATE VIEW varied_view AS SELECT id, n FROM varied;"
    ));
    let per_table = (rows / 50).max(10);
    let mut sql = String::new();
    for t in 0..tables {
        sql.push_str(&format!(
            "CREATE TABLE many_{t} (id int PRIMARY KEY, v text, r int REFERENCES many_{t}(id));
             INSERT INTO many_{t} SELECT i, 'row ' || i, NULLIF(i - 1, 0) FROM generate_series(1, {per_table}) i;"
        ));
    }
    if !sql.is_empty() {
        pg.psql(db, &sql);
    }
}

/// A table of hard-to-compress text, so uploads take many parts and (with a slow
/// compression level) long enough to interrupt.
pub fn fill_bulky(pg: &Pg, db: &str, megabytes: u64) {
    let rows = megabytes * 1024 * 1024 / 2048;
    pg.psql(db, &format!(
        "CREATE TABLE bulky (id int, body text);
         INSERT INTO bulky SELECT i, (SELECT string_agg(md5(random()::text || i || j), '') FROM generate_series(1, 64) j)
         FROM generate_series(1, {rows}) i;"
    ));
}

/// AWS variables for an endpoint, with test credentials and no profile or IMDS look-ups.
pub fn s3_env(endpoint: &str) -> Vec<(String, String)> {
    vec![
        ("AWS_ENDPOINT_URL".into(), endpoint.into()),
        ("AWS_REGION".into(), "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID".into(), S3_ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET_KEY.into()),
        ("AWS_CONFIG_FILE".into(), "/dev/null".into()),
        ("AWS_SHARED_CREDENTIALS_FILE".into(), "/dev/null".into()),
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ("DBOP_BACKUP_BUCKET".into(), BUCKET.into()),
        ("DBOP_BACKUP_PATH_STYLE".into(), "true".into()),
    ]
}

/// Replaces (or adds) one variable.
pub fn with_env(mut env: Vec<(String, String)>, key: &str, value: &str) -> Vec<(String, String)> {
    env.retain(|(k, _)| k != key);
    env.push((key.into(), value.into()));
    env
}

/// Every process command line on the machine, for the no-secret-on-a-command-line check.
pub fn all_command_lines() -> Vec<String> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 2 s) until the clock is in a later second than `after`: backup ids have
/// second resolution, so the next backup then gets a new id.
pub fn next_second_after(after: chrono::DateTime<chrono::Utc>) {
    use chrono::Timelike;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let second = |t: chrono::DateTime<chrono::Utc>| t.with_nanosecond(0);
    while second(chrono::Utc::now()) <= second(after) {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock did not move on"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A self-signed CA in `dir`: `<name>.pem` and `<name>.key`.
pub fn openssl_ca(dir: &std::path::Path, name: &str, subject: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            subject,
            "-keyout",
            &key,
            "-out",
            &pem,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A key and certificate in `dir` (`<name>.key`, `<name>.pem`) for `subject`, signed by the
/// CA `ca.pem`/`ca.key` there, with the X.509 extensions `ext` (an extfile's lines).
pub fn openssl_signed(dir: &std::path::Path, (name, subject): (&str, &str), ext: &str) {
    let [key, csr, cnf, pem] = ["key", "csr", "cnf", "pem"].map(|x| format!("{name}.{x}"));
    std::fs::write(dir.join(&cnf), ext).unwrap();
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &cnf,
            "-out",
            &pem,
        ],
    );
}

/// Runs `openssl` with `args` in `dir`; panics with its error output when it fails.
pub fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", install_hint("openssl")));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TCP proxy on a free loopback port in front of `upstream`: each accepted connection and
/// its own connection to `upstream` go to `serve` (on a thread of their own); its port.
pub fn tcp_proxy(
    upstream: u16,
    serve: impl Fn(std::net::TcpStream, std::net::TcpStream) + Send + Sync + 'static,
) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = std::sync::Arc::new(serve);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let serve = serve.clone();
            std::thread::spawn(move || serve(client, server));
        }
    });
    port
}
