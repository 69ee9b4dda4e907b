//! What a controller reads about an instance's replication: its role, timeline, WAL positions
//! and lag; and the slots a primary holds.
//!
//! Pure: the queries, and parsers of their output as `psql -At -F '|'` prints it (NULL is an
//! empty field). The caller runs them.

use std::collections::BTreeMap;

use dbop_contract::position::{Archiver, Position};
pub use dbop_contract::position::{Lsn, lag_bytes};

/// Primary or standby, as the server itself says (`pg_is_in_recovery()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Standby,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
        }
    }
}

/// One instance's replication status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Primary {
        timeline: u32,
        /// Where the primary writes WAL (`pg_current_wal_lsn()`).
        current: Lsn,
    },
    Standby {
        /// The timeline of the WAL last received (`None` when no WAL receiver runs).
        timeline: Option<u32>,
        /// WAL received and flushed (`pg_last_wal_receive_lsn()`): what a promotion would keep.
        received: Option<Lsn>,
        /// WAL replayed (`pg_last_wal_replay_lsn()`): what its queries see.
        replayed: Option<Lsn>,
        /// The WAL receiver's state is `streaming`.
        streaming: bool,
        /// `host:port` the WAL receiver is connected to.
        upstream: Option<String>,
        /// Milliseconds since the last replayed transaction committed on the primary (lag in
        /// time, but only while the primary is writing: it grows on an idle primary too).
        replay_age_ms: Option<u64>,
    },
}

impl Status {
    pub fn role(&self) -> Role {
        match self {
            Status::Primary { .. } => Role::Primary,
            Status::Standby { .. } => Role::Standby,
        }
    }

    pub fn timeline(&self) -> Option<u32> {
        match self {
            Status::Primary { timeline, .. } => Some(*timeline),
            Status::Standby { timeline, .. } => *timeline,
        }
    }

    /// The WAL a promotion of this instance would keep: its current position on a primary,
    /// the WAL received on a standby (a promotion replays all of it first).
    pub fn durable(&self) -> Option<Lsn> {
        match self {
            Status::Primary { current, .. } => Some(*current),
            Status::Standby {
                received, replayed, ..
            } => (*received).max(*replayed),
        }
    }

    /// What the status endpoint reports (`GET /status`).
    pub fn position(&self) -> Position {
        match self {
            Status::Primary { timeline, current } => Position {
                standby: false,
                timeline: Some(*timeline),
                lsn: Some(*current),
                replayed: None,
                streaming: false,
                replay_lag_ms: BTreeMap::new(),
                sync_states: BTreeMap::new(),
                archiver: None,
            },
            Status::Standby {
                timeline,
                replayed,
                streaming,
                ..
            } => Position {
                standby: true,
                timeline: *timeline,
                lsn: self.durable(),
                replayed: *replayed,
                streaming: *streaming,
                replay_lag_ms: BTreeMap::new(),
                sync_states: BTreeMap::new(),
                archiver: None,
            },
        }
    }

    /// `key=value` lines, what `dbop-instance replication status` prints.
    pub fn render(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_default();
        let mut out = format!("role={}\n", self.role().label());
        out.push_str(&format!(
            "timeline={}\n",
            opt(self.timeline().map(|t| t.to_string()))
        ));
        match self {
            Status::Primary { current, .. } => out.push_str(&format!("current_lsn={current}\n")),
            Status::Standby {
                received,
                replayed,
                streaming,
                upstream,
                replay_age_ms,
                ..
            } => {
                out.push_str(&format!(
                    "received_lsn={}\nreplayed_lsn={}\nstreaming={streaming}\nupstream={}\n\
                     replay_age_ms={}\n",
                    opt(received.map(|l| l.to_string())),
                    opt(replayed.map(|l| l.to_string())),
                    opt(upstream.clone()),
                    opt(replay_age_ms.map(|m| m.to_string())),
                ));
            }
        }
        out
    }
}

/// The status query: one row of 8 fields. The timeline of a primary is the one its WAL is
/// written on (the first 8 hex digits of the current WAL file's name); the branches of the
/// `CASE`s that only work on one role are evaluated on that role only.
pub const STATUS_QUERY: &str = "SELECT pg_is_in_recovery(), \
 CASE WHEN pg_is_in_recovery() THEN NULL \
      ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END, \
 CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn() END, \
 pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn(), \
 (SELECT received_tli FROM pg_stat_wal_receiver), \
 (SELECT status || '|' || coalesce(sender_host || ':' || sender_port, '') \
    FROM pg_stat_wal_receiver), \
 (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint";

