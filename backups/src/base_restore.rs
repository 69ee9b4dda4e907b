//! Point-in-time restore, the I/O of `base-restore`: the base backup `base::choose` picks for
//! the target, streamed from S3 and unpacked into an empty data directory (checked: stored size
//! and SHA-256, the encryption's authentication, zstd's checksum, the tar's structure; on any
//! failure the directory is emptied again), then `pg_verifybackup --no-parse-wal`, then the
//! recovery settings and `recovery.signal`. Starting PostgreSQL on it replays WAL through
//! `wal-fetch` to the target and promotes.
//!
//! Every decision (keys, which backup, settings text) is `base`'s.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::base::{self, BaseRecord, Target};
use crate::crypto::{Decrypt, Key, KeyRing};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pg::{self, PgTools};
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::tar::{self, Entry, Kind, Visitor};

/// How a base backup is restored.
#[derive(Debug, Clone)]
pub struct BaseRestoreOptions {
    pub database: String,
    pub backup_id: Option<String>,
    pub target: Target,
    pub data_dir: PathBuf,
    pub keys: Option<KeyRing>,
    /// The whole `restore_command`.
    pub restore_command: String,
}

/// Every complete base backup of the database (records that cannot be read are skipped,
/// with a warning).
pub async fn records(store: &Store, layout: &Layout, database: &str) -> Result<Vec<BaseRecord>> {
    let objects = store.list(&base::base_prefix(layout, database)).await?;
    let mut out = Vec::new();
    for o in objects {
        if base::id_of_record_key(layout, database, &o.key).is_none() {
            continue;
        }
        let Some(bytes) = store.get_small(&o.key, base::MAX_RECORD_BYTES).await? else {
            continue;
        };
        match BaseRecord::parse(&bytes) {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!(key = o.key, "skipped: {e}"),
        }
    }
    Ok(out)
}

/// `base-restore`: the chosen base backup unpacked, checked and set up to recover to the
/// target; returns its record.
pub async fn base_restore(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseRestoreOptions,
    interrupt: &Interrupt,
) -> Result<BaseRecord> {
    prepare_data_dir(&opts.data_dir)?;
    let all = records(store, layout, &opts.database).await?;
    let record = base::choose(&all, &opts.target, opts.backup_id.as_deref())
        .map_err(|e| {
            let message = format!("database {:?}: {e}", opts.database);
            match e {
                base::NoBackup::BeforeBackups(_) => Error::TargetBeforeBackups(message),
                base::NoBackup::Unavailable(_) => Error::NotFound(message),
            }
        })?
        .clone();
    tracing::info!(backup_id = record.backup_id, stop = %record.stop_lsn, "restoring base backup");
    let restored = async {
        let key = decryption_key(&record, opts.keys.as_ref())?;
        // The unpacking stops on a signal by itself, so nothing writes after the clean-up.
        unpack(
            store,
            layout,
            &record,
            key.clone(),
            &opts.data_dir,
            interrupt,
        )
        .await?;
        fetch_manifest(store, layout, &record, key.as_ref(), &opts.data_dir).await?;
        tokio::select! {
            r = verify_manifest(tools, &record, &opts.data_dir) => r?,
            s = interrupt.wait() => return Err(Error::Interrupted(s)),
        }
        write_recovery(&opts.data_dir, &record, opts)
    }
    .await;
    if let Err(e) = restored {
        empty_dir(&opts.data_dir);
        return Err(e);
    }
    Ok(record)
}

