//! Point-in-time recovery (`recover`), the decisions: where the scratch directory and the
//! marker of a finished recovery live, what a data directory found before a run means, the
//! settings of the private server that replays WAL, whether a connection attempt says "still
//! recovering", "promoted" or "refused", what the server's log says when it stopped before
//! promoting, the recovery settings removed afterwards, and what `pg_controldata` says.
//!
//! Pure: no process, no file system, no clock (the caller passes the facts). The I/O is
//! `recover`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::base::Target;
use crate::error::Error;
use crate::result::{BackupResult, Operation, Outcome};

/// The marker of a finished recovery, inside the data directory: the result, as printed.
pub const MARKER_FILE: &str = "dbop-recovery.json";
/// The scratch sibling a recovery works in: `<data dir>.recovering`.
pub const SCRATCH_SUFFIX: &str = ".recovering";
/// The port of the private server (only its socket's name: it listens on no TCP address).
pub const PORT: u16 = 5432;
/// The database the agent connects to on the private server: one that always exists.
pub const CONNECT_DATABASE: &str = "template1";
/// The private server's `pg_hba.conf`: its socket directory is the agent's own (mode 0700),
/// so only the agent's user can connect.
pub const HBA: &str = "local all all trust\n";
/// How many lines of the server's log a failure message quotes.
const LOG_TAIL_LINES: usize = 12;
/// How many bytes of the server's log a failure message quotes at most.
const LOG_TAIL_BYTES: usize = 1500;

/// `<data dir>.recovering`, beside the data directory (so on the same volume, for the final
/// rename); None when the path has no last component to add to.
pub fn scratch_dir(data_dir: &Path) -> Option<PathBuf> {
    let name = data_dir.file_name()?;
    let mut scratch = name.to_os_string();
    scratch.push(SCRATCH_SUFFIX);
    Some(data_dir.with_file_name(scratch))
}

/// What the data directory holds before a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// Absent or empty: recover into it.
    Fresh,
    /// A finished recovery: its result, printed again.
    Finished(Box<BackupResult>),
    /// Anything else: refused, never deleted.
    Occupied(String),
}

/// The decision for a data directory with `entries` (None: it does not exist) and the text of
/// its marker, if it has one.
pub fn start_from(data_dir: &Path, entries: Option<&[String]>, marker: Option<&[u8]>) -> Start {
    let Some(entries) = entries.filter(|e| !e.is_empty()) else {
        return Start::Fresh;
    };
    if let Some(result) = marker.and_then(finished_result) {
        return Start::Finished(Box::new(result));
    }
    let mut shown: Vec<&str> = entries.iter().map(String::as_str).collect();
    shown.sort_unstable();
    let more = shown.len().saturating_sub(5);
    shown.truncate(5);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Start::Occupied(format!(
        "the data directory {} holds {}{more} and no finished recovery ({MARKER_FILE}): recover writes only into an absent or empty directory; nothing was changed",
        data_dir.display(),
        shown.join(", "),
    ))
}

/// The result in a marker, when it is a succeeded recovery's.
fn finished_result(marker: &[u8]) -> Option<BackupResult> {
    let r: BackupResult = serde_json::from_slice(marker).ok()?;
    (r.operation == Operation::Recover && r.outcome == Outcome::Succeeded).then_some(r)
}

/// The `-c` settings of the private server that replays WAL: no TCP, its own socket directory
/// and `pg_hba.conf`, no archiving, no hot standby (connections only once promoted, and no
/// check of the source's connection limits against this pod's settings), no TLS (its files
/// may not be in the Job), and a log on stderr in English with UTC times, for the agent to read.
pub fn server_settings(socket_dir: &Path, hba_file: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("listen_addresses", String::new()),
        ("port", PORT.to_string()),
        ("unix_socket_directories", socket_dir.display().to_string()),
        ("unix_socket_permissions", "0700".into()),
        ("hba_file", hba_file.display().to_string()),
        ("archive_mode", "off".into()),
        ("hot_standby", "off".into()),
        ("ssl", "off".into()),
        ("logging_collector", "off".into()),
        ("log_destination", "stderr".into()),
        ("log_min_messages", "warning".into()),
        ("lc_messages", "C".into()),
        ("log_timezone", "UTC".into()),
        ("log_line_prefix", "%m [%p] ".into()),
    ]
}

