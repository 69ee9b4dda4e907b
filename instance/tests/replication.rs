//! Streaming replication for real: three `dbop-instance run` managers of Debian's PostgreSQL on
//! loopback (own ports, own data directories under temporary directories, run as `postgres`
//! when the tests run as root), driven through `dbop-instance replication …` the way the
//! operator will drive them: clone two standbys, fail over to one, repoint the other, rewind
//! the old primary after divergent writes of its own. Every wait polls a condition with a
//! deadline; every server is stopped when its test ends, failed or not.
//! Requires the PostgreSQL server packages (backups/install-test-deps.sh installs them).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dbop_instance::replication::config::slot_name;
use dbop_instance::replication::status::{
    self, Lsn, Role, STATUS_QUERY, Status, lag_bytes, parse_status,
};

use dbop_contract::position::Position;
use std::io::{Read, Write};

mod common;
use common::{free_port, ids, server};

const DEADLINE: Duration = Duration::from_secs(90);
const REPLICATION_PASSWORD: &str = "repl-Secr3t:never\\printed";

/// Polls `check` until it gives a value, for at most `DEADLINE`; the last error says why not.
fn wait_for<T>(what: &str, check: impl FnMut() -> Result<T, String>) -> T {
    common::wait_for(what, DEADLINE, Duration::from_millis(100), check)
}

/// One instance: its own directory with the data, the socket, the credentials and a copy of
/// the binary (the target directory may not be readable by `postgres`).
struct Node {
    name: String,
    dir: tempfile::TempDir,
    ids: Option<(u32, u32)>,
    major: u32,
    bin: PathBuf,
    port: u16,
    /// Of its status endpoint (`--status-addr`).
    status_port: u16,
}