/// The data directory must be empty (or absent: created, mode 0700).
fn prepare_data_dir(dir: &Path) -> Result<()> {
    let io = |e| {
        Error::io(
            format!("cannot prepare the data directory {}", dir.display()),
            e,
        )
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::Usage(format!(
                    "the data directory {} is not empty: base-restore writes only into an empty one",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io)?;
        }
        Err(e) => return Err(io(e)),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

/// Removes what a failed restore wrote (the directory was empty before).
fn empty_dir(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

fn decryption_key(record: &BaseRecord, ring: Option<&KeyRing>) -> Result<Option<Key>> {
    let Some(enc) = &record.encryption else {
        return Ok(None);
    };
    let ring = ring.ok_or_else(|| {
        Error::Key(format!(
            "base backup {} is encrypted with key {:?}: pass --encryption-key-dir",
            record.backup_id, enc.key_name
        ))
    })?;
    let k = ring.get(&enc.key_name).map_err(Error::Key)?;
    if k.fingerprint() != enc.key_fingerprint {
        return Err(Error::Key(format!(
            "key {:?} of {} has fingerprint {}, base backup {} was written with {}",
            enc.key_name,
            ring.dir.display(),
            k.fingerprint(),
            record.backup_id,
            enc.key_fingerprint
        )));
    }
    Ok(Some(k))
}

/// Streams the tar object into the data directory; its size and SHA-256 are checked at the end.
async fn unpack(
    store: &Store,
    layout: &Layout,
    record: &BaseRecord,
    key: Option<Key>,
    dir: &Path,
    interrupt: &Interrupt,
) -> Result<()> {
    let object = base::tar_key(layout, &record.database, &record.backup_id);
    let (body, _) = store.get_stream(&object).await?;
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    let mut writer = Unpacker::new(
        dir,
        key.map(|k| Decrypt::new(k, &base::crypto_context(&record.backup_id))),
    )
    .map_err(|e| Error::io("cannot start decompressing", e))?;
    let worker = tokio::task::spawn_blocking(move || {
        while let Some(chunk) = rx.blocking_recv() {
            writer.push(&chunk)?;
        }
        writer.finish()
    });
    let stopped = download(body, tx, interrupt).await;
    let outcome = worker
        .await
        .map_err(|e| Error::io("unpacking", std::io::Error::other(e.to_string())))?;
    match stopped {
        Some(Stopped::Signal(s)) => return Err(Error::Interrupted(s)),
        Some(Stopped::S3(detail)) => {
            return Err(Error::S3 {
                operation: "GetObject",
                endpoint: store.endpoint.clone(),
                bucket: store.bucket.clone(),
                key: Some(object),
                detail,
            });
        }
        None => {}
    }
    let integrity = |detail: String| Error::Integrity {
        key: object.clone(),
        detail: format!("{detail}; the data directory was emptied again"),
    };
    let (size, sha256) = match outcome {
        Ok(v) => v,
        Err(detail) => {
            return Err(integrity(detail));
        }
    };
    if size != record.size_bytes || sha256 != record.sha256 {
        return Err(integrity(format!(
            "the object has {size} bytes with sha256 {sha256}, the record says {} bytes with sha256 {}",
            record.size_bytes, record.sha256
        )));
    }
    Ok(())
}

/// The manifest stored beside the tar (base backups the server compressed), written into the
/// data directory as `backup_manifest` for the check, after its size, SHA-256, encryption and
/// zstd checksum are checked. Nothing to do for a manifest inside the tar.
async fn fetch_manifest(
    store: &Store,
    layout: &Layout,
    record: &BaseRecord,
    key: Option<&Key>,
    dir: &Path,
) -> Result<()> {
    let Some(stored) = &record.manifest else {
        return Ok(());
    };
    let object = base::manifest_key(layout, &record.database, &record.backup_id);
    let integrity = |detail: String| Error::Integrity {
        key: object.clone(),
        detail: format!("{detail}; the data directory was emptied again"),
    };
    let bytes = store
        .get_small(&object, base::MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| integrity("the record names a backup manifest that is not stored".into()))?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    if bytes.len() as u64 != stored.size_bytes || sha256 != stored.sha256 {
        return Err(integrity(format!(
            "the manifest object has {} bytes with sha256 {sha256}, the record says {} bytes with sha256 {}",
            bytes.len(),
            stored.size_bytes,
            stored.sha256
        )));
    }
    let plain = match key {
        Some(k) => {
            crate::crypto::open(k, &base::manifest_crypto_context(&record.backup_id), &bytes)
                .map_err(integrity)?
        }
        None => bytes.to_vec(),
    };
    let manifest = zstd::bulk::decompress(&plain, base::MAX_MANIFEST_BYTES)
        .map_err(|e| integrity(format!("the manifest does not decompress: {e}")))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("backup_manifest"))
        .and_then(|mut f| f.write_all(&manifest))
        .map_err(|e| Error::io("writing backup_manifest", e))
}

/// Why the download stopped before the end of the object.
enum Stopped {
    S3(String),
    Signal(&'static str),
}

/// Hands the object's chunks to the unpacking thread until the end, a failure, a signal, or
/// the thread stopping (it failed: its own error says why); dropping `tx` ends the thread.
async fn download(
    mut body: ByteStream,
    tx: mpsc::Sender<Bytes>,
    interrupt: &Interrupt,
) -> Option<Stopped> {
    loop {
        let next = tokio::select! {
            chunk = body.next() => chunk,
            s = interrupt.wait() => return Some(Stopped::Signal(s)),
        };
        match next {
            None => return None,
            Some(Ok(chunk)) => {
                if tx.send(chunk).await.is_err() {
                    return None;
                }
            }
            Some(Err(e)) => return Some(Stopped::S3(DisplayErrorContext(&e).to_string())),
        }
    }
}

/// Stored bytes → SHA-256 → decryption → zstd → tar → files.
struct Unpacker {
    hasher: Sha256,
    size: u64,
    decrypt: Option<Decrypt>,
    zstd: zstd::stream::write::Decoder<'static, TarSink>,
}

impl Unpacker {
    fn new(dir: &Path, decrypt: Option<Decrypt>) -> std::io::Result<Unpacker> {
        let sink = TarSink {
            parser: tar::Parser::new(),
            files: Files {
                root: dir.to_path_buf(),
                file: None,
            },
        };
        Ok(Unpacker {
            hasher: Sha256::new(),
            size: 0,
            decrypt,
            zstd: zstd::stream::write::Decoder::new(sink)?,
        })
    }

    fn push(&mut self, chunk: &[u8]) -> std::result::Result<(), String> {
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        match &mut self.decrypt {
            Some(d) => {
                let mut plain = Vec::with_capacity(chunk.len());
                d.push(chunk, &mut plain)?;
                self.write(&plain)
            }
            None => self.write(chunk),
        }
    }

    fn write(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        self.zstd
            .write_all(data)
            .map_err(|e| format!("it does not decompress: {e}"))
    }

    /// The end of the object: the stored size and SHA-256.
    fn finish(mut self) -> std::result::Result<(u64, String), String> {
        if let Some(d) = &mut self.decrypt {
            let mut plain = Vec::new();
            d.finish(&mut plain)?;
            self.write(&plain)?;
        }
        self.zstd
            .flush()
            .map_err(|e| format!("it does not decompress: {e}"))?;
        let sink = self.zstd.into_inner();
        sink.parser.finish()?;
        Ok((self.size, hex::encode(self.hasher.finalize())))
    }
}

/// The decompressed tar, fed to the parser that writes the files.
struct TarSink {
    parser: tar::Parser,
    files: Files,
}

impl Write for TarSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.parser
            .feed(data, &mut self.files)
            .map_err(std::io::Error::other)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes the entries below `root`: directories 0700, files 0600 (PostgreSQL's modes).
struct Files {
    root: PathBuf,
    file: Option<std::fs::File>,
}

impl Visitor for Files {
    fn entry(&mut self, entry: &Entry) -> std::result::Result<(), String> {
        self.file = None;
        let path = self.root.join(&entry.path);
        let io = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        match entry.kind {
            Kind::Dir => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(io),
            Kind::File => {
                if let Some(parent) = path.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(parent)
                        .map_err(io)?;
                }
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(io)?;
                self.file = Some(f);
                Ok(())
            }
            Kind::Symlink => Err(format!(
                "the backup holds a symbolic link {} (a tablespace): base-restore restores only the main tablespace",
                entry.path
            )),
        }
    }

    fn data(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        match &mut self.file {
            Some(f) => f
                .write_all(data)
                .map_err(|e| format!("cannot write into {}: {e}", self.root.display())),
            None => Ok(()),
        }
    }
}

/// `pg_verifybackup --no-parse-wal`: every file the manifest lists, with its size and
/// checksum (the WAL is not in the backup; recovery checks it as it replays). Without
/// `pg_verifybackup` (not installed), every listed file is checked for its size only.
async fn verify_manifest(tools: &PgTools, record: &BaseRecord, dir: &Path) -> Result<()> {
    let major = record
        .engine_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok());
    let mut cmd = tools.command("pg_verifybackup", major);
    cmd.args(["--no-parse-wal", "--quiet"]).arg(dir);
    let refused = |detail: String| Error::Integrity {
        key: format!("base backup {}", record.backup_id),
        detail: format!("the restored files do not match its backup_manifest: {detail}"),
    };
    let out = match cmd.output().await {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                tool = %tools.path("pg_verifybackup", major).display(),
                "pg_verifybackup not found: checking that every file of the backup manifest is there with its size (not its checksum)"
            );
            return check_sizes(dir).map_err(refused);
        }
        Err(e) => {
            return Err(pg::pg_error(
                "pg_verifybackup",
                "(instance)",
                format!("cannot run it: {e}"),
            ));
        }
    };
    if !out.status.success() {
        let detail = pg::tail_text(&String::from_utf8_lossy(&out.stderr));
        return Err(refused(format!("pg_verifybackup: {detail}")));
    }
    Ok(())
}

