//! Physical base backups and point-in-time restore, the decisions: where a base backup lives,
//! what its record says, how the facts are read from the `backup_label` and `backup_manifest`
//! that `pg_basebackup` puts in its tar stream, which base backup serves a recovery target, and
//! the recovery settings a restored data directory gets.
//!
//! Layout, beside the logical backups and the WAL of the same database folder:
//!
//! ```text
//! <prefix>/<database>/base/<backup id>/base.tar.zst   the tar (-X none) in zstd frames, the
//!                                                     server's or the agent's (encrypted when
//!                                                     a key is set)
//! <prefix>/<database>/base/<backup id>/backup_manifest.zst
//!                                                     the manifest, when the server compressed
//!                                                     the tar (`StoredManifest`)
//! <prefix>/<database>/base/<backup id>/backup.json    the record (`BaseRecord`), written last:
//!                                                     a base backup without one is incomplete
//! <prefix>/<database>/wal/<timeline>/<file>.zst       the archived WAL (`wal`)
//! ```
//!
//! PostgreSQL's `backup_manifest` (checked with `pg_verifybackup` on restore) is in the tar when
//! pg_basebackup took the backup, beside it when the server compressed it; the tar holds no
//! WAL: recovery fetches it from the archive (`wal-fetch`).
//!
//! Pure: no client, no file system, no clock (the caller passes the facts).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// The folder of a database's base backups.
pub const BASE_DIR: &str = "base";
/// The tar stream, compressed (and encrypted when a key is set).
pub const BASE_FILE: &str = "base.tar.zst";
/// The record, written after the tar is stored.
pub const RECORD_FILE: &str = "backup.json";
/// The backup manifest beside the tar, when the server compressed the tar (its own zstd frame,
/// encrypted when a key is set); older backups hold it in the tar.
pub const MANIFEST_FILE: &str = "backup_manifest.zst";
/// The record format's version: 2 when the manifest is stored beside the tar (an agent that
/// knows only 1 would look for it in the tar, so it refuses the record instead).
pub const RECORD_VERSION: u32 = 2;
/// The largest record read back.
pub const MAX_RECORD_BYTES: usize = 64 << 10;
/// The largest `backup_manifest` read out of the stream (one line per file of the instance).
pub const MAX_MANIFEST_BYTES: usize = 256 << 20;

/// `<prefix>/<database>/base/`.
pub fn base_prefix(layout: &Layout, database: &str) -> String {
    format!("{}{BASE_DIR}/", layout.database_prefix(database))
}

/// `<prefix>/<database>/base/<id>/base.tar.zst`.
pub fn tar_key(layout: &Layout, database: &str, id: &str) -> String {
    format!("{}{id}/{BASE_FILE}", base_prefix(layout, database))
}

/// `<prefix>/<database>/base/<id>/backup_manifest.zst`.
pub fn manifest_key(layout: &Layout, database: &str, id: &str) -> String {
    format!("{}{id}/{MANIFEST_FILE}", base_prefix(layout, database))
}

/// `<prefix>/<database>/base/<id>/backup.json`.
pub fn record_key(layout: &Layout, database: &str, id: &str) -> String {
    format!("{}{id}/{RECORD_FILE}", base_prefix(layout, database))
}

/// The id of a record's key (`None` for every other key).
pub fn id_of_record_key<'a>(layout: &Layout, database: &str, key: &'a str) -> Option<&'a str> {
    let prefix = base_prefix(layout, database);
    let id = key
        .strip_prefix(prefix.as_str())?
        .strip_suffix(&format!("/{RECORD_FILE}"))?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The encryption context of a base backup's tar: it cannot pass for another object.
pub fn crypto_context(id: &str) -> String {
    format!("{BASE_DIR}/{id}/{BASE_FILE}")
}

/// The encryption context of the manifest stored beside the tar.
pub fn manifest_crypto_context(id: &str) -> String {
    format!("{BASE_DIR}/{id}/{MANIFEST_FILE}")
}

/// A WAL location, `X/Y` in hex as PostgreSQL writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lsn(pub u64);