impl Node {
    fn new(name: &str) -> Node {
        let (major, bin) = server();
        let ids = ids();
        let dir = tempfile::Builder::new()
            .prefix(&format!("dbop-repl-{name}-"))
            .tempdir()
            .unwrap();
        for sub in ["", "data", "run", "creds", "repl"] {
            let p = dir.path().join(sub);
            std::fs::create_dir_all(&p).unwrap();
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        std::fs::write(dir.path().join("creds/username"), "app").unwrap();
        std::fs::write(dir.path().join("creds/password"), "app-password").unwrap();
        std::fs::write(dir.path().join("repl/password"), REPLICATION_PASSWORD).unwrap();
        let exe = dir.path().join("dbop-instance");
        common::copy_manager(&exe);
        Node {
            name: name.to_string(),
            dir,
            ids,
            major,
            bin,
            port: free_port(),
            status_port: free_port(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn pgdata(&self) -> PathBuf {
        self.path("data/pgdata")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(self.path("dbop-instance"));
        cmd.env_remove("PGPASSWORD").current_dir(self.dir.path());
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn local_args(&self) -> Vec<String> {
        vec![
            format!("--pgdata={}", self.pgdata().display()),
            format!("--major={}", self.major),
            format!("--port={}", self.port),
            format!("--socket-dir={}", self.path("run").display()),
            format!("--credentials-dir={}", self.path("creds").display()),
        ]
    }

    /// The arguments that point this instance at `primary`.
    fn upstream_args(&self, primary: &Node) -> Vec<String> {
        vec![
            "--primary-host=127.0.0.1".to_string(),
            format!("--primary-port={}", primary.port),
            format!("--instance={}", self.name),
            format!(
                "--replication-password-file={}",
                self.path("repl/password").display()
            ),
            format!(
                "--passfile={}",
                self.path("run/dbop-replication.pgpass").display()
            ),
        ]
    }

    /// `dbop-instance replication <sub> <local args> <extra>`.
    fn replication(&self, sub: &str, extra: &[String]) -> Output {
        let out = self
            .command()
            .args(["replication", sub])
            .args(self.local_args())
            .args(extra)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !all.contains(REPLICATION_PASSWORD) && !all.contains("app-password"),
            "a password in the output of {sub}"
        );
        out
    }

    /// The same, which must succeed; its standard output and error.
    fn must(&self, sub: &str, extra: &[String]) -> String {
        let out = self.replication(sub, extra);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{} replication {sub} failed ({}): {text}",
            self.name,
            out.status
        );
        text
    }

    /// `dbop-instance run`, its log in a file (a pipe nobody reads would block the server);
    /// returns once the probe passes.
    fn start(&self) -> Running {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("log"))
            .unwrap();
        let mut child = self
            .command()
            .arg("run")
            .args(self.local_args())
            .arg("--listen-addresses=127.0.0.1")
            .arg(format!(
                "--termination-log={}",
                self.path("termination-log").display()
            ))
            .arg("--poll-millis=200")
            .arg(format!("--status-addr=127.0.0.1:{}", self.status_port))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !self.probe() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "{}: dbop-instance exited early ({status}): {}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} not ready within {DEADLINE:?}: {}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Running(Some(child))
    }

    /// `GET /status` on its status endpoint, what the operator reads.
    fn position(&self) -> Result<Position, String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.status_port))
            .map_err(|e| format!("{}: status endpoint: {e}", self.name))?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /status HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).map_err(|e| e.to_string())?;
        let (head, body) = all.split_once("\r\n\r\n").ok_or("no response head")?;
        if !head.starts_with("HTTP/1.1 200 ") {
            return Err(format!("{}: {head}: {body}", self.name));
        }
        Position::from_json(body)
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
        self.command()
            .arg("probe")
            .args(self.local_args())
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// SQL over the local socket as `app` (peer authentication through dbop's map).
    fn sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "--no-psqlrc",
                "--no-align",
                "--tuples-only",
                "--field-separator=|",
            ])
            .args(["--set=ON_ERROR_STOP=1", "-c", sql])
            .arg(format!(
                "host={} port={} user=app dbname=app",
                self.path("run").display(),
                self.port
            ))
            .env_remove("PGPASSWORD")
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    fn status(&self) -> Result<Status, String> {
        parse_status(&self.sql(STATUS_QUERY)?)
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

    /// Waits until this standby streams from `primary` on `timeline`.
    fn wait_streaming(&self, primary: &Node, timeline: u32) -> Status {
        let upstream = format!("127.0.0.1:{}", primary.port);
        wait_for(
            &format!("{} streams from {}", self.name, primary.name),
            || {
                let s = self.status()?;
                match &s {
                    Status::Standby {
                        streaming: true,
                        upstream: Some(u),
                        timeline: Some(t),
                        ..
                    } if *u == upstream && *t == timeline => Ok(s),
                    other => Err(format!("{other:?}; its log ends: {}", self.log_tail())),
                }
            },
        )
    }

    fn slot(&self, instance: &str) -> Result<status::Slot, String> {
        let name = slot_name(instance);
        status::parse_slots(&self.sql(status::SLOTS_QUERY)?)?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or(format!("no slot {name}"))
    }
}

/// A running manager, stopped (immediate shutdown, forwarded to its server) if a test fails
/// before it stops it: no server outlives its test.
struct Running(Option<Child>);

