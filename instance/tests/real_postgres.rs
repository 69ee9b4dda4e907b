//! dbop-instance run for real against Debian's PostgreSQL in a temporary directory, as the
//! `postgres` user when the tests run as root (PostgreSQL refuses to run as root).
//! Requires the PostgreSQL server packages (backups/install-test-deps.sh installs them).

use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dbop_contract::volume::VolumeUsage;

mod common;
use common::{free_port, ids, server};

const DEADLINE: Duration = Duration::from_secs(60);

fn chown(path: &Path, ids: Option<(u32, u32)>) {
    if let Some((uid, gid)) = ids {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    }
}

struct Instance {
    dir: tempfile::TempDir,
    ids: Option<(u32, u32)>,
    major: u32,
    bin: PathBuf,
    port: u16,
    generation: u32,
}

impl Instance {
    fn new() -> Instance {
        let (major, bin) = server();
        let ids = ids();
        let dir = tempfile::Builder::new()
            .prefix("dbop-instance-")
            .tempdir()
            .unwrap();
        for sub in ["", "data", "run", "creds", "config", "accounts"] {
            let p = dir.path().join(sub);
            std::fs::create_dir_all(&p).unwrap();
            chown(&p, ids);
        }
        let exe = dir.path().join("dbop-instance");
        common::copy_manager(&exe);
        chown(&exe, ids);
        let mut i = Instance {
            dir,
            ids,
            major,
            bin,
            port: free_port(),
            generation: 0,
        };
        i.set_credentials("app", "first-password");
        i
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Writes the credentials the way the kubelet updates a Secret volume: a new timestamped
    /// directory, then an atomic swap of the `..data` symlink the key files point through.
    fn set_credentials(&mut self, user: &str, password: &str) {
        self.generation += 1;
        let creds = self.path("creds");
        let version = format!("..v{}", self.generation);
        std::fs::create_dir(creds.join(&version)).unwrap();
        std::fs::write(creds.join(&version).join("username"), user).unwrap();
        std::fs::write(creds.join(&version).join("password"), password).unwrap();
        symlink(&version, creds.join("..data_tmp")).unwrap();
        std::fs::rename(creds.join("..data_tmp"), creds.join("..data")).unwrap();
        for key in ["username", "password"] {
            if !creds.join(key).exists() {
                symlink(format!("..data/{key}"), creds.join(key)).unwrap();
            }
        }
    }

    /// Writes the Database's parameters file the way the kubelet updates a ConfigMap volume.
    fn set_parameters(&mut self, text: &str) {
        self.generation += 1;
        let config = self.path("config");
        let version = format!("..v{}", self.generation);
        std::fs::create_dir(config.join(&version)).unwrap();
        std::fs::write(config.join(&version).join("postgresql.conf"), text).unwrap();
        symlink(&version, config.join("..data_tmp")).unwrap();
        std::fs::rename(config.join("..data_tmp"), config.join("..data")).unwrap();
        if !config.join("postgresql.conf").exists() {
            symlink("..data/postgresql.conf", config.join("postgresql.conf")).unwrap();
        }
    }

    /// Writes the accounts Secret's files the way the kubelet updates a Secret volume.
    fn set_accounts(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let dir = self.path("accounts");
        let version = format!("..v{}", self.generation);
        std::fs::create_dir(dir.join(&version)).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(&version).join(name), text).unwrap();
        }
        symlink(&version, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        for (name, _) in files {
            if !dir.join(name).exists() {
                symlink(format!("..data/{name}"), dir.join(name)).unwrap();
            }
        }
    }

    /// psql over the network as `user` with `password` into `dbname`.
    fn psql_as(&self, user: &str, password: &str, dbname: &str, sql: &str) -> Output {
        Command::new(self.bin.join("psql"))
            .args(["--no-psqlrc", "--tuples-only", "--no-align", "-c", sql])
            .arg(format!(
                "host=127.0.0.1 port={} user={user} dbname={dbname} connect_timeout=10",
                self.port
            ))
            .env("PGPASSWORD", password)
            .output()
            .unwrap()
    }

