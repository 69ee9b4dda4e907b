//! The manifest: a small JSON document beside the dumps, written last, that makes a backup
//! complete. It records what `restore` and `verify` check against. Pure.
//!
//! The top-level dump fields describe the application database (the one the agent connected
//! to), as in version 1, so an older agent restores that one as before; version 2 adds how to
//! recreate it (`definition`) and every other database of the instance (`otherDatabases`). A
//! version 1 manifest is read as a backup of one database.
//!
//! A database dumped in parallel streams (`streams`) is stored as several objects restored in
//! order in one transaction: its `parts`. Such a backup says so in `format`
//! ([`FORMAT_PARTS`]), which agents that predate parts refuse rather than restore the first
//! object alone. A part may also be a slice of one large table's rows in `COPY` text
//! (`slices`) rather than a pg_dump archive; a backup with such a part says so with
//! [`FORMAT_SLICED`], which agents that predate slices refuse.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::databases::DatabaseDefinition;
use crate::layout::{GLOBALS_FILE, MANIFEST_FILE};
use crate::result::BackupResult;

pub const FORMAT: &str = "pg_dump-custom";
/// The format of a backup with at least one database in parts.
pub const FORMAT_PARTS: &str = "pg_dump-custom-parts";
/// The format of a backup with at least one part that is a slice of a table ([`TableCopy`]).
pub const FORMAT_SLICED: &str = "pg_dump-custom-parts-sliced";
pub const COMPRESSION: &str = "zstd";
/// Manifests larger than this are refused when read.
pub const MAX_MANIFEST_BYTES: usize = 16 << 20;
/// The version this agent writes: 2 lists every database.
pub const MANIFEST_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub manifest_version: u32,
    pub backup_id: String,
    pub database: String,
    pub engine: String,
    pub engine_version: String,
    #[serde(with = "crate::result::rfc3339_req")]
    pub started_at: DateTime<Utc>,
    #[serde(with = "crate::result::rfc3339_req")]
    pub completed_at: DateTime<Utc>,
    /// Uncompressed pg_dump output.
    pub raw_bytes: u64,
    /// The stored (compressed) object.
    pub size_bytes: u64,
    /// Hex SHA-256 of the stored object.
    pub sha256: String,
    pub format: String,
    pub compression: String,
    pub compression_level: i32,
    pub agent_version: String,
    /// The dump object's file name inside the backup folder.
    pub dump_file: String,
    /// Rows per table (`schema.table`, quoted as `format('%I.%I')` does), counted in the
    /// snapshot the dump was taken from.
    pub row_counts: BTreeMap<String, u64>,
    /// The application database's objects in restore order when it was dumped in parallel
    /// streams (then `dumpFile` and `sha256` are the first's, `rawBytes` and `sizeBytes` the
    /// sums); empty for a single object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<DumpPart>,
    /// The roles and memberships script beside the dump (absent in backups of older agents,
    /// which restore without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub globals: Option<GlobalsInfo>,
    /// How to recreate the application database (absent in version 1 manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<DatabaseDefinition>,
    /// Every other database backed up, in the order they were dumped (empty in version 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_databases: Vec<DatabaseDump>,
    /// The key the backup's objects are encrypted with (absent: not encrypted). Inside a
    /// sealed manifest it repeats the envelope's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionInfo>,
}

/// How a backup is encrypted: in the clear in the stored manifest, so a restore knows which
/// key to pick (and that it is the same key) before it decrypts anything. Nothing secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionInfo {
    /// `crypto::ALGORITHM`.
    pub algorithm: String,
    /// The key's name: the file (Secret key) it is read from.
    pub key_name: String,
    /// `crypto::Key::fingerprint`: tells a different key under the same name.
    pub key_fingerprint: String,
}

