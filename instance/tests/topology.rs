//! `dbop-instance run` following the operator's topology, for real: managers of Debian's
//! PostgreSQL on loopback (own ports, data, socket, credentials, config and replication
//! directories; run as `postgres` when the tests run as root), each told its name and given a
//! `topology` file, and driven only by rewriting those files: a standby clones its primary
//! (making its own slot when the primary's topology is older), streams and is ready only while
//! it streams; a switchover fences the old primary, promotes the standby, and the old primary
//! rejoins as a standby; without a topology file nothing changes. Every wait polls with a
//! deadline; every manager is stopped when its test ends, failed or not.
//! Requires the PostgreSQL server packages.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use dbop_instance::replication::config::slot_name;
use dbop_instance::replication::status::{self, STATUS_QUERY, Status, parse_status};

mod common;
use common::{free_port, ids, server};

const DEADLINE: Duration = Duration::from_secs(90);
const APP_PASSWORD: &str = "app-Secr3t-password";
const REPLICATION_PASSWORD: &str = "repl-Secr3t:never\\printed";

fn wait_for<T>(what: &str, check: impl FnMut() -> Result<T, String>) -> T {
    common::wait_for(what, DEADLINE, Duration::from_millis(200), check)
}

struct Node {
    name: String,
    dir: tempfile::TempDir,
    ids: Option<(u32, u32)>,
    major: u32,
    bin: PathBuf,
    port: u16,
}