impl Lsn {
    pub fn parse(s: &str) -> Result<Lsn, String> {
        let bad = || format!("{s:?} is not an LSN (X/Y, hexadecimal)");
        let (hi, lo) = s.trim().split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let s = String::deserialize(d)?;
        Lsn::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What `backup_label` and `backup_manifest` say of the backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRange {
    pub start_lsn: Lsn,
    /// The segment holding the start (`START WAL LOCATION: … (file …)`), when the label says.
    pub start_wal_file: Option<String>,
    pub stop_lsn: Lsn,
    /// The timeline the backup ends on.
    pub timeline: u32,
    /// `primary` or `standby`.
    pub backup_from: String,
}

/// The segment name in `START WAL LOCATION: 0/2000028 (file 000000010000000000000002)`.
fn label_start_file(location: &str) -> Option<String> {
    let name = location.split_once("(file ")?.1.strip_suffix(')')?.trim();
    crate::wal::WalFile::parse(name)
        .ok()
        .filter(|f| f.kind == crate::wal::WalKind::Segment)
        .map(|f| f.name)
}

/// What a `backup_label` says: its start, start segment, timeline and `BACKUP FROM`.
type Label = (Lsn, Option<String>, u32, String);

/// Reads `START WAL LOCATION`, `START TIMELINE` and `BACKUP FROM` from a `backup_label`.
fn parse_label(label: &str) -> Result<Label, String> {
    let line = |name: &str| {
        label
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .ok_or_else(|| format!("backup_label has no {name:?} line"))
    };
    let location = line("START WAL LOCATION:")?;
    let start = Lsn::parse(location.split_whitespace().next().unwrap_or(""))?;
    let start_file = label_start_file(location);
    let timeline = line("START TIMELINE:")?
        .parse()
        .map_err(|_| "backup_label has a bad START TIMELINE".to_string())?;
    let from = line("BACKUP FROM:").unwrap_or("primary").to_string();
    Ok((start, start_file, timeline, from))
}

#[derive(Deserialize)]
struct ManifestWal {
    #[serde(rename = "WAL-Ranges")]
    wal_ranges: Vec<ManifestRange>,
}

#[derive(Deserialize)]
struct ManifestRange {
    #[serde(rename = "Timeline")]
    timeline: u32,
    #[serde(rename = "Start-LSN")]
    start: Lsn,
    #[serde(rename = "End-LSN")]
    end: Lsn,
}

/// The WAL a backup needs, from its `backup_label` and `backup_manifest` (whose `WAL-Ranges`
/// hold the stop LSN; a backup from a standby that saw a timeline switch has several ranges).
pub fn wal_range(label: &[u8], manifest: &[u8]) -> Result<WalRange, String> {
    let label = std::str::from_utf8(label).map_err(|_| "backup_label is not UTF-8")?;
    let (start, start_file, label_timeline, from) = parse_label(label)?;
    let m: ManifestWal = serde_json::from_slice(manifest)
        .map_err(|e| format!("backup_manifest has no readable WAL-Ranges: {e}"))?;
    let (Some(first), Some(last)) = (m.wal_ranges.first(), m.wal_ranges.last()) else {
        return Err("backup_manifest has no WAL range".into());
    };
    if first.start != start || first.timeline != label_timeline {
        return Err(format!(
            "backup_label starts at {start} on timeline {label_timeline}, backup_manifest at {} on timeline {}",
            first.start, first.timeline
        ));
    }
    if last.end < start {
        return Err(format!(
            "backup_manifest ends at {} before its start {start}",
            last.end
        ));
    }
    Ok(WalRange {
        start_lsn: start,
        start_wal_file: start_file,
        stop_lsn: last.end,
        timeline: last.timeline,
        backup_from: from,
    })
}

/// The replication commands whose answers identify the server (psql runs each in turn, on a
/// replication connection, which a LOGIN REPLICATION role may open without any SQL access).
pub const IDENTIFY_COMMANDS: [&str; 3] = [
    "IDENTIFY_SYSTEM",
    "SHOW server_version",
    "SHOW server_version_num",
];

/// What a server says of itself before a base backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    pub system_identifier: String,
    pub timeline: u32,
    /// `server_version`, e.g. `15.10 (Debian 15.10-1.pgdg120+1)`.
    pub version: String,
    /// `server_version_num`, e.g. `150010`.
    pub version_num: String,
}

/// Reads psql's unaligned, tuples-only answers to [`IDENTIFY_COMMANDS`]: `systemid|timeline|
/// xlogpos|dbname`, then the version, then its number.
pub fn parse_identity(text: &str) -> Result<ServerIdentity, String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let [system, version, version_num] = lines.as_slice() else {
        return Err(format!(
            "unexpected answer to IDENTIFY_SYSTEM and SHOW: {} lines",
            lines.len()
        ));
    };
    let mut fields = system.split('|');
    let (Some(system_identifier), Some(timeline)) = (fields.next(), fields.next()) else {
        return Err("IDENTIFY_SYSTEM answered without a system identifier and timeline".into());
    };
    if system_identifier.is_empty() || !system_identifier.bytes().all(|b| b.is_ascii_digit()) {
        return Err("IDENTIFY_SYSTEM answered a malformed system identifier".into());
    }
    let timeline = timeline
        .parse()
        .map_err(|_| "IDENTIFY_SYSTEM answered a malformed timeline".to_string())?;
    if !version_num.bytes().all(|b| b.is_ascii_digit()) || version_num.is_empty() {
        return Err("SHOW server_version_num answered a malformed number".into());
    }
    Ok(ServerIdentity {
        system_identifier: system_identifier.to_string(),
        timeline,
        version: version.to_string(),
        version_num: version_num.to_string(),
    })
}