/// The manifest of an encrypted backup as stored: what a listing or a person needs in the
/// clear (which backup, when, which key), and the whole manifest sealed with the backup's key
/// (table names, row counts, database names and definitions, checksums).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SealedManifest {
    pub manifest_version: u32,
    pub backup_id: String,
    pub database: String,
    pub engine: String,
    pub engine_version: String,
    #[serde(with = "crate::result::rfc3339_req")]
    pub started_at: DateTime<Utc>,
    #[serde(with = "crate::result::rfc3339_req")]
    pub completed_at: DateTime<Utc>,
    pub agent_version: String,
    pub encryption: EncryptionInfo,
    /// Base64 of the manifest's JSON encrypted like a dump (`crypto`).
    pub sealed: String,
}

/// The version of a sealed manifest (older agents refuse it: they cannot decrypt).
pub const SEALED_MANIFEST_VERSION: u32 = 3;

/// A stored manifest, before any key is used (one per run: its size does not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Plain(Manifest),
    Sealed(SealedManifest),
}

impl Stored {
    /// Reads a stored manifest: a sealed one is told by its `sealed` field.
    pub fn parse(bytes: &[u8]) -> Result<Stored, String> {
        #[derive(Deserialize)]
        struct Probe {
            #[serde(default)]
            sealed: Option<serde::de::IgnoredAny>,
        }
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid: {e}"))?;
        if probe.sealed.is_none() {
            return Manifest::parse(bytes).map(Stored::Plain);
        }
        let s: SealedManifest =
            serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid: {e}"))?;
        if s.encryption.algorithm != crate::crypto::ALGORITHM {
            return Err(format!(
                "unsupported encryption {} (this agent reads {})",
                s.encryption.algorithm,
                crate::crypto::ALGORITHM
            ));
        }
        Ok(Stored::Sealed(s))
    }
}

/// What `crypto` context a backup's object is encrypted under: `<backup id>/<file>`.
pub fn object_context(backup_id: &str, file: &str) -> String {
    format!("{backup_id}/{file}")
}

impl SealedManifest {
    /// Opens the sealed manifest with `key` (whose fingerprint the caller has checked) and
    /// checks that it is the envelope's.
    pub fn open(&self, key: &crate::crypto::Key) -> Result<Manifest, String> {
        use base64::Engine as _;
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(&self.sealed)
            .map_err(|_| "the sealed manifest is not base64".to_string())?;
        let context = object_context(&self.backup_id, MANIFEST_FILE);
        let json = crate::crypto::open(key, &context, &sealed)
            .map_err(|e| format!("the sealed manifest: {e}"))?;
        let m = Manifest::parse(&json)?;
        if m.backup_id != self.backup_id || m.encryption.as_ref() != Some(&self.encryption) {
            return Err("the sealed manifest is not the one its envelope describes".into());
        }
        Ok(m)
    }
}

/// One database's dump in the backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseDump {
    /// The exact name.
    pub name: String,
    /// The dump object's file name inside the backup folder.
    pub dump_file: String,
    pub raw_bytes: u64,
    pub size_bytes: u64,
    pub sha256: String,
    pub row_counts: BTreeMap<String, u64>,
    /// How to recreate it; absent for the single database of a version 1 manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<DatabaseDefinition>,
    /// Its objects in restore order when dumped in parallel streams (see `Manifest::parts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<DumpPart>,
}

/// One stored object of a database's dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DumpPart {
    /// The file name inside the backup folder.
    pub file: String,
    pub raw_bytes: u64,
    pub size_bytes: u64,
    pub sha256: String,
    /// Set for a slice of one table's rows in `COPY` text, not a pg_dump archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<TableCopy>,
}

/// Where a slice's rows go: `COPY schema.table (columns) FROM STDIN`, the text in the
/// source database's `encoding`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCopy {
    pub schema: String,
    pub table: String,
    pub columns: Vec<String>,
    pub encoding: String,
}

impl DumpPart {
    /// The raw and stored sizes of `parts` together.
    pub fn sizes(parts: &[DumpPart]) -> (u64, u64) {
        let sum = |f: fn(&DumpPart) -> u64| parts.iter().map(f).fold(0u64, u64::saturating_add);
        (sum(|p| p.raw_bytes), sum(|p| p.size_bytes))
    }
}

