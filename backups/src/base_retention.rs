//! Retention of physical backups, the decisions: which base backups `base-backup` deletes after
//! a successful run (the rule of `retention`, as `dump` applies it to logical backups: the
//! newest `keep-last` complete ones, none older than `max-age`, the newest always, incomplete
//! ones only after the grace period) and which archived WAL segments no retained base backup
//! needs any more (every whole segment before the start segment of the oldest retained one,
//! on any timeline; never a history file, a partial segment, a backup label or a name this
//! agent does not know).
//!
//! Pure: the listing, the records read and the clock are passed in. The I/O is `base_prune`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::base::{self, BaseRecord};
use crate::catalog::ObjectInfo;
use crate::layout::Layout;
use crate::retention::{self, Candidate, Policy, Verdict};
use crate::wal::{self, WalFile, WalKind};

/// What the record of a base backup folder says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// No record: the backup is incomplete (or still being written).
    Missing,
    /// A record this agent cannot read (a newer agent's, or damaged): never deleted.
    Unreadable,
    Complete(Box<BaseRecord>),
}

/// One base backup folder, `<prefix>/<database>/base/<id>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    pub id: String,
    /// Every object in it.
    pub keys: Vec<String>,
    /// Its newest object's time (an incomplete backup's age).
    pub newest: DateTime<Utc>,
    pub state: RecordState,
}

/// The base backup folders of a listing of `<prefix>/<database>/base/` (records not read yet:
/// `Missing` where there is none, `Unreadable` where there is one, for the caller to read).
pub fn folders(layout: &Layout, database: &str, objects: &[ObjectInfo]) -> Vec<Folder> {
    let prefix = base::base_prefix(layout, database);
    let mut by_id: BTreeMap<&str, Folder> = BTreeMap::new();
    for o in objects {
        let Some((id, rest)) = o
            .key
            .strip_prefix(prefix.as_str())
            .and_then(|k| k.split_once('/'))
        else {
            continue;
        };
        if id.is_empty() || rest.is_empty() {
            continue;
        }
        let f = by_id.entry(id).or_insert_with(|| Folder {
            id: id.to_string(),
            keys: Vec::new(),
            newest: o.last_modified,
            state: RecordState::Missing,
        });
        f.keys.push(o.key.clone());
        f.newest = f.newest.max(o.last_modified);
        if rest == base::RECORD_FILE {
            f.state = RecordState::Unreadable;
        }
    }
    by_id.into_values().collect()
}

/// What to do with the base backups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BasePlan {
    /// Complete base backups to delete, with why.
    pub delete: Vec<(String, String)>,
    /// Incomplete base backups older than the grace period.
    pub delete_incomplete: Vec<String>,
    /// The complete base backups kept.
    pub kept: Vec<String>,
    /// Incomplete backups within the grace period (one may be being written).
    pub recent_incomplete: usize,
    /// Folders whose record cannot be read: kept, and the WAL with them.
    pub unreadable: Vec<String>,
}

/// The retention rule on base backup folders; `just_taken` is kept whatever the rule says.
pub fn plan_bases(
    folders: &[Folder],
    policy: Policy,
    grace: Duration,
    now: DateTime<Utc>,
    just_taken: &str,
) -> BasePlan {
    let mut plan = BasePlan::default();
    let mut candidates = Vec::new();
    for f in folders {
        let (complete, completed_at) = match &f.state {
            RecordState::Unreadable => {
                plan.unreadable.push(f.id.clone());
                continue;
            }
            RecordState::Missing => (false, f.newest),
            RecordState::Complete(r) => (true, r.stop_time),
        };
        candidates.push(Candidate {
            backup_id: f.id.clone(),
            complete,
            completed_at,
        });
    }
    for d in retention::verdicts(&candidates, policy, grace, now) {
        let complete = candidates
            .iter()
            .any(|c| c.backup_id == d.backup_id && c.complete);
        match (d.verdict, complete) {
            (Verdict::Delete(why), true) if d.backup_id != just_taken => {
                plan.delete.push((d.backup_id, why));
            }
            (_, true) => plan.kept.push(d.backup_id),
            (Verdict::Delete(_), false) if d.backup_id != just_taken => {
                plan.delete_incomplete.push(d.backup_id);
            }
            (_, false) => plan.recent_incomplete += 1,
        }
    }
    plan
}