/// The UTC offset of a time zone as PostgreSQL prints it in a `backup_label` (`%Z` of the
/// server's `log_timezone`): `UTC`, `GMT`, or a numeric `+03`/`-0530`; None for a named
/// zone, whose abbreviation is ambiguous.
fn zone_offset(zone: &str) -> Option<chrono::Duration> {
    if matches!(zone, "UTC" | "GMT" | "UCT" | "Z") {
        return Some(chrono::Duration::zero());
    }
    let (sign, digits) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m) = match digits.len() {
        2 => (digits.parse::<i64>().ok()?, 0),
        4 => (
            digits[..2].parse::<i64>().ok()?,
            digits[2..].parse::<i64>().ok()?,
        ),
        _ => return None,
    };
    (h <= 15 && m < 60).then(|| chrono::Duration::minutes(sign * (h * 60 + m)))
}

/// The server's clock when the backup started, from the `START TIME` line of its
/// `backup_label` (whole seconds), when its zone is unambiguous.
pub fn label_start_time(label: &[u8]) -> Option<DateTime<Utc>> {
    let label = std::str::from_utf8(label).ok()?;
    let text = label
        .lines()
        .find_map(|l| l.strip_prefix("START TIME:"))?
        .trim();
    let (local, zone) = text.rsplit_once(' ')?;
    let naive = chrono::NaiveDateTime::parse_from_str(local, "%Y-%m-%d %H:%M:%S").ok()?;
    Some(naive.and_utc() - zone_offset(zone)?)
}

/// When the backup ended, for the record: the agent's clock after pg_basebackup ended (a
/// replication connection cannot ask the server's clock: the two must agree, as NTP keeps
/// them), never before the server's own start time from the `backup_label`. A recovery target
/// at or after it is past the backup's consistency point.
pub fn stop_time(local_after: DateTime<Utc>, label_start: Option<DateTime<Utc>>) -> DateTime<Utc> {
    label_start.map_or(local_after, |start| start.max(local_after))
}

/// The one-line account of a base backup in its result: where its WAL starts and stops.
pub fn summary(record: &BaseRecord, taken_now: bool) -> String {
    let how = if taken_now {
        "taken"
    } else {
        "already complete, not taken again"
    };
    let compressed_by = match record.manifest {
        Some(_) => "the server",
        None => "the agent",
    };
    format!(
        "base backup {} {how}: WAL from {} to {} on timeline {} (from the {}), {} files, compressed by {compressed_by}",
        record.backup_id,
        record.start_lsn,
        record.stop_lsn,
        record.timeline,
        record.backup_from,
        record.files
    )
}

/// One file PostgreSQL's backup manifest lists: its path in the data directory and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    pub path: String,
    pub size: u64,
}

#[derive(Deserialize)]
struct ManifestFiles {
    #[serde(rename = "Files")]
    files: Vec<ManifestEntry>,
}

