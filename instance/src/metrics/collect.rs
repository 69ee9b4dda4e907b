//! One scrape: the built-in statements in one psql session, then the largest tables of each
//! database (one session per database), each custom query in its own session beside them (all
//! at once, each bounded by its own timeout), the data volume's statvfs, then the families of
//! all that and the error counters, rendered.
//!
//! I/O: psql children, the queries file, statvfs. What the output means is decided by the
//! pure modules (`batch`, `builtin`, `custom`, `exposition`).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::metrics::batch::{self, Statement};
use crate::metrics::exposition::{self, Family, Kind};
use crate::metrics::{builtin, custom, psql};
use crate::replication::status;
use dbop_contract::position::Position;
use dbop_contract::volume::VolumeUsage;

/// `statement_timeout` of each built-in statement.
pub const BUILTIN_STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The wall-clock bound of the built-in session (connection included).
pub const BUILTIN_LIMIT: Duration = Duration::from_secs(5);
/// What a custom query's session may take beyond its statement timeout (connecting).
pub const CONNECT_SLACK: Duration = Duration::from_secs(2);
/// The wall-clock bound of the status report's session (connection included).
pub const STATUS_LIMIT: Duration = Duration::from_secs(3);
/// The error counter's label for the data volume's statvfs.
pub const VOLUME: &str = "data_volume";

/// Where the server and the queries file are.
#[derive(Clone, Debug)]
pub struct Source {
    pub bin: PathBuf,
    pub socket_dir: PathBuf,
    pub port: u16,
    pub superuser: String,
    pub pgdata: PathBuf,
    pub major: u32,
    pub queries_file: PathBuf,
}

/// The scraper and what outlives one scrape: the error counters.
pub struct Collector {
    source: Source,
    errors: BTreeMap<String, u64>,
    last_file_problem: Option<String>,
}

fn log(message: &str) {
    eprintln!("dbop-instance: metrics: {message}");
}

impl Collector {
    pub fn new(source: Source) -> Collector {
        let errors = builtin::NAMES
            .iter()
            .chain(&[builtin::TABLES, VOLUME, custom::FILE_ERROR])
            .map(|n| (n.to_string(), 0))
            .collect();
        Collector {
            source,
            errors,
            last_file_problem: None,
        }
    }

    fn psql(&self, database: &str) -> Command {
        let s = &self.source;
        let mut cmd = Command::new(s.bin.join("psql"));
        cmd.arg(format!("--host={}", s.socket_dir.display()))
            .arg(format!("--port={}", s.port))
            .arg(format!("--username={}", s.superuser))
            .arg(format!(
                "--dbname=dbname='{}'",
                database.replace('\\', "\\\\").replace('\'', "\\'")
            ))
            .args(batch::PSQL_ARGS);
        cmd
    }

    /// The custom queries, or none (and a counted error) when the file is unusable. A missing
    /// file means none.
    fn custom_queries(&mut self) -> Vec<custom::Query> {
        let parsed = match std::fs::read_to_string(&self.source.queries_file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(format!("cannot read it: {e}")),
            Ok(text) => custom::parse(&text),
        };
        match parsed {
            Ok(queries) => {
                self.last_file_problem = None;
                for q in &queries {
                    self.errors.entry(q.name.clone()).or_default();
                }
                queries
            }
            Err(why) => {
                if self.last_file_problem.as_ref() != Some(&why) {
                    log(&format!(
                        "the custom queries in {} are not used: {why}",
                        self.source.queries_file.display()
                    ));
                    self.last_file_problem = Some(why);
                }
                *self.errors.entry(custom::FILE_ERROR.into()).or_default() += 1;
                Vec::new()
            }
        }
    }

    fn run_builtin(&self, statements: &[Statement]) -> batch::Split {
        self.run_batch("postgres", statements)
    }

    /// dbop's `statements` in one session on `database`.
    fn run_batch(&self, database: &str, statements: &[Statement]) -> batch::Split {
        let script = batch::script(statements, BUILTIN_STATEMENT_TIMEOUT);
        let mut cmd = self.psql(database);
        cmd.arg("--file=-");
        match psql::run(cmd, Some(&script), BUILTIN_LIMIT) {
            Ok(out) => {
                if out.killed {
                    log(&format!(
                        "the built-in queries on {database} took over {BUILTIN_LIMIT:?}"
                    ));
                }
                batch::split(&out.stdout, statements)
            }
            Err(e) => {
                log(&format!("cannot run psql: {e}"));
                batch::Split::default()
            }
        }
    }

    fn run_custom(&self, q: &custom::Query) -> Result<Vec<Family>, String> {
        let mut cmd = self.psql(&q.database);
        cmd.arg("--set=ON_ERROR_STOP=1");
        for c in q.commands() {
            cmd.arg(format!("--command={c}"));
        }
        let out = psql::run(cmd, None, q.timeout + CONNECT_SLACK)
            .map_err(|e| format!("cannot run psql: {e}"))?;
        let statement = q.statement();
        let split = batch::split(&out.stdout, std::slice::from_ref(&statement));
        match split.of(&q.name) {
            Some(rows) => q.families(rows),
            None if out.killed => Err(format!("killed after {:?}", q.timeout + CONNECT_SLACK)),
            None => Err(out.stderr.trim().to_string()),
        }
    }

