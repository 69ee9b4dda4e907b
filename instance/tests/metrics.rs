//! The metrics endpoint for real: `dbop-instance run --metrics-addr 127.0.0.1:<port>` of
//! Debian's PostgreSQL in a temporary directory (as `postgres` when the tests run as root),
//! scraped over HTTP, each metric compared with what PostgreSQL itself reports for the same
//! thing at the same moment. Sessions that hold a transaction, wait for a lock or sleep are
//! real psql clients. Every wait polls with a deadline; every server and session is stopped
//! when its test ends, failed or not.
//! Requires the PostgreSQL server packages (backups/install-test-deps.sh installs them).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, ids, server};

const DEADLINE: Duration = Duration::from_secs(60);
const PASSWORD: &str = "app-Secr3t-never-scraped";
const REPLICATION_PASSWORD: &str = "repl-Secr3t-never-scraped";

/// Polls `check` until it gives a value, for at most `DEADLINE`; the last error says why not.
fn wait_for<T>(what: &str, check: impl FnMut() -> Result<T, String>) -> T {
    common::wait_for(what, DEADLINE, Duration::from_millis(100), check)
}

/// One instance with its metrics endpoint.
struct Node {
    name: String,
    dir: tempfile::TempDir,
    ids: Option<(u32, u32)>,
    major: u32,
    bin: PathBuf,
    port: u16,
    metrics_port: u16,
}

impl Node {
    fn new(name: &str) -> Node {
        let (major, bin) = server();
        let ids = ids();
        let dir = tempfile::Builder::new()
            .prefix(&format!("dbop-metrics-{name}-"))
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
        std::fs::write(dir.path().join("creds/password"), PASSWORD).unwrap();
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
            metrics_port: free_port(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(self.path("dbop-instance"));
        cmd.env_remove("PGPASSWORD")
            .env("DBOP_METRICS_QUERIES", self.path("queries.yaml"))
            .current_dir(self.dir.path());
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn local_args(&self) -> Vec<String> {
        vec![
            format!("--pgdata={}", self.path("data/pgdata").display()),
            format!("--major={}", self.major),
            format!("--port={}", self.port),
            format!("--socket-dir={}", self.path("run").display()),
            format!("--credentials-dir={}", self.path("creds").display()),
        ]
    }

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

    fn replication(&self, sub: &str, extra: &[String]) {
        let out = self
            .command()
            .args(["replication", sub])
            .args(self.local_args())
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} replication {sub}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `dbop-instance run --metrics-addr …`, its log in a file; returns once the probe passes.
    fn start(&self) -> Running {
        self.start_with(true)
    }

    /// The same, with the endpoint or without it (no `--metrics-addr`: today's pods).
    fn start_with(&self, metrics: bool) -> Running {
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
            .args(metrics.then(|| format!("--metrics-addr=127.0.0.1:{}", self.metrics_port)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !self.probe() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{}: exited early ({status}): {}", self.name, self.log());
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{} not ready: {}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Running(Some(child))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("log")).unwrap_or_default()
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

    fn conninfo(&self, database: &str) -> String {
        format!(
            "host={} port={} user=app dbname={database}",
            self.path("run").display(),
            self.port
        )
    }

    /// SQL over the local socket as `app` on `database`; the rows `|`-separated.
    fn sql_on(&self, database: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "--no-psqlrc",
                "--no-align",
                "--tuples-only",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql])
            .arg(self.conninfo(database))
            .env_remove("PGPASSWORD")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn sql(&self, sql: &str) -> String {
        self.sql_on("app", sql)
    }

    fn number(&self, sql: &str) -> f64 {
        let text = self.sql(sql);
        text.parse()
            .unwrap_or_else(|_| panic!("{sql} gave {text:?}"))
    }

    /// A psql session kept open, fed statements on its standard input.
    fn session(&self, application_name: &str) -> Session {
        let child = Command::new(self.bin.join("psql"))
            .args(["--no-psqlrc", "--quiet"])
            .arg(format!(
                "{} application_name={application_name}",
                self.conninfo("app")
            ))
            .env_remove("PGPASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Session(child)
    }

    /// GET `path` on the metrics endpoint: (status code, body).
    fn get(&self, path: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .unwrap_or_else(|e| panic!("{}: metrics endpoint: {e}", self.name));
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        let (head, body) = all.split_once("\r\n\r\n").unwrap();
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        if code == 200 && path == "/metrics" {
            assert!(
                head.contains("Content-Type: text/plain; version=0.0.4"),
                "{head}"
            );
        }
        (code, body.to_string())
    }

    /// One scrape, checked well-formed, with its wall-clock time.
    fn scrape(&self) -> (Scrape, Duration) {
        let started = Instant::now();
        let (code, body) = self.get("/metrics");
        let took = started.elapsed();
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.contains(PASSWORD) && !body.contains(REPLICATION_PASSWORD),
            "a password in the metrics"
        );
        (Scrape::parse(&body), took)
    }
}

/// A scrape's samples, by series as printed (`name{labels}`).
struct Scrape {
    text: String,
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// Parses the text, checking that every sample's family has HELP and TYPE before it.
    fn parse(text: &str) -> Scrape {
        let mut typed = Vec::new();
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["gauge", "counter"].contains(&kind), "{line}");
                assert!(
                    text.contains(&format!("# HELP {name} ")),
                    "no HELP for {name}"
                );
                assert!(name.starts_with("dbop_pg_"), "{name}");
                typed.push(name.to_string());
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                assert_eq!(typed.last().map(String::as_str), Some(name), "{line}");
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
                assert!(
                    samples.insert(series.to_string(), value).is_none(),
                    "duplicate {series}"
                );
            }
        }
        Scrape {
            text: text.to_string(),
            samples,
        }
    }

    fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    fn must(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("{series} missing from\n{}", self.text))
    }

    fn has_family(&self, name: &str) -> bool {
        self.text.contains(&format!("# TYPE {name} "))
    }
}

/// A psql client session, killed when dropped.
struct Session(Child);

impl Session {
    fn send(&mut self, sql: &str) {
        let stdin: &mut ChildStdin = self.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{sql}").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running manager, stopped (immediate shutdown, forwarded to its server) when dropped,
/// so no server outlives its test, failed or not.
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

/// `low <= x <= high`, with the three in the message.
fn between(what: &str, low: f64, x: f64, high: f64) {
    assert!(
        low <= x && x <= high,
        "{what}: {x} is not within [{low}, {high}]"
    );
}

/// utime + stime + cutime + cstime of `pid`, in seconds (clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = after
        .split(' ')
        .skip(11)
        .take(4)
        .map(|x| x.parse().unwrap())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    f.iter().sum::<f64>() / hz
}

#[test]
fn each_metric_is_what_postgresql_reports() {
    let n = Node::new("db-0");
    let running = n.start();
    let manager_pid = running.0.as_ref().unwrap().id();
    assert!(
        n.log().contains("metrics on http://127.0.0.1:"),
        "{}",
        n.log()
    );

    // The endpoint: metrics and health only.
    assert_eq!(n.get("/healthz"), (200, "ok\n".to_string()));
    assert_eq!(n.get("/").0, 404);
    let (s, _) = n.scrape();
    assert_eq!(s.must("dbop_pg_up"), 1.0);
    assert_eq!(s.must("dbop_pg_in_recovery"), 0.0);
    assert_eq!(
        s.must("dbop_pg_max_connections"),
        n.number("SELECT current_setting('max_connections')::int")
    );
    for q in [
        "settings",
        "activity",
        "databases",
        "transactions",
        "locks",
        "checkpoints",
        "status",
        "replication",
        "archiver",
        "data_volume",
    ] {
        assert_eq!(
            s.must(&format!("dbop_pg_query_errors_total{{query=\"{q}\"}}")),
            0.0
        );
    }
    assert!(
        !s.has_family("dbop_pg_replication_lag_bytes"),
        "no standby yet"
    );

    // Database size: a table of a known size, then the size PostgreSQL reports just before
    // and just after the scrape.
    n.sql(
        "CREATE TABLE big AS SELECT g AS id, repeat('x', 1000) AS pad \
         FROM generate_series(1, 20000) g",
    );
    let table = n.number("SELECT pg_total_relation_size('big')");
    assert!(table > 20_000_000.0, "{table}");
    let size = "SELECT pg_database_size('app')";
    let before = n.number(size);
    let (s, _) = n.scrape();
    let after = n.number(size);
    let scraped = s.must("dbop_pg_database_size_bytes{datname=\"app\"}");
    between("database size", before, scraped, after);
    assert!(scraped > table, "{scraped} <= the table's {table}");

    // Dead tuples of the largest tables: 1000 deleted rows (below autovacuum's threshold for
    // 20000, so they stay), as pg_stat_user_tables counts them; never autovacuumed: no age.
    n.sql("DELETE FROM big WHERE id <= 1000");
    let dead = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'big'";
    wait_for("the statistics count the dead tuples", || {
        let d = n.number(dead);
        (d == 1000.0).then_some(()).ok_or(format!("{d} dead"))
    });
    let (s, _) = n.scrape();
    let big = "{datname=\"app\",schema=\"public\",table=\"big\"}";
    assert_eq!(
        s.must(&format!("dbop_pg_table_dead_tuples{big}")),
        n.number(dead)
    );
    assert!(
        s.get(&format!("dbop_pg_table_last_autovacuum_age_seconds{big}"))
            .is_none()
    );
    assert_eq!(s.must("dbop_pg_query_errors_total{query=\"tables\"}"), 0.0);

    // Transaction id age per database: age(datfrozenxid) read directly around the scrape.
    let ages = "SELECT string_agg(datname || '=' || age(datfrozenxid), ',' ORDER BY datname) \
                FROM pg_database";
    let read_ages = || -> BTreeMap<String, f64> {
        n.sql(ages)
            .split(',')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    };
    let before = read_ages();
    let (s, _) = n.scrape();
    let after = read_ages();
    assert!(before.len() >= 4, "{before:?}");
    for (db, age) in &before {
        let scraped = s.must(&format!("dbop_pg_database_xid_age{{datname=\"{db}\"}}"));
        between(&format!("xid age of {db}"), *age, scraped, after[db]);
    }

    // Transactions: the counters follow pg_stat_database (read after each session ended,
    // which flushes its statistics).
    let stat = |column: &str| {
        n.number(&format!(
            "SELECT {column} FROM pg_stat_database WHERE datname = 'app'"
        ))
    };
    let rolled_back = stat("xact_rollback");
    n.sql("BEGIN; SELECT 1; ROLLBACK");
    wait_for("a rollback counted", || {
        let (s, _) = n.scrape();
        let got = s.must("dbop_pg_transactions_rolled_back_total{datname=\"app\"}");
        (got > rolled_back)
            .then_some(())
            .ok_or(format!("{got} rolled back"))
    });
    let committed = stat("xact_commit");
    let (s, _) = n.scrape();
    assert!(s.must("dbop_pg_transactions_committed_total{datname=\"app\"}") >= committed);

    // A transaction left open, idle: it ages, and both the longest-transaction and the
    // idle-in-transaction metrics see at least the age PostgreSQL reports.
    let mut open = n.session("test-open");
    open.send("BEGIN; SELECT txid_current();");
    let age = |column: &str| {
        n.number(&format!(
            "SELECT coalesce((SELECT extract(epoch FROM clock_timestamp() - {column}) \
             FROM pg_stat_activity WHERE application_name = 'test-open'), -1)"
        ))
    };
    wait_for("the open transaction is 3 s old", || {
        let a = age("state_change");
        (a >= 3.0).then_some(()).ok_or(format!("{a} s"))
    });
    let (xact, idle) = (age("xact_start"), age("state_change"));
    let (s, _) = n.scrape();
    let longest = s.must("dbop_pg_longest_transaction_seconds");
    let longest_idle = s.must("dbop_pg_longest_idle_in_transaction_seconds");
    assert!(
        longest >= xact && longest < xact + 5.0,
        "{longest} vs {xact}"
    );
    assert!(
        longest_idle >= idle && longest_idle < idle + 5.0,
        "{longest_idle} vs {idle}"
    );
    assert!(s.must("dbop_pg_connections{datname=\"app\",state=\"idle in transaction\"}") >= 1.0);

    // A lock wait made by two sessions: one holds the table, the other waits for it.
    let mut holder = n.session("test-holder");
    holder.send("BEGIN; LOCK TABLE big IN ACCESS EXCLUSIVE MODE;");
    wait_for("the holder holds the table", || {
        let held = n.number(
            "SELECT count(*) FROM pg_locks WHERE relation = 'big'::regclass \
             AND mode = 'AccessExclusiveLock' AND granted",
        );
        (held == 1.0).then_some(()).ok_or(format!("{held} held"))
    });
    let mut waiter = n.session("test-waiter");
    waiter.send("SELECT count(*) FROM big;");
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                   WHERE NOT l.granted AND a.datname = 'app'";
    wait_for("the waiter waits", || {
        let w = n.number(waiting);
        (w >= 1.0).then_some(()).ok_or(format!("{w} waiting"))
    });
    let (s, _) = n.scrape();
    assert_eq!(
        s.must("dbop_pg_locks_waiting{datname=\"app\"}"),
        n.number(waiting)
    );
    assert!(s.must("dbop_pg_connections{datname=\"app\",state=\"active\"}") >= 1.0);
    drop(holder);
    drop(waiter);
    drop(open);
    wait_for("no lock waited for", || {
        let (s, _) = n.scrape();
        let w = s.must("dbop_pg_locks_waiting{datname=\"app\"}");
        (w == 0.0).then_some(()).ok_or(format!("{w}"))
    });

    // Checkpoints (the checkpointer reports its count a little after CHECKPOINT returns) and
    // WAL.
    n.sql("CHECKPOINT");
    let requested = if n.major >= 17 {
        "SELECT num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_req FROM pg_stat_bgwriter"
    };
    wait_for("the checkpoint counted", || {
        let r = n.number(requested);
        (r >= 1.0).then_some(()).ok_or(format!("{r} requested"))
    });
    let wal = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn";
    let (before, requested_before) = (n.number(wal), n.number(requested));
    let (s, _) = n.scrape();
    let (after, requested_after) = (n.number(wal), n.number(requested));
    between(
        "requested checkpoints",
        requested_before,
        s.must("dbop_pg_checkpoints_total{kind=\"requested\"}"),
        requested_after,
    );
    assert!(s.get("dbop_pg_checkpoints_total{kind=\"timed\"}").is_some());
    between(
        "WAL bytes",
        before,
        s.must("dbop_pg_wal_bytes_total"),
        after,
    );

    // The data volume: statvfs, as df reports it.
    let df = Command::new("df")
        .args(["-B1", "--output=size,avail"])
        .arg(n.path("data/pgdata"))
        .output()
        .unwrap();
    let df = String::from_utf8(df.stdout).unwrap();
    let numbers: Vec<f64> = df
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let (s, _) = n.scrape();
    assert_eq!(s.must("dbop_pg_data_volume_size_bytes"), numbers[0]);
    let free = s.must("dbop_pg_data_volume_free_bytes");
    assert!(
        (free - numbers[1]).abs() < 256.0 * 1024.0 * 1024.0,
        "{free} free, df says {}",
        numbers[1]
    );

    // Custom queries: one that works, one that sleeps past its timeout. The slow one is
    // counted as an error and absent; everything else is in the same scrape, which returns
    // within the slow query's timeout and a margin (not after its sleep).
    std::fs::write(
        n.path("queries.yaml"),
        "queries:
  - name: schema_tables
    help: Tables of the application database by schema.
    database: app
    sql: SELECT schemaname AS schema, count(*) AS count FROM pg_tables GROUP BY schemaname
    labels: [schema]
    values: [count]
  - name: slow
    help: Sleeps past its timeout.
    sql: SELECT 1 AS value FROM pg_sleep(10)
    values: [value]
    timeout_seconds: 1
",
    )
    .unwrap();
    let errors = "dbop_pg_query_errors_total{query=\"slow\"}";
    for round in 1..=2 {
        let (s, took) = n.scrape();
        assert!(
            took < Duration::from_millis(2500),
            "the scrape took {took:?} with a query timing out after 1 s"
        );
        assert_eq!(s.must(errors), f64::from(round), "{}", s.text);
        assert!(!s.has_family("dbop_pg_custom_slow_value"));
        assert_eq!(
            s.must("dbop_pg_custom_schema_tables_count{schema=\"public\"}"),
            n.number("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        );
        assert_eq!(s.must("dbop_pg_up"), 1.0);
        for family in [
            "dbop_pg_database_size_bytes",
            "dbop_pg_connections",
            "dbop_pg_longest_transaction_seconds",
            "dbop_pg_data_volume_free_bytes",
            "dbop_pg_wal_bytes_total",
        ] {
            assert!(s.has_family(family), "{family} missing from\n{}", s.text);
        }
        assert_eq!(
            s.must("dbop_pg_query_errors_total{query=\"schema_tables\"}"),
            0.0
        );
    }
    // While a scrape waits for the slow query, the readiness probe answers at once.
    std::thread::scope(|scope| {
        let scrape = scope.spawn(|| n.scrape());
        // The scrape is inside the slow query once its session sleeps.
        wait_for("the scrape's slow query running", || {
            let sleeping = n.number(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(10)%' \
                 AND state = 'active' AND pid <> pg_backend_pid()",
            );
            (sleeping > 0.0).then_some(()).ok_or("not yet".to_string())
        });
        let started = Instant::now();
        assert!(n.probe(), "the probe failed during a scrape");
        let probe = started.elapsed();
        assert!(
            !scrape.is_finished(),
            "the scrape ended before the probe ran"
        );
        assert!(
            probe < Duration::from_millis(700),
            "the probe took {probe:?}"
        );
        scrape.join().unwrap();
    });
    // The sleeping session was cancelled by its statement timeout, not left running.
    wait_for("no session sleeps", || {
        let sleeping = n.number(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(10)%' \
             AND pid <> pg_backend_pid()",
        );
        (sleeping == 0.0)
            .then_some(())
            .ok_or(format!("{sleeping} sleeping"))
    });
    // A file that is not valid: counted, no custom metric, the built-in ones all there.
    std::fs::write(n.path("queries.yaml"), "queries: [{name: Bad}]").unwrap();
    let (s, _) = n.scrape();
    assert_eq!(
        s.must("dbop_pg_query_errors_total{query=\"custom_queries_file\"}"),
        1.0
    );
    assert!(!s.text.contains("dbop_pg_custom_"));
    assert_eq!(s.must("dbop_pg_up"), 1.0);
    std::fs::remove_file(n.path("queries.yaml")).unwrap();

    // What a scrape costs: wall time, the manager's CPU (its psql children included), the
    // server's CPU (its exited backends, accounted to the postmaster), its transactions.
    let postmaster: u32 = std::fs::read_to_string(n.path("data/pgdata/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let commits =
        || n.number("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'");
    const N: u32 = 20;
    let (c0, m0, p0) = (commits(), cpu_seconds(manager_pid), cpu_seconds(postmaster));
    let mut times = Vec::new();
    for _ in 0..N {
        let (s, took) = n.scrape();
        assert_eq!(s.must("dbop_pg_up"), 1.0);
        times.push(took);
    }
    let (m1, p1) = (cpu_seconds(manager_pid), cpu_seconds(postmaster));
    // The scrapes' backends report their commits within a second of ending: wait until the
    // count only moves by this read's own transaction.
    let mut last = commits();
    let c1 = wait_for("the scrapes' commits counted", || {
        let now = commits();
        let settled = now - last <= 1.0;
        last = now;
        settled
            .then_some(now)
            .ok_or(format!("still rising at {now}"))
    });
    times.sort();
    eprintln!(
        "scrape cost over {N} scrapes: wall median {:?}, max {:?}; manager CPU {:.1} ms/scrape; \
         server CPU {:.1} ms/scrape; {:.1} transactions/scrape in database postgres",
        times[times.len() / 2],
        times[times.len() - 1],
        (m1 - m0) * 1000.0 / f64::from(N),
        (p1 - p0) * 1000.0 / f64::from(N),
        (c1 - c0 - 1.0) / f64::from(N),
    );
    assert!(times[times.len() - 1] < Duration::from_secs(2));
    drop(running);
    assert!(!n.log().contains(PASSWORD));
}

#[test]
fn a_standby_shows_in_the_primary_lag_metric() {
    let a = Node::new("db-0");
    let b = Node::new("db-1");
    let _running_a = a.start();
    a.replication(
        "ensure-role",
        &[format!(
            "--replication-password-file={}",
            a.path("repl/password").display()
        )],
    );
    a.replication("slots", &["--standby=db-1".to_string()]);
    b.replication("clone", &b.upstream_args(&a));
    let _running_b = b.start();

    // The primary: the standby's lag in bytes, 0 once it has replayed everything, as
    // pg_stat_replication says.
    let direct = "SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), -1) \
                  FROM pg_stat_replication WHERE application_name = 'db-1'";
    a.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g");
    let replayed = "dbop_pg_replication_lag_bytes{standby=\"db-1\",position=\"replayed\"}";
    wait_for(
        "the standby caught up, in the metric and in pg_stat_replication",
        || {
            let (s, _) = a.scrape();
            let scraped = s.get(replayed).ok_or("no lag metric for db-1")?;
            let got = a.sql(direct);
            match (scraped, got.as_str()) {
                (0.0, "0") => Ok(s),
                other => Err(format!("{other:?}")),
            }
        },
    );
    // The flushed position too, and the primary is not in recovery.
    let (s, _) = a.scrape();
    assert_eq!(
        s.must("dbop_pg_replication_lag_bytes{standby=\"db-1\",position=\"flushed\"}"),
        0.0
    );
    assert_eq!(s.must("dbop_pg_in_recovery"), 0.0);

    // The standby: in recovery, no WAL of its own, its replay lag.
    let (s, _) = b.scrape();
    assert_eq!(s.must("dbop_pg_up"), 1.0);
    assert_eq!(s.must("dbop_pg_in_recovery"), 1.0);
    assert!(!s.has_family("dbop_pg_wal_bytes_total"));
    assert!(
        s.get("dbop_pg_standby_replay_lag_bytes").is_some(),
        "{}",
        s.text
    );
    assert!(
        s.get("dbop_pg_database_size_bytes{datname=\"app\"}")
            .is_some()
    );
    for q in [
        "settings",
        "databases",
        "status",
        "replication",
        "checkpoints",
    ] {
        assert_eq!(
            s.must(&format!("dbop_pg_query_errors_total{{query=\"{q}\"}}")),
            0.0,
            "{q} failed on the standby: {}",
            b.log()
        );
    }
}

#[test]
fn without_the_flag_nothing_listens() {
    let n = Node::new("plain");
    let running = n.start_with(false);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", n.metrics_port)).is_err(),
        "something listens on the metrics port"
    );
    drop(running);
    assert!(!n.log().contains("metrics on http"), "{}", n.log());
}

/// WAL archiving as the archive families show it: absent while `archive_mode` is off; with an
/// `archive_command` that fails, the file waits and `failing` is 1; once it succeeds, nothing
/// waits, `failing` is 0 and the last archived time is there — each as `pg_stat_archiver` and
/// `pg_ls_archive_statusdir()` say.
#[test]
fn archiving_shows_the_files_waiting_and_whether_the_last_attempt_failed() {
    let n = Node::new("db-0");
    let running = n.start();
    let (s, _) = n.scrape();
    assert!(!s.has_family("dbop_pg_wal_archive_waiting_files"), "off");
    assert_eq!(
        s.must("dbop_pg_query_errors_total{query=\"archiver\"}"),
        0.0
    );
    n.sql("ALTER SYSTEM SET archive_mode = on");
    n.sql("ALTER SYSTEM SET archive_command = 'false'");
    drop(running);
    let _running = n.start();

    n.sql("CREATE TABLE t AS SELECT 1 AS id");
    n.sql("SELECT pg_switch_wal()");
    wait_for("an archive attempt to fail", || {
        let failed = n.number("SELECT failed_count FROM pg_stat_archiver");
        (failed >= 1.0)
            .then_some(())
            .ok_or(format!("{failed} failures"))
    });
    let ready = "SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'";
    let (s, _) = n.scrape();
    assert_eq!(s.must("dbop_pg_wal_archive_waiting_files"), n.number(ready));
    assert!(s.must("dbop_pg_wal_archive_waiting_files") >= 1.0);
    assert_eq!(s.must("dbop_pg_wal_archive_failing"), 1.0);
    assert!(s.must("dbop_pg_wal_archive_failures_total") >= 1.0);
    assert_eq!(s.must("dbop_pg_wal_archived_files_total"), 0.0);
    assert!(
        s.get("dbop_pg_wal_last_archived_timestamp_seconds")
            .is_none()
    );

    n.sql("ALTER SYSTEM SET archive_command = 'true'");
    n.sql("SELECT pg_reload_conf()");
    let s = wait_for("a scrape with the files archived", || {
        let (s, _) = n.scrape();
        let waiting = s.must("dbop_pg_wal_archive_waiting_files");
        let failing = s.must("dbop_pg_wal_archive_failing");
        (waiting == 0.0 && failing == 0.0)
            .then_some(s)
            .ok_or(format!("{waiting} waiting, failing {failing}"))
    });
    assert_eq!(n.number(ready), 0.0);
    assert!(s.must("dbop_pg_wal_archived_files_total") >= 1.0);
    let archived_at =
        n.number("SELECT extract(epoch FROM last_archived_time)::bigint FROM pg_stat_archiver");
    assert_eq!(
        s.must("dbop_pg_wal_last_archived_timestamp_seconds"),
        archived_at
    );
}
