//! Continuous WAL archiving, the I/O: `wal-push` (PostgreSQL's `archive_command`) stores one
//! file, compressed, encrypted when a key is configured, its plain SHA-256 in the object's
//! metadata, never over a different object; it also uploads files PostgreSQL has already marked
//! ready and leaves a spool marker for each, so their own later call returns at once.
//! `wal-fetch` (`restore_command`) brings one back, checked, atomically into place.
//!
//! Every decision (names, keys, whether a stored object is the same file, whether a marker
//! proves anything, retry waits) is `wal`'s; this module reads files, talks to S3 and writes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::crypto::{self, Key, KeyRing};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::s3::{PutNew, Store};
use crate::wal::{
    self, Existing, MARKER_SUFFIX, Marker, PushVerdict, READY_SUFFIX, Stored, WalFile,
};

/// The largest object `wal-fetch` reads (WAL segments are at most 1 GiB).
const OBJECT_LIMIT: usize = 1 << 31;
/// The largest plain file a stored object may decompress to.
const PLAIN_LIMIT: u64 = 1 << 30;

/// Where and how WAL is stored.
#[derive(Debug, Clone)]
pub struct WalStore {
    pub store: Store,
    pub layout: Layout,
    pub database: String,
    /// The key new objects are encrypted with.
    pub key: Option<Key>,
    /// Where the keys named by stored objects are read.
    pub ring: Option<KeyRing>,
    pub compression_level: i32,
    /// Overall time for one call, retries included.
    pub deadline: Duration,
}

/// What became of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Uploaded,
    AlreadyArchived,
    /// A spool marker left by an earlier call's read-ahead proved it stored.
    ByReadAhead,
}

/// The local file: its bytes and what identifies them.
#[derive(Clone)]
struct Local {
    file: WalFile,
    plain: Bytes,
    sha256: String,
}

fn read_local(file: WalFile, path: &Path) -> Result<Local> {
    let plain = std::fs::read(path)
        .map_err(|e| Error::io(format!("cannot read WAL file {}", path.display()), e))?;
    let sha256 = hex::encode(Sha256::digest(&plain));
    Ok(Local {
        file,
        plain: plain.into(),
        sha256,
    })
}

fn parse_name(name: &str) -> Result<WalFile> {
    WalFile::parse(name).map_err(Error::Usage)
}

impl WalStore {
    fn key_of(&self, file: &WalFile) -> String {
        wal::object_key(&self.layout, &self.database, file)
    }

    /// What a marker for `local` must say to prove it stored.
    fn marker_for(&self, local: &Local) -> Marker {
        Marker {
            endpoint: self.store.endpoint.clone(),
            bucket: self.store.bucket.clone(),
            key: self.key_of(&local.file),
            sha256: local.sha256.clone(),
            size: local.plain.len() as u64,
        }
    }

    /// Compresses (zstd with a content checksum) and encrypts when a key is set.
    fn encode(&self, local: &Local) -> Result<(Bytes, Stored)> {
        let io = |e| Error::io(format!("cannot compress {}", local.file.name), e);
        let mut enc =
            zstd::stream::write::Encoder::new(Vec::new(), self.compression_level).map_err(io)?;
        enc.include_checksum(true).map_err(io)?;
        enc.write_all(&local.plain).map_err(io)?;
        let compressed = enc.finish().map_err(io)?;
        let body = match &self.key {
            Some(k) => crypto::seal(k, &local.file.crypto_context(), &compressed),
            None => compressed,
        };
        let stored = Stored {
            sha256: local.sha256.clone(),
            size: local.plain.len() as u64,
            stored_size: body.len() as u64,
            key: self.key.as_ref().map(|k| (k.name.clone(), k.fingerprint())),
        };
        Ok((body.into(), stored))
    }

    /// Decrypts (with the key the metadata names; without metadata, the write key) and
    /// decompresses a stored object.
    fn decode(
        &self,
        key: &str,
        file: &WalFile,
        body: &[u8],
        stored: Option<&Stored>,
    ) -> Result<Vec<u8>> {
        let integrity = |detail: String| Error::Integrity {
            key: key.to_string(),
            detail,
        };
        let named = stored.and_then(|s| s.key.as_ref());
        let compressed = match (named, &self.key) {
            (Some((name, fingerprint)), _) => {
                let k = self.named_key(name, fingerprint)?;
                crypto::open(&k, &file.crypto_context(), body).map_err(integrity)?
            }
            (None, Some(k)) if stored.is_none() && body.starts_with(crypto::MAGIC) => {
                crypto::open(k, &file.crypto_context(), body).map_err(integrity)?
            }
            (None, _) => body.to_vec(),
        };
        let mut plain = Vec::new();
        zstd::stream::read::Decoder::new(compressed.as_slice())
            .and_then(|d| d.take(PLAIN_LIMIT + 1).read_to_end(&mut plain))
            .map_err(|e| integrity(format!("it does not decompress: {e}")))?;
        Ok(plain)
    }