/// What one connection attempt to the recovering server says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Still starting or recovering (or not listening yet): wait.
    Recovering,
    /// `pg_is_in_recovery()` is false.
    Promoted,
    /// The server accepts connections but refused this one (e.g. no such role): the message.
    Refused(String),
}

/// The probe of `SELECT pg_is_in_recovery()`'s answer or psql's error.
pub fn probe(answer: Result<&str, &str>) -> Probe {
    // PostgreSQL's refusals while it starts, recovers or stops: "the database system is
    // starting up", "… is not accepting connections" (hot standby off), "… is shutting down".
    const WAITING: &str = "the database system is ";
    match answer {
        Ok(a) if a.trim() == "f" => Probe::Promoted,
        Ok(_) => Probe::Recovering,
        Err(e) if e.contains("FATAL") && !e.contains(WAITING) => {
            Probe::Refused(e.trim().replace('\n', " | "))
        }
        Err(_) => Probe::Recovering,
    }
}

/// The query that reads the point reached: the last replayed commit's time (empty when none
/// was replayed: a base backup with no commit after it) and the last replayed WAL location,
/// separated by `|` (a space would be trimmed away with the output when the time is empty).
pub const REACHED_SQL: &str = r#"SELECT coalesce(to_char(pg_last_xact_replay_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), '') || '|' || coalesce(pg_last_wal_replay_lsn()::text, '')"#;

/// The point recovery reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub last_commit: Option<DateTime<Utc>>,
    pub lsn: Option<String>,
}

/// [`REACHED_SQL`]'s answer.
pub fn parse_reached(answer: &str) -> Result<Reached, String> {
    let bad = || format!("unexpected answer {answer:?} for the point reached");
    let (time, lsn) = answer.trim().split_once('|').ok_or_else(bad)?;
    let last_commit = match time.trim() {
        "" => None,
        t => Some(
            DateTime::parse_from_rfc3339(t)
                .map_err(|_| bad())?
                .with_timezone(&Utc),
        ),
    };
    let lsn = match lsn.trim() {
        "" => None,
        l => Some(crate::base::Lsn::parse(l)?.to_string()),
    };
    Ok(Reached { last_commit, lsn })
}

/// What `pg_controldata` says of a stopped server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub state: String,
    pub timeline: u32,
}

/// `pg_controldata`'s output (run with `LC_ALL=C`).
pub fn parse_controldata(text: &str) -> Result<Control, String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().into())
            .ok_or_else(|| format!("pg_controldata printed no {name:?}"))
    };
    let state = field("Database cluster state:")?.to_string();
    let timeline = field("Latest checkpoint's TimeLineID:")?;
    let timeline = timeline
        .parse()
        .map_err(|_| format!("pg_controldata printed a timeline {timeline:?}"))?;
    Ok(Control { state, timeline })
}

/// `postgresql.auto.conf` without the settings that make a server recover: every
/// `restore_command` and `recovery_target*` line and base-restore's comment, so the recovered
/// server starts as a plain primary that never reads the source's archive.
pub fn without_recovery_settings(auto_conf: &str) -> String {
    let recovery = |line: &str| {
        let t = line.trim_start();
        if t.starts_with(crate::base::RECOVERY_COMMENT) {
            return true;
        }
        let name = t
            .split(['=', ' ', '\t'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        name == "restore_command" || name.starts_with("recovery_target")
    };
    let kept: Vec<&str> = auto_conf.lines().filter(|l| !recovery(l)).collect();
    let mut text = kept.join("\n").trim_end().to_string();
    text.push('\n');
    text
}

/// The last lines of the server's log, one string: PostgreSQL's own lines (they start with
/// the time of `log_line_prefix`; `wal-fetch`'s output is in the same file), or every line
/// when none does.
pub fn log_tail(log: &str) -> String {
    let all: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let own: Vec<&str> = all
        .iter()
        .copied()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()) && !probe_refusal(l))
        .collect();
    let lines = if own.is_empty() { all } else { own };
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ");
    let mut start = tail.len().saturating_sub(LOG_TAIL_BYTES);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail[start..].to_string()
    }
}