    /// Waits until `sql` as `user` answers `want`.
    fn wait_answer(&self, user: &str, password: &str, dbname: &str, sql: &str, want: &str) {
        let start = Instant::now();
        loop {
            let out = self.psql_as(user, password, dbname, sql);
            let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && got == want {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{user}: {sql} never gave {want:?} (last {got:?}: {})",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One value, over the network as `app` (a superuser) with `password`.
    fn query(&self, password: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["--no-psqlrc", "--tuples-only", "--no-align", "-c", sql])
            .arg(format!(
                "host=127.0.0.1 port={} user=app dbname=app connect_timeout=10",
                self.port
            ))
            .env("PGPASSWORD", password)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn command(&self, sub: &str, major: u32) -> Command {
        let mut cmd = Command::new(self.path("dbop-instance"));
        cmd.arg(sub)
            .arg(format!("--pgdata={}", self.path("data/pgdata").display()))
            .arg(format!("--major={major}"))
            .arg("--listen-addresses=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket-dir={}", self.path("run").display()))
            .arg(format!(
                "--credentials-dir={}",
                self.path("creds").display()
            ))
            .arg(format!(
                "--termination-log={}",
                self.path("termination-log").display()
            ))
            .arg(format!("--config-dir={}", self.path("config").display()))
            .arg(format!(
                "--accounts-dir={}",
                self.path("accounts").display()
            ))
            .arg("--poll-millis=100")
            .env_remove("PGPASSWORD")
            .current_dir(self.dir.path());
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn start(&self) -> Running {
        self.start_with(&[])
    }

    fn start_with(&self, args: &[String]) -> Running {
        let mut child = self
            .command("run", self.major)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !self.probe() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("dbop-instance exited early ({status}): {}", stderr(child));
            }
            assert!(start.elapsed() < DEADLINE, "not ready within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Running(Some(child))
    }

    fn probe(&self) -> bool {
        self.command("probe", self.major)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// A network login (SCRAM over TCP) as `app` to the application database `app`.
    fn login(&self, password: &str) -> Output {
        Command::new(self.bin.join("psql"))
            .args([
                "--no-psqlrc",
                "--tuples-only",
                "--no-align",
                "-c",
                "SELECT current_database()",
            ])
            .arg(format!(
                "host=127.0.0.1 port={} user=app dbname=app connect_timeout=10",
                self.port
            ))
            .env("PGPASSWORD", password)
            .output()
            .unwrap()
    }

    fn wait_login(&self, password: &str) {
        let start = Instant::now();
        loop {
            let out = self.login(password);
            if out.status.success() {
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "app");
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "login never worked: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cluster_state(&self) -> String {
        let out = Command::new(self.bin.join("pg_controldata"))
            .arg(self.path("data/pgdata"))
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("Database cluster state:"))
            .unwrap_or_default()
            .to_string()
    }
}

fn stderr(child: Child) -> String {
    String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).into_owned()
}

/// A running manager, stopped (immediate shutdown, forwarded to its server) if a test fails
/// before it stops it: no server outlives its test.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
            let _ = child.wait();
        }
    }
}