    fn named_key(&self, name: &str, fingerprint: &str) -> Result<Key> {
        let ring = self.ring.as_ref().ok_or_else(|| {
            Error::Key(format!(
                "the WAL file is encrypted with key {name:?}: pass --encryption-key-dir"
            ))
        })?;
        let k = ring.get(name).map_err(Error::Key)?;
        if k.fingerprint() != fingerprint {
            return Err(Error::Key(format!(
                "key {name:?} of {} has fingerprint {}, the WAL file was written with {fingerprint}",
                ring.dir.display(),
                k.fingerprint()
            )));
        }
        Ok(k)
    }

    async fn existing(&self, key: &str) -> Result<Existing> {
        Ok(match self.store.head_with_metadata(key).await? {
            None => Existing::Absent,
            Some((length, metadata)) => Existing::Present {
                length,
                stored: Stored::from_metadata(&metadata),
            },
        })
    }

    /// One attempt: HEAD, then upload only where nothing is.
    async fn push_once(&self, local: &Local) -> Result<Pushed> {
        let key = self.key_of(&local.file);
        let size = local.plain.len() as u64;
        match wal::push_verdict(&self.existing(&key).await?, &local.sha256, size) {
            PushVerdict::AlreadyArchived => return Ok(Pushed::AlreadyArchived),
            PushVerdict::Refuse(why) => return Err(refused(&key, &why)),
            PushVerdict::CompareContent => return self.compare_content(&key, local).await,
            PushVerdict::Upload => {}
        }
        // Compression is CPU work: off the runtime's threads, so read-ahead uploads overlap it.
        let (this, copy) = (self.clone(), local.clone());
        let (body, stored) = tokio::task::spawn_blocking(move || this.encode(&copy))
            .await
            .map_err(|e| Error::io("compression stopped", std::io::Error::other(e)))??;
        let put = |conditional| {
            self.store.put_new(
                &key,
                body.clone(),
                "application/zstd",
                stored.to_metadata(),
                conditional,
            )
        };
        match put(true).await? {
            PutNew::Created => Ok(Pushed::Uploaded),
            PutNew::ConditionUnsupported => put(false).await.map(|_| Pushed::Uploaded),
            // Someone stored it between our HEAD and PUT: the same rules decide.
            PutNew::Exists => {
                match wal::push_verdict(&self.existing(&key).await?, &local.sha256, size) {
                    PushVerdict::AlreadyArchived => Ok(Pushed::AlreadyArchived),
                    PushVerdict::Refuse(why) => Err(refused(&key, &why)),
                    PushVerdict::CompareContent | PushVerdict::Upload => {
                        self.compare_content(&key, local).await
                    }
                }
            }
        }
    }

