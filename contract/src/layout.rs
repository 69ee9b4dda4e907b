//! Object layout and backup ids: `<prefix>/<database>/<backup id>/{dump.pgc.zst,manifest.json}`
//! (no leading slash when the prefix is empty). Default ids are UTC times `YYYYMMDDTHHMMSSZ`,
//! so they sort by time. Pure: no I/O, no clock (the caller passes the time).

use chrono::{DateTime, NaiveDateTime, Utc};

pub const DUMP_FILE: &str = "dump.pgc.zst";
pub const MANIFEST_FILE: &str = "manifest.json";
/// The roles and memberships the database needs, as an idempotent psql script (see the agent's
/// `globals`); written before the manifest, absent from backups of older agents.
pub const GLOBALS_FILE: &str = "globals.sql";
const ID_FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// The key prefix of one Database's backups in a bucket: `<prefix>/<namespace>/<database>`
/// (`prefix` is `spec.backup.s3.prefix`; its slashes are trimmed). The operator passes it to
/// the agent, for which it is the bucket's prefix.
pub fn storage_prefix(prefix: Option<&str>, namespace: &str, database: &str) -> String {
    let base = prefix.unwrap_or_default().trim_matches('/');
    let own = format!("{namespace}/{database}");
    if base.is_empty() {
        own
    } else {
        format!("{base}/{own}")
    }
}

/// Where a bucket's backups live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Normalised: no leading or trailing `/`, may be empty.
    prefix: String,
}

/// One key split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKey {
    pub database: String,
    pub backup_id: String,
    pub file: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    /// `<prefix>/` or `` — where every database's folder starts.
    pub fn root(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        }
    }

    pub fn database_prefix(&self, database: &str) -> String {
        format!("{}{database}/", self.root())
    }

    pub fn backup_prefix(&self, database: &str, id: &str) -> String {
        format!("{}{id}/", self.database_prefix(database))
    }

    pub fn dump_key(&self, database: &str, id: &str) -> String {
        format!("{}{DUMP_FILE}", self.backup_prefix(database, id))
    }

    pub fn manifest_key(&self, database: &str, id: &str) -> String {
        format!("{}{MANIFEST_FILE}", self.backup_prefix(database, id))
    }

    pub fn globals_key(&self, database: &str, id: &str) -> String {
        format!("{}{GLOBALS_FILE}", self.backup_prefix(database, id))
    }

    /// Splits a key below the root into database, id and file; `None` for anything else.
    pub fn parse_key(&self, key: &str) -> Option<ParsedKey> {
        let rest = key.strip_prefix(&self.root())?;
        let mut parts = rest.splitn(3, '/');
        let database = parts.next()?;
        let backup_id = parts.next()?;
        let file = parts.next()?;
        if database.is_empty() || backup_id.is_empty() || file.is_empty() || file.contains('/') {
            return None;
        }
        Some(ParsedKey {
            database: database.to_string(),
            backup_id: backup_id.to_string(),
            file: file.to_string(),
        })
    }
}

/// The default id for a backup started at `t`.
pub fn backup_id_at(t: DateTime<Utc>) -> String {
    t.format(ID_FORMAT).to_string()
}

/// The time a default id stands for; `None` for ids chosen by the caller.
pub fn backup_id_time(id: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(id, ID_FORMAT)
        .ok()
        .map(|t| t.and_utc())
}

/// An id given with `--backup-id`: 1–128 of `[A-Za-z0-9._-]`, not `.`/`..`, not `latest`.
pub fn validate_backup_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err(format!(
            "backup id must have 1 to 128 characters, got {}",
            id.len()
        ));
    }
    if id == "." || id == ".." || id == "latest" {
        return Err(format!("'{id}' cannot be a backup id"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "backup id may only hold letters, digits, '.', '_' and '-', found {c:?}"
        ));
    }
    Ok(())
}

/// A database name must fit in one path segment.
pub fn validate_database_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(format!(
            "database name {name:?} cannot be used in an object key (empty, '.', '..' or contains '/')"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn keys_with_and_without_prefix() {
        let cases = [
            (
                "",
                "app/20250131T020000Z/dump.pgc.zst",
                "app/20250131T020000Z/manifest.json",
            ),
            (
                "backups",
                "backups/app/20250131T020000Z/dump.pgc.zst",
                "backups/app/20250131T020000Z/manifest.json",
            ),
            (
                "/a/b/",
                "a/b/app/20250131T020000Z/dump.pgc.zst",
                "a/b/app/20250131T020000Z/manifest.json",
            ),
            (
                "/",
                "app/20250131T020000Z/dump.pgc.zst",
                "app/20250131T020000Z/manifest.json",
            ),
        ];
        for (prefix, dump, manifest) in cases {
            let l = Layout::new(prefix);
            assert_eq!(
                l.dump_key("app", "20250131T020000Z"),
                dump,
                "prefix {prefix:?}"
            );
            assert_eq!(
                l.manifest_key("app", "20250131T020000Z"),
                manifest,
                "prefix {prefix:?}"
            );
            assert_eq!(
                l.parse_key(dump),
                Some(ParsedKey {
                    database: "app".into(),
                    backup_id: "20250131T020000Z".into(),
                    file: DUMP_FILE.into()
                })
            );
        }
    }

    #[test]
    fn parse_key_rejects_foreign_keys() {
        let l = Layout::new("p");
        for key in [
            "q/app/id/dump.pgc.zst",
            "p/app/id",
            "p/app/",
            "p//id/x",
            "p/app/id/",
            "p/app/id/a/b",
            "p",
        ] {
            assert_eq!(l.parse_key(key), None, "{key}");
        }
    }

    #[test]
    fn default_ids_sort_by_time_and_parse_back() {
        let a = Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 0).unwrap();
        let b = Utc.with_ymd_and_hms(2025, 12, 1, 0, 0, 1).unwrap();
        let (ia, ib) = (backup_id_at(a), backup_id_at(b));
        assert_eq!(ia, "20250131T020000Z");
        assert!(ia < ib);
        assert_eq!(backup_id_time(&ia), Some(a));
        assert_eq!(backup_id_time("nightly-1"), None);
    }

    #[test]
    fn backup_id_validation() {
        let cases = [
            ("20250131T020000Z", true),
            ("db-backup-2025.01_31", true),
            ("", false),
            ("latest", false),
            ("..", false),
            ("a/b", false),
            ("a b", false),
            ("ü", false),
        ];
        for (id, ok) in cases {
            assert_eq!(validate_backup_id(id).is_ok(), ok, "{id:?}");
        }
        assert!(validate_backup_id(&"a".repeat(129)).is_err());
    }

    #[test]
    fn database_name_validation() {
        for (name, ok) in [
            ("app", true),
            ("My DB", true),
            ("", false),
            ("a/b", false),
            ("..", false),
        ] {
            assert_eq!(validate_database_name(name).is_ok(), ok, "{name:?}");
        }
    }
}