/// A line the server logs when it refuses the agent's probes while it recovers.
fn probe_refusal(line: &str) -> bool {
    line.contains("FATAL:  the database system is ")
        || line.contains("Hot standby mode is disabled")
}

/// What the server's log says recovery reached, for the message of a failed recovery.
pub fn reached_in_log(log: &str) -> String {
    let last = |prefix: &str| {
        log.lines()
            .rev()
            .find_map(|l| Some(l.split_once(prefix)?.1.trim().to_string()))
    };
    let mut facts = Vec::new();
    if let Some(t) = last("last completed transaction was at log time ") {
        facts.push(format!("the last replayed commit was at {t}"));
    }
    if let Some(at) = last("redo done at ") {
        let lsn = at.split_whitespace().next().unwrap_or(&at);
        facts.push(format!("replay ended at LSN {lsn}"));
    }
    if let Some(f) = last("restored log file ") {
        let file = f.split('"').nth(1).unwrap_or(&f);
        facts.push(format!(
            "the last WAL file fetched from the archive was {file}"
        ));
    }
    if facts.is_empty() {
        "nothing past the base backup was replayed".into()
    } else {
        facts.join(", ")
    }
}

/// The error of a server that exited (`status`) before promoting, from its log.
pub fn exit_failure(target: &Target, scratch: &Path, status: &str, log: &str) -> Error {
    if log.contains("recovery ended before configured recovery target was reached") {
        return Error::TargetUnreachable(format!(
            "recovery replayed every archived WAL file without reaching {}: {}; the archive holds nothing later. Server log: {}",
            target.describe(),
            reached_in_log(log),
            log_tail(log)
        ));
    }
    let why = match unfetched_wal(log) {
        Some(file) => format!(
            "fetching WAL file {file} from the archive failed, so recovery stopped there rather than end early without the commits after it; it can be run again once the archive answers. It stopped ({status})"
        ),
        None => format!("it stopped ({status}) before recovery ended and it promoted"),
    };
    Error::Postgres {
        tool: "postgres".into(),
        database: "(instance)".into(),
        server: format!("data directory {}", scratch.display()),
        detail: format!("{why}. Server log: {}", log_tail(log)),
    }
}

/// The WAL file whose `restore_command` failed and stopped recovery (`wal-fetch` exits above 125
/// for anything but a missing file), from the server's log.
fn unfetched_wal(log: &str) -> Option<String> {
    log.lines().rev().find_map(|l| {
        let rest = l.split_once("FATAL:  could not restore file \"")?.1;
        Some(rest.split('"').next()?.to_string())
    })
}

