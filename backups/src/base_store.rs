//! Physical base backups, the I/O of `base-backup`: the whole instance, from a primary or a
//! standby, without WAL (it comes from the archive), through the agent's own replication
//! connection with the server compressing (`base_direct`), or else `pg_basebackup -Ft -D - -X
//! none` → zstd here; either way → encryption when a key is set → S3 multipart upload,
//! SHA-256 on the fly, nothing staged on disk; `backup_label` and `backup_manifest` are read
//! for the WAL range; the record is written last. The restore is `base_restore`.
//!
//! Every decision (keys, record, WAL range) is `base`'s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use tokio::sync::mpsc;

use crate::base::{self, BaseRecord};
use crate::base_direct::{self, Direct, NotDirect};
use crate::crypto::{self, Key};
use crate::error::{Error, Result};
use crate::layout::{self, Layout};
use crate::pg::{self, PgTools};
use crate::replication::base_backup::Request;
use crate::replication::wire::Connection;
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::tar::{self, Capture};
use crate::upload::{Compressed, compress_observed, upload_parts};

/// How a base backup is taken and stored.
#[derive(Debug, Clone)]
pub struct BaseBackupOptions {
    pub database: String,
    pub backup_id: Option<String>,
    pub key: Option<Key>,
    pub compression_level: i32,
    pub compression_threads: u32,
    pub part_size: usize,
    pub concurrency: usize,
    /// `--checkpoint=fast` instead of a spread checkpoint.
    pub fast_checkpoint: bool,
    /// `--manifest-checksums`.
    pub manifest_checksums: String,
    /// The agent's own replication connection when it can make it (`--base-client auto`).
    pub direct: bool,
}

/// What the server says before the backup.
struct Server {
    version: String,
    major: Option<u32>,
    system_identifier: String,
}