impl Running {
    /// Sends `signal` to the manager (which forwards it to postgres) and waits for its end.
    fn stop(mut self, signal: libc::c_int) -> std::process::ExitStatus {
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

/// A `postmaster.pid` in `node`'s data directory naming a live process that is no server on
/// it (a `sleep`, killed when the guard drops), as a container restart leaves one.
fn stale_pid_file(node: &Node) -> KillOnDrop {
    // Of the manager's user: PostgreSQL takes a PID it may not signal for a dead one.
    let mut sleep = Command::new("sleep");
    sleep.arg("300").current_dir("/");
    if let Some((uid, gid)) = node.ids {
        sleep.uid(uid).gid(gid);
    }
    let other = sleep.spawn().unwrap();
    let data = node.pgdata();
    std::fs::write(
        data.join("postmaster.pid"),
        format!(
            "{}\n{}\n1764900000\n{}\n{}\n127.0.0.1\n  5432001     32768\nready   \n",
            other.id(),
            data.display(),
            node.port,
            node.path("run").display()
        ),
    )
    .unwrap();
    if let Some((uid, gid)) = node.ids {
        std::os::unix::fs::chown(data.join("postmaster.pid"), Some(uid), Some(gid)).unwrap();
    }
    KillOnDrop(other)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn insert(node: &Node, origin: &str, from: u32, to: u32) {
    node.sql(&format!(
        "INSERT INTO t SELECT g, '{origin}' FROM generate_series({from}, {to}) g"
    ))
    .unwrap_or_else(|e| panic!("{}: insert {origin}: {e}", node.name));
}

/// Waits until `standby` has replayed everything `primary` wrote: the standby's replayed
/// position reaches the primary's current one, as the status parser reads them.
fn wait_caught_up(primary: &Node, standby: &Node) {
    wait_for(
        &format!("{} catches up with {}", standby.name, primary.name),
        || {
            let Status::Primary { current, .. } = primary.status()? else {
                return Err(format!("{} is not a primary", primary.name));
            };
            match standby.status()? {
                Status::Standby {
                    received: Some(received),
                    replayed: Some(replayed),
                    ..
                } if lag_bytes(current, replayed) == 0 => {
                    assert!(
                        received >= replayed,
                        "received {received} < replayed {replayed}"
                    );
                    Ok(())
                }
                other => Err(format!("primary at {current}, standby {other:?}")),
            }
        },
    )
}

#[test]
fn clones_streams_fails_over_repoints_and_rewinds_the_old_primary() {
    let a = Node::new("db-0");
    let b = Node::new("db-1");
    let c = Node::new("db-2");
    let began = Instant::now();
    let phase = |what: &str| eprintln!("{:>6.1} s  {what}", began.elapsed().as_secs_f64());

    // The primary: initdb by `run`, the replication role, a slot per standby (twice: idempotent).
    let running_a = a.start();
    a.must(
        "ensure-role",
        &[format!(
            "--replication-password-file={}",
            a.path("repl/password").display()
        )],
    );
    for _ in 0..2 {
        a.must("slots", &strings(&["--standby=db-1", "--standby=db-2"]));
    }
    for standby in ["db-1", "db-2"] {
        let slot = a.slot(standby).unwrap();
        assert!(!slot.active && slot.restart_lsn.is_some(), "{slot:?}");
    }
    a.sql("CREATE TABLE t (id int PRIMARY KEY, origin text NOT NULL)")
        .unwrap();
    insert(&a, "a", 1, 100);

    phase("primary ready");
    // Two standbys cloned from it, then run by their managers.
    for standby in [&b, &c] {
        standby.must("clone", &standby.upstream_args(&a));
        let passfile = standby.path("run/dbop-replication.pgpass");
        let mode = std::fs::metadata(&passfile).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        assert!(standby.pgdata().join("standby.signal").exists());
    }
    phase("standbys cloned");
    let running_b = b.start();
    let running_c = c.start();
    phase("standbys started");
    insert(&a, "a", 101, 200);
    for standby in [&b, &c] {
        standby.wait_streaming(&a, 1);
        standby.wait_rows("a", 200);
        assert!(
            standby.sql("INSERT INTO t VALUES (0, 'x')").is_err(),
            "a standby accepted a write"
        );
    }
    assert!(matches!(
        a.status().unwrap(),
        Status::Primary { timeline: 1, .. }
    ));

    phase("standbys stream");
    // Each standby's slot is in use and advances with the WAL it confirms.
    let before: Vec<Lsn> = ["db-1", "db-2"]
        .iter()
        .map(|s| {
            let slot = wait_for(&format!("slot of {s} active"), || match a.slot(s)? {
                slot if slot.active => Ok(slot),
                slot => Err(format!("{slot:?}")),
            });
            slot.restart_lsn.unwrap()
        })
        .collect();
    insert(&a, "a", 201, 10_000);
    for (s, was) in ["db-1", "db-2"].iter().zip(before) {
        wait_for(&format!("slot of {s} advances past {was}"), || {
            match a.slot(s)?.restart_lsn {
                Some(now) if now > was => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    }
    for standby in [&b, &c] {
        wait_caught_up(&a, standby);
        standby.wait_rows("a", 10_000);
    }
    // The status endpoint says what the operator ranks a failover by: the primary's position,
    // and each standby's received WAL, which has caught up with it (nothing is written now).
    let primary = a.position().unwrap();
    assert!(
        !primary.standby && primary.timeline == Some(1),
        "{primary:?}"
    );
    let written = primary.lsn.expect("a primary reports its position");
    assert_eq!(
        primary.replay_lag_ms.keys().collect::<Vec<_>>(),
        ["db-1", "db-2"],
        "the primary reports each streaming standby's replay lag"
    );
    for standby in [&b, &c] {
        let p = standby.position().unwrap();
        assert!(p.standby && p.streaming && p.timeline == Some(1), "{p:?}");
        assert!(
            p.lsn >= Some(written) && p.replayed >= Some(written),
            "{p:?} behind {written}"
        );
    }

    phase("slots advanced");
    // Failover: the primary stops (its standbys get all of its WAL); db-1 is promoted.
    assert!(running_a.stop(libc::SIGTERM).success(), "{}", a.log());
    let out = b.must("promote", &[]);
    assert!(out.contains("promoted"), "{out}");
    insert(&b, "b", 20_001, 20_100);
    assert!(matches!(
        b.status().unwrap(),
        Status::Primary { timeline: 2, .. }
    ));
    // Its slots for the others, then db-2 repointed to it without a restart.
    b.must("slots", &strings(&["--standby=db-2", "--standby=db-0"]));
    c.must("follow", &c.upstream_args(&b));
    c.wait_streaming(&b, 2);
    c.wait_rows("b", 100);
    wait_for("slot of db-2 active on db-1", || match b.slot("db-2")? {
        slot if slot.active => Ok(()),
        slot => Err(format!("{slot:?}")),
    });
    // A running primary refuses to follow: it must stop and rejoin.
    let refused = b.replication("follow", &b.upstream_args(&c));
    assert!(!refused.status.success());

    phase("failed over, db-2 repointed");
    // The old primary comes back on its own, takes divergent writes, and crashes.
    let running_a = a.start();
    assert!(matches!(
        a.status().unwrap(),
        Status::Primary { timeline: 1, .. }
    ));
    insert(&a, "diverged", 30_001, 30_050);
    drop(running_a);

    phase("divergent writes on the old primary");
    // As a manager that had already made it a standby leaves it (a demotion, then a crash):
    // pg_rewind's crash recovery runs in single-user mode, which refuses standby mode.
    std::fs::write(a.pgdata().join("standby.signal"), b"").unwrap();
    // pg_rewind that fails in its crash recovery (a setting the server refuses) changed no
    // file: the data is not marked half-rewound, and the rejoin after the fix rewinds it.
    let auto_conf = a.pgdata().join("postgresql.auto.conf");
    let settings = std::fs::read_to_string(&auto_conf).unwrap();
    std::fs::write(&auto_conf, format!("{settings}\nnot a setting\n")).unwrap();
    let failed = a.replication("rejoin", &a.upstream_args(&b));
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "rejoined with a broken setting");
    assert!(said.contains("nothing was rewound"), "{said}");
    assert!(
        !dbop_instance::replication::ops::rewind_marker(&a.pgdata()).exists(),
        "a rewind that changed nothing marked the data half-rewound"
    );
    std::fs::write(&auto_conf, settings).unwrap();
    // A postmaster.pid naming a live process that is no server (after a container restart,
    // the killed server's PID is soon a thread or a tool of the manager) stops no rejoin.
    let _reused_pid = stale_pid_file(&a);
    // It rejoins the new primary: rewound, then streaming; its divergent rows are gone.
    let out = a.must("rejoin", &a.upstream_args(&b));
    assert!(out.contains("removed a stale postmaster.pid"), "{out}");
    assert!(out.contains("rejoined: Rewound"), "{out}");
    let running_a = a.start();
    a.wait_streaming(&b, 2);
    a.wait_rows("b", 100);
    assert_eq!(
        a.rows("diverged").unwrap(),
        0,
        "the divergent rows survived"
    );
    assert_eq!(a.rows("a").unwrap(), 10_000);
    // The rewound old primary keeps none of its slots (they would pin its WAL for ever);
    // `slots` with no standby keeps it so.
    assert_eq!(a.sql(status::SLOTS_QUERY).unwrap(), "");
    a.must("slots", &[]);

    phase("old primary rewound and streaming");
    // Status: one primary, two standbys on its timeline, caught up, slots active.
    insert(&b, "b", 20_101, 20_200);
    for standby in [&a, &c] {
        wait_caught_up(&b, standby);
        standby.wait_rows("b", 200);
        assert_eq!(standby.status().unwrap().role(), Role::Standby);
    }
    let printed = b.must("status", &[]);
    for want in [
        "role=primary\n",
        "timeline=2\n",
        "slot.dbop_db_0=active",
        "slot.dbop_db_2=active",
    ] {
        assert!(printed.contains(want), "{want} missing: {printed}");
    }
    let printed = c.must("status", &[]);
    assert!(printed.contains("role=standby\ntimeline=2\n"), "{printed}");
    assert!(printed.contains(&format!("upstream=127.0.0.1:{}\n", b.port)));

    phase("status checked");
    // Switchover to db-2: the primary stops cleanly (a fast shutdown waits until its standbys
    // have flushed all of its WAL, its last commits included), db-2 is promoted, db-0 follows
    // it, db-1 rejoins (pg_rewind finds nothing to rewind) and streams: no commit lost.
    insert(&b, "last", 40_001, 40_010);
    assert!(running_b.stop(libc::SIGINT).success(), "{}", b.log());
    c.must("promote", &[]);
    assert_eq!(
        c.rows("last").unwrap(),
        10,
        "a commit was lost in the switchover"
    );
    c.must("slots", &strings(&["--standby=db-0", "--standby=db-1"]));
    a.must("follow", &a.upstream_args(&c));
    let out = b.must("rejoin", &b.upstream_args(&c));
    assert!(out.contains("rejoined: NothingToRewind"), "{out}");
    // Nor a start: PostgreSQL alone would refuse it ("lock file already exists").
    let _reused_pid = stale_pid_file(&b);
    let running_b = b.start();
    assert!(b.log().contains("removed a stale postmaster.pid"));
    a.wait_streaming(&c, 3);
    b.wait_streaming(&c, 3);
    insert(&c, "c", 50_001, 50_010);
    for standby in [&a, &b] {
        wait_caught_up(&c, standby);
        standby.wait_rows("c", 10);
        assert_eq!(standby.rows("last").unwrap(), 10);
        assert_eq!(standby.rows("diverged").unwrap(), 0);
    }

    phase("switched over");
    for node in [&a, &b, &c] {
        let log = node.log();
        assert!(
            !log.contains(REPLICATION_PASSWORD) && !log.contains("app-password"),
            "a password in {}'s log",
            node.name
        );
    }
    drop(running_a);
    drop(running_b);
    drop(running_c);
    phase("stopped");
}

#[test]
fn rejoin_clones_only_when_allowed_to_discard() {
    let a = Node::new("solo-0");
    let d = Node::new("solo-1");
    let _running_a = a.start();
    a.must(
        "ensure-role",
        &[format!(
            "--replication-password-file={}",
            a.path("repl/password").display()
        )],
    );
    a.must("slots", &strings(&["--standby=solo-1"]));
    a.sql("CREATE TABLE t (id int PRIMARY KEY, origin text NOT NULL)")
        .unwrap();
    insert(&a, "a", 1, 10);
    // Another cluster's data (its own initdb) cannot be rewound from a.
    drop(d.start());
    let out = d.replication("rejoin", &d.upstream_args(&a));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("another cluster"));
    assert!(d.pgdata().join("PG_VERSION").exists(), "data discarded");
    let out = d.must(
        "rejoin",
        &[d.upstream_args(&a), strings(&["--allow-discard"])].concat(),
    );
    assert!(out.contains("Cloned(OtherCluster"), "{out}");
    let _running_d = d.start();
    d.wait_streaming(&a, 1);
    d.wait_rows("a", 10);
    assert!(Path::new(&d.pgdata()).join("standby.signal").exists());
}