#[derive(Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Path")]
    path: Option<String>,
    /// A name that is not UTF-8, in hex.
    #[serde(rename = "Encoded-Path")]
    encoded_path: Option<String>,
    #[serde(rename = "Size")]
    size: u64,
}

/// The files a backup manifest lists (for the checks made when `pg_verifybackup` is missing).
pub fn manifest_files(manifest: &[u8]) -> Result<Vec<ManifestFile>, String> {
    let m: ManifestFiles = serde_json::from_slice(manifest)
        .map_err(|e| format!("backup_manifest has no readable file list: {e}"))?;
    m.files
        .into_iter()
        .map(|f| {
            let path = match (f.path, f.encoded_path) {
                (Some(p), _) => p,
                (None, Some(hex_path)) => hex::decode(&hex_path)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        format!("backup_manifest lists a path {hex_path:?} this agent cannot read")
                    })?,
                (None, None) => return Err("backup_manifest lists a file without a path".into()),
            };
            if path.starts_with('/') || path.split('/').any(|p| p == "..") {
                return Err(format!(
                    "backup_manifest lists a path {path:?} outside the data directory"
                ));
            }
            Ok(ManifestFile { path, size: f.size })
        })
        .collect()
}

/// The encryption of a base backup: the key's name and fingerprint (never the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Encryption {
    pub algorithm: String,
    pub key_name: String,
    pub key_fingerprint: String,
}

/// The version a new record says it is: `RECORD_VERSION` when its manifest is stored beside
/// the tar, else 1, which every agent reads.
pub fn record_version(manifest: Option<&StoredManifest>) -> u32 {
    match manifest {
        Some(_) => RECORD_VERSION,
        None => 1,
    }
}

/// `backup.json`: what a complete base backup is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BaseRecord {
    pub record_version: u32,
    pub backup_id: String,
    pub database: String,
    pub start_lsn: Lsn,
    /// The WAL segment holding `start_lsn` (from the `backup_label`): WAL retention keeps every
    /// segment from it on. Absent in records of agents before retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_wal_file: Option<String>,
    pub stop_lsn: Lsn,
    pub timeline: u32,
    /// The server's clock when the backup started (its `backup_label`, whole seconds; the
    /// agent's clock when the label's zone is not UTC or numeric).
    pub start_time: DateTime<Utc>,
    /// The agent's clock after pg_basebackup ended (`stop_time`): at or after the stop point
    /// while the clocks agree, so a target time at or after it is past consistency.
    pub stop_time: DateTime<Utc>,
    /// `primary` or `standby`.
    pub backup_from: String,
    /// The tar's size, and the stored object's.
    pub raw_bytes: u64,
    pub size_bytes: u64,
    /// SHA-256 of the stored object.
    pub sha256: String,
    pub files: u64,
    pub engine_version: String,
    pub system_identifier: String,
    pub compression: String,
    pub agent_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// The manifest stored beside the tar (`MANIFEST_FILE`); absent: it is in the tar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<StoredManifest>,
}

/// The stored manifest object: its size and SHA-256 as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredManifest {
    pub size_bytes: u64,
    pub sha256: String,
}

impl BaseRecord {
    pub fn parse(bytes: &[u8]) -> Result<BaseRecord, String> {
        let r: BaseRecord =
            serde_json::from_slice(bytes).map_err(|e| format!("not a base backup record: {e}"))?;
        if r.record_version > RECORD_VERSION {
            return Err(format!(
                "record version {} is newer than this agent's {RECORD_VERSION}",
                r.record_version
            ));
        }
        if r.sha256.len() != 64 || !r.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("the record's sha256 is malformed".into());
        }
        if r.stop_lsn < r.start_lsn {
            return Err("the record's stop LSN is before its start".into());
        }
        Ok(r)
    }

    /// The earliest point a restore from it can stop at.
    pub fn restorable_from(&self) -> String {
        format!(
            "{} (LSN {}, base backup {})",
            crate::result::format_time(&self.stop_time),
            self.stop_lsn,
            self.backup_id
        )
    }
}

/// Where recovery stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Replays every archived WAL file.
    Latest,
    Time(DateTime<Utc>),
    Lsn(Lsn),
    /// A restore point made with `pg_create_restore_point`.
    Name(String),
}

