//! PostgreSQL through its own client tools (`psql`, `pg_dump`, `pg_restore`), so every libpq
//! variable (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGPASSFILE`, `PGSSLMODE`, …) works as
//! users expect and no secret is ever put on a command line. Owns: finding the tools that
//! match the server's major version, a psql session that holds an exported snapshot, the row
//! count query, running again a psql that could not connect for a passing reason, and
//! collecting a bounded tail of a tool's stderr for error messages.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// Lists every table whose data pg_dump dumps, with its exact row count, as one JSON object.
/// Leaf tables only (partitioned parents hold no rows), no extension members, no temp tables.
/// `verify` compares a restored database's counts with the manifest's through it; `dump`
/// counts rows from the archive stream (`archive`) and falls back to it in the snapshot.
pub const ROW_COUNT_SQL: &str = r#"SELECT coalesce(json_object_agg(t.name, t.n), '{}')::text FROM (
  SELECT format('%I.%I', n.nspname, c.relname) AS name,
         (xpath('/row/c/text()', query_to_xml(
            format('SELECT count(*) AS c FROM ONLY %I.%I', n.nspname, c.relname),
            false, true, '')))[1]::text::bigint AS n
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind = 'r' AND c.relpersistence <> 't'
    AND n.nspname NOT IN ('pg_catalog', 'information_schema')
    AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp\_%'
    AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')
) t;"#;

/// psql's flags for one query (then the SQL): no psqlrc, no password prompt, quiet,
/// unaligned, tuples only, stop at the first error.
pub const QUERY_ARGS: [&str; 8] = ["-X", "-w", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c"];

/// `host:port` for messages, from the libpq variables (never the password).
pub fn server_label() -> String {
    let host = std::env::var("PGHOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local socket".into());
    let port = std::env::var("PGPORT")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "5432".into());
    format!("{host}:{port}")
}

/// The major version in `server_version_num` (`150018` → 15).
pub fn major_of_version_num(num: &str) -> Option<u32> {
    num.trim().parse::<u32>().ok().map(|n| n / 10_000)
}

/// `15.18 (Debian 15.18-0+deb12u1)` → `15.18`.
pub fn short_version(server_version: &str) -> String {
    server_version
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// The major version in a tool's `--version` line: `pg_dump (PostgreSQL) 15.18 (Debian…)` → 15.
pub fn major_of_tool_version(line: &str) -> Option<u32> {
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .and_then(|v| v.split(['.', 'b', 'r', 'd']).next())
        .and_then(|m| m.parse().ok())
}

/// Finds the PostgreSQL client tools.
#[derive(Debug, Clone, Default)]
pub struct PgTools {
    /// `--pg-bin-dir`: used as is when given.
    pub bin_dir: Option<PathBuf>,
}

impl PgTools {
    /// The target server's major (with pg_restore checked against it) and its version.
    pub async fn reach_target(&self, target: Option<&str>) -> Result<(Option<u32>, String)> {
        let version_num = self
            .query(target, "SELECT current_setting('server_version_num')")
            .await?;
        let major = major_of_version_num(&version_num);
        if let Some(major) = major {
            let label = database_label(target);
            self.check_version("pg_restore", major, &label).await?;
        }
        let version = self
            .query(target, "SELECT current_setting('server_version')")
            .await?;
        Ok((major, short_version(&version)))
    }

    /// The tool for a server of `server_major`: `--pg-bin-dir`, then Debian's
    /// `/usr/lib/postgresql/<major>/bin`, then `PATH`.
    pub fn path(&self, tool: &str, server_major: Option<u32>) -> PathBuf {
        if let Some(dir) = &self.bin_dir {
            return dir.join(tool);
        }
        if let Some(major) = server_major {
            let p = Path::new("/usr/lib/postgresql")
                .join(major.to_string())
                .join("bin")
                .join(tool);
            if p.exists() {
                return p;
            }
        }
        PathBuf::from(tool)
    }

    /// A command for a tool with the environment every tool gets.
    pub fn command(&self, tool: &str, server_major: Option<u32>) -> Command {
        let mut cmd = Command::new(self.path(tool, server_major));
        if std::env::var_os("PGAPPNAME").is_none() {
            cmd.env("PGAPPNAME", "dbop-backup");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Fails unless the tool's major version is at least the server's.
    pub async fn check_version(&self, tool: &str, server_major: u32, database: &str) -> Result<()> {
        let path = self.path(tool, Some(server_major));
        let out = Command::new(&path)
            .arg("--version")
            .output()
            .await
            .map_err(|e| {
                pg_error(
                    tool,
                    database,
                    format!("cannot run {}: {e}", path.display()),
                )
            })?;
        let line = String::from_utf8_lossy(&out.stdout);
        match major_of_tool_version(&line) {
            Some(m) if m >= server_major => Ok(()),
            Some(m) => Err(pg_error(
                tool,
                database,
                format!(
                    "{} is version {m} but the server is {server_major}; use the tools of the server's version (--pg-bin-dir)",
                    path.display()
                ),
            )),
            None => Err(pg_error(
                tool,
                database,
                format!("cannot read the version of {}", path.display()),
            )),
        }
    }

    /// Runs one query with psql and returns its unaligned, tuples-only output; a psql that
    /// could not connect for a passing reason is run again ([`patiently`]).
    pub async fn query(&self, database: Option<&str>, sql: &str) -> Result<String> {
        let db_label = database_label(database);
        patiently(&db_label, || async {
            let mut cmd = self.command("psql", None);
            cmd.args(QUERY_ARGS).arg(sql);
            if let Some(db) = database {
                cmd.env("PGDATABASE", db);
            }
            let out = cmd
                .output()
                .await
                .map_err(|e| pg_error("psql", &db_label, format!("cannot run psql: {e}")))?;
            Ok(if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).to_string())
            })
        })
        .await
    }
}

