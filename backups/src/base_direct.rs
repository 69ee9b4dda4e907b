//! A base backup through the agent's own replication connection (`replication`), the I/O: the
//! server compresses the archive with zstd (its `workers` threads), the agent stores the bytes
//! as they come (encrypted when a key is set), decompressing only the tar's start on the way,
//! for its `backup_label`; the size before compression is the server's last progress report
//! and the file count the manifest's. The manifest, which the server sends apart, is stored
//! beside it (`base::MANIFEST_FILE`). `base_store` falls back to pg_basebackup when this
//! client cannot make the connection.

use std::io::Write;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::base;
use crate::crypto;
use crate::error::{Error, Result};
use crate::replication::base_backup::{self, Answer, Request};
use crate::replication::wire::Connection;
use crate::replication::{self, conninfo};
use crate::s3::Store;
use crate::tar::{self, Capture};
use crate::upload::{Compressed, store_observed, upload_parts};

/// Why pg_basebackup takes the backup.
pub enum NotDirect {
    /// A setting or server version this client leaves to libpq.
    Unsupported(String),
    /// The connection failed (pg_basebackup, libpq itself, tries again).
    Failed(String),
}

/// The connection when this client can make it.
pub async fn connect() -> std::result::Result<Connection, NotDirect> {
    let mut settings = replication::settings_from_env()
        .map_err(|conninfo::Unsupported(why)| NotDirect::Unsupported(why))?;
    if settings.application_name.is_none() {
        settings.application_name = Some("dbop-backup".into());
    }
    replication::wire::connect(&settings)
        .await
        .map_err(NotDirect::Failed)
}

/// What the direct path stored: the archive's object, the tar's `backup_label` (and the
/// manifest in `files[1]`, as pg_basebackup's stream would have it), and the manifest's object.
pub(crate) struct Stored {
    pub archive: Compressed,
    pub capture: Capture,
    pub manifest: base::StoredManifest,
}

/// The options `stream` needs of the backup's.
pub(crate) struct Direct<'a> {
    pub request: Request,
    pub key: Option<&'a crypto::Key>,
    pub part_size: usize,
    pub concurrency: usize,
}

/// Takes the backup over `conn` into the multipart upload `upload_id` of `tar_key`, then
/// stores the manifest at `manifest_key`. The upload is the caller's to abort on failure.
pub(crate) async fn stream(
    store: &Store,
    mut conn: Connection,
    direct: &Direct<'_>,
    (tar_key, manifest_key, upload_id): (&str, &str, &str),
    id: &str,
) -> Result<Stored> {
    let (archive_tx, archive_rx) = mpsc::channel::<Bytes>(64);
    let (parts_tx, parts_rx) = mpsc::channel::<Bytes>(1);
    let sealing = direct.key.cloned().map(|k| (k, base::crypto_context(id)));
    let part_size = direct.part_size;
    let writer = tokio::task::spawn_blocking(move || {
        let mut reader = TarReader::new().map_err(|e| e.to_string())?;
        let stored = store_observed(archive_rx, part_size, sealing, parts_tx, &mut |chunk| {
            reader.feed(chunk)
        });
        Ok::<_, String>((stored, reader.finish()))
    });
    let uploading = upload_parts(store, tar_key, upload_id, parts_rx, direct.concurrency);
    let reading = async {
        let answer = base_backup::run(
            &mut conn,
            &direct.request,
            &archive_tx,
            base::MAX_MANIFEST_BYTES,
        )
        .await;
        drop(archive_tx);
        answer
    };
    let (answer, parts) = tokio::join!(reading, uploading);
    let written = writer.await.map_err(|e| e.to_string()).and_then(|w| w);
    let (stored, read) =
        written.map_err(|e| Error::io("the archive's writer", std::io::Error::other(e)))?;
    // The first failure in the chain is the cause: the upload stops the writer, which stops
    // the reader.
    let parts = parts?;
    let mut archive = stored.map_err(|e| Error::io("storing the server's archive", e))?;
    let answer: Answer = answer.map_err(failed)?;
    conn.close().await;
    let mut capture = read.map_err(|e| failed(format!("its archive: {e}")))?;
    archive.raw_bytes = answer.archive_bytes.unwrap_or(0);
    capture.file_count = base::manifest_files(&answer.manifest)
        .map_err(|e| failed(format!("its manifest: {e}")))?
        .len() as u64;
    store.complete_upload(tar_key, upload_id, parts).await?;
    crate::dump::check_stored_size(store, tar_key, archive.size_bytes).await?;
    let manifest = store_manifest(store, manifest_key, &answer.manifest, direct.key, id).await?;
    capture.files[1] = Some(answer.manifest);
    Ok(Stored {
        archive,
        capture,
        manifest,
    })
}