/// The result of a finished recovery.
pub fn recovered(
    mut result: BackupResult,
    backup_id: &str,
    reached: &Reached,
    timeline: u32,
) -> BackupResult {
    result.outcome = Outcome::Succeeded;
    result.backup_id = Some(backup_id.to_string());
    result.recovered_to = reached.last_commit;
    result.recovered_lsn = reached.lsn.clone();
    result.timeline = Some(timeline);
    let commit = match &reached.last_commit {
        Some(t) => format!("the last replayed commit at {}", crate::base::pg_time(t)),
        None => "no commit replayed".into(),
    };
    result.message = Some(format!(
        "recovered from base backup {backup_id} to LSN {} ({commit}); promoted onto timeline {timeline}",
        reached.lsn.as_deref().unwrap_or("(unknown)"),
    ));
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_scratch_is_a_sibling() {
        assert_eq!(
            scratch_dir(Path::new("/var/lib/pg/data")),
            Some(PathBuf::from("/var/lib/pg/data.recovering"))
        );
        assert_eq!(
            scratch_dir(Path::new("data/")),
            Some(PathBuf::from("data.recovering"))
        );
        assert_eq!(scratch_dir(Path::new("/")), None);
        assert_eq!(scratch_dir(Path::new("a/..")), None);
    }

    fn finished() -> BackupResult {
        let mut r = BackupResult::new(Operation::Recover);
        r.outcome = Outcome::Succeeded;
        r.timeline = Some(2);
        r
    }

    #[test]
    fn a_data_directory_is_fresh_finished_or_refused() {
        let d = Path::new("/d");
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(start_from(d, None, None), Start::Fresh);
        assert_eq!(start_from(d, Some(&[]), None), Start::Fresh);
        let line = finished().to_summary_line();
        assert_eq!(
            start_from(d, Some(&names(&[MARKER_FILE])), Some(line.as_bytes())),
            Start::Finished(Box::new(finished()))
        );
        let mut failed = finished();
        failed.outcome = Outcome::Failed;
        let mut dump = finished();
        dump.operation = Operation::Dump;
        for marker in [
            None,
            Some(failed.to_summary_line().into_bytes()),
            Some(dump.to_summary_line().into_bytes()),
            Some(b"{garbage".to_vec()),
        ] {
            let many = names(&["PG_VERSION", "base", "a", "b", "c", "d", "e"]);
            let Start::Occupied(m) = start_from(d, Some(&many), marker.as_deref()) else {
                panic!("not refused: {marker:?}")
            };
            assert!(
                m.contains("/d holds PG_VERSION, a, b, base, c and 2 more")
                    && m.contains("nothing was changed"),
                "{m}"
            );
        }
    }

    #[test]
    fn the_private_server_is_unreachable_and_does_not_archive() {
        let s = server_settings(Path::new("/tmp/x"), Path::new("/tmp/x/hba"));
        let get = |n: &str| s.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("listen_addresses"), Some(""));
        assert_eq!(get("archive_mode"), Some("off"));
        assert_eq!(get("unix_socket_directories"), Some("/tmp/x"));
        assert_eq!(get("hba_file"), Some("/tmp/x/hba"));
        assert_eq!(get("hot_standby"), Some("off"));
        assert_eq!(get("lc_messages"), Some("C"));
    }

    #[test]
    fn probes_wait_through_startup_and_fail_on_a_refusal() {
        assert_eq!(probe(Ok("f")), Probe::Promoted);
        assert_eq!(probe(Ok("t")), Probe::Recovering);
        for waiting in [
            "psql: error: connection to server on socket \"/tmp/x/.s.PGSQL.5432\" failed: No such file or directory",
            "psql: error: connection to server on socket \"/tmp/x/.s.PGSQL.5432\" failed: FATAL:  the database system is not yet accepting connections\nDETAIL:  Hot standby mode is disabled.",
            "psql: error: connection failed: FATAL:  the database system is starting up",
            "psql: error: connection failed: FATAL:  the database system is not accepting connections\nDETAIL:  Hot standby mode is disabled.",
        ] {
            assert_eq!(probe(Err(waiting)), Probe::Recovering, "{waiting}");
        }
        let refused = probe(Err(
            "psql: error: connection to server on socket \"/tmp/x/.s.PGSQL.5432\" failed: FATAL:  role \"app\" does not exist\n",
        ));
        assert!(
            matches!(&refused, Probe::Refused(m) if m.ends_with("role \"app\" does not exist")),
            "{refused:?}"
        );
    }

    #[test]
    fn the_point_reached_and_the_control_data_parse() {
        let r = parse_reached("2026-12-04T22:30:01.123456Z|0/3000100").unwrap();
        assert_eq!(
            r.last_commit,
            Some(Utc.timestamp_opt(1_796_423_401, 123_456_000).unwrap())
        );
        assert_eq!(r.lsn.as_deref(), Some("0/3000100"));
        // No commit replayed after the base backup: no time, and the output trimmed.
        assert_eq!(
            parse_reached("|0/3000100\n").unwrap(),
            Reached {
                last_commit: None,
                lsn: Some("0/3000100".into())
            }
        );
        for bad in ["", "0/3000100", "yesterday|0/1", "2026-12-04T22:30:01Z|x/y"] {
            assert!(parse_reached(bad).is_err(), "{bad}");
        }
        let text = "pg_control version number:            1300\nDatabase cluster state:               shut down\nLatest checkpoint location:           0/4000028\nLatest checkpoint's TimeLineID:       2\nLatest checkpoint's PrevTimeLineID:   2\n";
        assert_eq!(
            parse_controldata(text).unwrap(),
            Control {
                state: "shut down".into(),
                timeline: 2
            }
        );
        assert!(parse_controldata("Database cluster state: shut down\n").is_err());
        assert!(
            parse_controldata("Database cluster state: x\nLatest checkpoint's TimeLineID: two\n")
                .is_err()
        );
    }

    #[test]
    fn only_the_recovery_settings_are_removed() {
        let auto = "# Do not edit this file manually!\nwork_mem = '8MB'\n\n# dbop-backup base-restore of base backup x1: recovery settings\nrestore_command = 'a wal-fetch %f %p'\nrecovery_target_timeline = 'latest'\nrecovery_target_time = '2025-01-01 00:00:00+00'\nrecovery_target_action = 'promote'\nRECOVERY_TARGET_NAME='n'\n";
        assert_eq!(
            without_recovery_settings(auto),
            "# Do not edit this file manually!\nwork_mem = '8MB'\n"
        );
        assert_eq!(without_recovery_settings(""), "\n");
    }

    const LOG: &str = "2026-12-04 22:30:00.000 UTC [10] LOG:  starting archive recovery\n2026-12-04 22:30:00.100 UTC [10] LOG:  restored log file \"000000010000000000000003\" from archive\n2026-12-04 22:30:00.200 UTC [10] LOG:  redo done at 0/3000100 system usage: CPU: user: 0.00 s\n2026-12-04 22:30:00.200 UTC [10] LOG:  last completed transaction was at log time 2026-12-04 22:29:58.5+00\n2026-12-04 22:30:00.300 UTC [10] FATAL:  recovery ended before configured recovery target was reached\n";

    #[test]
    fn a_target_past_the_archive_is_unreachable_and_says_what_was_reached() {
        let t = Target::Time(Utc.timestamp_opt(1_900_000_000, 0).unwrap());
        let e = exit_failure(&t, Path::new("/d.recovering"), "exit status: 1", LOG);
        assert_eq!(e.label(), "target-unreachable");
        let m = e.to_string();
        assert!(
            m.contains("without reaching time 2030-03-17T17:46:40Z: the last replayed commit was at 2026-12-04 22:29:58.5+00, replay ended at LSN 0/3000100, the last WAL file fetched from the archive was 000000010000000000000003"),
            "{m}"
        );
        assert!(m.contains("FATAL:  recovery ended before"), "{m}");
        let other = exit_failure(
            &t,
            Path::new("/d.recovering"),
            "exit status: 1",
            "FATAL:  could not open file \"x.conf\"\n",
        );
        assert_eq!(other.label(), "postgres");
        assert!(other.to_string().contains("x.conf"));
        let unfetched = exit_failure(
            &t,
            Path::new("/d.recovering"),
            "exit status: 1",
            "2026-12-05 01:00:00 UTC FATAL:  could not restore file \"000000010000000000000004\" from archive: child process exited with exit code 200\n",
        );
        assert_eq!(unfetched.label(), "postgres");
        assert!(
            unfetched.to_string().contains("fetching WAL file 000000010000000000000004 from the archive failed, so recovery stopped there"),
            "{unfetched}"
        );
        assert_eq!(
            reached_in_log("LOG: starting\n"),
            "nothing past the base backup was replayed"
        );
    }

    #[test]
    fn log_tails_are_short() {
        let long: String = (0..500).map(|i| format!("line é {i}\n")).collect();
        let t = log_tail(&long);
        assert!(
            t.len() <= LOG_TAIL_BYTES && t.ends_with("line é 499"),
            "{t}"
        );
        assert_eq!(log_tail(""), "(empty)");
    }

    #[test]
    fn the_result_names_the_point_and_the_timeline() {
        let at = Utc.timestamp_opt(1_796_423_401, 0).unwrap();
        let reached = Reached {
            last_commit: Some(at),
            lsn: Some("0/3000100".into()),
        };
        let r = recovered(BackupResult::new(Operation::Recover), "b1", &reached, 2);
        assert_eq!(r.outcome, Outcome::Succeeded);
        assert_eq!(
            (r.backup_id.as_deref(), r.timeline, r.recovered_to),
            (Some("b1"), Some(2), Some(at))
        );
        let line = r.to_summary_line();
        assert!(
            line.contains(
                r#""recoveredTo":"2026-12-04T22:30:01.000000Z","recoveredLsn":"0/3000100","timeline":2"#
            ),
            "{line}"
        );
    }
}