    /// One scrape's exposition text.
    pub fn scrape(&mut self) -> String {
        let started = Instant::now();
        let queries = self.custom_queries();
        let (split, per_table, custom) = self.run_sessions(&queries);
        let (mut families, failed) = builtin::families(&split);
        for name in failed {
            self.count_error(name);
        }
        for result in per_table {
            match result {
                Ok(f) => families.extend(f),
                Err(why) => {
                    log(&format!("{why}: failed"));
                    self.count_error(builtin::TABLES);
                }
            }
        }
        match volume_usage(&self.source.pgdata) {
            Ok(v) => families.extend(volume_families(v.size_bytes, v.free_bytes)),
            Err(e) => {
                log(&format!("statvfs of the data directory: {e}"));
                self.count_error(VOLUME);
            }
        }
        for (q, result) in queries.iter().zip(custom) {
            match result {
                Ok(f) => families.extend(f),
                Err(why) => {
                    log(&format!("custom query {}: {why}", q.name));
                    self.count_error(&q.name);
                }
            }
        }
        families.push(self.errors_family());
        families.push(Family::single(
            "dbop_pg_scrape_duration_seconds",
            "Wall-clock time this scrape took to query the server and the volume.",
            Kind::Gauge,
            started.elapsed().as_secs_f64(),
        ));
        exposition::render(&exposition::merge(families))
    }

    /// The built-in session, then the largest tables of each database it found (one session
    /// each, all at once), and every custom query in its own session beside them.
    fn run_sessions(
        &self,
        queries: &[custom::Query],
    ) -> (batch::Split, Vec<Scraped>, Vec<Scraped>) {
        let statements = builtin::statements(self.source.major);
        let tables = [builtin::tables_statement()];
        std::thread::scope(|scope| {
            let customs: Vec<_> = queries
                .iter()
                .map(|q| scope.spawn(move || self.run_custom(q)))
                .collect();
            let split = self.run_builtin(&statements);
            let per_table: Vec<_> = builtin::tables_databases(&split)
                .into_iter()
                .map(|db| {
                    let tables = &tables;
                    scope.spawn(move || {
                        let split = self.run_batch(&db, tables);
                        match split.of(builtin::TABLES) {
                            Some(rows) => builtin::table_families(&db, rows),
                            None => Err(format!("the largest tables of {db}")),
                        }
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(joined)
                .collect();
            let custom = customs.into_iter().map(joined).collect();
            (split, per_table, custom)
        })
    }

    fn count_error(&mut self, query: &str) {
        *self.errors.entry(query.into()).or_default() += 1;
    }

    /// `dbop_pg_query_errors_total`, by query.
    fn errors_family(&self) -> Family {
        let mut errors = Family::new(
            "dbop_pg_query_errors_total",
            "Scrapes in which the query failed or timed out (its metrics were absent from that \
             scrape), by query: dbop's own, custom ones, the custom queries file, the data \
             volume's statvfs.",
            Kind::Counter,
        );
        for (name, n) in &self.errors {
            errors = errors.with(&[("query", name)], *n as f64);
        }
        errors
    }
}

/// What one session of a scrape gave: its families, or why it gave none.
type Scraped = Result<Vec<Family>, String>;

/// A session thread's result; a thread that panicked counts as a failed session.
fn joined(handle: std::thread::ScopedJoinHandle<'_, Scraped>) -> Scraped {
    handle.join().unwrap_or_else(|_| Err("panicked".into()))
}

/// The data volume's size and free bytes.
fn volume_families(size: u64, free: u64) -> [Family; 2] {
    [
        Family::single(
            "dbop_pg_data_volume_size_bytes",
            "Size of the filesystem holding the data directory (statvfs).",
            Kind::Gauge,
            size as f64,
        ),
        Family::single(
            "dbop_pg_data_volume_free_bytes",
            "Bytes free for the server on the filesystem holding the data directory \
             (statvfs f_bavail).",
            Kind::Gauge,
            free as f64,
        ),
    ]
}

/// The size of the filesystem holding `path` (or its parent, before initdb made it) and the
/// bytes available to unprivileged users: for `/metrics`, `GET /volume` and a stop on a full
/// volume. No PostgreSQL involved.
pub fn volume_usage(path: &Path) -> std::io::Result<VolumeUsage> {
    let target = if path.exists() {
        path
    } else {
        path.parent().unwrap_or(path)
    };
    let c = CString::new(target.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; c is NUL-terminated.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = s.f_frsize as u64;
    Ok(VolumeUsage {
        size_bytes: s.f_blocks as u64 * frsize,
        free_bytes: s.f_bavail as u64 * frsize,
    })
}

/// The instance's WAL position for `GET /status`: `replication::status`'s query, and on a
/// primary its standbys' replay lag and sync state and its WAL archiving, each in one session
/// bounded by `STATUS_LIMIT`.
pub fn position(source: &Source) -> Result<Position, String> {
    let mut position = status::parse_status(&query(source, status::STATUS_QUERY)?)?.position();
    if !position.standby {
        let rows = status::parse_standby_rows(&query(source, status::REPLAY_LAG_QUERY)?)?;
        position.replay_lag_ms = rows.replay_lag_ms;
        position.sync_states = rows.sync_states;
        position.archiver = status::parse_archiver(&query(source, status::ARCHIVER_QUERY)?)?;
    }
    Ok(position)
}

/// One statement's rows as `psql -At -F '|'` prints them, or why not.
fn query(source: &Source, sql: &str) -> Result<String, String> {
    let mut cmd = Command::new(source.bin.join("psql"));
    cmd.arg(format!("--host={}", source.socket_dir.display()))
        .arg(format!("--port={}", source.port))
        .arg(format!("--username={}", source.superuser))
        .args(["--dbname=postgres", "--no-psqlrc", "-At", "-F", "|"])
        .arg(format!("--command={sql}"));
    let out = psql::run(cmd, None, STATUS_LIMIT).map_err(|e| format!("cannot run psql: {e}"))?;
    if out.killed {
        return Err(format!("the status query took over {STATUS_LIMIT:?}"));
    }
    match out.stderr.trim() {
        "" => Ok(out.stdout),
        stderr => Err(stderr.to_string()),
    }
}