/// How long a psql that never reached a server, for a reason that passes, is tried again: a
/// name server that did not answer, a Service whose server is restarting or failing over, a
/// network blip. Such a psql ran nothing, so running it again is safe whatever its SQL.
pub const CONNECT_PATIENCE: Duration = Duration::from_secs(60);

/// Whether psql's stderr says it never connected, for a reason that may pass: libpq's
/// connection errors (not a lost connection, after which a statement may have run) that are
/// not a refused login, a missing database or an unknown host name.
pub fn never_connected_transiently(stderr: &str) -> bool {
    const PASSING: [&str; 9] = [
        "Temporary failure in name resolution",
        "Connection refused",
        "timeout expired",
        "Connection timed out",
        "No route to host",
        "Network is unreachable",
        "the database system is starting up",
        "the database system is not yet accepting connections",
        "the database system is shutting down",
    ];
    let connecting = stderr.contains("could not translate host name")
        || stderr.contains("could not connect to server")
        || (stderr.contains("connection to server ") && stderr.contains(" failed: "));
    connecting && PASSING.iter().any(|p| stderr.contains(p))
}

/// Runs `psql` (one psql process: `Ok(output)` or `Err(its stderr)`) until it succeeds, fails
/// for good, or [`CONNECT_PATIENCE`] has passed while it could not connect.
pub async fn patiently<T, F, Fut>(database: &str, mut psql: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<std::result::Result<T, String>>>,
{
    let deadline = Instant::now() + CONNECT_PATIENCE;
    let mut attempt = 0;
    loop {
        let stderr = match psql().await? {
            Ok(output) => return Ok(output),
            Err(stderr) => stderr,
        };
        attempt += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = never_connected_transiently(&stderr)
            .then(|| crate::wal::retry_wait(attempt, left))
            .flatten();
        let detail = tail_text(&stderr);
        let Some(wait) = wait else {
            return Err(pg_error("psql", database, detail));
        };
        tracing::warn!(
            database,
            "psql could not connect: {detail}; retrying in {wait:?}"
        );
        tokio::time::sleep(wait).await;
    }
}

impl PgTools {
    /// Runs a psql script (read from stdin, never a command line) against `database` in one
    /// transaction that stops at the first error; a psql that could not connect for a passing
    /// reason is run again ([`patiently`]).
    pub async fn run_script(&self, database: &str, script: &str) -> Result<()> {
        patiently(database, || self.run_script_once(database, script)).await
    }

    async fn run_script_once(
        &self,
        database: &str,
        script: &str,
    ) -> Result<std::result::Result<(), String>> {
        let mut cmd = self.command("psql", None);
        cmd.args([
            "-X",
            "-w",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "--single-transaction",
            "-f",
            "-",
        ])
        .env("PGDATABASE", database)
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| pg_error("psql", database, format!("cannot run psql: {e}")))?;
        let stderr = collect_stderr(&mut child, "psql");
        if let Some(mut stdin) = child.stdin.take() {
            // A failed write means psql exited: its status and stderr say why.
            let _ = stdin.write_all(script.as_bytes()).await;
            let _ = stdin.shutdown().await;
        }
        let status = child
            .wait()
            .await
            .map_err(|e| pg_error("psql", database, e.to_string()))?;
        let tail = stderr.await.unwrap_or_default();
        Ok(if status.success() { Ok(()) } else { Err(tail) })
    }
}