fn terminate(mut running: Running) -> (std::process::ExitStatus, String) {
    let child = running.0.take().unwrap();
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn initialises_follows_the_password_file_stops_cleanly_and_restarts_on_its_data() {
    let mut i = Instance::new();
    let child = i.start();
    i.wait_login("first-password");
    assert!(!i.login("wrong").status.success());

    i.set_credentials("app", "second-password");
    i.wait_login("second-password");
    assert!(
        !i.login("first-password").status.success(),
        "the old password still works"
    );

    let (status, log) = terminate(child);
    assert!(status.success(), "exit {status}: {log}");
    assert!(log.contains("initialising a new data directory"), "{log}");
    assert!(
        i.cluster_state().ends_with("shut down"),
        "{}",
        i.cluster_state()
    );
    assert!(!log.contains("second-password") && !log.contains("first-password"));

    let child = i.start();
    i.wait_login("second-password");
    let (status, log) = terminate(child);
    assert!(status.success(), "exit {status}: {log}");
    assert!(!log.contains("initialising"), "re-initialised: {log}");
    assert!(log.contains("the data directory is initialised"), "{log}");
}

#[test]
fn refuses_a_data_directory_of_another_major() {
    let i = Instance::new();
    let pgdata = i.path("data/pgdata");
    std::fs::create_dir(&pgdata).unwrap();
    std::fs::write(pgdata.join("PG_VERSION"), format!("{}\n", i.major - 1)).unwrap();
    chown(&pgdata, i.ids);
    let out = i.command("run", i.major).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let message = std::fs::read_to_string(i.path("termination-log")).unwrap();
    assert!(
        message.contains(&format!("belongs to PostgreSQL {}", i.major - 1)),
        "{message}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(&message));
    assert_eq!(
        std::fs::read_dir(&pgdata).unwrap().count(),
        1,
        "the data directory was touched"
    );
}

#[test]
fn includes_the_mounted_parameters_and_reloads_them_in_place_when_they_change() {
    let mut i = Instance::new();
    i.set_parameters("work_mem = '12MB'\nlog_min_duration_statement = '250'\n");
    let child = i.start();
    i.wait_login("first-password");
    assert_eq!(i.query("first-password", "SHOW work_mem"), "12MB");
    assert_eq!(
        i.query("first-password", "SHOW log_min_duration_statement"),
        "250ms"
    );
    let started = i.query("first-password", "SELECT pg_postmaster_start_time()");

    i.set_parameters("work_mem = '20MB'\n");
    let start = Instant::now();
    while i.query("first-password", "SHOW work_mem") != "20MB" {
        assert!(start.elapsed() < DEADLINE, "work_mem was not reloaded");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Removed from the file: back to the default, still without a restart.
    assert_eq!(
        i.query("first-password", "SHOW log_min_duration_statement"),
        "-1"
    );
    assert_eq!(
        i.query("first-password", "SELECT pg_postmaster_start_time()"),
        started,
        "a reload does not restart the server"
    );
    let (status, log) = terminate(child);
    assert!(status.success(), "exit {status}: {log}");
    assert!(log.contains("reloading the server (SIGHUP)"), "{log}");
}

fn accounts_document(reporting: &str) -> String {
    format!(
        r#"{{"application": {{"database": "shop", "owner": "shop_owner"}},
            "roles": [
              {{"name": "reporting", "ensure": "{reporting}", "login": true, "createdb": false,
                "createrole": false, "inherit": true, "bypassrls": false, "connectionLimit": 3,
                "inRoles": ["pg_read_all_data"], "passwordFile": "role-0.password"}},
              {{"name": "no password", "login": true, "createdb": true, "createrole": false,
                "inherit": false, "bypassrls": false, "connectionLimit": -1}}
            ]}}"#
    )
}

#[test]
fn the_primary_keeps_the_application_role_its_database_and_the_declared_roles() {
    let mut i = Instance::new();
    i.set_accounts(&[
        ("accounts.json", &accounts_document("Present")),
        ("application.password", "shop-pw-1"),
        ("role-0.password", "reporting-pw"),
    ]);
    let child = i.start();
    // Ready only once the application role and its database exist.
    let owner = |sql: &str| i.psql_as("shop_owner", "shop-pw-1", "shop", sql);
    let out = owner("SELECT current_user || '/' || current_database()");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "shop_owner/shop"
    );
    // It owns its database and may build in it, and nothing more.
    assert!(
        owner("CREATE TABLE orders (id int); INSERT INTO orders VALUES (1)")
            .status
            .success()
    );
    let refused = owner("CREATE ROLE intruder");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("permission denied"));
    assert!(!owner("CREATE DATABASE other").status.success());
    i.query(
        "first-password",
        "CREATE TABLE private (secret text); INSERT INTO private VALUES ('x')",
    );
    let other = i.psql_as("shop_owner", "shop-pw-1", "app", "SELECT * FROM private");
    assert!(
        !other.status.success(),
        "the application read another database's table"
    );
    assert_eq!(
        i.query("first-password", "SELECT rolsuper::text || rolcreaterole::text || rolcreatedb::text FROM pg_roles WHERE rolname = 'shop_owner'"),
        "falsefalsefalse"
    );
    // The declared roles: attributes, memberships, a password only where one is given.
    i.wait_answer(
        "reporting",
        "reporting-pw",
        "shop",
        "SELECT count(*) FROM orders",
        "1",
    );
    assert_eq!(
        i.query("first-password", "SELECT rolconnlimit || ' ' || rolcreatedb::text || ' ' || (rolpassword IS NULL)::text FROM pg_authid WHERE rolname IN ('reporting', 'no password') ORDER BY rolname"),
        "-1 true true\n3 false false"
    );
    // A grant outside the spec is taken back; a changed password and an Absent role follow.
    i.query("first-password", "GRANT pg_monitor TO reporting");
    i.set_accounts(&[
        ("accounts.json", &accounts_document("Absent")),
        ("application.password", "shop-pw-2"),
        ("role-0.password", "reporting-pw"),
    ]);
    i.wait_answer(
        "shop_owner",
        "shop-pw-2",
        "shop",
        "SELECT count(*) FROM orders",
        "1",
    );
    assert!(
        !i.psql_as("shop_owner", "shop-pw-1", "shop", "SELECT 1")
            .status
            .success()
    );
    i.wait_answer(
        "app",
        "first-password",
        "app",
        "SELECT count(*) FROM pg_roles WHERE rolname = 'reporting'",
        "0",
    );
    let (status, log) = terminate(child);
    assert!(status.success(), "exit {status}: {log}");
    for secret in ["shop-pw-1", "shop-pw-2", "reporting-pw"] {
        assert!(!log.contains(secret), "a password in the log: {log}");
    }
    assert!(log.contains("the accounts are applied"), "{log}");
}

