//! The test harness both sides use (behind the `test-support` feature): a real PostgreSQL of
//! our own (initdb in a temp dir, run as the `postgres` user when the tests run as root) and
//! s3s-fs, an S3-compatible server, on loopback. A missing dependency fails the test with a
//! message naming `backups/install-test-deps.sh`; nothing is skipped. No AWS SDK here: the agent's
//! tests add their SDK helpers on top.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const PG_USER: &str = "dbop";
pub const PG_PASSWORD: &str = "pw-Secr3t-never-printed";
pub const S3_ACCESS_KEY: &str = "dbop-test-access";
pub const S3_SECRET_KEY: &str = "s3-Secr3t-never-printed";
pub const BUCKET: &str = "backups";

pub fn install_hint(what: &str) -> String {
    format!("{what} not found: run `sudo backups/install-test-deps.sh` (tests never skip)")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

pub fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited during start-up: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on port {port} within 60 s");
}

pub fn find_in_path(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn pg_bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("DBOP_TEST_PG_BIN_DIR") {
        return dir.into();
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let major = e.file_name().to_str()?.parse().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("initdb").is_file().then_some((major, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().map(|(_, d)| d).unwrap_or_else(|| {
        panic!(
            "{}",
            install_hint("PostgreSQL server (initdb under /usr/lib/postgresql/*/bin)")
        )
    })
}

/// PostgreSQL's user and group ids when the tests run as root (a server refuses to run as
/// root, and a pod runs as the image's non-root user); `None` otherwise.
pub fn postgres_ids() -> Option<(u32, u32)> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id");
        assert!(
            out.status.success(),
            "{}",
            install_hint("the postgres system user")
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("numeric id")
    };
    Some((id("-u"), id("-g")))
}

/// Runs `cmd` as PostgreSQL's user when the tests run as root.
pub fn run_as_postgres(cmd: &mut Command) -> &mut Command {
    as_owner(cmd, postgres_ids());
    cmd
}

/// `path` (a directory: mode 0755) and everything in it owned by PostgreSQL's user when the
/// tests run as root.
pub fn give_to_postgres(path: &Path) {
    if path.is_dir() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    if postgres_ids().is_some() {
        let out = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .output()
            .expect("chown");
        assert!(out.status.success(), "chown -R postgres {}", path.display());
    }
}

/// The agent the operator's tests run: `DBOP_BACKUP_BIN`, or `dbop-backup` beside the test
/// executable's directory (target/<profile>, built by `cargo build -p dbop-backup`).
pub fn built_agent() -> PathBuf {
    if let Some(path) = std::env::var_os("DBOP_BACKUP_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("dbop-backup");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p dbop-backup` (make test-unit does) or set \
         DBOP_BACKUP_BIN",
        bin.display()
    );
    bin
}

/// A copy of the agent `built` in `dir`/bin that PostgreSQL's user can run, as
/// `archive_command` or as the pod's user: a clone inside a private temporary directory (as CI
/// makes one) is out of that user's reach.
pub fn agent_for_postgres(dir: &Path, built: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let copy = bin.join("dbop-backup");
    std::fs::copy(built, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    give_to_postgres(&bin);
    copy
}

/// A PostgreSQL server of our own on a free port.
pub struct Pg {
    child: Child,
    pub port: u16,
    pub bin: PathBuf,
    _dir: tempfile::TempDir,
}

/// Runs `cmd` as the postgres user when the tests run as root (`ids`).
fn as_owner(cmd: &mut Command, ids: Option<(u32, u32)>) {
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
}

/// A new cluster in `dir`/data (scram-sha-256, the test superuser and password), owned by
/// `ids` when given; its path.
fn initdb(bin: &Path, dir: &Path, ids: Option<(u32, u32)>) -> PathBuf {
    let pwfile = dir.join("pw");
    std::fs::write(&pwfile, PG_PASSWORD).unwrap();
    if let Some((uid, gid)) = ids {
        for p in [dir, pwfile.as_path()] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
    }
    let data = dir.join("data");
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .args([
            "-U",
            PG_USER,
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--pwfile",
        ])
        .arg(&pwfile)
        .arg("-D")
        .arg(&data)
        .current_dir(dir);
    as_owner(&mut initdb, ids);
    let out = initdb
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", install_hint("initdb")));
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

impl Pg {
    pub fn start() -> Pg {
        Self::start_with(&[])
    }

    /// A server with extra settings (`-c name=value`), e.g. `archive_mode`.
    pub fn start_with(settings: &[(&str, &str)]) -> Pg {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("dbop-pg-")
            .tempdir()
            .expect("tempdir");
        let ids = postgres_ids();
        let data = initdb(&bin, dir.path(), ids);
        let port = free_port();
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ])
            .args([
                "-c",
                "max_wal_size=8GB",
                "-c",
                "shared_buffers=256MB",
                "-c",
                "logging_collector=off",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir(dir.path());
        for (name, value) in settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        as_owner(&mut cmd, ids);
        let mut child = cmd.spawn().expect("postgres");
        wait_for_port(port, &mut child, "postgres");
        let pg = Pg {
            child,
            port,
            bin,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while pg.try_psql("postgres", "SELECT 1").is_err() {
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg
    }

    /// libpq variables for the agent and the tools.
    pub fn env(&self, database: &str) -> Vec<(String, String)> {
        vec![
            ("PGHOST".into(), "127.0.0.1".into()),
            ("PGPORT".into(), self.port.to_string()),
            ("PGUSER".into(), PG_USER.into()),
            ("PGPASSWORD".into(), PG_PASSWORD.into()),
            ("PGDATABASE".into(), database.into()),
        ]
    }

    pub fn try_psql(&self, database: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-w",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .env_clear()
            .envs(self.env(database))
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    pub fn psql(&self, database: &str, sql: &str) -> String {
        self.try_psql(database, sql)
            .unwrap_or_else(|e| panic!("psql failed: {e}\n{sql}"))
    }

    pub fn create_db(&self, name: &str) {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
    }

    /// SHA-256 of a plain-text dump of `database` (schema and data, without owners and the
    /// per-run `\restrict` keys): equal hashes mean equal databases.
    /// `role` (LOGIN REPLICATION, no superuser) with `password`, which pg_hba then allows only
    /// replication connections over TCP (scram-sha-256), as dbop's replication role; the test's
    /// superuser keeps SQL and replication access. Returns once the server has read the rules.
    pub fn replication_only_role(&self, role: &str, password: &str) {
        self.psql(
            "postgres",
            &format!("CREATE ROLE {role} LOGIN REPLICATION NOSUPERUSER PASSWORD '{password}'"),
        );
        let hba = self.psql("postgres", "SHOW hba_file");
        std::fs::write(
            &hba,
            format!(
                "host all {PG_USER} 127.0.0.1/32 scram-sha-256\n\
                 host replication {PG_USER} 127.0.0.1/32 scram-sha-256\n\
                 host replication {role} 127.0.0.1/32 scram-sha-256\n"
            ),
        )
        .unwrap();
        self.psql("postgres", "SELECT pg_reload_conf()");
        wait_until(10, "pg_hba.conf to be reloaded", || {
            let out = Command::new(self.bin.join("psql"))
                .args(["-X", "-w", "-c", "SELECT 1", "-d", "postgres"])
                .env_clear()
                .env("PGHOST", "127.0.0.1")
                .env("PGPORT", self.port.to_string())
                .env("PGUSER", role)
                .env("PGPASSWORD", password)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stderr).contains("no pg_hba.conf entry")
        });
    }

    pub fn content_hash(&self, database: &str) -> String {
        let mut child = Command::new(self.bin.join("pg_dump"))
            .args(["--format=plain", "--no-owner", "--no-acl"])
            .env_clear()
            .envs(self.env(database))
            .stdout(Stdio::piped())
            .spawn()
            .expect("pg_dump");
        let mut out = child.stdout.take().unwrap();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut pending = Vec::new();
        loop {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
            let last_nl = pending.iter().rposition(|b| *b == b'\n');
            if let Some(pos) = last_nl {
                for line in pending[..=pos].split_inclusive(|b| *b == b'\n') {
                    if !(line.starts_with(b"\\restrict") || line.starts_with(b"\\unrestrict")) {
                        hasher.update(line);
                    }
                }
                pending.drain(..=pos);
            }
        }
        hasher.update(&pending);
        assert!(
            child.wait().unwrap().success(),
            "pg_dump of {database} failed"
        );
        hex::encode(hasher.finalize())
    }

    pub fn table_count(&self, database: &str) -> u64 {
        self.psql(
            database,
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog','information_schema')",
        )
        .parse()
        .unwrap()
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        // SAFETY: signalling our own child (SIGINT: a fast shutdown).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_s3s(root: &Path, port: u16) -> Child {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let bin = find_in_path("s3s-fs", &[home.join(".cargo/bin")]).unwrap_or_else(|| {
        panic!(
            "{}",
            install_hint("s3s-fs (cargo install s3s-fs --version 0.14.1 --features binary)")
        )
    });
    Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("s3s-fs")
}

/// Waits until `cond` holds, for at most `secs`.
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// s3s-fs of our own on a free port, serving a temp directory with the bucket in it.
pub struct S3sFs {
    child: Option<Child>,
    pub port: u16,
    /// The served directory: `root/<bucket>/<key>`.
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

impl S3sFs {
    pub fn start() -> S3sFs {
        let dir = tempfile::Builder::new()
            .prefix("dbop-s3s-")
            .tempdir()
            .unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir(root.join(BUCKET)).unwrap();
        let port = free_port();
        let mut child = spawn_s3s(&root, port);
        wait_for_port(port, &mut child, "s3s-fs");
        S3sFs {
            child: Some(child),
            port,
            root,
            _dir: dir,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