/// The database named in messages: the override, else `PGDATABASE`, else libpq's default.
pub fn database_label(database: Option<&str>) -> String {
    database
        .map(str::to_string)
        .or_else(|| std::env::var("PGDATABASE").ok().filter(|d| !d.is_empty()))
        .unwrap_or_else(|| "(default)".into())
}

pub fn pg_error(tool: &str, database: &str, detail: impl Into<String>) -> Error {
    Error::Postgres {
        tool: tool.into(),
        database: database.into(),
        server: server_label(),
        detail: detail.into(),
    }
}

/// The last 2 KiB of a tool's stderr, trimmed, one line per message.
pub fn tail_text(s: &str) -> String {
    let s = s.trim();
    let mut start = s.len().saturating_sub(2048);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    let t = s[start..].trim().replace('\n', " | ");
    if t.is_empty() {
        "no error output".into()
    } else {
        t
    }
}

/// Collects a child's stderr (bounded to its last 8 KiB) and logs each line at debug level.
pub fn collect_stderr(child: &mut Child, tool: &'static str) -> JoinHandle<String> {
    let stderr = child.stderr.take();
    tokio::spawn(async move {
        let Some(stderr) = stderr else {
            return String::new();
        };
        let mut lines = BufReader::new(stderr).lines();
        let mut tail = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(tool, "{line}");
            tail.push_str(&line);
            tail.push('\n');
            if tail.len() > 8192 {
                let mut cut = tail.len() - 8192;
                while !tail.is_char_boundary(cut) {
                    cut += 1;
                }
                tail.drain(..cut);
            }
        }
        tail
    })
}

/// Turns a child's pipe into a blocking file for a worker thread, with a 1 MiB pipe buffer.
pub fn blocking_fd(fd: OwnedFd) -> std::io::Result<std::fs::File> {
    let raw = fd.as_raw_fd();
    // SAFETY: `raw` is a valid open descriptor owned by `fd` for the duration of these calls.
    unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFL);
        if flags < 0 || libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // A larger pipe means fewer wake-ups; failure (limits) is harmless.
        libc::fcntl(raw, libc::F_SETPIPE_SZ, 1 << 20);
    }
    Ok(std::fs::File::from(fd))
}

pub fn stdout_file(stdout: ChildStdout) -> std::io::Result<std::fs::File> {
    blocking_fd(stdout.into_owned_fd()?)
}

pub fn stdin_file(stdin: ChildStdin) -> std::io::Result<std::fs::File> {
    blocking_fd(stdin.into_owned_fd()?)
}

/// A psql process holding one transaction open: used to export the snapshot pg_dump reads
/// and, should the archive stream not be readable, to count rows in that same snapshot.
pub struct PsqlSession {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<String>>,
    seq: u64,
    database: String,
}

impl PsqlSession {
    pub async fn start(tools: &PgTools, database: Option<&str>) -> Result<PsqlSession> {
        let mut cmd = tools.command("psql", None);
        cmd.args(["-X", "-w", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped());
        if let Some(db) = database {
            cmd.env("PGDATABASE", db);
        }
        let label = database_label(database);
        let mut child = cmd
            .spawn()
            .map_err(|e| pg_error("psql", &label, format!("cannot run psql: {e}")))?;
        let stderr = Some(collect_stderr(&mut child, "psql"));
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(pg_error("psql", &label, "psql pipes are missing"));
        };
        Ok(PsqlSession {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr,
            seq: 0,
            database: label,
        })
    }

    async fn failure(&mut self, what: &str) -> Error {
        let _ = self.child.kill().await;
        let tail = match self.stderr.take() {
            Some(h) => h.await.unwrap_or_default(),
            None => String::new(),
        };
        pg_error(
            "psql",
            &self.database,
            format!("{what}: {}", tail_text(&tail)),
        )
    }

