//! Continuous WAL archiving, the decisions: which file names are WAL files (segments, timeline
//! history files, backup labels, partial segments), where each one lives in the bucket
//! (`<prefix>/<database>/wal/<timeline>/<file name>.zst`), what the object's metadata says,
//! whether an object already stored under that name is the same file, when a spool marker may
//! be trusted, which ready files to upload ahead, and how long to wait between attempts.
//!
//! Pure: no client, no file system, no clock (the caller passes the facts). The I/O that acts
//! on these decisions is `wal_store`.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// The folder of a database's WAL below its backups.
pub const WAL_DIR: &str = "wal";
/// What every stored WAL object's name ends with (zstd frames, possibly encrypted).
pub const OBJECT_SUFFIX: &str = ".zst";
/// Object metadata (`x-amz-meta-…`): the SHA-256 of the file's plain bytes, in hex.
pub const META_SHA256: &str = "dbop-sha256";
/// Object metadata: the file's plain size.
pub const META_SIZE: &str = "dbop-size";
/// Object metadata: the size of the stored body, so a truncated object is never "the same".
pub const META_STORED_SIZE: &str = "dbop-stored-size";
/// Object metadata: the name of the encryption key (absent: not encrypted).
pub const META_KEY: &str = "dbop-encryption-key";
/// Object metadata: the key's fingerprint.
pub const META_KEY_FINGERPRINT: &str = "dbop-key-fingerprint";
/// The file name suffix PostgreSQL gives a file ready to archive in `archive_status/`.
pub const READY_SUFFIX: &str = ".ready";
/// A spool marker's name is the WAL file's name and this.
pub const MARKER_SUFFIX: &str = ".archived";

/// What kind of WAL file a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalKind {
    /// `TTTTTTTTXXXXXXXXYYYYYYYY`: a whole segment.
    Segment,
    /// `TTTTTTTT.history`: the timeline history written when a timeline starts.
    History,
    /// `TTTTTTTTXXXXXXXXYYYYYYYY.OOOOOOOO.backup`: a base backup's label.
    BackupLabel,
    /// `TTTTTTTTXXXXXXXXYYYYYYYY.partial`: the last, unfinished segment of an old timeline.
    Partial,
}

/// A validated WAL file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalFile {
    pub name: String,
    pub timeline: u32,
    pub kind: WalKind,
}

/// `n` upper-case hex digits (PostgreSQL writes them so).
fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
}

fn timeline_of(hex8: &str) -> Option<u32> {
    u32::from_str_radix(hex8, 16).ok().filter(|t| *t != 0)
}

impl WalFile {
    /// Parses a file name as PostgreSQL passes it (`%f`); anything else is an error that says
    /// what was expected. Never panics.
    pub fn parse(name: &str) -> Result<WalFile, String> {
        let bad = || {
            format!(
                "{name:?} is not a WAL file name (24 upper-case hex digits, optionally .partial or .OOOOOOOO.backup, or 8 hex digits .history; timeline not 0)"
            )
        };
        if !name.is_ascii() {
            return Err(bad());
        }
        let (stem, kind) = if let Some(tl) = name.strip_suffix(".history") {
            (tl, WalKind::History)
        } else if let Some(seg) = name.strip_suffix(".partial") {
            (seg, WalKind::Partial)
        } else if let Some(rest) = name.strip_suffix(".backup") {
            match rest.split_once('.') {
                Some((seg, offset)) if is_hex(offset, 8) => (seg, WalKind::BackupLabel),
                _ => return Err(bad()),
            }
        } else {
            (name, WalKind::Segment)
        };
        let width = if kind == WalKind::History { 8 } else { 24 };
        if !is_hex(stem, width) {
            return Err(bad());
        }
        let timeline = timeline_of(&stem[..8]).ok_or_else(bad)?;
        Ok(WalFile {
            name: name.to_string(),
            timeline,
            kind,
        })
    }

    /// The timeline as PostgreSQL writes it in names: 8 upper-case hex digits.
    pub fn timeline_hex(&self) -> String {
        format!("{:08X}", self.timeline)
    }