impl Target {
    pub fn describe(&self) -> String {
        match self {
            Target::Latest => "the latest point".into(),
            Target::Time(t) => format!("time {}", crate::result::format_time(t)),
            Target::Lsn(l) => format!("LSN {l}"),
            Target::Name(n) => format!("restore point {n:?}"),
        }
    }
}

/// Whether a base backup ends before a target (so recovery from it can reach the target);
/// a restore point's position is not known without reading WAL: any backup may serve.
fn ends_before(r: &BaseRecord, target: &Target) -> bool {
    match target {
        Target::Latest | Target::Name(_) => true,
        Target::Time(t) => r.stop_time <= *t,
        Target::Lsn(l) => r.stop_lsn <= *l,
    }
}

/// Why no base backup serves a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoBackup {
    /// Every base backup ends after the target: the earliest and newest restorable points.
    BeforeBackups(String),
    /// None at all, or not the one asked for.
    Unavailable(String),
}

impl std::fmt::Display for NoBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoBackup::BeforeBackups(m) | NoBackup::Unavailable(m) => f.write_str(m),
        }
    }
}

/// The base backup to restore for `target`: the one named by `id`, else the newest that ends
/// before the target; for a restore point, the oldest (its position is unknown, and the oldest
/// reaches every point the archive holds). A target no backup can reach fails with the
/// earliest restorable point (the oldest backup's end) and the newest backup's end.
pub fn choose<'a>(
    records: &'a [BaseRecord],
    target: &Target,
    id: Option<&str>,
) -> Result<&'a BaseRecord, NoBackup> {
    let mut sorted: Vec<&BaseRecord> = records.iter().collect();
    sorted.sort_by_key(|r| (r.stop_lsn, r.stop_time));
    let (Some(oldest), Some(newest)) = (sorted.first(), sorted.last()) else {
        return Err(NoBackup::Unavailable(
            "there is no complete base backup".into(),
        ));
    };
    if let Some(id) = id {
        let r = sorted.iter().find(|r| r.backup_id == id).ok_or_else(|| {
            NoBackup::Unavailable(format!("there is no complete base backup {id:?}"))
        })?;
        if !ends_before(r, target) {
            return Err(NoBackup::Unavailable(format!(
                "base backup {id} ends after {}: it can restore to {} or later",
                target.describe(),
                r.restorable_from()
            )));
        }
        return Ok(r);
    }
    let chosen = match target {
        Target::Name(_) => Some(*oldest),
        _ => sorted
            .iter()
            .rev()
            .find(|r| ends_before(r, target))
            .copied(),
    };
    chosen.ok_or_else(|| {
        NoBackup::BeforeBackups(format!(
            "no base backup ends before {}: the earliest restorable point is {}; the newest base backup ends at {} (with the archived WAL, points up to the end of the archive are restorable)",
            target.describe(),
            oldest.restorable_from(),
            newest.restorable_from()
        ))
    })
}

/// A word as `sh` reads it: as is when it is plain, else single-quoted.
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"%_./=:,+@-".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A value in a PostgreSQL configuration file: single-quoted, quotes doubled.
pub fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// `restore_command`: the agent's `wal-fetch %f %p` with the flags that say where the WAL is
/// (names and file paths only: no secret is ever part of it).
pub fn restore_command(agent: &str, flags: &[(String, Option<String>)]) -> String {
    let mut words = vec![
        shell_quote(agent),
        "wal-fetch".into(),
        "%f".into(),
        "%p".into(),
    ];
    for (flag, value) in flags {
        words.push(shell_quote(flag));
        if let Some(v) = value {
            words.push(shell_quote(v));
        }
    }
    words.join(" ")
}

/// PostgreSQL's format for `recovery_target_time`.
pub fn pg_time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string()
}

/// The first words of the comment above the recovery settings.
pub const RECOVERY_COMMENT: &str = "# dbop-backup base-restore of base backup";