/// The server's identity over a replication connection (`IDENTIFY_SYSTEM`, `SHOW`): no SQL,
/// no database, no superuser; what pg_basebackup's own connection may do.
async fn server_identity(tools: &PgTools) -> Result<Server> {
    let mut cmd = tools.command("psql", None);
    cmd.args(["-X", "-w", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-d", "replication=true"]);
    for command in base::IDENTIFY_COMMANDS {
        cmd.arg("-c").arg(command);
    }
    let failed = |detail: String| pg::pg_error("psql", "(replication)", detail);
    let out = cmd
        .output()
        .await
        .map_err(|e| failed(format!("cannot run psql: {e}")))?;
    if !out.status.success() {
        return Err(failed(pg::tail_text(&String::from_utf8_lossy(&out.stderr))));
    }
    let identity = base::parse_identity(&String::from_utf8_lossy(&out.stdout)).map_err(failed)?;
    Ok(Server {
        version: pg::short_version(&identity.version),
        major: pg::major_of_version_num(&identity.version_num),
        system_identifier: identity.system_identifier,
    })
}

/// A base backup's record and whether this run took it (else it was complete already).
#[derive(Debug, Clone)]
pub struct BaseBackupDone {
    pub record: BaseRecord,
    pub taken_now: bool,
}

/// An upload in progress, aborted if the backup fails.
type Pending = Arc<Mutex<Option<(String, String)>>>;

/// `base-backup`: takes, stores and records one base backup; returns its record.
pub async fn base_backup(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseBackupOptions,
    interrupt: &Interrupt,
) -> Result<BaseBackupDone> {
    let pending: Pending = Arc::default();
    let outcome = tokio::select! {
        r = backup_inner(store, layout, tools, opts, &pending) => r,
        s = interrupt.wait() => Err(Error::Interrupted(s)),
    };
    if outcome.is_err() {
        let upload = pending.lock().map(|mut p| p.take()).unwrap_or(None);
        if let Some((key, upload_id)) = upload {
            let abort = store.abort_upload(&key, &upload_id);
            match tokio::time::timeout(Duration::from_secs(15), abort).await {
                Ok(Ok(())) => tracing::info!(key, "multipart upload aborted"),
                _ => tracing::error!(
                    key,
                    "could not abort the multipart upload; prune removes it after the grace period"
                ),
            }
        }
    }
    outcome
}

/// The id of this run's backup: `--backup-id`, else the start time.
fn backup_id(opts: &BaseBackupOptions) -> Result<String> {
    match &opts.backup_id {
        Some(id) => layout::validate_backup_id(id)
            .map(|()| id.clone())
            .map_err(Error::Usage),
        None => Ok(layout::backup_id_at(Utc::now())),
    }
}

/// The record of a complete base backup `id`, if there is one.
async fn complete_record(store: &Store, record_key: &str) -> Result<Option<BaseRecord>> {
    let Some(bytes) = store.get_small(record_key, base::MAX_RECORD_BYTES).await? else {
        return Ok(None);
    };
    BaseRecord::parse(&bytes)
        .map(Some)
        .map_err(|detail| Error::Integrity {
            key: record_key.to_string(),
            detail,
        })
}

async fn backup_inner(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseBackupOptions,
    pending: &Pending,
) -> Result<BaseBackupDone> {
    let id = backup_id(opts)?;
    let record_key = base::record_key(layout, &opts.database, &id);
    store.check_bucket().await?;
    if let Some(record) = complete_record(store, &record_key).await? {
        tracing::info!(
            backup_id = id,
            "base backup already complete; not taken again"
        );
        return Ok(BaseBackupDone {
            record,
            taken_now: false,
        });
    }
    let server = server_identity(tools).await?;
    let direct = match opts.direct {
        true => direct_connection(&server).await,
        false => None,
    };
    if let (None, Some(major)) = (&direct, server.major) {
        tools
            .check_version("pg_basebackup", major, "(instance)")
            .await?;
    }
    let key = base::tar_key(layout, &opts.database, &id);
    tracing::info!(
        backup_id = id,
        key,
        direct = direct.is_some(),
        "base backup starting"
    );
    let local_before = Utc::now();
    let (compressed, captured, manifest) = match direct {
        Some(conn) => {
            let manifest_key = base::manifest_key(layout, &opts.database, &id);
            stream_direct(store, conn, opts, (&key, &manifest_key, &id), pending).await?
        }
        None => {
            let (compressed, captured) =
                stream_base(store, tools, opts, &server, (&key, &id), pending).await?;
            (compressed, captured, None)
        }
    };
    let local_after = Utc::now();
    let (range, label_start) = label_facts(&captured, local_after)?;
    let record = BaseRecord {
        record_version: base::record_version(manifest.as_ref()),
        backup_id: id,
        database: opts.database.clone(),
        start_lsn: range.start_lsn,
        start_wal_file: range.start_wal_file,
        stop_lsn: range.stop_lsn,
        timeline: range.timeline,
        start_time: label_start.unwrap_or(local_before),
        stop_time: base::stop_time(local_after, label_start),
        backup_from: range.backup_from,
        raw_bytes: compressed.raw_bytes,
        size_bytes: compressed.size_bytes,
        sha256: compressed.sha256,
        files: captured.file_count,
        engine_version: server.version,
        system_identifier: server.system_identifier,
        compression: "zstd".into(),
        agent_version: crate::AGENT_VERSION.into(),
        encryption: opts.key.as_ref().map(|k| base::Encryption {
            algorithm: crypto::ALGORITHM.into(),
            key_name: k.name.clone(),
            key_fingerprint: k.fingerprint(),
        }),
        manifest,
    };
    let json = serde_json::to_vec_pretty(&record).unwrap_or_default();
    store
        .put(&record_key, Bytes::from(json), "application/json")
        .await?;
    tracing::info!(backup_id = record.backup_id, start = %record.start_lsn, stop = %record.stop_lsn, raw_bytes = record.raw_bytes, size_bytes = record.size_bytes, "base backup complete");
    Ok(BaseBackupDone {
        record,
        taken_now: true,
    })
}

/// The WAL range and the start time in the stream's backup_label and backup_manifest; a
/// warning when the label's start time is missing or after `local_after` (the server's clock
/// is ahead of this agent's).
fn label_facts(
    captured: &Capture,
    local_after: chrono::DateTime<Utc>,
) -> Result<(base::WalRange, Option<chrono::DateTime<Utc>>)> {
    let [Some(label), Some(manifest)] = captured.files.as_slice() else {
        return Err(pg::pg_error(
            "pg_basebackup",
            "(instance)",
            "its tar stream held no backup_label or no backup_manifest (PostgreSQL 13 or later writes the manifest into the stream)",
        ));
    };
    let range = base::wal_range(label, manifest)
        .map_err(|e| pg::pg_error("pg_basebackup", "(instance)", e))?;
    let label_start = base::label_start_time(label);
    if label_start.is_none() {
        tracing::warn!(
            "backup_label has no START TIME in UTC or a numeric zone: the record's start time is this agent's clock"
        );
    }
    if label_start.is_some_and(|start| start > local_after) {
        tracing::warn!(
            "the server's clock is ahead of this agent's: the record's stop time may be early; keep the clocks in sync (NTP)"
        );
    }
    Ok((range, label_start))
}

/// The agent's own replication connection, when it can make it (PostgreSQL 15 or later, and
/// settings it implements as libpq does); else `None`, and pg_basebackup takes the backup.
async fn direct_connection(server: &Server) -> Option<Connection> {
    if server.major.is_some_and(|m| m < 15) {
        tracing::info!(
            version = server.version,
            "pg_basebackup takes the backup: server-side compression needs PostgreSQL 15"
        );
        return None;
    }
    match base_direct::connect().await {
        Ok(conn) => Some(conn),
        Err(NotDirect::Unsupported(why)) => {
            tracing::info!(reason = why, "pg_basebackup takes the backup");
            None
        }
        Err(NotDirect::Failed(why)) => {
            tracing::warn!(
                reason = why,
                "the agent's replication connection failed; pg_basebackup takes the backup"
            );
            None
        }
    }
}

/// The server's zstd archive → (cipher) → multipart upload, the manifest beside it.
async fn stream_direct(
    store: &Store,
    conn: Connection,
    opts: &BaseBackupOptions,
    (key, manifest_key, id): (&str, &str, &str),
    pending: &Pending,
) -> Result<(Compressed, Capture, Option<base::StoredManifest>)> {
    let upload_id = store.create_upload(key, "application/zstd").await?;
    if let Ok(mut p) = pending.lock() {
        *p = Some((key.to_string(), upload_id.clone()));
    }
    let direct = Direct {
        request: Request {
            label: format!("dbop {id}"),
            fast_checkpoint: opts.fast_checkpoint,
            manifest_checksums: opts.manifest_checksums.clone(),
            level: opts.compression_level,
            workers: opts.compression_threads,
        },
        key: opts.key.as_ref(),
        part_size: opts.part_size,
        concurrency: opts.concurrency,
    };
    let stored =
        base_direct::stream(store, conn, &direct, (key, manifest_key, &upload_id), id).await?;
    if let Ok(mut p) = pending.lock() {
        p.take();
    }
    Ok((stored.archive, stored.capture, Some(stored.manifest)))
}

/// pg_basebackup's tar stream → zstd (→ cipher) → multipart upload, the tar read on the way.
async fn stream_base(
    store: &Store,
    tools: &PgTools,
    opts: &BaseBackupOptions,
    server: &Server,
    (key, id): (&str, &str),
    pending: &Pending,
) -> Result<(Compressed, Capture)> {
    let upload_id = store.create_upload(key, "application/zstd").await?;
    if let Ok(mut p) = pending.lock() {
        *p = Some((key.to_string(), upload_id.clone()));
    }
    let (mut child, stderr, stdout) = spawn_pg_basebackup(tools, opts, server, id)?;
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let level = (opts.compression_level, opts.compression_threads);
    let sealing = opts.key.clone().map(|k| (k, base::crypto_context(id)));
    let part_size = opts.part_size;
    let compressor = tokio::task::spawn_blocking(move || {
        let mut parser = tar::Parser::new();
        let mut capture = Capture::new(
            &["backup_label", "backup_manifest"],
            base::MAX_MANIFEST_BYTES,
        );
        let mut failure: Option<String> = None;
        let mut observe = |chunk: &[u8]| {
            if failure.is_none() {
                failure = parser.feed(chunk, &mut capture).err();
            }
        };
        let compressed = compress_observed(stdout, level, part_size, sealing, tx, &mut observe);
        let read = failure.map_or_else(|| parser.finish(), Err);
        (compressed, read, capture)
    });
    let parts = upload_parts(store, key, &upload_id, rx, opts.concurrency).await?;
    let (compressed, read, capture) = compressor
        .await
        .map_err(|e| Error::io("compressor", std::io::Error::other(e.to_string())))?;
    let status = child
        .wait()
        .await
        .map_err(|e| pg::pg_error("pg_basebackup", "(instance)", e.to_string()))?;
    let tail = stderr.await.unwrap_or_default();
    if !status.success() {
        return Err(pg::pg_error(
            "pg_basebackup",
            "(instance)",
            format!("{status}: {}", pg::tail_text(&tail)),
        ));
    }
    let compressed = compressed.map_err(|e| Error::io("reading pg_basebackup's output", e))?;
    read.map_err(|e| {
        pg::pg_error(
            "pg_basebackup",
            "(instance)",
            format!("its tar stream: {e}"),
        )
    })?;
    store.complete_upload(key, &upload_id, parts).await?;
    if let Ok(mut p) = pending.lock() {
        p.take();
    }
    crate::dump::check_stored_size(store, key, compressed.size_bytes).await?;
    Ok((compressed, capture))
}

type Spawned = (
    tokio::process::Child,
    tokio::task::JoinHandle<String>,
    std::fs::File,
);

/// `pg_basebackup -Ft -D - -X none`: the main tablespace as one tar on stdout, with the
/// backup manifest in it; no WAL (the archive has it).
fn spawn_pg_basebackup(
    tools: &PgTools,
    opts: &BaseBackupOptions,
    server: &Server,
    id: &str,
) -> Result<Spawned> {
    let checkpoint = if opts.fast_checkpoint {
        "fast"
    } else {
        "spread"
    };
    let mut child = tools
        .command("pg_basebackup", server.major)
        .args([
            "--format=tar",
            "--pgdata=-",
            "--wal-method=none",
            "--no-password",
        ])
        .arg(format!("--checkpoint={checkpoint}"))
        .arg(format!("--manifest-checksums={}", opts.manifest_checksums))
        .arg(format!("--label=dbop {id}"))
        .spawn()
        .map_err(|e| {
            pg::pg_error(
                "pg_basebackup",
                "(instance)",
                format!("cannot run pg_basebackup: {e}"),
            )
        })?;
    let stderr = pg::collect_stderr(&mut child, "pg_basebackup");
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| pg::pg_error("pg_basebackup", "(instance)", "no stdout pipe"))
        .and_then(|s| {
            pg::stdout_file(s)
                .map_err(|e| pg::pg_error("pg_basebackup", "(instance)", e.to_string()))
        })?;
    Ok((child, stderr, stdout))
}