/// Parses the row of `STATUS_QUERY`. The WAL receiver's state and upstream share one column
/// (so that a missing receiver is one NULL): 9 fields when it runs, 8 otherwise.
pub fn parse_status(output: &str) -> Result<Status, String> {
    let row = output
        .lines()
        .find(|l| !l.trim().is_empty())
        .ok_or("the status query returned no row")?;
    let mut f: Vec<&str> = row.split('|').map(str::trim).collect();
    match f.len() {
        8 => f.insert(7, ""),
        9 => {}
        n => return Err(format!("the status query returned {n} fields")),
    }
    let lsn =
        |s: &str| -> Result<Option<Lsn>, String> { (!s.is_empty()).then(|| s.parse()).transpose() };
    let int = |s: &str, what: &str| -> Result<Option<u64>, String> {
        (!s.is_empty())
            .then(|| s.parse::<i64>().map(|n| n.max(0) as u64))
            .transpose()
            .map_err(|_| format!("the status query's {what} is not a number: {s:?}"))
    };
    let timeline = |s: &str| -> Result<Option<u32>, String> {
        int(s, "timeline")?
            .map(|t| u32::try_from(t).map_err(|_| "timeline out of range".to_string()))
            .transpose()
    };
    match f[0] {
        "f" => Ok(Status::Primary {
            timeline: timeline(f[1])?.ok_or("a primary without a timeline")?,
            current: lsn(f[2])?.ok_or("a primary without a WAL position")?,
        }),
        "t" => Ok(Status::Standby {
            timeline: timeline(f[5])?,
            received: lsn(f[3])?,
            replayed: lsn(f[4])?,
            streaming: f[6] == "streaming",
            upstream: (!f[7].is_empty()).then(|| f[7].to_string()),
            replay_age_ms: int(f[8], "replay age")?,
        }),
        other => Err(format!("pg_is_in_recovery() returned {other:?}")),
    }
}

/// A primary's streaming standbys: how long their replay lags behind its commits, in
/// milliseconds (PostgreSQL's `replay_lag`; 0 when it has no recent measure: the standby caught
/// up and nothing is written), and how it counts each for synchronous commits (`sync_state`).
/// One row per standby, `name|ms|sync_state`.
pub const REPLAY_LAG_QUERY: &str = "SELECT application_name, \
 coalesce((extract(epoch FROM replay_lag) * 1000)::bigint, 0), sync_state \
 FROM pg_stat_replication WHERE state = 'streaming' ORDER BY application_name";

/// A primary's streaming standbys, by name: replay lag in milliseconds, and sync state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandbyRows {
    pub replay_lag_ms: BTreeMap<String, u64>,
    pub sync_states: BTreeMap<String, String>,
}

/// Parses the rows of `REPLAY_LAG_QUERY`.
pub fn parse_standby_rows(output: &str) -> Result<StandbyRows, String> {
    let mut rows = StandbyRows::default();
    for row in output.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = row.rsplitn(3, '|');
        let (Some(state), Some(ms), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("a standby row without two '|': {row:?}"));
        };
        let ms = ms
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("a replay lag that is not a number: {row:?}"))?;
        let name = name.trim().to_string();
        rows.replay_lag_ms.insert(name.clone(), ms.max(0) as u64);
        rows.sync_states.insert(name, state.trim().to_string());
    }
    Ok(rows)
}

/// A primary's WAL archiving, one row of 8 fields, or no row when `archive_mode` is off. The
/// files waiting are counted in `pg_wal/archive_status` (superuser, as the manager connects).
pub const ARCHIVER_QUERY: &str = "SELECT archived_count, last_archived_wal, \
 extract(epoch FROM last_archived_time)::bigint, failed_count, last_failed_wal, \
 extract(epoch FROM last_failed_time)::bigint, \
 (SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'), \
 current_setting('archive_mode') \
 FROM pg_stat_archiver WHERE current_setting('archive_mode') <> 'off'";