impl Node {
    fn new(name: &str) -> Node {
        let (major, bin) = server();
        let ids = ids();
        let dir = tempfile::Builder::new()
            .prefix(&format!("dbop-topo-{name}-"))
            .tempdir()
            .unwrap();
        for sub in ["", "data", "run", "creds", "config", "repl"] {
            let p = dir.path().join(sub);
            std::fs::create_dir_all(&p).unwrap();
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        std::fs::write(dir.path().join("creds/username"), "app").unwrap();
        std::fs::write(dir.path().join("creds/password"), APP_PASSWORD).unwrap();
        std::fs::write(dir.path().join("repl/password"), REPLICATION_PASSWORD).unwrap();
        common::copy_manager(&dir.path().join("dbop-instance"));
        Node {
            name: name.to_string(),
            dir,
            ids,
            major,
            bin,
            port: free_port(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn command(&self, sub: &str) -> Command {
        let mut cmd = Command::new(self.path("dbop-instance"));
        cmd.arg(sub)
            .arg(format!("--pgdata={}", self.path("data/pgdata").display()))
            .arg(format!("--major={}", self.major))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket-dir={}", self.path("run").display()))
            .arg(format!(
                "--credentials-dir={}",
                self.path("creds").display()
            ))
            .env_remove("PGPASSWORD")
            .current_dir(self.dir.path());
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// Writes this node's topology file (renamed into place, as the kubelet swaps it).
    fn topology(&self, primary: &Node, members: &[&Node]) {
        self.topology_and(primary, members, "");
    }

    /// The same, with more lines (`synchronous=…`).
    fn topology_and(&self, primary: &Node, members: &[&Node], more: &str) {
        let mut text = format!("# test\nprimary={}\n", primary.name);
        for m in members {
            text.push_str(&format!("instance={} 127.0.0.1 {}\n", m.name, m.port));
        }
        text.push_str(more);
        let tmp = self.path("config/.topology.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.path("config/topology")).unwrap();
    }

    /// `dbop-instance run` in the background, its log appended to a file.
    fn spawn(&self) -> Running {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("log"))
            .unwrap();
        let child = self
            .command("run")
            .arg("--listen-addresses=127.0.0.1")
            .arg(format!("--config-dir={}", self.path("config").display()))
            .arg(format!("--replication-dir={}", self.path("repl").display()))
            .arg(format!("--instance-name={}", self.name))
            .arg(format!(
                "--termination-log={}",
                self.path("termination-log").display()
            ))
            .arg("--poll-millis=200")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Running(Some(child))
    }

    /// Starts the manager and waits until the probe passes.
    fn start(&self) -> Running {
        let mut running = self.spawn();
        self.wait_ready(&mut running);
        running
    }

    fn wait_ready(&self, running: &mut Running) {
        wait_for(&format!("{} ready", self.name), || {
            if let Some(status) = running.try_wait() {
                panic!("{} exited early ({status}): {}", self.name, self.log());
            }
            if self.probe() {
                Ok(())
            } else {
                Err(self.log_tail())
            }
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn probe(&self) -> bool {
        self.command("probe")
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// SQL over the local socket as `app` (peer authentication through dbop's map).
    fn sql(&self, sql: &str) -> Result<String, String> {
        let out = self.psql(sql).output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// `sql`'s psql, not started.
    fn psql(&self, sql: &str) -> Command {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["--no-psqlrc", "--no-align", "--tuples-only"])
            .args(["--set=ON_ERROR_STOP=1", "-c", sql])
            .arg(format!(
                "host={} port={} user=app dbname=app",
                self.path("run").display(),
                self.port
            ))
            .env_remove("PGPASSWORD");
        cmd
    }

    fn status(&self) -> Result<Status, String> {
        parse_status(&self.sql(STATUS_QUERY)?)
    }

    fn wait_streaming(&self, primary: &Node, timeline: u32) {
        let upstream = format!("127.0.0.1:{}", primary.port);
        wait_for(
            &format!("{} streams from {}", self.name, primary.name),
            || match self.status()? {
                Status::Standby {
                    streaming: true,
                    upstream: Some(u),
                    timeline: Some(t),
                    ..
                } if u == upstream && t == timeline => Ok(()),
                other => Err(format!("{other:?}; its log ends: {}", self.log_tail())),
            },
        )
    }

    fn rows(&self, origin: &str) -> Result<u64, String> {
        self.sql(&format!("SELECT count(*) FROM t WHERE origin = '{origin}'"))?
            .parse()
            .map_err(|e| format!("{e}"))
    }

    fn wait_rows(&self, origin: &str, want: u64) {
        wait_for(
            &format!("{}: {want} rows from {origin}", self.name),
            || match self.rows(origin)? {
                n if n == want => Ok(()),
                n => Err(format!("{n} rows")),
            },
        )
    }

    fn insert(&self, origin: &str, from: u32, to: u32) {
        self.sql(&format!(
            "INSERT INTO t SELECT g, '{origin}' FROM generate_series({from}, {to}) g"
        ))
        .unwrap_or_else(|e| panic!("{}: insert {origin}: {e}", self.name));
    }

    fn slot(&self, instance: &str) -> Result<status::Slot, String> {
        let name = slot_name(instance);
        status::parse_slots(&self.sql(status::SLOTS_QUERY)?)?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or(format!("no slot {name}"))
    }

    fn in_recovery(&self) -> bool {
        self.sql("SELECT pg_is_in_recovery()").unwrap() == "t"
    }

    fn assert_no_password_logged(&self) {
        let log = self.log();
        assert!(!log.is_empty(), "{} logged nothing", self.name);
        for secret in [APP_PASSWORD, REPLICATION_PASSWORD] {
            assert!(!log.contains(secret), "a password in {}'s log", self.name);
        }
    }
}

/// A running manager, stopped (SIGQUIT, which it forwards) if a test ends before it stops it.
struct Running(Option<Child>);

impl Running {
    fn try_wait(&mut self) -> Option<ExitStatus> {
        self.0.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    fn stop(mut self, signal: libc::c_int) -> ExitStatus {
        let mut child = self.0.take().unwrap();
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(child.id() as i32, signal) };
        child.wait().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
            let _ = child.wait();
        }
    }
}

#[test]
fn a_standby_clones_its_primary_streams_and_is_ready_only_while_it_streams() {
    let p = Node::new("tp-0");
    let s = Node::new("tp-1");
    // The primary's topology is older: it does not know the standby yet.
    p.topology(&p, &[&p]);
    s.topology(&p, &[&p, &s]);
    let mut running_p = p.start();
    assert!(!p.in_recovery());
    p.sql("CREATE TABLE t (id int PRIMARY KEY, origin text NOT NULL)")
        .unwrap();
    p.insert("p", 1, 100);

    // The standby clones from an empty directory, making its own slot on the primary.
    let running_s = s.start();
    assert!(s.in_recovery(), "the standby is not in recovery");
    s.wait_streaming(&p, 1);
    s.wait_rows("p", 100);
    p.insert("p", 101, 200);
    s.wait_rows("p", 200);
    assert!(s.sql("INSERT INTO t VALUES (0, 'x')").is_err());
    assert!(p.slot("tp-1").unwrap().active);
    let passfile = s.path("data/pgdata.pgpass");
    let mode = std::fs::metadata(&passfile).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    // The slot the primary's topology does not name stays while the standby is away: longer
    // than the primary's slot checks, well within its grace period.
    assert!(running_s.stop(libc::SIGINT).success(), "{}", s.log());
    std::thread::sleep(Duration::from_secs(12));
    let slot = p
        .slot("tp-1")
        .expect("the primary dropped the standby's slot");
    assert!(!slot.active);
    let mut running_s = s.start();
    s.wait_streaming(&p, 1);

    // Ready only while streaming: the primary stops, the standby answers but is not ready.
    assert!(running_p.stop(libc::SIGINT).success(), "{}", p.log());
    wait_for("the standby is not ready without its primary", || {
        match s.probe() {
            true => Err("still ready".to_string()),
            false => Ok(()),
        }
    });
    assert!(s.in_recovery(), "the standby stopped answering");
    assert!(running_s.try_wait().is_none(), "{}", s.log());
    // The primary comes back, knowing its standby now: ready again.
    p.topology(&p, &[&p, &s]);
    running_p = p.start();
    s.wait_ready(&mut running_s);
    s.wait_streaming(&p, 1);
    p.insert("p", 201, 300);
    s.wait_rows("p", 300);
    assert!(p.slot("tp-1").unwrap().active);

    for node in [&p, &s] {
        node.assert_no_password_logged();
    }
    drop(running_s);
    drop(running_p);
}

#[test]
fn a_switchover_by_topology_fences_promotes_follows_and_rejoins_without_losing_a_row() {
    let a = Node::new("tq-0");
    let b = Node::new("tq-1");
    let c = Node::new("tq-2");
    for node in [&a, &b, &c] {
        node.topology(&a, &[&a, &b, &c]);
    }
    let running_a = a.start();
    a.sql("CREATE TABLE t (id int PRIMARY KEY, origin text NOT NULL)")
        .unwrap();
    a.insert("a", 1, 100);
    let running_b = b.start();
    let running_c = c.start();
    for standby in [&b, &c] {
        standby.wait_streaming(&a, 1);
        standby.insert_refused();
    }
    a.insert("a", 101, 110);
    b.wait_rows("a", 110);
    c.wait_rows("a", 110);

    // Writes stopped; the topology names b: a steps down, b is promoted, c follows b.
    for node in [&a, &b, &c] {
        node.topology(&b, &[&a, &b, &c]);
    }
    wait_for("the new primary accepts writes", || match b.status()? {
        Status::Primary { timeline: 2, .. } => Ok(()),
        other => Err(format!("{other:?}: {}", b.log_tail())),
    });
    b.insert("b", 201, 210);
    assert_eq!(
        b.rows("a").unwrap(),
        110,
        "a row was lost in the switchover"
    );
    c.wait_streaming(&b, 2);
    c.wait_rows("b", 10);
    assert!(c.log().contains("following the new primary tq-1"));

    // The old primary stopped its server and starts again in the same process (a container
    // restart would wait for the kubelet's back-off): it rejoins as a standby of the new one.
    a.wait_streaming(&b, 2);
    a.wait_rows("b", 10);
    assert!(a.in_recovery());
    assert_eq!(a.rows("a").unwrap(), 110);
    let mut running_a = running_a;
    assert_eq!(
        running_a.try_wait(),
        None,
        "the manager exited: {}",
        a.log()
    );
    let log = a.log();
    assert!(
        log.contains("stepped down") && log.contains("starting again in place"),
        "{log}"
    );
    b.insert("b", 211, 220);
    a.wait_rows("b", 20);
    wait_for("the slot of tq-0 active on tq-1", || {
        match b.slot("tq-0")? {
            slot if slot.active => Ok(()),
            slot => Err(format!("{slot:?}")),
        }
    });
    let log = a.log();
    let rejoined = log
        .lines()
        .find(|l| l.contains("rejoined tq-1 as its standby: "))
        .unwrap_or_else(|| panic!("no rejoin in {log}"));
    assert!(
        rejoined.ends_with("NothingToRewind") || rejoined.ends_with("Rewound"),
        "{rejoined}"
    );
    eprintln!("{rejoined}");

    c.wait_rows("b", 20);
    for node in [&a, &b, &c] {
        node.assert_no_password_logged();
    }
    drop(running_a);
    drop(running_b);
    drop(running_c);
}

impl Node {
    fn insert_refused(&self) {
        assert!(
            self.sql("INSERT INTO t VALUES (0, 'x')").is_err(),
            "{} accepted a write as a standby",
            self.name
        );
    }
}

#[test]
fn without_a_topology_file_the_instance_runs_as_before() {
    let n = Node::new("tn-0");
    let running = n.start();
    assert!(!n.in_recovery());
    // Longer than the topology checks: nothing about replication is made.
    std::thread::sleep(Duration::from_secs(3));
    let roles = n
        .sql("SELECT count(*) FROM pg_roles WHERE rolname = 'dbop_replication'")
        .unwrap();
    assert_eq!(
        roles, "0",
        "the replication role was made without a topology"
    );
    assert_eq!(n.sql(status::SLOTS_QUERY).unwrap(), "");
    assert!(!n.path("data/pgdata.pgpass").exists());
    assert!(!n.log().contains("topology"), "{}", n.log());
    assert!(running.stop(libc::SIGTERM).success(), "{}", n.log());
    n.assert_no_password_logged();
}

/// A commit in the background, by a psql of its own.
struct Commit(Child);

impl Commit {
    fn start(node: &Node, sql: &str) -> Commit {
        let mut psql = node.psql(sql);
        psql.stdout(Stdio::null()).stderr(Stdio::null());
        Commit(psql.spawn().unwrap())
    }

    /// Still waiting to be acknowledged.
    fn waiting(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }

    /// Waits until it is acknowledged, successfully.
    fn acknowledged(&mut self, what: &str) {
        let status = wait_for(what, || {
            self.0.try_wait().unwrap().ok_or("waiting".to_string())
        });
        assert!(status.success(), "{what}: psql failed");
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until a session on `node` waits for a synchronous standby to confirm its commit.
fn wait_sync_rep(node: &Node) {
    wait_for("a commit waiting for a synchronous standby", || match node
        .sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")?
    {
        n if n != "0" => Ok(()),
        n => Err(format!("{n} sessions wait for a standby")),
    });
}

/// `synchronous_standby_names` of `node`'s server, once it is `want`.
fn wait_standby_names(node: &Node, want: &str) {
    wait_for(
        &format!("{}: synchronous_standby_names = {want:?}", node.name),
        || match node.sql("SHOW synchronous_standby_names")? {
            now if now == want => Ok(()),
            now => Err(format!("{now:?}; the manager's log: {}", node.log_tail())),
        },
    );
}

#[test]
fn synchronous_replication_holds_commits_until_a_standby_has_them_or_degrades_when_told() {
    let p = Node::new("ts-0");
    let s = Node::new("ts-1");
    for node in [&p, &s] {
        node.topology_and(&p, &[&p, &s], "synchronous=1 wait\n");
    }
    // The primary gets ready with no standby at all: its own sessions never wait.
    let running_p = p.start();
    wait_standby_names(&p, "ANY 1 (\"ts-1\")");
    // (A commit of its own that does not wait either.)
    p.sql(
        "SET synchronous_commit = local; CREATE TABLE t (id int PRIMARY KEY, origin text NOT NULL)",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut held = Commit::start(&p, "INSERT INTO t VALUES (1, 'held')");
    wait_sync_rep(&p);
    assert!(held.waiting(), "acknowledged with no standby to confirm it");
    // The standby clones, streams, and confirms it: acknowledged, and the standby has it.
    let running_s = s.start();
    held.acknowledged("the held commit, once the standby streams");
    s.wait_rows("held", 1);
    p.insert("p", 2, 100);
    s.wait_rows("p", 99);

    // The standby stops: commits wait again; told to degrade, the primary confirms alone.
    assert!(running_s.stop(libc::SIGINT).success(), "{}", s.log());
    let mut held = Commit::start(&p, "INSERT INTO t VALUES (101, 'degraded')");
    wait_sync_rep(&p);
    assert!(held.waiting(), "acknowledged with its standby stopped");
    p.topology_and(&p, &[&p, &s], "synchronous=1 degrade\n");
    wait_standby_names(&p, "");
    held.acknowledged("the held commit, once degraded");
    // Waiting again, then without synchronous replication at all: asynchronous, as before.
    p.topology_and(&p, &[&p, &s], "synchronous=1 wait\n");
    wait_standby_names(&p, "ANY 1 (\"ts-1\")");
    p.topology(&p, &[&p, &s]);
    wait_standby_names(&p, "");
    p.insert("p", 102, 110);
    for node in [&p, &s] {
        node.assert_no_password_logged();
    }
    drop(running_p);
}