impl DatabaseDump {
    /// The objects to restore, in order: the parts, or the one dump object.
    pub fn objects(&self) -> Vec<DumpPart> {
        if !self.parts.is_empty() {
            return self.parts.clone();
        }
        vec![DumpPart {
            file: self.dump_file.clone(),
            raw_bytes: self.raw_bytes,
            size_bytes: self.size_bytes,
            sha256: self.sha256.clone(),
            copy: None,
        }]
    }
}

/// The globals script of a backup, checked like the dump before it is run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalsInfo {
    /// The file name inside the backup folder.
    pub file: String,
    pub size_bytes: u64,
    /// Hex SHA-256 of the script.
    pub sha256: String,
    /// The roles it creates.
    pub roles: u32,
}

impl Manifest {
    /// Copies what the manifest knows into the run's result.
    pub fn fill_result(&self, result: &mut BackupResult) {
        result.backup_id = Some(self.backup_id.clone());
        result.database = Some(self.database.clone());
        result.size_bytes = Some(self.size_bytes);
        result.raw_bytes = Some(self.raw_bytes);
        result.sha256 = Some(self.sha256.clone());
        result.engine_version = Some(self.engine_version.clone());
        result.databases = u32::try_from(self.dumps().len()).ok();
        result.started_at = Some(self.started_at);
        result.completed_at = Some(self.completed_at);
    }

    pub fn parse(bytes: &[u8]) -> Result<Manifest, String> {
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid: {e}"))?;
        if ![FORMAT, FORMAT_PARTS, FORMAT_SLICED].contains(&m.format.as_str())
            || m.compression != COMPRESSION
        {
            return Err(format!(
                "unsupported backup format {}/{} (this agent reads {FORMAT}, {FORMAT_PARTS} or {FORMAT_SLICED}, {COMPRESSION})",
                m.format, m.compression
            ));
        }
        if !is_sha256(&m.sha256) {
            return Err("manifest sha256 is not 64 hex digits".into());
        }
        check_databases(&m)?;
        Ok(m)
    }