    /// The encryption context: an object cannot be passed off as another WAL file.
    pub fn crypto_context(&self) -> String {
        format!("{WAL_DIR}/{}", self.name)
    }
}

/// `<prefix>/<database>/wal/` — where a database's WAL lives.
pub fn wal_prefix(layout: &Layout, database: &str) -> String {
    format!("{}{WAL_DIR}/", layout.database_prefix(database))
}

/// `<prefix>/<database>/wal/<timeline>/<file name>.zst`.
pub fn object_key(layout: &Layout, database: &str, file: &WalFile) -> String {
    format!(
        "{}{}/{}{OBJECT_SUFFIX}",
        wal_prefix(layout, database),
        file.timeline_hex(),
        file.name
    )
}

/// What the agent records about one file it stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub sha256: String,
    pub size: u64,
    pub stored_size: u64,
    /// Name and fingerprint of the encryption key.
    pub key: Option<(String, String)>,
}

impl Stored {
    /// The object metadata that records it.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::from([
            (META_SHA256.to_string(), self.sha256.clone()),
            (META_SIZE.to_string(), self.size.to_string()),
            (META_STORED_SIZE.to_string(), self.stored_size.to_string()),
        ]);
        if let Some((name, fingerprint)) = &self.key {
            m.insert(META_KEY.to_string(), name.clone());
            m.insert(META_KEY_FINGERPRINT.to_string(), fingerprint.clone());
        }
        m
    }

    /// Reads the metadata back; `None` when the checksum or a size is missing or malformed
    /// (an object not written by this agent, or whose metadata was lost).
    pub fn from_metadata(m: &HashMap<String, String>) -> Option<Stored> {
        let sha256 = m.get(META_SHA256).filter(|s| is_sha256(s))?.clone();
        let size = m.get(META_SIZE)?.parse().ok()?;
        let stored_size = m.get(META_STORED_SIZE)?.parse().ok()?;
        let key = match (m.get(META_KEY), m.get(META_KEY_FINGERPRINT)) {
            (Some(n), Some(f)) => Some((n.clone(), f.clone())),
            (None, None) => None,
            _ => return None,
        };
        Some(Stored {
            sha256,
            size,
            stored_size,
            key,
        })
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What HEAD says of the object under a file's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    Absent,
    /// An object, its body's length, and its metadata if readable.
    Present {
        length: u64,
        stored: Option<Stored>,
    },
}

/// What to do about the object under the key of a file about to be pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushVerdict {
    /// Nothing there: upload (conditionally).
    Upload,
    /// The same file is stored: success, nothing uploaded.
    AlreadyArchived,
    /// Something else is stored: refuse, overwrite nothing.
    Refuse(String),
    /// An object without the agent's metadata: download it and compare its plain bytes.
    CompareContent,
}

/// Decides from the local file's checksum and size what the stored object means. An object
/// counts as the same file only if its recorded checksum and size equal the file's and its
/// body has the length recorded when it was written (so a truncated body is never "the same").
pub fn push_verdict(existing: &Existing, sha256: &str, size: u64) -> PushVerdict {
    match existing {
        Existing::Absent => PushVerdict::Upload,
        Existing::Present { stored: None, .. } => PushVerdict::CompareContent,
        Existing::Present {
            length,
            stored: Some(s),
        } => {
            if s.stored_size != *length {
                PushVerdict::Refuse(format!(
                    "its body has {length} bytes, {} were written",
                    s.stored_size
                ))
            } else if s.sha256 != sha256 || s.size != size {
                PushVerdict::Refuse(format!(
                    "it holds {} bytes with sha256 {}, the local file {size} bytes with sha256 {sha256}",
                    s.size, s.sha256
                ))
            } else {
                PushVerdict::AlreadyArchived
            }
        }
    }
}

/// A spool marker: written only after a file was durably stored, naming where and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub endpoint: String,
    pub bucket: String,
    pub key: String,
    pub sha256: String,
    pub size: u64,
}