/// Every file the manifest lists exists with its size.
fn check_sizes(dir: &Path) -> std::result::Result<(), String> {
    let manifest = std::fs::read(dir.join("backup_manifest"))
        .map_err(|e| format!("cannot read backup_manifest: {e}"))?;
    for f in base::manifest_files(&manifest)? {
        match std::fs::symlink_metadata(dir.join(&f.path)) {
            Ok(m) if m.is_file() && m.len() == f.size => {}
            Ok(m) => {
                return Err(format!(
                    "{} has {} bytes, the manifest says {}",
                    f.path,
                    m.len(),
                    f.size
                ));
            }
            Err(e) => return Err(format!("{} is missing: {e}", f.path)),
        }
    }
    Ok(())
}

/// Appends the recovery settings to `postgresql.auto.conf` and writes `recovery.signal` (a
/// standby's `standby.signal` would make it follow, not recover and promote).
fn write_recovery(dir: &Path, record: &BaseRecord, opts: &BaseRestoreOptions) -> Result<()> {
    let settings = base::recovery_settings(&record.backup_id, &opts.restore_command, &opts.target);
    let auto = dir.join("postgresql.auto.conf");
    let io = |e| {
        Error::io(
            format!("cannot write the recovery settings into {}", dir.display()),
            e,
        )
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&auto)
        .map_err(io)?;
    f.write_all(format!("\n{settings}").as_bytes())
        .map_err(io)?;
    f.sync_all().map_err(io)?;
    let _ = std::fs::remove_file(dir.join("standby.signal"));
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(dir.join("recovery.signal"))
        .map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_pg_verifybackup_every_listed_file_must_have_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("backup_manifest"),
            r#"{"Files": [{ "Path": "PG_VERSION", "Size": 3 }, { "Path": "base/1/1259", "Size": 4 }]}"#,
        )
        .unwrap();
        std::fs::write(d.join("PG_VERSION"), "15\n").unwrap();
        std::fs::create_dir_all(d.join("base/1")).unwrap();
        std::fs::write(d.join("base/1/1259"), "abcd").unwrap();
        check_sizes(d).unwrap();
        std::fs::write(d.join("base/1/1259"), "abc").unwrap();
        let e = check_sizes(d).unwrap_err();
        assert!(
            e.contains("base/1/1259 has 3 bytes, the manifest says 4"),
            "{e}"
        );
        std::fs::remove_file(d.join("PG_VERSION")).unwrap();
        assert!(
            check_sizes(d)
                .unwrap_err()
                .contains("PG_VERSION is missing")
        );
    }
}