/// A WAL segment's place in the WAL stream, whatever its timeline: (log, seg) of its name.
pub type SegmentPosition = (u32, u32);

/// The position of a segment name (`TTTTTTTTXXXXXXXXYYYYYYYY`); `None` for any other name.
pub fn segment_position(name: &str) -> Option<SegmentPosition> {
    let file = WalFile::parse(name).ok()?;
    if file.kind != WalKind::Segment {
        return None;
    }
    let log = u32::from_str_radix(name.get(8..16)?, 16).ok()?;
    let seg = u32::from_str_radix(name.get(16..24)?, 16).ok()?;
    Some((log, seg))
}

/// Where the WAL the retained base backups need starts: the start segment of the oldest of
/// them; `Err` saying why no WAL may be deleted (no complete backup kept, one whose record
/// has no start segment, an unreadable record, a recent incomplete backup).
pub fn wal_boundary(plan: &BasePlan, folders: &[Folder]) -> Result<SegmentPosition, String> {
    if !plan.unreadable.is_empty() {
        return Err(format!(
            "base backups {} have records this agent cannot read",
            plan.unreadable.join(", ")
        ));
    }
    if plan.recent_incomplete > 0 {
        return Err("an incomplete base backup within the grace period may need it".into());
    }
    let mut oldest: Option<SegmentPosition> = None;
    for id in &plan.kept {
        let record = folders.iter().find_map(|f| match &f.state {
            RecordState::Complete(r) if &f.id == id => Some(r),
            _ => None,
        });
        let position = record
            .and_then(|r| r.start_wal_file.as_deref())
            .and_then(segment_position)
            .ok_or_else(|| format!("the record of base backup {id} names no start segment"))?;
        oldest = Some(oldest.map_or(position, |o| o.min(position)));
    }
    oldest.ok_or_else(|| "there is no complete base backup".to_string())
}

/// What to do with the archived WAL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalPlan {
    /// Segment objects wholly before the boundary, oldest first.
    pub delete: Vec<String>,
    /// Kept: history files, partial segments, backup labels, and segments from the boundary on.
    pub kept: usize,
    /// Objects whose names this agent does not know: kept.
    pub unknown: Vec<String>,
}

/// The WAL objects of a listing of `<prefix>/<database>/wal/` that lie wholly before
/// `boundary` (the segment holding the oldest retained backup's start is kept).
pub fn plan_wal(
    layout: &Layout,
    database: &str,
    keys: &[String],
    boundary: SegmentPosition,
) -> WalPlan {
    let prefix = wal::wal_prefix(layout, database);
    let mut plan = WalPlan::default();
    let mut delete: Vec<(SegmentPosition, &str)> = Vec::new();
    for key in keys {
        match wal_file_of(&prefix, key) {
            None => plan.unknown.push(key.clone()),
            Some(file) => match segment_position(&file.name) {
                Some(p) if p < boundary => delete.push((p, key)),
                _ => plan.kept += 1,
            },
        }
    }
    delete.sort();
    plan.delete = delete.into_iter().map(|(_, k)| k.to_string()).collect();
    plan
}

/// The newest whole segment archived on the newest timeline that has any, as (timeline,
/// position): what a recovery to the latest point must replay at least up to. `None` when the
/// listing holds no segment.
pub fn newest_segment(
    layout: &Layout,
    database: &str,
    keys: &[String],
) -> Option<(u32, SegmentPosition)> {
    let prefix = wal::wal_prefix(layout, database);
    keys.iter()
        .filter_map(|key| wal_file_of(&prefix, key))
        .filter_map(|file| Some((file.timeline, segment_position(&file.name)?)))
        .max()
}

