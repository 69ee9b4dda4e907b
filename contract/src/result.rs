//! The result summary: one JSON line on stdout and in `--result-file` (the Job's termination
//! message), at most 4 KiB. This is the contract with the operator; field names are fixed.
//! Pure: no I/O. The operator reads it back with [`parse_termination_message`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The termination message limit of a Kubernetes container.
pub const MAX_SUMMARY_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Outcome {
    Succeeded,
    #[default]
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    #[default]
    Dump,
    Restore,
    Verify,
    Prune,
    /// A point-in-time recovery into a data directory (`recover`).
    Recover,
    /// A physical base backup of the whole instance (`base-backup`).
    #[serde(rename = "base-backup")]
    BaseBackup,
}

impl Operation {
    pub fn label(self) -> &'static str {
        match self {
            Operation::Dump => "dump",
            Operation::Restore => "restore",
            Operation::Verify => "verify",
            Operation::Prune => "prune",
            Operation::Recover => "recover",
            Operation::BaseBackup => "base-backup",
        }
    }
}

/// The agent's exit code for bad flags, environment or input.
pub const EXIT_USAGE: i32 = 2;
/// The agent's exit code for a failure no retry can fix: the backup is missing, damaged, of a
/// newer major version or sealed with another key, the recovery target lies outside the
/// archive, a verification found a difference. A Job stops retrying on it.
pub const EXIT_PERMANENT: i32 = 4;

/// What one run of the agent did. Absent fields are omitted from the JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct BackupResult {
    pub outcome: Outcome,
    /// Defaulted when reading, so a minimal `{"outcome":…}` line still counts as a result.
    #[serde(default)]
    pub operation: Operation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_key: Option<String>,
    /// Compressed size of the dump object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Uncompressed size of the pg_dump stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_bytes: Option<u64>,
    /// Hex SHA-256 of the compressed object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// How many databases the backup holds (dump, restore, verify); absent from the results
    /// of agents that backed up one database only. The other size fields describe the
    /// application database's dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub databases: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub completed_at: Option<DateTime<Utc>>,
    /// `recover`: the time of the last commit replayed (absent when none was), to the
    /// microsecond: a time target is judged against it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rfc3339_micros_opt"
    )]
    pub recovered_to: Option<DateTime<Utc>>,
    /// `recover`: the WAL location of the last record replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_lsn: Option<String>,
    /// `recover`: the timeline the recovered server continues on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// `verify` and `verify-base`: how long restoring the backup took (a dump into scratch
    /// databases, or a base backup and its WAL into a scratch instance), in milliseconds: the
    /// recovery time measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// On failure, the kind of failure as a short machine label (`not-found`, `integrity`,
    /// `incompatible-version`, `s3`, `postgres`, `usage`, `interrupted`, `io`, `verify`;
    /// `encryption-key`; `recover` adds `target-before-backups` and `target-unreachable`), so
    /// the operator can name the cause in a condition without parsing `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<String>,
}

impl BackupResult {
    pub fn new(operation: Operation) -> Self {
        BackupResult {
            operation,
            ..Default::default()
        }
    }

    /// One JSON line of at most [`MAX_SUMMARY_BYTES`] bytes: `message` is shortened (on a
    /// character boundary, ending in `…`) until it fits, and dropped if even that is not enough.
    pub fn to_summary_line(&self) -> String {
        let mut result = self.clone();
        loop {
            let line = serde_json::to_string(&result).unwrap_or_else(|_| {
                r#"{"outcome":"Failed","message":"result could not be encoded"}"#.to_string()
            });
            if line.len() <= MAX_SUMMARY_BYTES {
                return line;
            }
            let excess = line.len() - MAX_SUMMARY_BYTES;
            match result.message.take() {
                Some(message) if message.len() > 16 => {
                    // Escapes make the JSON longer than the text: when the excess is more than
                    // the text, halve it and measure again.
                    let mut cut = if message.len() > excess + 8 {
                        message.len() - excess - 8
                    } else {
                        message.len() / 2
                    };
                    while !message.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    result.message = Some(format!("{}…", &message[..cut]));
                }
                Some(_) => {}
                None => {
                    // Nothing left to shorten: keep only the fields the operator must have.
                    result = BackupResult {
                        outcome: self.outcome,
                        operation: self.operation,
                        failure_kind: self.failure_kind.clone(),
                        ..Default::default()
                    };
                }
            }
        }
    }
}

