//! What is in the bucket: groups a listing of keys into complete backups (those with a
//! manifest) and incomplete ones (objects but no manifest). Pure: the listing is passed in.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::layout::{DUMP_FILE, Layout, MANIFEST_FILE};

/// One object from a bucket listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub last_modified: DateTime<Utc>,
}

/// One backup folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupEntry {
    pub database: String,
    pub backup_id: String,
    /// A manifest exists: the only kind of backup that counts.
    pub complete: bool,
    /// Size of the dump object, if present.
    pub size_bytes: Option<u64>,
    /// When the manifest (written last) was stored; for an incomplete backup, its newest object.
    #[serde(with = "crate::result::rfc3339_plain")]
    pub completed_at: DateTime<Utc>,
    #[serde(skip)]
    pub keys: Vec<String>,
}

/// Groups a listing into backups, newest first (by completion time, then id), per database.
pub fn group(layout: &Layout, objects: &[ObjectInfo]) -> Vec<BackupEntry> {
    let mut folders: BTreeMap<(String, String), Vec<&ObjectInfo>> = BTreeMap::new();
    for o in objects {
        if let Some(k) = layout.parse_key(&o.key) {
            folders
                .entry((k.database, k.backup_id))
                .or_default()
                .push(o);
        }
    }
    let mut out: Vec<BackupEntry> = folders
        .into_iter()
        .map(|((database, backup_id), objs)| {
            let file = |name: &str| objs.iter().find(|o| o.key.ends_with(&format!("/{name}")));
            let manifest = file(MANIFEST_FILE);
            let dump = file(DUMP_FILE);
            let newest = objs
                .iter()
                .map(|o| o.last_modified)
                .max()
                .unwrap_or_default();
            BackupEntry {
                database,
                backup_id,
                complete: manifest.is_some() && dump.is_some(),
                size_bytes: dump.map(|d| d.size),
                completed_at: manifest.map(|m| m.last_modified).unwrap_or(newest),
                keys: objs.iter().map(|o| o.key.clone()).collect(),
            }
        })
        .collect();
    sort_newest_first(&mut out);
    out
}

/// Newest first: database ascending, then completion time and id descending.
pub fn sort_newest_first(entries: &mut [BackupEntry]) {
    entries.sort_by(|a, b| {
        a.database
            .cmp(&b.database)
            .then(b.completed_at.cmp(&a.completed_at))
            .then(b.backup_id.cmp(&a.backup_id))
    });
}

/// The newest complete backup of `database`.
pub fn latest<'a>(entries: &'a [BackupEntry], database: &str) -> Option<&'a BackupEntry> {
    entries
        .iter()
        .filter(|e| e.database == database && e.complete)
        .max_by(|a, b| {
            a.completed_at
                .cmp(&b.completed_at)
                .then(a.backup_id.cmp(&b.backup_id))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn obj(key: &str, size: u64, hour: u32) -> ObjectInfo {
        ObjectInfo {
            key: key.into(),
            size,
            last_modified: Utc.with_ymd_and_hms(2025, 1, 1, hour, 0, 0).unwrap(),
        }
    }

    #[test]
    fn groups_complete_and_incomplete() {
        let l = Layout::new("p");
        let objects = [
            obj("p/app/A/dump.pgc.zst", 10, 1),
            obj("p/app/A/manifest.json", 1, 2),
            obj("p/app/B/dump.pgc.zst", 20, 3),
            obj("p/app/C/manifest.json", 1, 4),
            obj("p/other/A/dump.pgc.zst", 5, 5),
            obj("p/other/A/manifest.json", 1, 6),
            obj("p/stray.txt", 1, 7),
            obj("q/app/Z/manifest.json", 1, 8),
        ];
        let got: Vec<(String, String, bool, Option<u64>)> = group(&l, &objects)
            .into_iter()
            .map(|e| (e.database, e.backup_id, e.complete, e.size_bytes))
            .collect();
        let want = vec![
            ("app".into(), "C".into(), false, None),
            ("app".into(), "B".into(), false, Some(20)),
            ("app".into(), "A".into(), true, Some(10)),
            ("other".into(), "A".into(), true, Some(5)),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn latest_ignores_incomplete_and_other_databases() {
        let l = Layout::new("");
        let objects = [
            obj("app/20250101T010000Z/dump.pgc.zst", 1, 1),
            obj("app/20250101T010000Z/manifest.json", 1, 1),
            obj("app/20250101T020000Z/dump.pgc.zst", 1, 2),
            obj("app/20250101T020000Z/manifest.json", 1, 2),
            obj("app/20250101T030000Z/dump.pgc.zst", 1, 3),
            obj("zzz/20250101T040000Z/dump.pgc.zst", 1, 4),
            obj("zzz/20250101T040000Z/manifest.json", 1, 4),
        ];
        let entries = group(&l, &objects);
        assert_eq!(
            latest(&entries, "app").unwrap().backup_id,
            "20250101T020000Z"
        );
        assert_eq!(
            latest(&entries, "zzz").unwrap().backup_id,
            "20250101T040000Z"
        );
        assert!(latest(&entries, "none").is_none());
    }
}