#[test]
fn a_declared_membership_is_revoked_when_the_spec_drops_it() {
    let mut i = Instance::new();
    let document = |in_roles: &str| {
        format!(
            r#"{{"application": {{"database": "shop", "owner": "shop_owner"}},
                "roles": [{{"name": "auditor", "login": false, "createdb": false,
                  "createrole": false, "inherit": true, "bypassrls": false,
                  "connectionLimit": -1, "inRoles": [{in_roles}]}}]}}"#
        )
    };
    i.set_accounts(&[
        ("accounts.json", &document(r#""pg_monitor""#)),
        ("application.password", "shop-pw"),
    ]);
    let child = i.start();
    let members = "SELECT coalesce(string_agg(r.rolname, ','), '-') FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid WHERE m.member = 'auditor'::regrole";
    i.wait_answer("app", "first-password", "app", members, "pg_monitor");
    i.set_accounts(&[
        ("accounts.json", &document("")),
        ("application.password", "shop-pw"),
    ]);
    i.wait_answer("app", "first-password", "app", members, "-");
    drop(child);
}

/// A tmpfs of `mib` MiB mounted at `dir` (owned by `ids`) until dropped: a volume with a real
/// size, which writes can fill.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, mib: u32, ids: Option<(u32, u32)>) -> Tmpfs {
        assert!(
            ids.is_some(),
            "this test mounts a tmpfs: run it as root (CI does)"
        );
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        chown(dir, ids);
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// (size, available to unprivileged users) of the filesystem at `dir`, as `df` reports it.
fn df(dir: &Path) -> (u64, u64) {
    let out = Command::new("df")
        .args(["-B1", "--output=size,avail"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let numbers: Vec<u64> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (numbers[0], numbers[1])
}

/// `GET /volume` on the status endpoint at `port`.
fn volume_report(port: u16) -> Result<VolumeUsage, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /volume HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).map_err(|e| e.to_string())?;
    let (head, body) = all.split_once("\r\n\r\n").ok_or("no response head")?;
    if !head.starts_with("HTTP/1.1 200 ") {
        return Err(format!("{head}: {body}"));
    }
    VolumeUsage::from_json(body)
}

/// SIGKILLs the postmaster, as the kernel's OOM killer or a PANIC loop would end it, and
/// returns what the manager wrote to the termination log as it exited.
fn kill_server_and_read_termination(i: &Instance, mut running: Running) -> String {
    let pid_file = std::fs::read_to_string(i.path("data/pgdata/postmaster.pid")).unwrap();
    let pid: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let status = running.0.take().unwrap().wait().unwrap();
    assert!(
        !status.success(),
        "the manager exited 0 after its server died"
    );
    std::fs::read_to_string(i.path("termination-log")).unwrap_or_default()
}

/// The data volume is read from its filesystem at `GET /volume`, as `df` reads it; a server that
/// stops on its own on a full volume leaves a `volume-full` termination message with the
/// figures the operator grows from, and one that stops with room leaves its exit status only.
#[test]
fn a_server_stopping_on_a_full_volume_says_so_and_the_volume_is_reported() {
    let i = Instance::new();
    let data = i.path("data");
    let _volume = Tmpfs::mount(&data, 128, i.ids);
    let status_port = free_port();
    let args = [format!("--status-addr=127.0.0.1:{status_port}")];

    let running = i.start_with(&args);
    let report = volume_report(status_port).unwrap();
    let (size, avail) = df(&data);
    assert_eq!(report.size_bytes, size);
    assert_eq!(report.size_bytes, 128 * 1024 * 1024);
    // The server writes meanwhile: within a WAL segment of df's figure.
    assert!(
        report.free_bytes.abs_diff(avail) < 16 << 20,
        "{report:?} vs df {avail}"
    );
    assert!(!report.full());
    let message = kill_server_and_read_termination(&i, running);
    assert!(
        message.starts_with("postgres exited with status"),
        "{message}"
    );

    // Leave less than the room a restart needs, then the server dies.
    let running = i.start_with(&args);
    let filler = data.join("filler");
    let (_, avail) = df(&data);
    let out = Command::new("fallocate")
        .args(["-l", &(avail - (8 << 20)).to_string()])
        .arg(&filler)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = volume_report(status_port).unwrap();
    assert!(report.full(), "{report:?}");
    let message = kill_server_and_read_termination(&i, running);
    let rest = message
        .strip_prefix("volume-full: ")
        .unwrap_or_else(|| panic!("not a volume-full message: {message}"));
    let then = VolumeUsage::from_full_message(rest).expect("the figures");
    assert_eq!(then.size_bytes, 128 * 1024 * 1024);
    assert!(then.free_bytes < 32 << 20, "{then:?}");
    assert!(rest.contains("spec.storage.autoGrow"), "{rest}");
}