/// The agent's result from a termination message: its last line that is a JSON result. With
/// `FallbackToLogsOnError` the message may be a log tail instead; then None.
pub fn parse_termination_message(message: &str) -> Option<BackupResult> {
    message
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str::<BackupResult>(l).ok())
}

/// Why the instance manager stopped before its server ran, when the operator can tell the user
/// what to change: the first word of the database container's termination message, as
/// `<label>: <message>` (other fatal errors are plain text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceFailure {
    /// The container's uid has no passwd entry and the image no nss_wrapper to give it one.
    NoUserEntry,
    /// PostgreSQL stopped because the data volume is full (`volume::VolumeUsage::full`); the
    /// message starts with the figures (`VolumeUsage::full_message`).
    VolumeFull,
}

impl InstanceFailure {
    pub const ALL: [InstanceFailure; 2] =
        [InstanceFailure::NoUserEntry, InstanceFailure::VolumeFull];

    pub fn label(self) -> &'static str {
        match self {
            InstanceFailure::NoUserEntry => "no-user-entry",
            InstanceFailure::VolumeFull => "volume-full",
        }
    }

    /// The termination message: the label, then the message.
    pub fn message(self, message: &str) -> String {
        format!("{}: {message}", self.label())
    }

    /// The failure a termination message names, with the rest of its first line.
    pub fn parse(termination_message: &str) -> Option<(InstanceFailure, &str)> {
        let first = termination_message.lines().next()?;
        let (label, rest) = first.split_once(": ")?;
        Self::ALL
            .into_iter()
            .find(|f| f.label() == label)
            .map(|f| (f, rest))
    }
}

/// RFC 3339 with whole seconds and `Z`, e.g. `2025-01-31T02:00:00Z`.
pub fn format_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Like [`rfc3339_opt`], with the microseconds PostgreSQL's commit times have.
pub mod rfc3339_micros_opt {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Micros, true)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        super::rfc3339_opt::deserialize(d)
    }
}

