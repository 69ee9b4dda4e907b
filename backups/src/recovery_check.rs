//! Verification of a base backup (`verify-base`), the decisions: whether the recovery into a
//! scratch instance replayed every WAL segment the bucket held when it started (a missing or
//! unreadable segment in between ends a recovery to the latest point early and silently, as
//! PostgreSQL takes it for the end of the archive, so it must be looked for), how the
//! recovered server's databases and row counts are read, and what the verification reports.
//!
//! Pure: the listing's newest segment, the server's answers and the measured time are passed
//! in. The I/O is `verify_base` (and `recover`, which runs the server).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::base::Lsn;
use crate::base_retention::{SegmentPosition, segment_position};
use crate::error::Error;

/// The databases of the recovered server that accept connections, as a JSON array of names.
pub const DATABASES_SQL: &str = "SELECT coalesce(json_agg(datname ORDER BY datname), '[]')::text FROM pg_database WHERE datallowconn AND NOT datistemplate";

/// The query naming the WAL segment that holds `lsn` (on the recovered server's new timeline;
/// only its position counts). An [`Lsn`] prints as hexadecimal digits and a slash only.
pub fn wal_file_sql(lsn: &Lsn) -> String {
    format!("SELECT pg_walfile_name('{lsn}')")
}

/// What the recovered server holds: for each database, each table's rows.
pub type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// The database names of [`DATABASES_SQL`]'s answer.
pub fn parse_databases(answer: &str) -> Result<Vec<String>, Error> {
    serde_json::from_str(answer.trim()).map_err(|e| {
        Error::Verify(format!(
            "unexpected answer {answer:?} for the recovered databases: {e}"
        ))
    })
}

/// Succeeds when the recovery reached the bucket's newest segment (`newest`: timeline and
/// position, from the listing taken before it began); the segment it reached is `reached_file`.
pub fn check_reached(
    newest: Option<(u32, SegmentPosition)>,
    reached_file: &str,
) -> Result<(), Error> {
    let Some((timeline, newest)) = newest else {
        return Err(Error::Verify(
            "the bucket holds no archived WAL segment: a base backup restores only with the WAL archived during and after it (is walArchiving on?)".into(),
        ));
    };
    let reached = segment_position(reached_file.trim()).ok_or_else(|| {
        Error::Verify(format!(
            "unexpected WAL file name {reached_file:?} for the point reached"
        ))
    })?;
    if reached >= newest {
        return Ok(());
    }
    Err(Error::Verify(format!(
        "the recovery stopped in WAL segment {} but the bucket held WAL up to segment {} of timeline {timeline}: a WAL file in between is missing or could not be read, so a recovery to the latest point loses every commit after the first",
        position_hex(reached),
        position_hex(newest),
    )))
}

/// A segment's position as in its file name (`XXXXXXXXYYYYYYYY`).
fn position_hex((log, seg): SegmentPosition) -> String {
    format!("{log:08X}{seg:08X}")
}

/// The message of a verification that passed.
pub fn verified_message(
    backup_id: &str,
    lsn: &Lsn,
    last_commit: Option<DateTime<Utc>>,
    took: Duration,
    counts: &Counts,
) -> String {
    let tables: usize = counts.values().map(BTreeMap::len).sum();
    let rows: u64 = counts.values().flat_map(BTreeMap::values).sum();
    let commit = match last_commit {
        Some(t) => format!("the last commit at {}", crate::base::pg_time(&t)),
        None => "no commit after the backup".into(),
    };
    format!(
        "base backup {backup_id} restored into a scratch instance and every archived WAL file replayed, to LSN {lsn} ({commit}), in {:.1} s; {} read whole: {}, {}",
        took.as_secs_f64(),
        plural(counts.len() as u64, "database"),
        plural(tables as u64, "table"),
        plural(rows, "row"),
    )
}

/// `1 table`, `2 tables`.
fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_recovery_must_reach_the_newest_archived_segment() {
        let newest = Some((2, (0, 9)));
        assert!(check_reached(newest, "000000030000000000000009").is_ok());
        assert!(check_reached(newest, "00000003000000000000000A\n").is_ok());
        let short = check_reached(newest, "000000030000000000000007").unwrap_err();
        let text = short.to_string();
        assert!(
            text.contains("segment 0000000000000007")
                && text.contains("0000000000000009 of timeline 2")
                && text.contains("missing"),
            "{text}"
        );
        assert_eq!(short.label(), "verify");
        // Across a log boundary: (1, 0) is after (0, FF).
        assert!(check_reached(Some((1, (0, 0xFF))), "000000020000000100000000").is_ok());
        assert!(check_reached(newest, "not a wal file").is_err());
        let none = check_reached(None, "000000030000000000000009").unwrap_err();
        assert!(none.to_string().contains("walArchiving"), "{none}");
    }

    #[test]
    fn the_message_says_what_was_restored_and_read() {
        let mut counts = Counts::new();
        counts.insert(
            "app".into(),
            [("public.t".into(), 5), ("public.u".into(), 2)].into(),
        );
        counts.insert("postgres".into(), BTreeMap::new());
        counts.insert("shop".into(), [("public.o".into(), 1)].into());
        let at = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
        let m = verified_message(
            "b1",
            &Lsn(0x3_0000_0100),
            Some(at),
            Duration::from_millis(4250),
            &counts,
        );
        assert!(m.contains("base backup b1"), "{m}");
        assert!(m.contains("LSN 3/100"), "{m}");
        assert!(m.contains("in 4.2 s") || m.contains("in 4.3 s"), "{m}");
        assert!(
            m.contains("3 databases read whole: 3 tables, 8 rows"),
            "{m}"
        );
        counts.remove("app");
        counts.remove("postgres");
        let m = verified_message("b1", &Lsn(1), None, Duration::ZERO, &counts);
        assert!(m.contains("1 database read whole: 1 table, 1 row"), "{m}");
        assert!(m.contains("no commit after the backup"), "{m}");
    }

    #[test]
    fn the_queries_are_what_the_server_is_asked() {
        assert_eq!(
            wal_file_sql(&Lsn(0x1_0000_0028)),
            "SELECT pg_walfile_name('1/28')"
        );
        assert_eq!(
            parse_databases("[\"app\", \"postgres\"]\n").unwrap(),
            ["app", "postgres"]
        );
        assert!(parse_databases("app").is_err());
    }
}