/// A marker proves a file archived only if it names this very store, key and content: a
/// marker left by another cluster, bucket, prefix or timeline, or for other bytes under the
/// same name, proves nothing.
pub fn marker_proves(marker: &Marker, expected: &Marker) -> bool {
    marker == expected
}

/// The ready files to upload ahead of `current`: valid WAL names from `archive_status/`
/// entries (`<name>.ready`), by name (so older timelines and segments first), at most `limit`,
/// never `current` itself.
pub fn read_ahead(entries: &[String], current: &str, limit: usize) -> Vec<WalFile> {
    let mut files: Vec<WalFile> = entries
        .iter()
        .filter_map(|e| e.strip_suffix(READY_SUFFIX))
        .filter(|n| *n != current)
        .filter_map(|n| WalFile::parse(n).ok())
        .collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));
    files.dedup();
    files.truncate(limit);
    files
}

/// The wait before attempt `attempt` (1 is the first retry): doubling from 250 ms, at most 5 s,
/// and never past what is left of the deadline; `None` when no time is left for another try.
pub fn retry_wait(attempt: u32, left: Duration) -> Option<Duration> {
    let wait = Duration::from_millis(250)
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(5))
        .min(Duration::from_secs(5));
    (left > wait).then_some(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_and_rejects_the_rest() {
        let ok = [
            ("000000010000000000000002", 1, WalKind::Segment),
            ("0000000A00000001000000FF", 10, WalKind::Segment),
            ("00000002.history", 2, WalKind::History),
            (
                "000000010000000000000002.00000028.backup",
                1,
                WalKind::BackupLabel,
            ),
            ("000000030000000000000005.partial", 3, WalKind::Partial),
        ];
        for (name, timeline, kind) in ok {
            let f = WalFile::parse(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                (f.timeline, f.kind, f.name.as_str()),
                (timeline, kind, name)
            );
        }
        for name in [
            "",
            "00000001000000000000000",
            "0000000100000000000000021",
            "000000010000000000000002.ready",
            "00000001000000000000000g",
            "00000001000000000000000a",
            "000000000000000000000002",
            "00000000.history",
            "0000001.history",
            "000000010000000000000002.0000028.backup",
            "000000010000000000000002.backup",
            "../../etc/passwd",
            "00000001/000000000000002",
            "0000000100000000000000é2",
            "RECOVERYHISTORY",
        ] {
            let e = WalFile::parse(name).unwrap_err();
            assert!(e.contains("not a WAL file name"), "{name}: {e}");
        }
    }

    #[test]
    fn keys_sit_under_the_database_by_timeline() {
        let f = |n| WalFile::parse(n).unwrap();
        let cases = [
            (
                "",
                "000000010000000000000002",
                "app/wal/00000001/000000010000000000000002.zst",
            ),
            (
                "p/q/",
                "0000000A.history",
                "p/q/app/wal/0000000A/0000000A.history.zst",
            ),
            (
                "p",
                "000000020000000000000002.00000028.backup",
                "p/app/wal/00000002/000000020000000000000002.00000028.backup.zst",
            ),
        ];
        for (prefix, name, key) in cases {
            assert_eq!(object_key(&Layout::new(prefix), "app", &f(name)), key);
        }
        // A backup folder never takes WAL for one of its files.
        let l = Layout::new("p");
        assert_eq!(
            l.parse_key(&object_key(&l, "app", &f("00000001.history"))),
            None
        );
    }

    fn stored(sha: &str, size: u64, stored_size: u64) -> Stored {
        Stored {
            sha256: sha.into(),
            size,
            stored_size,
            key: None,
        }
    }

    #[test]
    fn metadata_round_trips_and_rejects_what_is_malformed() {
        let with_key = Stored {
            key: Some(("k1".into(), "ab".into())),
            ..stored(&"a".repeat(64), 16, 9)
        };
        for s in [stored(&"0".repeat(64), 16 << 20, 1234), with_key] {
            assert_eq!(Stored::from_metadata(&s.to_metadata()), Some(s));
        }
        let good = stored(&"0".repeat(64), 1, 2).to_metadata();
        let broken = |k: &str, v: Option<&str>| {
            let mut m = good.clone();
            match v {
                Some(v) => m.insert(k.into(), v.into()),
                None => m.remove(k),
            };
            m
        };
        for m in [
            broken(META_SHA256, None),
            broken(META_SHA256, Some("xyz")),
            broken(META_SIZE, Some("-1")),
            broken(META_STORED_SIZE, None),
            broken(META_KEY, Some("k1")),
        ] {
            assert_eq!(Stored::from_metadata(&m), None, "{m:?}");
        }
    }

    #[test]
    fn only_the_same_bytes_fully_stored_count_as_archived() {
        let sha = "1".repeat(64);
        let present = |s: Option<Stored>, length| Existing::Present { length, stored: s };
        let cases = [
            (Existing::Absent, "upload"),
            (present(None, 10), "compare"),
            (present(Some(stored(&sha, 100, 10)), 10), "archived"),
            (present(Some(stored(&sha, 100, 10)), 9), "refuse"),
            (
                present(Some(stored(&"2".repeat(64), 100, 10)), 10),
                "refuse",
            ),
            (present(Some(stored(&sha, 99, 10)), 10), "refuse"),
        ];
        for (existing, want) in cases {
            let got = match push_verdict(&existing, &sha, 100) {
                PushVerdict::Upload => "upload",
                PushVerdict::AlreadyArchived => "archived",
                PushVerdict::Refuse(_) => "refuse",
                PushVerdict::CompareContent => "compare",
            };
            assert_eq!(got, want, "{existing:?}");
        }
    }

    #[test]
    fn a_marker_proves_only_its_own_store_key_and_bytes() {
        let m = Marker {
            endpoint: "http://s3".into(),
            bucket: "b".into(),
            key: "p/app/wal/00000001/000000010000000000000002.zst".into(),
            sha256: "3".repeat(64),
            size: 16,
        };
        assert!(marker_proves(&m, &m.clone()));
        let changed = [
            Marker {
                endpoint: "http://other".into(),
                ..m.clone()
            },
            Marker {
                bucket: "c".into(),
                ..m.clone()
            },
            Marker {
                key: "q/app/wal/00000001/000000010000000000000002.zst".into(),
                ..m.clone()
            },
            Marker {
                sha256: "4".repeat(64),
                ..m.clone()
            },
            Marker {
                size: 17,
                ..m.clone()
            },
        ];
        for other in changed {
            assert!(!marker_proves(&m, &other), "{other:?}");
        }
    }

    #[test]
    fn read_ahead_takes_the_oldest_valid_ready_files_but_the_current_one() {
        let entries: Vec<String> = [
            "000000010000000000000005.ready",
            "000000010000000000000003.ready",
            "000000010000000000000004.done",
            "000000010000000000000002.ready",
            "00000002.history.ready",
            "garbage.ready",
            "000000010000000000000006.ready",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names = |limit| -> Vec<String> {
            read_ahead(&entries, "000000010000000000000002", limit)
                .into_iter()
                .map(|f| f.name)
                .collect()
        };
        assert_eq!(
            names(3),
            [
                "000000010000000000000003",
                "000000010000000000000005",
                "000000010000000000000006"
            ]
        );
        assert_eq!(names(10).len(), 4);
        assert!(names(0).is_empty());
    }

    #[test]
    fn retries_back_off_and_stop_at_the_deadline() {
        let s = Duration::from_secs;
        assert_eq!(retry_wait(1, s(60)), Some(Duration::from_millis(250)));
        assert_eq!(retry_wait(2, s(60)), Some(Duration::from_millis(500)));
        assert_eq!(retry_wait(6, s(60)), Some(s(5)));
        assert_eq!(retry_wait(40, s(60)), Some(s(5)));
        assert_eq!(retry_wait(1, Duration::from_millis(100)), None);
        assert_eq!(retry_wait(3, s(1)), None);
    }
}