    /// Every database of the backup, the application database first (for a version 1
    /// manifest, that one alone).
    pub fn dumps(&self) -> Vec<DatabaseDump> {
        let first = DatabaseDump {
            name: self.database.clone(),
            dump_file: self.dump_file.clone(),
            raw_bytes: self.raw_bytes,
            size_bytes: self.size_bytes,
            sha256: self.sha256.clone(),
            row_counts: self.row_counts.clone(),
            definition: self.definition.clone(),
            parts: self.parts.clone(),
        };
        std::iter::once(first)
            .chain(self.other_databases.iter().cloned())
            .collect()
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// The manifest as stored: plain, or sealed with `key` (then `encryption` must name it).
    pub fn to_stored(&self, key: Option<&crate::crypto::Key>) -> Vec<u8> {
        let (Some(key), Some(encryption)) = (key, &self.encryption) else {
            return self.to_json();
        };
        use base64::Engine as _;
        let context = object_context(&self.backup_id, MANIFEST_FILE);
        let sealed =
            crate::crypto::seal(key, &context, &serde_json::to_vec(self).unwrap_or_default());
        let envelope = SealedManifest {
            manifest_version: SEALED_MANIFEST_VERSION,
            backup_id: self.backup_id.clone(),
            database: self.database.clone(),
            engine: self.engine.clone(),
            engine_version: self.engine_version.clone(),
            started_at: self.started_at,
            completed_at: self.completed_at,
            agent_version: self.agent_version.clone(),
            encryption: encryption.clone(),
            sealed: base64::engine::general_purpose::STANDARD.encode(sealed),
        };
        serde_json::to_vec_pretty(&envelope).unwrap_or_default()
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The list of databases must be whole: unique names, and unique file names that stay inside
/// the backup folder; a database in parts says so in the format, and its parts agree with its
/// own fields.
fn check_databases(m: &Manifest) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    let mut files = std::collections::BTreeSet::new();
    for d in &m.dumps() {
        if d.name.is_empty() || !names.insert(d.name.clone()) {
            return Err(format!(
                "manifest lists database {:?} twice or empty",
                d.name
            ));
        }
        check_parts(m, d)?;
        for part in d.objects() {
            let bad_file = part.file.is_empty()
                || part.file.contains('/')
                || part.file.starts_with('.')
                || [MANIFEST_FILE, GLOBALS_FILE].contains(&part.file.as_str());
            if bad_file || !files.insert(part.file.clone()) {
                return Err(format!("manifest names a bad dump file {:?}", part.file));
            }
            if !is_sha256(&part.sha256) {
                return Err(format!(
                    "manifest sha256 of database {:?} is not 64 hex digits",
                    d.name
                ));
            }
        }
    }
    Ok(())
}

/// A database's parts: at least two, in a backup of a parts format (slices only in the sliced
/// one, and never first or last: the schema comes before them and the post-data after), the
/// first being its `dumpFile` and `sha256`, the sizes adding up to its own.
fn check_parts(m: &Manifest, d: &DatabaseDump) -> Result<(), String> {
    let (Some(first), Some(last)) = (d.parts.first(), d.parts.last()) else {
        return Ok(());
    };
    let sliced = d.parts.iter().any(|p| p.copy.is_some());
    let format_agrees = match sliced {
        true => m.format == FORMAT_SLICED,
        false => [FORMAT_PARTS, FORMAT_SLICED].contains(&m.format.as_str()),
    };
    let slices_inside = first.copy.is_none()
        && last.copy.is_none()
        && d.parts
            .iter()
            .all(|p| p.copy.as_ref().is_none_or(|c| !c.columns.is_empty()));
    let agrees = format_agrees
        && slices_inside
        && d.parts.len() >= 2
        && first.file == d.dump_file
        && first.sha256 == d.sha256
        && DumpPart::sizes(&d.parts) == (d.raw_bytes, d.size_bytes);
    if agrees {
        Ok(())
    } else {
        Err(format!(
            "manifest's parts of database {:?} do not agree with its dump fields or format",
            d.name
        ))
    }
}

/// The first difference between expected and actual row counts, if any.
pub fn first_difference(
    expected: &BTreeMap<String, u64>,
    actual: &BTreeMap<String, u64>,
) -> Option<String> {
    let mut names: Vec<&String> = expected.keys().chain(actual.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .find_map(|name| match (expected.get(name), actual.get(name)) {
            (Some(e), Some(a)) if e != a => Some(format!(
                "table {name}: manifest has {e} rows, restored database has {a}"
            )),
            (Some(e), None) => Some(format!(
                "table {name} ({e} rows in the manifest) is missing from the restored database"
            )),
            (None, Some(a)) => Some(format!(
                "table {name} ({a} rows) is in the restored database but not in the manifest"
            )),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn sample() -> Manifest {
        Manifest {
            manifest_version: 1,
            backup_id: "20250131T020000Z".into(),
            database: "app".into(),
            engine: "postgresql".into(),
            engine_version: "15.18".into(),
            started_at: Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 0).unwrap(),
            completed_at: Utc.with_ymd_and_hms(2025, 1, 31, 2, 0, 9).unwrap(),
            raw_bytes: 100,
            size_bytes: 10,
            sha256: "0".repeat(64),
            format: FORMAT.into(),
            compression: COMPRESSION.into(),
            compression_level: 3,
            agent_version: "0.1.0".into(),
            dump_file: "dump.pgc.zst".into(),
            row_counts: [("public.a".to_string(), 3u64)].into_iter().collect(),
            globals: None,
            definition: None,
            parts: vec![],
            other_databases: vec![],
            encryption: None,
        }
    }

    fn test_key(seed: u8) -> crate::crypto::Key {
        use base64::Engine as _;
        let bytes: Vec<u8> = (0..32u8)
            .map(|i| i.wrapping_mul(3).wrapping_add(seed))
            .collect();
        let text = base64::engine::general_purpose::STANDARD.encode(bytes);
        crate::crypto::Key::parse("k1", text.as_bytes()).unwrap()
    }

    #[test]
    fn a_sealed_manifest_keeps_only_the_envelope_in_the_clear() {
        let key = test_key(1);
        let mut m = with_databases();
        m.encryption = Some(EncryptionInfo {
            algorithm: crate::crypto::ALGORITHM.into(),
            key_name: "k1".into(),
            key_fingerprint: key.fingerprint(),
        });
        let stored = m.to_stored(Some(&key));
        let text = String::from_utf8(stored.clone()).unwrap();
        for secret in ["public.a", "ird/", "sha256", "rowCounts", "otherDatabases"] {
            assert!(!text.contains(secret), "{secret} in the clear: {text}");
        }
        assert!(text.contains(&key.fingerprint()) && text.contains("\"keyName\": \"k1\""));
        let Stored::Sealed(s) = Stored::parse(&stored).unwrap() else {
            panic!("not sealed")
        };
        assert_eq!(s.open(&key).unwrap(), m);
        assert!(s.open(&test_key(2)).is_err());
        // An envelope moved to another backup id does not open.
        let mut moved = s.clone();
        moved.backup_id = "other".into();
        assert!(moved.open(&key).is_err());
        // A plain manifest stays plain.
        assert_eq!(
            Stored::parse(&sample().to_stored(Some(&key))).unwrap(),
            Stored::Plain(sample())
        );
    }

    fn with_databases() -> Manifest {
        let mut m = sample();
        m.manifest_version = MANIFEST_VERSION;
        let mut second = m.dumps().remove(0);
        second.name = "we\"ird/ü".into();
        second.dump_file = "db-001-77.pgc.zst".into();
        m.other_databases = vec![second];
        m
    }

    #[test]
    fn version_1_reads_as_one_database() {
        let m = sample();
        let dumps = m.dumps();
        assert_eq!(dumps.len(), 1);
        assert_eq!(dumps[0].name, "app");
        assert_eq!(dumps[0].dump_file, "dump.pgc.zst");
        assert_eq!(dumps[0].sha256, m.sha256);
        assert_eq!(dumps[0].row_counts, m.row_counts);
        assert!(
            !String::from_utf8(m.to_json())
                .unwrap()
                .contains("otherDatabases")
        );
    }

    #[test]
    fn database_lists_are_checked() {
        let m = with_databases();
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        assert_eq!(m.dumps().len(), 2);
        let broken: [fn(&mut Manifest); 6] = [
            |m| m.other_databases[0].name = "".into(),
            |m| m.other_databases[0].name = "app".into(),
            |m| m.other_databases[0].dump_file = "dump.pgc.zst".into(),
            |m| m.other_databases[0].dump_file = "../x".into(),
            |m| m.other_databases[0].dump_file = "manifest.json".into(),
            |m| m.other_databases[0].sha256 = "zz".into(),
        ];
        for (i, f) in broken.iter().enumerate() {
            let mut b = with_databases();
            f(&mut b);
            assert!(Manifest::parse(&b.to_json()).is_err(), "case {i}");
        }
    }

    #[test]
    fn round_trip_and_validation() {
        let m = sample();
        assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
        let text = String::from_utf8(m.to_json()).unwrap();
        assert!(!text.contains("globals"), "an absent script is omitted");
        let mut with = sample();
        with.globals = Some(GlobalsInfo {
            file: "globals.sql".into(),
            size_bytes: 10,
            sha256: "1".repeat(64),
            roles: 2,
        });
        assert_eq!(Manifest::parse(&with.to_json()).unwrap(), with);
        let mut bad = sample();
        bad.compression = "gzip".into();
        assert!(Manifest::parse(&bad.to_json()).is_err());
        let mut bad = sample();
        bad.sha256 = "xyz".into();
        assert!(Manifest::parse(&bad.to_json()).is_err());
        assert!(Manifest::parse(b"{").is_err());
        assert!(Manifest::parse(b"").is_err());
    }

    #[test]
    fn differences() {
        let map = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        type Counts = BTreeMap<String, u64>;
        let cases: Vec<(Counts, Counts, Option<&str>)> = vec![
            (map(&[("a", 1)]), map(&[("a", 1)]), None),
            (map(&[]), map(&[]), None),
            (
                map(&[("a", 1), ("b", 2)]),
                map(&[("a", 1), ("b", 3)]),
                Some("table b: manifest has 2 rows"),
            ),
            (
                map(&[("a", 1), ("b", 2)]),
                map(&[("b", 2)]),
                Some("table a (1 rows in the manifest) is missing"),
            ),
            (
                map(&[("b", 2)]),
                map(&[("a", 0), ("b", 2)]),
                Some("table a (0 rows) is in the restored"),
            ),
        ];
        for (e, a, want) in cases {
            let got = first_difference(&e, &a);
            match want {
                None => assert_eq!(got, None),
                Some(w) => assert!(got.as_deref().unwrap_or("").starts_with(w), "{got:?}"),
            }
        }
    }

    fn part(file: &str, raw: u64, size: u64, sha: char) -> DumpPart {
        DumpPart {
            file: file.into(),
            raw_bytes: raw,
            size_bytes: size,
            sha256: sha.to_string().repeat(64),
            copy: None,
        }
    }

    #[test]
    fn parts_are_checked() {
        let mut m = sample();
        m.format = FORMAT_PARTS.into();
        m.parts = vec![
            part("dump.pgc.zst", 60, 4, '0'),
            part("dump.data-1.pgc.zst", 40, 6, 'a'),
        ];
        let parsed = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(parsed.dumps()[0].objects(), m.parts);
        assert_eq!(sample().dumps()[0].objects().len(), 1);

        let refused = |change: fn(&mut Manifest)| {
            let mut bad = m.clone();
            change(&mut bad);
            Manifest::parse(&bad.to_json()).unwrap_err()
        };
        assert!(refused(|b| b.format = FORMAT.into()).contains("do not agree"));
        assert!(refused(|b| b.parts[0].file = "other.pgc.zst".into()).contains("do not agree"));
        assert!(refused(|b| b.parts[1].raw_bytes += 1).contains("do not agree"));
        assert!(refused(|b| b.parts[1].size_bytes += 1).contains("do not agree"));
        assert!(
            refused(|b| {
                b.parts.truncate(1);
                b.raw_bytes = 60;
                b.size_bytes = 4
            })
            .contains("do not agree")
        );
        assert!(refused(|b| b.parts[1].file = "../x".into()).contains("bad dump file"));
        assert!(refused(|b| b.parts[1].file = "dump.pgc.zst".into()).contains("bad dump file"));
        assert!(refused(|b| b.parts[1].sha256 = "x".into()).contains("64 hex"));
        let mut unknown = sample();
        unknown.format = "pg_dump-directory".into();
        assert!(
            Manifest::parse(&unknown.to_json())
                .unwrap_err()
                .contains("unsupported backup format")
        );
    }

    #[test]
    fn slices_need_their_format_and_stay_between_the_schema_and_the_rest() {
        let copy = TableCopy {
            schema: "s".into(),
            table: "t".into(),
            columns: vec!["id".into()],
            encoding: "UTF8".into(),
        };
        let mut m = sample();
        m.format = FORMAT_SLICED.into();
        m.parts = vec![
            part("dump.pgc.zst", 50, 4, '0'),
            DumpPart {
                copy: Some(copy.clone()),
                ..part("dump.slice-1.copy.zst", 20, 3, 'b')
            },
            part("dump.rest.pgc.zst", 30, 3, 'a'),
        ];
        let parsed = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(parsed.dumps()[0].objects()[1].copy.as_ref(), Some(&copy));
        let refused = |change: fn(&mut Manifest)| {
            let mut bad = m.clone();
            change(&mut bad);
            Manifest::parse(&bad.to_json()).unwrap_err()
        };
        // An agent that knows parts but not slices must refuse such a backup, not feed a
        // slice to pg_restore: the format says so.
        assert!(refused(|b| b.format = FORMAT_PARTS.into()).contains("do not agree"));
        assert!(refused(|b| b.parts.swap(1, 2)).contains("do not agree"));
        assert!(
            refused(|b| b.parts[1].copy.as_mut().unwrap().columns.clear()).contains("do not agree")
        );
        // A backup without slices may still say it is sliced (nothing is misread).
        let mut plain = m.clone();
        plain.parts[1].copy = None;
        assert!(Manifest::parse(&plain.to_json()).is_ok());
    }
}