pub mod rfc3339_opt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::format_time(t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| {
            DateTime::parse_from_rfc3339(&s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn full() -> BackupResult {
        BackupResult {
            outcome: Outcome::Succeeded,
            operation: Operation::Dump,
            backup_id: Some("20250131T020000Z".into()),
            database: Some("app".into()),
            bucket: Some("backups".into()),
            key: Some("p/app/20250131T020000Z/dump.pgc.zst".into()),
            manifest_key: Some("p/app/20250131T020000Z/manifest.json".into()),
            size_bytes: Some(10),
            raw_bytes: Some(100),
            sha256: Some("ab".repeat(32)),
            engine_version: Some("15.18".into()),
            databases: Some(3),
            started_at: Some(Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 0).unwrap()),
            completed_at: Some(Utc.with_ymd_and_hms(2025, 1, 31, 2, 1, 0).unwrap()),
            recovered_to: Some(Utc.with_ymd_and_hms(2025, 1, 31, 1, 59, 0).unwrap()),
            recovered_lsn: Some("0/3000100".into()),
            timeline: Some(2),
            recovery_millis: Some(4250),
            message: Some("ok".into()),
            failure_kind: Some("integrity".into()),
        }
    }

    #[test]
    fn a_recovery_point_keeps_its_microseconds() {
        let at = Utc.with_ymd_and_hms(2025, 1, 31, 1, 59, 0).unwrap()
            + chrono::Duration::microseconds(123_456);
        let result = BackupResult {
            recovered_to: Some(at),
            ..BackupResult::new(Operation::Recover)
        };
        let line = result.to_summary_line();
        assert!(
            line.contains(r#""recoveredTo":"2025-01-31T01:59:00.123456Z""#),
            "{line}"
        );
        assert_eq!(
            parse_termination_message(&line).unwrap().recovered_to,
            Some(at)
        );
    }

    #[test]
    fn field_names_are_the_contract() {
        let v: serde_json::Value = serde_json::from_str(&full().to_summary_line()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut expected = vec![
            "outcome",
            "operation",
            "backupId",
            "database",
            "bucket",
            "key",
            "manifestKey",
            "sizeBytes",
            "rawBytes",
            "sha256",
            "engineVersion",
            "databases",
            "startedAt",
            "completedAt",
            "recoveredTo",
            "recoveredLsn",
            "timeline",
            "recoveryMillis",
            "message",
            "failureKind",
        ];
        expected.sort();
        let mut keys = keys;
        keys.sort();
        assert_eq!(keys, expected);
        assert_eq!(v["outcome"], "Succeeded");
        assert_eq!(v["operation"], "dump");
        assert_eq!(v["startedAt"], "2025-01-31T02:00:00Z");
    }

    #[test]
    fn operations_serialize_as_their_labels() {
        for op in [
            Operation::Dump,
            Operation::Restore,
            Operation::Verify,
            Operation::Prune,
            Operation::Recover,
            Operation::BaseBackup,
        ] {
            let line = BackupResult::new(op).to_summary_line();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["operation"], op.label(), "{line}");
            assert_eq!(parse_termination_message(&line).unwrap().operation, op);
        }
    }

    #[test]
    fn absent_fields_are_omitted() {
        let mut r = BackupResult::new(Operation::Prune);
        r.message = Some("no".into());
        assert_eq!(
            r.to_summary_line(),
            r#"{"outcome":"Failed","operation":"prune","message":"no"}"#
        );
    }

    #[test]
    fn long_messages_are_truncated_to_fit() {
        for (msg, multibyte) in [("x".repeat(10_000), false), ("é\"\n".repeat(5_000), true)] {
            let mut r = full();
            r.message = Some(msg);
            let line = r.to_summary_line();
            assert!(line.len() <= MAX_SUMMARY_BYTES, "{} bytes", line.len());
            assert!(!line.contains('\n'));
            let back: BackupResult = serde_json::from_str(&line).unwrap();
            assert!(
                back.message.unwrap().ends_with('…'),
                "multibyte={multibyte}"
            );
            assert_eq!(back.sha256, r.sha256);
        }
    }

    #[test]
    fn termination_messages_parse_and_garbage_does_not() {
        let line = full().to_summary_line();
        assert_eq!(parse_termination_message(&line), Some(full()));
        let with_logs = format!("log line\n{line}\n");
        assert_eq!(parse_termination_message(&with_logs), Some(full()));
        let minimal = parse_termination_message(r#"{"outcome":"Failed","message":"x"}"#).unwrap();
        assert_eq!(minimal.message.as_deref(), Some("x"));
        for garbage in ["", "panic", "{not json", "{}", r#"{"sizeBytes": -1}"#] {
            assert_eq!(parse_termination_message(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn instance_failures_read_back() {
        for f in InstanceFailure::ALL {
            let line = f.message("uid 5 has no entry");
            assert_eq!(
                InstanceFailure::parse(&line),
                Some((f, "uid 5 has no entry"))
            );
        }
        for other in [
            "",
            "initdb failed (exit status: 1)",
            "no-user-entry",
            "x: no-user-entry: y",
        ] {
            assert_eq!(InstanceFailure::parse(other), None, "{other}");
        }
    }

    #[test]
    fn round_trips() {
        let r = full();
        let back: BackupResult = serde_json::from_str(&r.to_summary_line()).unwrap();
        assert_eq!(back, r);
    }
}

pub mod rfc3339_plain {
    use chrono::{DateTime, Utc};
    use serde::Serializer;

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(t))
    }
}

pub mod rfc3339_req {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_time(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}
