//! Where an instance stands in the WAL, as its manager reports it at `GET /status` on
//! `STATUS_PORT` and the operator reads it: its role as the server says, its timeline, and its
//! WAL positions. The operator promotes the standby that has received the most WAL and shows
//! every instance's positions and lag in the Database's status.
//!
//! Pure: the report's JSON shape and the WAL position type.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The port of the instance manager's status endpoint (`run --status-addr`, on by default on
/// every interface of the pod). Its answer holds no secret.
pub const STATUS_PORT: u16 = 8008;
/// The path of the report.
pub const STATUS_PATH: &str = "/status";

/// A WAL position (`pg_lsn`), printed `X/Y` in hexadecimal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl FromStr for Lsn {
    type Err = String;
    fn from_str(s: &str) -> Result<Lsn, String> {
        let bad = || format!("{s:?} is not a WAL position (X/Y)");
        let (high, low) = s.trim().split_once('/').ok_or_else(bad)?;
        let part = |p: &str| {
            if p.is_empty() || p.len() > 8 {
                return Err(bad());
            }
            u64::from_str_radix(p, 16).map_err(|_| bad())
        };
        Ok(Lsn((part(high)? << 32) | part(low)?))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Bytes of WAL between a standby's position and the primary's (0 when it is at or ahead).
pub fn lag_bytes(primary: Lsn, standby: Lsn) -> u64 {
    primary.0.saturating_sub(standby.0)
}

/// One instance's report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    /// The server is in recovery (a standby); `false`: it accepts writes.
    pub standby: bool,
    /// The timeline it writes (a primary) or last received (a standby; `None` when no WAL
    /// receiver runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// A primary's `pg_current_wal_lsn()`; a standby's WAL received and flushed
    /// (`pg_last_wal_receive_lsn()`, or what it replayed when it received nothing yet): what a
    /// promotion of it would keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<Lsn>,
    /// A standby's WAL replayed (`pg_last_wal_replay_lsn()`): what its queries see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<Lsn>,
    /// A standby's WAL receiver streams.
    #[serde(default)]
    pub streaming: bool,
    /// A primary's streaming standbys, by name, and how long each one's replay lags behind its
    /// commits in milliseconds (0: no recent measure, caught up and idle).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replay_lag_ms: BTreeMap<String, u64>,
    /// A primary's streaming standbys, by name, and how it counts each one for synchronous
    /// commits (`pg_stat_replication.sync_state`: `quorum` for `ANY n (…)`, `sync`,
    /// `potential`, `async`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sync_states: BTreeMap<String, String>,
    /// A primary's WAL archiving (`pg_stat_archiver`), when its `archive_mode` is not off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiver: Option<Archiver>,
}

/// How a primary's WAL archiving goes, as `pg_stat_archiver` counts it since the server
/// started (or the statistics were reset). Times are Unix seconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Archiver {
    pub archived_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_at: Option<i64>,
    pub failed_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_at: Option<i64>,
    /// WAL files waiting for archiving (`.ready` in `pg_wal/archive_status`): what a failing
    /// archive keeps on the volume.
    pub waiting: u64,
}

impl Archiver {
    /// The last attempt failed: a failure after the last success (or with none). The times
    /// are whole seconds, so a failure and a success in the same second (PostgreSQL retries
    /// every second) are told apart by what followed: the failed file archived since, or
    /// nothing left waiting, means the success came last.
    pub fn failing(&self) -> bool {
        match (self.last_failed_at, self.last_archived_at) {
            (Some(failed), Some(archived)) if failed == archived => {
                self.last_failed_wal != self.last_archived_wal && self.waiting > 0
            }
            (Some(failed), Some(archived)) => failed > archived,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

impl Position {
    /// The JSON body of `GET /status`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a body of `GET /status`.
    pub fn from_json(body: &str) -> Result<Position, String> {
        serde_json::from_str(body).map_err(|e| format!("not a status report: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns() {
        let table = [
            ("0/0", Some(0)),
            ("0/3000148", Some(0x3000148)),
            ("16/B374D848", Some(0x16_B374_D848)),
            ("FFFFFFFF/FFFFFFFF", Some(u64::MAX)),
            ("", None),
            ("3000148", None),
            ("0/", None),
            ("1/123456789", None),
            ("g/0", None),
        ];
        for (text, want) in table {
            assert_eq!(text.parse::<Lsn>().ok().map(|l| l.0), want, "{text:?}");
        }
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(lag_bytes(Lsn(0x1_0000_0010), Lsn(0xFFFF_FFF0)), 0x20);
        assert_eq!(lag_bytes(Lsn(5), Lsn(9)), 0);
    }

    #[test]
    fn a_report_round_trips_and_bad_bodies_are_refused() {
        let standby = Position {
            standby: true,
            timeline: Some(2),
            lsn: Some(Lsn(0x3000148)),
            replayed: Some(Lsn(0x3000100)),
            streaming: true,
            replay_lag_ms: BTreeMap::new(),
            sync_states: BTreeMap::new(),
            archiver: None,
        };
        let json = standby.to_json();
        assert_eq!(
            json,
            r#"{"standby":true,"timeline":2,"lsn":"0/3000148","replayed":"0/3000100","streaming":true}"#
        );
        assert_eq!(Position::from_json(&json).unwrap(), standby);
        let primary =
            Position::from_json(r#"{"standby":false,"timeline":3,"lsn":"0/6000000"}"#).unwrap();
        assert_eq!(primary.lsn, Some(Lsn(0x6000000)));
        assert!(!primary.streaming);
        let lagging = Position::from_json(
            r#"{"standby":false,"lsn":"0/6000000","replayLagMs":{"db-1":12,"db-2":0}}"#,
        )
        .unwrap();
        assert_eq!(lagging.replay_lag_ms["db-1"], 12);
        assert!(Position::from_json(&lagging.to_json()).unwrap() == lagging);
        for bad in ["", "{", r#"{"standby":true,"lsn":"nope"}"#, "[]"] {
            assert!(Position::from_json(bad).is_err(), "{bad:?}");
        }
    }
}