fn failed(detail: String) -> Error {
    crate::pg::pg_error("BASE_BACKUP", "(instance)", detail)
}

/// The manifest as one zstd frame with a checksum, sealed when a key is set.
async fn store_manifest(
    store: &Store,
    key: &str,
    manifest: &[u8],
    sealing: Option<&crypto::Key>,
    id: &str,
) -> Result<base::StoredManifest> {
    let compressed = zstd::bulk::Compressor::new(3)
        .and_then(|mut c| {
            c.include_checksum(true)?;
            c.compress(manifest)
        })
        .map_err(|e| Error::io("compressing the backup manifest", e))?;
    let object = match sealing {
        Some(k) => crypto::seal(k, &base::manifest_crypto_context(id), &compressed),
        None => compressed,
    };
    let stored = base::StoredManifest {
        size_bytes: object.len() as u64,
        sha256: hex::encode(Sha256::digest(&object)),
    };
    store
        .put(key, Bytes::from(object), "application/zstd")
        .await?;
    Ok(stored)
}

/// Decompresses the start of the server's archive as it passes, until its `backup_label`
/// (PostgreSQL sends it first) is read whole: the rest is stored as it comes, without
/// decompressing here (the restore and the scheduled verification read it all).
struct TarReader {
    decoder: Option<zstd::stream::write::Decoder<'static, TarTap>>,
    capture: Option<Capture>,
}

/// The decompressed side: the tar's structure up to the label.
struct TarTap {
    parser: tar::Parser,
    capture: Capture,
}

impl Write for TarTap {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.parser
            .feed(data, &mut self.capture)
            .map_err(std::io::Error::other)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl TarTap {
    /// The label is whole once another file's header came after it.
    fn label_read(&self) -> bool {
        self.capture.files[0].is_some() && self.capture.file_count >= 2
    }
}

impl TarReader {
    fn new() -> std::io::Result<TarReader> {
        let tap = TarTap {
            parser: tar::Parser::new(),
            capture: Capture::new(
                &["backup_label", "backup_manifest"],
                base::MAX_MANIFEST_BYTES,
            ),
        };
        Ok(TarReader {
            decoder: Some(zstd::stream::write::Decoder::new(tap)?),
            capture: None,
        })
    }

    /// Reads `chunk` while the label is not read yet.
    fn feed(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        let Some(decoder) = self.decoder.as_mut() else {
            return Ok(());
        };
        decoder.write_all(chunk)?;
        if decoder.get_ref().label_read() {
            let tap = self.decoder.take().map(|d| d.into_inner());
            self.capture = tap.map(|t| t.capture);
        }
        Ok(())
    }

    /// What the tar's start held; an error when the archive ended before its label was read
    /// (and then, as the archive was read whole, when the tar is not whole).
    fn finish(mut self) -> std::result::Result<Capture, String> {
        if let Some(mut decoder) = self.decoder.take() {
            decoder.flush().map_err(|e| e.to_string())?;
            let tap = decoder.into_inner();
            tap.parser.finish()?;
            self.capture = Some(tap.capture);
        }
        self.capture
            .filter(|c| c.files[0].is_some())
            .ok_or_else(|| "it holds no backup_label".into())
    }
}