/// Parses the row of `ARCHIVER_QUERY`: `None` when archiving is off.
pub fn parse_archiver(output: &str) -> Result<Option<Archiver>, String> {
    let Some(row) = output.lines().find(|l| !l.trim().is_empty()) else {
        return Ok(None);
    };
    let f: Vec<&str> = row.split('|').map(str::trim).collect();
    let [
        archived,
        last_archived,
        archived_at,
        failed,
        last_failed,
        failed_at,
        waiting,
        _mode,
    ] = f[..]
    else {
        return Err(format!("an archiver row with {} fields", f.len()));
    };
    let count = |s: &str| {
        s.parse::<i64>()
            .map(|n| n.max(0) as u64)
            .map_err(|_| format!("an archiver count that is not a number: {row:?}"))
    };
    let time = |s: &str| -> Result<Option<i64>, String> {
        (!s.is_empty())
            .then(|| s.parse::<i64>())
            .transpose()
            .map_err(|_| format!("an archiver time that is not a number: {row:?}"))
    };
    let name = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Ok(Some(Archiver {
        archived_count: count(archived)?,
        last_archived_wal: name(last_archived),
        last_archived_at: time(archived_at)?,
        failed_count: count(failed)?,
        last_failed_wal: name(last_failed),
        last_failed_at: time(failed_at)?,
        waiting: count(waiting)?,
    }))
}

/// A replication slot on a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub active: bool,
    /// The oldest WAL the slot keeps (`None` until it first reserved WAL).
    pub restart_lsn: Option<Lsn>,
}

/// The physical slots, one per row `name|active|restart_lsn`.
pub const SLOTS_QUERY: &str = "SELECT slot_name, active, restart_lsn FROM pg_replication_slots \
 WHERE slot_type = 'physical' ORDER BY slot_name";

pub fn parse_slots(output: &str) -> Result<Vec<Slot>, String> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|row| {
            let f: Vec<&str> = row.split('|').map(str::trim).collect();
            let [name, active, restart] = f[..] else {
                return Err(format!("a slot row with {} fields", f.len()));
            };
            Ok(Slot {
                name: name.to_string(),
                active: active == "t",
                restart_lsn: (!restart.is_empty()).then(|| restart.parse()).transpose()?,
            })
        })
        .collect()
}

/// What to do about slots so that exactly `wanted` of dbop's exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotPlan {
    pub create: Vec<String>,
    /// dbop's slots no instance needs, not in use: dropped so they stop keeping WAL.
    pub drop: Vec<String>,
    /// dbop's slots no instance needs but still in use (a removed standby still connected):
    /// dropped once it disconnects.
    pub busy: Vec<String>,
}