    /// An object without this agent's metadata: the same file only if its plain bytes are.
    async fn compare_content(&self, key: &str, local: &Local) -> Result<Pushed> {
        let Some((body, _)) = self.store.get_with_metadata(key, OBJECT_LIMIT).await? else {
            return Err(refused(key, "it vanished while being compared"));
        };
        match self.decode(key, &local.file, &body, None) {
            Ok(plain) if hex::encode(Sha256::digest(&plain)) == local.sha256 => {
                Ok(Pushed::AlreadyArchived)
            }
            Ok(_) => Err(refused(key, "it has no dbop checksum and other contents")),
            Err(e) => Err(refused(key, &format!("it has no dbop checksum and {e}"))),
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or `deadline` passes; only S3
    /// failures are retried.
    async fn with_retries<T, F, Fut>(&self, what: &str, deadline: Instant, attempt: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let result = match tokio::time::timeout(left, attempt()).await {
                Ok(r) => r,
                Err(_) => {
                    let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
                    let context = format!("{what}: no success within {:?}", self.deadline);
                    return Err(Error::io(context, timed_out));
                }
            };
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e @ Error::S3 { .. }) => e,
                Err(e) => return Err(e),
            };
            tries += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(wait) = wal::retry_wait(tries, left) else {
                return Err(err);
            };
            tracing::warn!(try_ = tries, "{what}: {err}; retrying in {wait:?}");
            tokio::time::sleep(wait).await;
        }
    }

    async fn push_local(&self, local: &Local, deadline: Instant) -> Result<Pushed> {
        let what = format!("archiving {}", local.file.name);
        self.with_retries(&what, deadline, || self.push_once(local))
            .await
    }

    /// `wal-push <path> <name>`: stores the file, and up to `parallel - 1` other ready files
    /// at once, each with a spool marker once stored.
    pub async fn push(
        &self,
        path: &Path,
        name: &str,
        parallel: usize,
        spool_dir: Option<&Path>,
    ) -> Result<Pushed> {
        let deadline = Instant::now() + self.deadline;
        let file = parse_name(name)?;
        let wal_dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let spool = spool_dir.map_or_else(|| wal_dir.join("../dbop-wal-spool"), Path::to_path_buf);
        let local = read_local(file, path)?;
        if self.take_marker(&spool, &local) {
            tracing::info!(
                file = name,
                "archived earlier by read-ahead (marker checked)"
            );
            return Ok(Pushed::ByReadAhead);
        }
        let ready = ready_entries(&wal_dir.join("archive_status"));
        let ahead = wal::read_ahead(&ready, name, parallel.saturating_sub(1));
        let (main, ()) = tokio::join!(
            self.push_local(&local, deadline),
            self.read_ahead(ahead, &wal_dir, &spool, deadline, parallel)
        );
        let pushed = main?;
        tracing::info!(
            file = name,
            key = self.key_of(&local.file),
            bytes = local.plain.len(),
            "{}",
            match pushed {
                Pushed::Uploaded => "archived",
                _ => "already archived, nothing uploaded",
            }
        );
        Ok(pushed)
    }

    /// True when a marker proves this very file stored; a marker that does not is removed.
    fn take_marker(&self, spool: &Path, local: &Local) -> bool {
        let path = marker_path(spool, &local.file.name);
        let Ok(text) = std::fs::read(&path) else {
            return false;
        };
        let proves = serde_json::from_slice::<Marker>(&text)
            .is_ok_and(|m| wal::marker_proves(&m, &self.marker_for(local)));
        let _ = std::fs::remove_file(&path);
        if !proves {
            tracing::warn!(
                file = local.file.name,
                "a spool marker that does not match the file was ignored and removed"
            );
        }
        proves
    }

    async fn read_ahead(
        &self,
        files: Vec<WalFile>,
        wal_dir: &Path,
        spool: &Path,
        deadline: Instant,
        parallel: usize,
    ) {
        futures::stream::iter(files)
            .for_each_concurrent(parallel.max(1), |file| async move {
                let name = file.name.clone();
                if let Err(e) = self.push_ahead(file, wal_dir, spool, deadline).await {
                    tracing::warn!(file = name, "read-ahead: {e} (its own call will try again)");
                }
            })
            .await;
    }

    async fn push_ahead(
        &self,
        file: WalFile,
        wal_dir: &Path,
        spool: &Path,
        deadline: Instant,
    ) -> Result<()> {
        let local = read_local(file.clone(), &wal_dir.join(&file.name))?;
        let marker = self.marker_for(&local);
        let path = marker_path(spool, &local.file.name);
        if std::fs::read(&path)
            .ok()
            .and_then(|t| serde_json::from_slice::<Marker>(&t).ok())
            .is_some_and(|m| wal::marker_proves(&m, &marker))
        {
            return Ok(());
        }
        self.push_local(&local, deadline).await?;
        write_marker(spool, &path, &marker)?;
        tracing::info!(file = local.file.name, "archived ahead of its call");
        Ok(())
    }

    /// `wal-fetch <name> <path>`: the file, checked, renamed into place; `Ok(false)` when the
    /// archive has no such file.
    pub async fn fetch(&self, name: &str, path: &Path) -> Result<bool> {
        let deadline = Instant::now() + self.deadline;
        let file = parse_name(name)?;
        let key = self.key_of(&file);
        let what = format!("fetching {name}");
        let got = self
            .with_retries(&what, deadline, || {
                self.store.get_with_metadata(&key, OBJECT_LIMIT)
            })
            .await?;
        let Some((body, metadata)) = got else {
            return Ok(false);
        };
        let integrity = |detail: String| Error::Integrity {
            key: key.clone(),
            detail: format!("{detail}; nothing was written to {}", path.display()),
        };
        let stored = Stored::from_metadata(&metadata)
            .ok_or_else(|| integrity("the object has no dbop checksum in its metadata".into()))?;
        let plain = self
            .decode(&key, &file, &body, Some(&stored))
            .map_err(|e| match e {
                Error::Integrity { detail, .. } => integrity(detail),
                other => other,
            })?;
        let sha256 = hex::encode(Sha256::digest(&plain));
        if sha256 != stored.sha256 || plain.len() as u64 != stored.size {
            return Err(integrity(format!(
                "it decodes to {} bytes with sha256 {sha256}, {} bytes with sha256 {} were archived",
                plain.len(),
                stored.size,
                stored.sha256
            )));
        }
        write_atomically(path, &plain)?;
        tracing::info!(file = name, key, bytes = plain.len(), "restored");
        Ok(true)
    }
}

fn refused(key: &str, why: &str) -> Error {
    Error::Integrity {
        key: key.to_string(),
        detail: format!(
            "refusing to overwrite a different object of the same name ({why}); nothing was uploaded. Another cluster may be archiving to the same bucket and prefix"
        ),
    }
}

fn marker_path(spool: &Path, name: &str) -> PathBuf {
    spool.join(format!("{name}{MARKER_SUFFIX}"))
}

/// The names in `archive_status/` (none when it cannot be read: read-ahead is a bonus).
fn ready_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(READY_SUFFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `data` beside `path` under a temporary name, syncs it and renames it into place, so
/// `path` holds either nothing or all of it.
fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.dbop-{}.tmp", std::process::id()));
    let io = |e| Error::io(format!("cannot write {}", path.display()), e);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(data).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn write_marker(spool: &Path, path: &Path, marker: &Marker) -> Result<()> {
    std::fs::create_dir_all(spool).map_err(|e| {
        Error::io(
            format!("cannot create the WAL spool {}", spool.display()),
            e,
        )
    })?;
    let text = serde_json::to_vec(marker).unwrap_or_default();
    write_atomically(path, &text)
}