/// The settings appended to `postgresql.auto.conf` (later lines win over the backup's own):
/// where WAL comes from, where recovery stops, that it then promotes onto a new timeline.
pub fn recovery_settings(backup_id: &str, restore_command: &str, target: &Target) -> String {
    let mut lines = vec![
        format!("{RECOVERY_COMMENT} {backup_id}: recovery settings"),
        format!("restore_command = {}", conf_quote(restore_command)),
        "recovery_target_timeline = 'latest'".to_string(),
    ];
    let stop = match target {
        Target::Latest => None,
        Target::Time(t) => Some(("recovery_target_time", pg_time(t))),
        Target::Lsn(l) => Some(("recovery_target_lsn", l.to_string())),
        Target::Name(n) => Some(("recovery_target_name", n.clone())),
    };
    if let Some((name, value)) = stop {
        lines.push(format!("{name} = {}", conf_quote(&value)));
        lines.push("recovery_target_action = 'promote'".to_string());
    }
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_identity_is_read_from_the_replication_answers() {
        let text = "7312345678901234567|1|0/3000060|\n15.10 (Debian 15.10-1.pgdg120+1)\n150010\n";
        assert_eq!(
            parse_identity(text),
            Ok(ServerIdentity {
                system_identifier: "7312345678901234567".into(),
                timeline: 1,
                version: "15.10 (Debian 15.10-1.pgdg120+1)".into(),
                version_num: "150010".into(),
            })
        );
        for bad in [
            "",
            "7312|1|0/1|\n15.10\n",
            "|1|0/1|\n15.10\n150010",
            "x12|1|0/1|\n15.10\n150010",
            "7312|one|0/1|\n15.10\n150010",
            "7312\n15.10\n150010",
            "7312|1|0/1|\n15.10\n15x",
            "7312|1|0/1|\n15.10\n150010\nmore",
        ] {
            assert!(parse_identity(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_label_start_time_is_read_when_its_zone_is_unambiguous() {
        let label = |time: &str| {
            format!(
                "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nSTART TIME: {time}\nSTART TIMELINE: 1\n"
            )
        };
        let at = Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 0).unwrap();
        for (time, want) in [
            ("2025-01-31 02:00:00 UTC", Some(at)),
            ("2025-01-31 02:00:00 GMT", Some(at)),
            ("2025-01-31 05:00:00 +03", Some(at)),
            ("2025-01-30 20:30:00 -0530", Some(at)),
            ("2025-01-31 03:00:00 CET", None),
            ("2025-01-31 02:00:00", None),
            ("2025-01-31 02:00:00 +3", None),
            ("2025-01-31 02:00:00 +99", None),
            ("2025-02-30 02:00:00 UTC", None),
            ("", None),
        ] {
            assert_eq!(label_start_time(label(time).as_bytes()), want, "{time}");
        }
        assert_eq!(label_start_time(b"START WAL LOCATION: 0/1\n"), None);
        assert_eq!(label_start_time(&[0xff, 0xfe]), None);
    }

    #[test]
    fn the_stop_time_is_the_agents_clock_never_before_the_labels_start() {
        let t = |s: i64| {
            Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 0).unwrap() + chrono::Duration::seconds(s)
        };
        assert_eq!(stop_time(t(10), Some(t(3))), t(10));
        assert_eq!(stop_time(t(10), None), t(10));
        // The server's clock ahead of the agent's: not before the server's start.
        assert_eq!(stop_time(t(10), Some(t(12))), t(12));
    }

    #[test]
    fn keys_sit_under_the_database_and_never_pass_for_a_logical_backup() {
        let l = Layout::new("p/q/");
        assert_eq!(
            tar_key(&l, "app", "20250101T000000Z"),
            "p/q/app/base/20250101T000000Z/base.tar.zst"
        );
        let rk = record_key(&l, "app", "x1");
        assert_eq!(rk, "p/q/app/base/x1/backup.json");
        assert_eq!(id_of_record_key(&l, "app", &rk), Some("x1"));
        assert_eq!(id_of_record_key(&l, "app", &tar_key(&l, "app", "x1")), None);
        assert_eq!(id_of_record_key(&l, "other", &rk), None);
        assert_eq!(l.parse_key(&rk), None);
        assert_eq!(l.parse_key(&tar_key(&Layout::new(""), "app", "x")), None);
        assert_eq!(crypto_context("x1"), "base/x1/base.tar.zst");
    }

    #[test]
    fn lsns_parse_print_and_order() {
        for s in ["0/0", "0/2000028", "1A/FF000000", "FFFFFFFF/FFFFFFFF"] {
            assert_eq!(Lsn::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Lsn::parse("1/0").unwrap(), Lsn(1 << 32));
        assert!(Lsn::parse("0/2000028").unwrap() < Lsn::parse("1/0").unwrap());
        for bad in ["", "12", "x/1", "1/", "/1", "100000000/0"] {
            assert!(Lsn::parse(bad).is_err(), "{bad}");
        }
    }

    const LABEL: &str = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nBACKUP METHOD: streamed\nBACKUP FROM: standby\nSTART TIME: 2025-01-01 00:00:00 UTC\nLABEL: dbop\nSTART TIMELINE: 1\n";

    #[test]
    fn the_wal_range_comes_from_the_label_and_the_manifest() {
        let manifest = br#"{"PostgreSQL-Backup-Manifest-Version": 1, "Files": [],
            "WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/3000100" },
                           { "Timeline": 2, "Start-LSN": "0/3000100", "End-LSN": "0/4000138" }]}"#;
        let r = wal_range(LABEL.as_bytes(), manifest).unwrap();
        assert_eq!(
            r,
            WalRange {
                start_lsn: Lsn(0x2000028),
                start_wal_file: Some("000000010000000000000002".into()),
                stop_lsn: Lsn(0x4000138),
                timeline: 2,
                backup_from: "standby".into()
            }
        );
        let other = br#"{"WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/3000028", "End-LSN": "0/3000100" }]}"#;
        assert!(
            wal_range(LABEL.as_bytes(), other)
                .unwrap_err()
                .contains("backup_label starts")
        );
        assert!(wal_range(LABEL.as_bytes(), br#"{"WAL-Ranges": []}"#).is_err());
        // A label without the segment's name, or with one that is not a segment's: none.
        for odd in [
            "(file 00000001.history)",
            "(file x)",
            "",
            "(file 000000010000000000000002",
        ] {
            let label = LABEL.replace("(file 000000010000000000000002)", odd);
            let r = wal_range(label.as_bytes(), manifest).unwrap();
            assert_eq!(r.start_wal_file, None, "{odd}");
        }
        assert!(
            wal_range(b"LABEL: x\n", manifest)
                .unwrap_err()
                .contains("START WAL")
        );
    }

    #[test]
    fn the_manifest_lists_files_with_their_sizes() {
        let m = br#"{"PostgreSQL-Backup-Manifest-Version": 1, "Files": [
            { "Path": "backup_label", "Size": 225, "Last-Modified": "2025-01-01 00:00:00 GMT", "Checksum-Algorithm": "CRC32C", "Checksum": "a1b2c3d4" },
            { "Encoded-Path": "626173652f312f31323539", "Size": 8192 }],
            "WAL-Ranges": []}"#;
        let files = manifest_files(m).unwrap();
        let got: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        assert_eq!(got, [("backup_label", 225), ("base/1/1259", 8192)]);
        for bad in [
            r#"{"Files": [{ "Size": 1 }]}"#,
            r#"{"Files": [{ "Path": "../x", "Size": 1 }]}"#,
            r#"{"Files": [{ "Encoded-Path": "zz", "Size": 1 }]}"#,
            r#"{"Files": 3}"#,
        ] {
            assert!(manifest_files(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    fn rec(id: &str, stop_lsn: u64, stop_secs: i64) -> BaseRecord {
        let t = |s: i64| Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        BaseRecord {
            record_version: 1,
            backup_id: id.into(),
            database: "app".into(),
            start_lsn: Lsn(stop_lsn - 10),
            start_wal_file: None,
            stop_lsn: Lsn(stop_lsn),
            timeline: 1,
            start_time: t(stop_secs - 5),
            stop_time: t(stop_secs),
            backup_from: "primary".into(),
            raw_bytes: 10,
            size_bytes: 5,
            sha256: "a".repeat(64),
            files: 3,
            engine_version: "15.8".into(),
            system_identifier: "7".into(),
            compression: "zstd".into(),
            agent_version: "0".into(),
            encryption: None,
            manifest: None,
        }
    }

    #[test]
    fn the_newest_backup_before_the_target_is_chosen() {
        let at = |s: i64| Target::Time(Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap());
        let records = [
            rec("b", 2000, 200),
            rec("a", 1000, 100),
            rec("c", 3000, 300),
        ];
        let id = |t: &Target, want: Option<&str>| {
            choose(&records, t, want)
                .map(|r| r.backup_id.clone())
                .map_err(|e| e.to_string())
        };
        assert_eq!(id(&Target::Latest, None).unwrap(), "c");
        assert_eq!(id(&at(250), None).unwrap(), "b");
        assert_eq!(id(&at(200), None).unwrap(), "b");
        assert_eq!(id(&at(100), None).unwrap(), "a");
        assert_eq!(id(&Target::Lsn(Lsn(2999)), None).unwrap(), "b");
        assert_eq!(
            id(&Target::Name("before-upgrade".into()), None).unwrap(),
            "a"
        );
        assert_eq!(id(&at(250), Some("a")).unwrap(), "a");
        let e = id(&at(99), None).unwrap_err();
        assert!(
            e.contains(
                "earliest restorable point is 2023-11-14T22:15:00Z (LSN 0/3E8, base backup a); the newest base backup ends at 2023-11-14T22:18:20Z (LSN 0/BB8, base backup c)"
            ),
            "{e}"
        );
        assert!(matches!(
            choose(&records, &at(99), None),
            Err(NoBackup::BeforeBackups(_))
        ));
        assert!(matches!(
            choose(&records, &at(250), Some("c")),
            Err(NoBackup::Unavailable(_))
        ));
        let e = id(&Target::Lsn(Lsn(5)), None).unwrap_err();
        assert!(e.contains("LSN 0/3E8"), "{e}");
        assert!(
            id(&at(250), Some("c"))
                .unwrap_err()
                .contains("ends after time")
        );
        assert!(
            id(&at(250), Some("zz"))
                .unwrap_err()
                .contains("no complete base backup")
        );
        assert!(
            choose(&[], &Target::Latest, None)
                .unwrap_err()
                .to_string()
                .contains("no complete")
        );
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = rec("a", 1000, 100);
        let json = serde_json::to_vec(&r).unwrap();
        assert!(String::from_utf8_lossy(&json).contains(r#""stopLsn":"0/3E8""#));
        assert_eq!(BaseRecord::parse(&json).unwrap(), r);
        let mut bad = r.clone();
        bad.sha256 = "x".into();
        assert!(BaseRecord::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        let mut newer = r;
        newer.record_version = 9;
        assert!(BaseRecord::parse(&serde_json::to_vec(&newer).unwrap()).is_err());
    }

    #[test]
    fn recovery_settings_say_where_wal_comes_from_and_where_to_stop() {
        let cmd = restore_command(
            "/opt/dbop's/dbop-backup",
            &[
                ("--bucket".into(), Some("b".into())),
                ("--prefix".into(), Some("ns/my db".into())),
                ("--path-style".into(), None),
            ],
        );
        assert_eq!(
            cmd,
            r#"'/opt/dbop'\''s/dbop-backup' wal-fetch %f %p --bucket b --prefix 'ns/my db' --path-style"#
        );
        let t = Utc.timestamp_opt(1_700_000_000, 123_456_000).unwrap();
        let text = recovery_settings("x1", &cmd, &Target::Time(t));
        assert!(
            text.contains(r#"restore_command = '''/opt/dbop''\''''s/dbop-backup'' wal-fetch %f %p --bucket b --prefix ''ns/my db'' --path-style'"#),
            "{text}"
        );
        assert!(text.contains("recovery_target_time = '2023-11-14 22:13:20.123456+00'\n"));
        assert!(text.contains("recovery_target_action = 'promote'\n"));
        assert!(text.contains("recovery_target_timeline = 'latest'\n"));
        let lsn = recovery_settings("x1", "c", &Target::Lsn(Lsn(0x3000100)));
        assert!(lsn.contains("recovery_target_lsn = '0/3000100'\n"));
        let name = recovery_settings("x1", "c", &Target::Name("it's".into()));
        assert!(name.contains("recovery_target_name = 'it''s'\n"));
        let latest = recovery_settings("x1", "c", &Target::Latest);
        assert!(
            !latest.contains("recovery_target_time =")
                && !latest.contains("recovery_target_action")
        );
        assert_eq!(shell_quote(""), "''");
    }
}