/// Plans slots: creates the missing `wanted` ones, drops dbop's (prefix `dbop_`) others.
/// Slots without dbop's prefix are someone else's and never touched.
pub fn plan_slots(existing: &[Slot], wanted: &[String]) -> SlotPlan {
    let mut plan = SlotPlan {
        create: wanted
            .iter()
            .filter(|w| !existing.iter().any(|s| &s.name == *w))
            .cloned()
            .collect(),
        ..SlotPlan::default()
    };
    plan.create.dedup();
    for s in existing {
        if !s.name.starts_with(crate::replication::config::SLOT_PREFIX) || wanted.contains(&s.name)
        {
            continue;
        }
        if s.active {
            plan.busy.push(s.name.clone());
        } else {
            plan.drop.push(s.name.clone());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archiver_rows() {
        assert_eq!(parse_archiver("").unwrap(), None);
        let fresh = parse_archiver("0|||0|||0|on\n").unwrap().unwrap();
        assert_eq!(fresh, Archiver::default());
        assert!(!fresh.failing());
        let failing = parse_archiver(
            "3|000000010000000000000003|1700000000|5|000000010000000000000004|1700000060|2|on",
        )
        .unwrap()
        .unwrap();
        assert_eq!(failing.archived_count, 3);
        assert_eq!(
            failing.last_failed_wal.as_deref(),
            Some("000000010000000000000004")
        );
        assert_eq!(failing.waiting, 2);
        assert!(failing.failing());
        let recovered = parse_archiver(
            "4|000000010000000000000004|1700000090|5|000000010000000000000004|1700000060|0|on",
        )
        .unwrap()
        .unwrap();
        assert!(!recovered.failing());
        // A failure and a success in the same second: the success came last when the failed
        // file was archived, or when nothing waits; otherwise the failure did.
        let same_second = |archived: &str, waiting: u64| Archiver {
            last_archived_wal: Some(archived.into()),
            last_archived_at: Some(1700000060),
            waiting,
            ..failing.clone()
        };
        assert!(!same_second("000000010000000000000004", 3).failing());
        assert!(!same_second("000000010000000000000003", 0).failing());
        assert!(same_second("000000010000000000000003", 2).failing());
        assert!(parse_archiver("1|2|3").is_err());
        assert!(parse_archiver("x|||0|||0|on").is_err());
    }

    #[test]
    fn replay_lags() {
        let rows = parse_standby_rows("db-1|12|quorum\ndb-2|0|async\n\n").unwrap();
        assert_eq!(rows.sync_states["db-1"], "quorum");
        assert_eq!(rows.sync_states["db-2"], "async");
        let lags = rows.replay_lag_ms;
        assert_eq!(
            lags,
            BTreeMap::from([("db-1".into(), 12), ("db-2".into(), 0)])
        );
        assert_eq!(parse_standby_rows("").unwrap(), StandbyRows::default());
        assert_eq!(
            parse_standby_rows("db-1|-3|async").unwrap().replay_lag_ms["db-1"],
            0
        );
        assert!(parse_standby_rows("db-1").is_err());
        assert!(parse_standby_rows("db-1|4").is_err());
        assert!(parse_standby_rows("db-1|x|sync").is_err());
    }

    #[test]
    fn statuses() {
        let table = [
            (
                "f|2|0/5000148|||||\n",
                Status::Primary {
                    timeline: 2,
                    current: Lsn(0x5000148),
                },
            ),
            (
                "t|||0/5000148|0/5000100|2|streaming|127.0.0.1:5433|1200\n",
                Status::Standby {
                    timeline: Some(2),
                    received: Some(Lsn(0x5000148)),
                    replayed: Some(Lsn(0x5000100)),
                    streaming: true,
                    upstream: Some("127.0.0.1:5433".into()),
                    replay_age_ms: Some(1200),
                },
            ),
            (
                // No WAL receiver (its primary is gone), nothing replayed since start.
                "t|||0/3000000|0/3000000|||\n",
                Status::Standby {
                    timeline: None,
                    received: Some(Lsn(0x3000000)),
                    replayed: Some(Lsn(0x3000000)),
                    streaming: false,
                    upstream: None,
                    replay_age_ms: None,
                },
            ),
            (
                "t|||||1|waiting||-3\n",
                Status::Standby {
                    timeline: Some(1),
                    received: None,
                    replayed: None,
                    streaming: false,
                    upstream: None,
                    replay_age_ms: Some(0),
                },
            ),
        ];
        for (row, want) in table {
            assert_eq!(parse_status(row).unwrap(), want, "{row:?}");
        }
        for bad in ["", "x|||||||", "f||0/1|||||", "f|2|zz|||||", "t|||"] {
            assert!(parse_status(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn status_accessors_and_rendering() {
        let standby = parse_status("t|||0/5000148|0/5000100|2|streaming|h:1|7").unwrap();
        assert_eq!(standby.role(), Role::Standby);
        assert_eq!(standby.timeline(), Some(2));
        assert_eq!(standby.durable(), Some(Lsn(0x5000148)));
        assert!(
            standby
                .render()
                .contains("role=standby\ntimeline=2\nreceived_lsn=0/5000148\n")
        );
        let primary = parse_status("f|3|0/6000000|||||").unwrap();
        assert_eq!(
            primary.render(),
            "role=primary\ntimeline=3\ncurrent_lsn=0/6000000\n"
        );
    }

    #[test]
    fn slots_are_parsed_and_planned() {
        let slots = parse_slots("dbop_db_1|t|0/3000148\ndbop_db_2|f|\nother|f|0/1\n").unwrap();
        assert_eq!(
            slots[0],
            Slot {
                name: "dbop_db_1".into(),
                active: true,
                restart_lsn: Some(Lsn(0x3000148)),
            }
        );
        assert_eq!(slots[1].restart_lsn, None);
        assert!(parse_slots("a|t").is_err());
        let s = |n: &str| n.to_string();
        let table = [
            (vec![s("dbop_db_1"), s("dbop_db_2")], SlotPlan::default()),
            (
                vec![s("dbop_db_1"), s("dbop_db_2"), s("dbop_db_3")],
                SlotPlan {
                    create: vec![s("dbop_db_3")],
                    ..SlotPlan::default()
                },
            ),
            (
                vec![],
                SlotPlan {
                    drop: vec![s("dbop_db_2")],
                    busy: vec![s("dbop_db_1")],
                    ..SlotPlan::default()
                },
            ),
        ];
        for (wanted, want) in table {
            assert_eq!(plan_slots(&slots, &wanted), want, "{wanted:?}");
        }
    }
}