/// The WAL file a key holds: `<wal prefix><timeline>/<name>.zst`, the timeline its name's.
fn wal_file_of(prefix: &str, key: &str) -> Option<WalFile> {
    let (dir, object) = key.strip_prefix(prefix)?.split_once('/')?;
    let file = WalFile::parse(object.strip_suffix(wal::OBJECT_SUFFIX)?).ok()?;
    (dir == file.timeline_hex()).then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::Lsn;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn record(id: &str, stop: i64, start_file: Option<&str>) -> BaseRecord {
        BaseRecord {
            record_version: 1,
            backup_id: id.into(),
            database: "app".into(),
            start_lsn: Lsn(0x2000028),
            stop_lsn: Lsn(0x2000100),
            timeline: 1,
            start_wal_file: start_file.map(str::to_string),
            start_time: t(stop - 5),
            stop_time: t(stop),
            backup_from: "primary".into(),
            raw_bytes: 1,
            size_bytes: 1,
            sha256: "a".repeat(64),
            files: 1,
            engine_version: "15".into(),
            system_identifier: "1".into(),
            compression: "zstd".into(),
            agent_version: "0".into(),
            encryption: None,
            manifest: None,
        }
    }

    fn folder(id: &str, newest: i64, state: RecordState) -> Folder {
        Folder {
            id: id.into(),
            keys: vec![format!("p/app/base/{id}/base.tar.zst")],
            newest: t(newest),
            state,
        }
    }

    fn complete(id: &str, stop: i64, start_file: &str) -> Folder {
        folder(
            id,
            stop,
            RecordState::Complete(Box::new(record(id, stop, Some(start_file)))),
        )
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn keep(n: u32) -> Policy {
        Policy {
            keep_last: Some(n),
            max_age: None,
        }
    }

    #[test]
    fn folders_group_objects_and_note_where_a_record_is() {
        let l = Layout::new("p/");
        let o = |key: &str, s: i64| ObjectInfo {
            key: key.into(),
            size: 1,
            last_modified: t(s),
        };
        let got = folders(
            &l,
            "app",
            &[
                o("p/app/base/a/base.tar.zst", 1),
                o("p/app/base/a/backup.json", 3),
                o("p/app/base/b/base.tar.zst", 5),
                o("p/app/base/stray", 9),
                o("p/app/base//x", 9),
                o("p/app/base/c/", 9),
                o("p/other/base/z/backup.json", 9),
            ],
        );
        let summary: Vec<(&str, usize, DateTime<Utc>, &RecordState)> = got
            .iter()
            .map(|f| (f.id.as_str(), f.keys.len(), f.newest, &f.state))
            .collect();
        assert_eq!(
            summary,
            [
                ("a", 2, t(3), &RecordState::Unreadable),
                ("b", 1, t(5), &RecordState::Missing)
            ]
        );
    }

    #[test]
    fn the_newest_keep_last_are_kept_and_the_just_taken_one_always() {
        let fs = [
            complete("a", 100, "000000010000000000000002"),
            complete("b", 200, "000000010000000000000004"),
            complete("c", 300, "000000020000000000000006"),
        ];
        let plan = plan_bases(&fs, keep(2), HOUR, t(400), "c");
        assert_eq!(plan.delete, [("a".into(), "beyond keep-last 2".into())]);
        assert_eq!(plan.kept, ["c", "b"]);
        // A re-run of an older id: it is kept although beyond keep-last.
        let plan = plan_bases(&fs, keep(1), HOUR, t(400), "a");
        let deleted: Vec<&str> = plan.delete.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(deleted, ["b"]);
        assert_eq!(plan.kept, ["c", "a"]);
        // max-age is a limit too, as for dumps; the newest always stays.
        let old = Policy {
            keep_last: None,
            max_age: Some(Duration::from_secs(150)),
        };
        let plan = plan_bases(&fs, old, HOUR, t(400), "c");
        assert_eq!(plan.kept, ["c"]);
        assert_eq!(plan.delete.len(), 2);
    }

    #[test]
    fn incomplete_backups_go_after_the_grace_period_and_unreadable_records_stay() {
        let fs = [
            complete("a", 100, "000000010000000000000002"),
            folder("old", 50, RecordState::Missing),
            folder("new", 3590, RecordState::Missing),
            folder("future", 50, RecordState::Unreadable),
        ];
        let plan = plan_bases(&fs, keep(1), HOUR, t(3700), "a");
        assert_eq!(plan.delete_incomplete, ["old"]);
        assert_eq!(plan.recent_incomplete, 1);
        assert_eq!(plan.unreadable, ["future"]);
        assert_eq!(plan.kept, ["a"]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn segment_positions_come_from_segment_names_only() {
        assert_eq!(segment_position("000000010000000000000002"), Some((0, 2)));
        assert_eq!(
            segment_position("0000000A000000FF000000FE"),
            Some((0xFF, 0xFE))
        );
        for other in [
            "00000002.history",
            "000000010000000000000002.partial",
            "000000010000000000000002.00000028.backup",
            "00000000000000000000002",
            "000000000000000000000002",
            "00000001000000000000000g",
            "",
            "é0000001000000000000002",
        ] {
            assert_eq!(segment_position(other), None, "{other}");
        }
    }

    #[test]
    fn the_boundary_is_the_oldest_retained_start_segment_on_any_timeline() {
        let fs = [
            complete("a", 100, "000000010000000000000009"),
            complete("b", 200, "000000020000000000000004"),
            complete("c", 300, "000000020000000100000001"),
        ];
        let plan = plan_bases(&fs, keep(3), HOUR, t(400), "c");
        assert_eq!(wal_boundary(&plan, &fs), Ok((0, 4)));
        let plan = plan_bases(&fs, keep(1), HOUR, t(400), "c");
        assert_eq!(wal_boundary(&plan, &fs), Ok((1, 1)));
    }

    #[test]
    fn no_wal_is_deleted_when_a_kept_backup_needs_an_unknown_amount() {
        let no_start = folder(
            "x",
            100,
            RecordState::Complete(Box::new(record("x", 100, None))),
        );
        let fs = [complete("a", 200, "000000010000000000000009"), no_start];
        let plan = plan_bases(&fs, keep(2), HOUR, t(400), "a");
        assert!(wal_boundary(&plan, &fs).unwrap_err().contains("x names no"));
        let fs = [
            complete("a", 200, "000000010000000000000009"),
            folder("f", 50, RecordState::Unreadable),
        ];
        let plan = plan_bases(&fs, keep(1), HOUR, t(400), "a");
        assert!(
            wal_boundary(&plan, &fs)
                .unwrap_err()
                .contains("cannot read")
        );
        let fs = [
            complete("a", 200, "000000010000000000000009"),
            folder("up", 390, RecordState::Missing),
        ];
        let plan = plan_bases(&fs, keep(1), HOUR, t(400), "a");
        assert!(wal_boundary(&plan, &fs).unwrap_err().contains("grace"));
        assert!(wal_boundary(&BasePlan::default(), &[]).is_err());
    }

    #[test]
    fn wal_wholly_before_the_boundary_goes_and_the_boundary_segment_stays() {
        let l = Layout::new("p/");
        let k = |tl: &str, name: &str| format!("p/app/wal/{tl}/{name}.zst");
        let keys = vec![
            k("00000001", "000000010000000000000004"),
            k("00000001", "000000010000000000000002"),
            k("00000001", "000000010000000000000003"),
            k("00000002", "000000020000000000000001"),
            k("00000002", "000000020000000000000005"),
            k("00000001", "0000000100000000000000FF"),
            k("00000002", "000000020000000100000000"),
            k("00000002", "00000002.history"),
            k("00000001", "000000010000000000000001.partial"),
            k("00000001", "000000010000000000000001.00000028.backup"),
            // Unknown: a segment in the wrong timeline folder, odd names, no suffix.
            k("00000002", "000000010000000000000001"),
            k("00000001", "000000010000000000000001.tmp"),
            "p/app/wal/00000001/000000010000000000000001".into(),
            "p/app/wal/stray.zst".into(),
        ];
        let plan = plan_wal(&l, "app", &keys, (0, 4));
        assert_eq!(
            plan.delete,
            [
                k("00000002", "000000020000000000000001"),
                k("00000001", "000000010000000000000002"),
                k("00000001", "000000010000000000000003"),
            ]
        );
        assert_eq!(plan.kept, 7);
        assert_eq!(plan.unknown.len(), 4);
        // The newest timeline's newest segment, whatever older timelines hold.
        assert_eq!(newest_segment(&l, "app", &keys), Some((2, (1, 0))));
        assert_eq!(newest_segment(&l, "app", &keys[..3]), Some((1, (0, 4))));
        assert_eq!(newest_segment(&l, "app", &keys[7..]), None);
        // Across a log boundary: (0, FF) is before (1, 0).
        let plan = plan_wal(&l, "app", &keys, (1, 0));
        assert!(
            plan.delete
                .contains(&k("00000001", "0000000100000000000000FF"))
        );
        assert!(
            plan.delete
                .contains(&k("00000001", "000000010000000000000004"))
        );
        assert!(
            !plan
                .delete
                .contains(&k("00000002", "000000020000000100000000"))
        );
    }
}