    /// Runs SQL (ending in `;`) and returns its output lines.
    pub async fn query(&mut self, sql: &str) -> Result<Vec<String>> {
        self.seq += 1;
        let marker = format!("__dbop_done_{}__", self.seq);
        let input = format!("{sql}\n\\echo {marker}\n");
        if self.stdin.write_all(input.as_bytes()).await.is_err()
            || self.stdin.flush().await.is_err()
        {
            return Err(self.failure("the session ended").await);
        }
        let mut lines = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line).await {
                Ok(0) | Err(_) => return Err(self.failure("the session ended").await),
                Ok(_) => {}
            }
            let l = line.trim_end_matches(['\n', '\r']);
            if l == marker {
                return Ok(lines);
            }
            lines.push(l.to_string());
        }
    }

    /// Exact row counts of every dumped table, as seen by this session's snapshot.
    pub async fn row_counts(&mut self) -> Result<BTreeMap<String, u64>> {
        let lines = self.query(ROW_COUNT_SQL).await?;
        let json = lines.concat();
        serde_json::from_str(&json).map_err(|e| {
            pg_error(
                "psql",
                &self.database,
                format!("unexpected row count output: {e}"),
            )
        })
    }

    /// Ends the transaction and the session.
    pub async fn finish(mut self) -> Result<()> {
        let _ = self.stdin.write_all(b"COMMIT;\n\\q\n").await;
        let _ = self.stdin.shutdown().await;
        let mut rest = Vec::new();
        let _ = self.stdout.read_to_end(&mut rest).await;
        let status = self.child.wait().await;
        if status.map(|s| s.success()).unwrap_or(false) {
            Ok(())
        } else {
            Err(self.failure("ending the snapshot transaction failed").await)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_that_never_happened_for_a_passing_reason_is_retried() {
        let passing = [
            "psql: error: could not translate host name \"ledger-rw\" to address: Temporary failure in name resolution",
            "psql: error: connection to server at \"10.0.0.7\", port 5432 failed: Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?",
            "psql: error: connection to server on socket \"/run/pg/.s.PGSQL.5432\" failed: FATAL:  the database system is starting up",
            "psql: error: connection to server at \"db\" (10.0.0.7), port 5432 failed: timeout expired",
            "psql: could not connect to server: Connection refused",
        ];
        for stderr in passing {
            assert!(never_connected_transiently(stderr), "{stderr}");
        }
        let lasting = [
            "psql: error: connection to server at \"db\" (10.0.0.7), port 5432 failed: FATAL:  password authentication failed for user \"app\"",
            "psql: error: connection to server at \"db\" (10.0.0.7), port 5432 failed: FATAL:  database \"nosuch\" does not exist",
            "psql: error: could not translate host name \"typo-rw\" to address: Name or service not known",
            "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally",
            "could not receive data from server: Connection timed out",
            "ERROR:  relation \"t\" does not exist",
        ];
        for stderr in lasting {
            assert!(!never_connected_transiently(stderr), "{stderr}");
        }
    }

    #[test]
    fn versions() {
        assert_eq!(major_of_version_num("150018"), Some(15));
        assert_eq!(major_of_version_num("90624"), Some(9));
        assert_eq!(major_of_version_num("x"), None);
        assert_eq!(short_version("15.18 (Debian 15.18-0+deb12u1)"), "15.18");
        assert_eq!(short_version("17beta1"), "17beta1");
        let tools = [
            (
                "pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)",
                Some(15),
            ),
            ("pg_restore (PostgreSQL) 17.2", Some(17)),
            ("pg_dump (PostgreSQL) 18beta1", Some(18)),
            ("pg_dump (PostgreSQL) 9.6.24", Some(9)),
            ("garbage", None),
            ("", None),
        ];
        for (line, want) in tools {
            assert_eq!(major_of_tool_version(line), want, "{line}");
        }
    }

    #[test]
    fn tails() {
        assert_eq!(tail_text("  \n"), "no error output");
        assert_eq!(tail_text("a\nb\n"), "a | b");
        let long = "é".repeat(3000);
        assert!(tail_text(&long).len() <= 2048);
    }

    #[test]
    fn tool_paths() {
        let t = PgTools {
            bin_dir: Some("/opt/pg/bin".into()),
        };
        assert_eq!(
            t.path("pg_dump", Some(15)),
            PathBuf::from("/opt/pg/bin/pg_dump")
        );
        let t = PgTools::default();
        assert_eq!(t.path("pg_dump", Some(999)), PathBuf::from("pg_dump"));
    }
}
