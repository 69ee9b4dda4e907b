//! `dump`: every database of the instance that accepts connections (not the templates, see
//! `databases`), each as its own pg_dump stream (custom format, uncompressed, reading an
//! exported snapshot of that database) → zstd (frames with content checksums) → S3 multipart
//! upload with bounded buffers, SHA-256 on the fly; row counts read from the archive as it
//! passes (`archive`); the roles and memberships (`globals`) beside them; the manifest written
//! last. On any failure or signal the upload in progress is aborted and no manifest is
//! written, so nothing looks like a complete backup.
//!
//! Each database is consistent in itself (its own snapshot: PostgreSQL snapshots do not cross
//! databases), not with the others. The databases are listed once, at the start: one dropped
//! before its turn fails the backup; one created after the listing is not in this backup.
//!
//! With `--jobs N` > 1 each database is dumped by the parallel streams of `streams`, all on
//! that database's one exported snapshot, each its own object (the manifest's `parts`).
//!
//! Memory: the databases are dumped one after another; per stream, one part is being filled,
//! one waits in a channel of capacity 1, and at most `concurrency` parts are in flight: about
//! (concurrency + 2) × part size per stream, whatever the databases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::archive::RowCounter;
use crate::crypto::{self, Key};
use crate::databases::{self, Listed};
use crate::error::{Error, Result};
use crate::globals;
use crate::layout::{self, GLOBALS_FILE, Layout};
use crate::manifest::{
    self, DatabaseDump, DumpPart, EncryptionInfo, GlobalsInfo, MAX_MANIFEST_BYTES, Manifest,
    Stored, TableCopy, object_context,
};
use crate::pg::{self, PgTools, PsqlSession};
use crate::result::BackupResult;
use crate::retention::Policy;
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::streams::{self, Producer, Stream, Table};
use crate::upload::{Compressed, compress, upload_parts};

/// Parts are planned for at most this many (S3 allows 10,000), leaving headroom.
const PLANNED_PARTS: u64 = 9_000;

/// The part size for a database of `db_size` bytes on disk: the requested size, raised so
/// that even a dump twice the database's size (bytea is dumped as hex) fits in the planned
/// number of parts, rounded up to whole MiB. Pure.
pub fn part_size_for(requested: usize, db_size: u64) -> usize {
    let needed = db_size.saturating_mul(2).div_ceil(PLANNED_PARTS);
    let needed = needed.div_ceil(1 << 20).saturating_mul(1 << 20);
    requested.max(usize::try_from(needed).unwrap_or(usize::MAX).min(5 << 30))
}

#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub compression_level: i32,
    pub compression_threads: u32,
    pub part_size: usize,
    pub concurrency: usize,
    pub backup_id: Option<String>,
    pub policy: Policy,
    pub incomplete_grace: Duration,
    /// Encrypt every object with this key (`crypto`); `None`: stored as before, in the clear.
    pub key: Option<Key>,
    /// pg_dump streams per database (`streams`): 1 dumps each database as one object.
    pub jobs: usize,
    /// With `jobs` > 1, tables larger than this may be dumped in slices (`slices`).
    pub split_above: u64,
}

/// The uploads in progress (one per stream), remembered so they can be aborted whatever
/// happens.
type PendingUpload = Arc<Mutex<Vec<(String, String)>>>;

/// Runs `dump`, filling `result` as facts become known (so a failure still names them).
pub async fn dump(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &DumpOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
) -> Result<()> {
    let pending: PendingUpload = Arc::default();
    let outcome = tokio::select! {
        r = dump_inner(store, layout, tools, opts, result, &pending) => r,
        s = interrupt.wait() => Err(Error::Interrupted(s)),
    };
    if outcome.is_err() {
        let uploads = pending.lock().map(|mut p| std::mem::take(&mut *p));
        for (key, upload_id) in uploads.unwrap_or_default() {
            abort_upload(store, &key, &upload_id).await;
        }
    }
    outcome
}

/// Aborts one multipart upload of a failed dump; what cannot be aborted is left to prune.
async fn abort_upload(store: &Store, key: &str, upload_id: &str) {
    match tokio::time::timeout(Duration::from_secs(15), store.abort_upload(key, upload_id)).await {
        Ok(Ok(())) => tracing::info!(key, "multipart upload aborted"),
        Ok(Err(e)) => {
            tracing::error!(key, error = %e, "could not abort the multipart upload; prune removes it after the grace period")
        }
        Err(_) => tracing::error!(
            key,
            "aborting the multipart upload timed out; prune removes it after the grace period"
        ),
    }
}

/// The dump, step by step: name it, open the snapshot, skip it if it exists, stream
/// pg_dump → zstd → S3, check the stored object, write the manifest, prune.
async fn dump_inner(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &DumpOptions,
    result: &mut BackupResult,
    pending: &PendingUpload,
) -> Result<()> {
    let started = Utc::now();
    let clock = Instant::now();
    result.started_at = Some(started);
    result.bucket = Some(store.bucket.clone());
    let backup_id = choose_backup_id(opts, started)?;
    result.backup_id = Some(backup_id.clone());
    let (session, server) = open_snapshot(tools, None).await?;
    layout::validate_database_name(&server.database).map_err(Error::Usage)?;
    let target = Target::new(layout, &server.database, &backup_id);
    target.note(&server, result);

    store.check_bucket().await?;
    if let Some(m) = already_complete(store, &target, opts.key.as_ref()).await? {
        let _ = session.finish().await;
        m.fill_result(result);
        result.message = Some(format!(
            "backup {backup_id} of database '{}' was already complete; not dumped again",
            server.database
        ));
        return Ok(());
    }
    // The databases and the roles, read before the dumps (a failure costs no upload).
    let listed = list_databases(tools, &server.database).await?;
    result.databases = u32::try_from(listed.len()).ok();
    let globals = globals::collect(tools).await?;
    let engine_version = server.engine_version.clone();
    let dumps = dump_all(
        store,
        tools,
        opts,
        &target,
        &listed,
        (session, server),
        pending,
    )
    .await?;
    let mut m = manifest_of(opts, &target, &engine_version, started, dumps);
    m.globals = Some(store_globals(store, &target, globals, opts.key.as_ref()).await?);
    store
        .put(
            &target.manifest_key,
            Bytes::from(m.to_stored(opts.key.as_ref())),
            "application/json",
        )
        .await?;
    m.fill_result(result);
    let mut message = completion_message(&m, clock.elapsed());
    if let Some(pruned) = prune_after(store, layout, &m.database, opts).await {
        message.push_str(&format!("; {pruned}"));
    }
    result.message = Some(message);
    Ok(())
}

/// The databases to dump, the connected (application) database first.
async fn list_databases(tools: &PgTools, connected: &str) -> Result<Vec<Listed>> {
    let listed = databases::list(tools).await?;
    match listed.first() {
        Some(first) if first.name == connected => Ok(listed),
        _ => Err(pg::pg_error(
            "psql",
            connected,
            "the database list does not start with the connected database",
        )),
    }
}

/// Dumps the listed databases one after another (bounded memory: one upload at a time), the
/// first in the snapshot already open, each other one in a snapshot of its own.
async fn dump_all(
    store: &Store,
    tools: &PgTools,
    opts: &DumpOptions,
    target: &Target,
    listed: &[Listed],
    first: (PsqlSession, ServerFacts),
    pending: &PendingUpload,
) -> Result<Vec<DatabaseDump>> {
    let mut dumps = Vec::with_capacity(listed.len());
    let mut first = Some(first);
    for (index, db) in listed.iter().enumerate() {
        let (mut session, server) = match first.take() {
            Some(open) => open,
            None => open_listed(tools, &db.name).await?,
        };
        // An encrypted backup's object names do not give the databases' names away.
        let file = match (&opts.key, index) {
            (Some(_), 1..) => format!("db-{index:03}.pgc.zst"),
            _ => databases::dump_file_name(index, &db.name),
        };
        let dump = dump_database(
            store,
            tools,
            opts,
            target,
            &file,
            &mut session,
            &server,
            pending,
        )
        .await?;
        session.finish().await?;
        dumps.push(DatabaseDump {
            name: db.name.clone(),
            definition: Some(db.definition.clone()),
            ..dump
        });
    }
    Ok(dumps)
}

/// The snapshot of a listed database other than the connected one: a database dropped since
/// the listing fails the backup, saying so.
async fn open_listed(tools: &PgTools, name: &str) -> Result<(PsqlSession, ServerFacts)> {
    match open_snapshot(tools, Some(name)).await {
        Ok((session, server)) if server.database == name => Ok((session, server)),
        Ok((session, server)) => {
            let _ = session.finish().await;
            Err(pg::pg_error(
                "psql",
                name,
                format!("connected to {:?} instead", server.database),
            ))
        }
        Err(e) => Err(pg::pg_error(
            "pg_dump",
            name,
            format!(
                "database {name:?} was listed for this backup but cannot be dumped (dropped since?); no manifest written: {e}"
            ),
        )),
    }
}

/// Stores the globals script beside the dump (before the manifest, which makes it count),
/// encrypted with `key` when there is one; its size and SHA-256 are of what is stored.
async fn store_globals(
    store: &Store,
    target: &Target,
    script: String,
    key: Option<&Key>,
) -> Result<GlobalsInfo> {
    let roles = globals::role_count(&script);
    let stored = match key {
        Some(k) => crypto::seal(
            k,
            &object_context(&target.backup_id, GLOBALS_FILE),
            script.as_bytes(),
        ),
        None => script.into_bytes(),
    };
    let info = GlobalsInfo {
        file: GLOBALS_FILE.into(),
        size_bytes: stored.len() as u64,
        sha256: hex::encode(Sha256::digest(&stored)),
        roles,
    };
    store
        .put(&target.globals_key, Bytes::from(stored), "application/sql")
        .await?;
    Ok(info)
}

/// The id given with `--backup-id` (validated), or the start time's.
fn choose_backup_id(opts: &DumpOptions, started: chrono::DateTime<Utc>) -> Result<String> {
    match &opts.backup_id {
        Some(id) => {
            layout::validate_backup_id(id).map_err(Error::Usage)?;
            Ok(id.clone())
        }
        None => Ok(layout::backup_id_at(started)),
    }
}

/// What the server said in the snapshot's transaction.
struct ServerFacts {
    database: String,
    engine_version: String,
    server_major: Option<u32>,
    /// `pg_database_size`, for the part size.
    db_size: u64,
    /// The exported snapshot pg_dump imports.
    snapshot: String,
    /// `server_encoding`, in which slices are dumped and restored.
    encoding: String,
}

/// Where one backup's objects go.
struct Target {
    backup_id: String,
    /// The backup folder, ending in `/`.
    prefix: String,
    dump_key: String,
    manifest_key: String,
    globals_key: String,
}

impl Target {
    /// Says in the result where the backup goes, before anything can fail.
    fn note(&self, server: &ServerFacts, result: &mut BackupResult) {
        result.database = Some(server.database.clone());
        result.engine_version = Some(server.engine_version.clone());
        result.key = Some(self.dump_key.clone());
        result.manifest_key = Some(self.manifest_key.clone());
    }

    fn new(layout: &Layout, database: &str, backup_id: &str) -> Target {
        Target {
            backup_id: backup_id.to_string(),
            prefix: layout.backup_prefix(database, backup_id),
            dump_key: layout.dump_key(database, backup_id),
            manifest_key: layout.manifest_key(database, backup_id),
            globals_key: layout.globals_key(database, backup_id),
        }
    }
}

/// One transaction whose snapshot pg_dump imports; kept open until the dump is stored, so rows
/// can still be counted in it should the archive not be readable. A session that could not
/// connect for a passing reason is opened again (it is read-only: nothing ran).
async fn open_snapshot(
    tools: &PgTools,
    database: Option<&str>,
) -> Result<(PsqlSession, ServerFacts)> {
    pg::patiently(&pg::database_label(database), || async {
        match try_open_snapshot(tools, database).await {
            Err(Error::Postgres { detail, .. }) if pg::never_connected_transiently(&detail) => {
                Ok(Err(detail))
            }
            opened => opened.map(Ok),
        }
    })
    .await
}

async fn try_open_snapshot(
    tools: &PgTools,
    database: Option<&str>,
) -> Result<(PsqlSession, ServerFacts)> {
    let mut session = PsqlSession::start(tools, database).await?;
    let facts = session
        .query(
            "SET row_security = off;\n\
             BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;\n\
             SELECT to_json(current_database())::text;\n\
             SELECT current_setting('server_version');\n\
             SELECT current_setting('server_version_num');\n\
             SELECT pg_database_size(current_database());\n\
             SELECT current_setting('server_encoding');\n\
             SELECT pg_export_snapshot();",
        )
        .await?;
    let [
        database,
        server_version,
        version_num,
        db_size,
        encoding,
        snapshot,
    ] = facts.as_slice()
    else {
        return Err(pg::pg_error(
            "psql",
            &pg::database_label(database),
            format!("unexpected session output: {} lines", facts.len()),
        ));
    };
    let database: String = serde_json::from_str(database).map_err(|e| {
        pg::pg_error(
            "psql",
            "(unknown)",
            format!("unexpected database name: {e}"),
        )
    })?;
    let server = ServerFacts {
        database,
        engine_version: pg::short_version(server_version),
        server_major: pg::major_of_version_num(version_num),
        db_size: db_size.trim().parse().unwrap_or(0),
        snapshot: snapshot.clone(),
        encoding: encoding.clone(),
    };
    Ok((session, server))
}

/// The manifest of a backup with this id that was already completed (a retried Job); a
/// sealed one is opened with the dump's key.
async fn already_complete(
    store: &Store,
    target: &Target,
    key: Option<&Key>,
) -> Result<Option<Manifest>> {
    let Some(existing) = store
        .get_small(&target.manifest_key, MAX_MANIFEST_BYTES)
        .await?
    else {
        return Ok(None);
    };
    let integrity = |detail: String| Error::Integrity {
        key: target.manifest_key.clone(),
        detail: format!(
            "a backup with id {} exists but its {detail}",
            target.backup_id
        ),
    };
    match Stored::parse(&existing).map_err(integrity)? {
        Stored::Plain(m) => Ok(Some(m)),
        Stored::Sealed(sealed) => {
            let key = crate::restore::key_for(&sealed, key)?;
            sealed.open(&key).map(Some).map_err(integrity)
        }
    }
}

/// One database's dump in its snapshot: one stream, or (`--jobs` > 1) the streams of
/// `streams::plan` run at once, each its own object. The row counts are read from the archives
/// as they stream past; should the agent not read one (a pg_dump format it does not know),
/// they are counted by the server in the same snapshot instead, which `session` still holds.
#[allow(clippy::too_many_arguments)]
async fn dump_database(
    store: &Store,
    tools: &PgTools,
    opts: &DumpOptions,
    target: &Target,
    file: &str,
    session: &mut PsqlSession,
    server: &ServerFacts,
    pending: &PendingUpload,
) -> Result<DatabaseDump> {
    if let Some(major) = server.server_major {
        tools
            .check_version("pg_dump", major, &server.database)
            .await?;
    }
    let (plan, counted) = match opts.jobs {
        0 | 1 => (streams::plan(&[], 1, 0, None), None),
        jobs => {
            let (tables, other_bytes) = tables_of(session, &server.database).await?;
            // Without TID range scans, every slice would read the whole table.
            let split_above = server
                .server_major
                .is_some_and(|major| major >= SLICES_SINCE)
                .then_some(opts.split_above);
            let counted: BTreeSet<String> = tables.iter().map(|t| t.counted_as.clone()).collect();
            let plan = streams::plan(&tables, jobs, other_bytes, split_above);
            (plan, Some(counted))
        }
    };
    let streamed = stream_lanes(store, tools, opts, (target, file), server, pending, &plan).await?;
    let mut row_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut parts = Vec::with_capacity(streamed.len());
    let mut uncounted = None;
    for (index, file, compressed, counted) in streamed {
        match counted {
            // A sliced table's rows are in several parts.
            Ok(counts) => counts
                .into_iter()
                .for_each(|(table, rows)| *row_counts.entry(table).or_default() += rows),
            Err(e) => uncounted = Some(e),
        }
        parts.push(DumpPart {
            file,
            raw_bytes: compressed.raw_bytes,
            size_bytes: compressed.size_bytes,
            sha256: compressed.sha256,
            copy: table_copy(&plan.streams[index], &server.encoding),
        });
    }
    if let Some(counted) = counted.filter(|_| plan.streams.len() > 1) {
        // The parts count extension members' configuration tables too; the manifest counts
        // what `pg::ROW_COUNT_SQL` counts.
        row_counts.retain(|name, _| counted.contains(name));
    }
    if let Some(e) = uncounted {
        tracing::warn!(error = %e, "rows not counted from the dump stream; counting them in the snapshot");
        row_counts = session.row_counts().await?;
    }
    Ok(database_dump(parts, row_counts))
}

/// Every stream of `plan`, its lanes at once and each lane's streams one after another;
/// returned in restore order with what each compressor saw and counted.
async fn stream_lanes(
    store: &Store,
    tools: &PgTools,
    opts: &DumpOptions,
    (target, file): (&Target, &str),
    server: &ServerFacts,
    pending: &PendingUpload,
    plan: &streams::Plan,
) -> Result<Vec<Streamed>> {
    let run = |index: usize| {
        let stream = &plan.streams[index];
        let file = stream.file_name(index, file);
        async move {
            let key = format!("{}{file}", target.prefix);
            let (compressed, counted) = stream_dump(
                store,
                tools,
                opts,
                server,
                stream,
                (&key, &target.backup_id, &file),
                pending,
            )
            .await?;
            Ok::<_, Error>((index, file, compressed, counted))
        }
    };
    let run = &run;
    let lanes = plan.lanes.iter().map(|lane| async move {
        let mut done = Vec::with_capacity(lane.len());
        for &index in lane {
            done.push(run(index).await?);
        }
        Ok::<_, Error>(done)
    });
    let mut streamed: Vec<Streamed> = futures::future::try_join_all(lanes)
        .await?
        .into_iter()
        .flatten()
        .collect();
    streamed.sort_by_key(|(index, ..)| *index);
    Ok(streamed)
}

/// One stream's index in the plan, file name, compressed output and row counts (or why not).
type Streamed = (
    usize,
    String,
    Compressed,
    std::result::Result<BTreeMap<String, u64>, String>,
);

/// Slices need TID range scans (PostgreSQL 14).
const SLICES_SINCE: u32 = 14;

/// Where a slice's rows are restored (`None` for a pg_dump archive).
fn table_copy(stream: &Stream, encoding: &str) -> Option<TableCopy> {
    match stream {
        Stream::Slice(t, _) => Some(TableCopy {
            schema: t.schema.clone(),
            table: t.name.clone(),
            columns: t.columns.clone(),
            encoding: encoding.to_string(),
        }),
        _ => None,
    }
}

/// A database's dump of these objects: one, or parts whose sizes add up.
fn database_dump(mut parts: Vec<DumpPart>, row_counts: BTreeMap<String, u64>) -> DatabaseDump {
    let (raw_bytes, size_bytes) = DumpPart::sizes(&parts);
    debug_assert!(!parts.is_empty(), "a dump has at least one object");
    let first = parts.first().cloned().unwrap_or(DumpPart {
        file: String::new(),
        raw_bytes: 0,
        size_bytes: 0,
        sha256: String::new(),
        copy: None,
    });
    if parts.len() < 2 {
        parts.clear();
    }
    DatabaseDump {
        name: String::new(),
        dump_file: first.file,
        raw_bytes,
        size_bytes,
        sha256: first.sha256,
        row_counts,
        definition: None,
        parts,
    }
}

/// The tables whose rows pg_dump dumps and the large objects' size, as the snapshot's
/// session sees them.
async fn tables_of(session: &mut PsqlSession, database: &str) -> Result<(Vec<Table>, u64)> {
    let lines = session.query(streams::TABLES_SQL).await?;
    streams::parse_tables(&lines)
        .map_err(|e| pg::pg_error("psql", database, format!("unexpected table list: {e}")))
}

/// Streams one stream (pg_dump's, or a slice's `COPY`) through zstd into a multipart upload,
/// completes it and checks the stored size. Returns what the compressor saw and the row counts it read in the archive
/// (or why it could not).
async fn stream_dump(
    store: &Store,
    tools: &PgTools,
    opts: &DumpOptions,
    server: &ServerFacts,
    stream: &Stream,
    (key, backup_id, file): (&str, &str, &str),
    pending: &PendingUpload,
) -> Result<(
    Compressed,
    std::result::Result<BTreeMap<String, u64>, String>,
)> {
    let database = &server.database;
    tracing::info!(database, backup_id, key, "dump starting");
    let upload_id = begin_upload(store, key, pending).await?;
    let (program, producer) = match stream.producer(&server.snapshot, &server.encoding) {
        Producer::PgDump(args) => ("pg_dump", spawn_pg_dump(tools, server, &args)?),
        Producer::Copy(script) => ("psql", spawn_copy(tools, server, script)?),
    };
    let (child, stderr, stdout) = producer;
    let part_size = part_size_for(opts.part_size, server.db_size);
    if part_size != opts.part_size {
        tracing::info!(part_size, "part size raised to stay within 10,000 parts");
    }
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let level = (opts.compression_level, opts.compression_threads);
    let sealing = opts
        .key
        .clone()
        .map(|k| (k, object_context(backup_id, file)));
    let counter = match stream {
        Stream::Whole => RowCounter::new(),
        Stream::Slice(table, _) => RowCounter::copy_lines(&table.counted_as),
        _ => RowCounter::every_table(),
    };
    let compressor = tokio::task::spawn_blocking(move || {
        compress(stdout, level, part_size, sealing, (tx, counter))
    });
    let parts = upload_parts(store, key, &upload_id, rx, opts.concurrency).await?;
    let compressed = compressor
        .await
        .map_err(|e| Error::io("compressor", std::io::Error::other(e.to_string())))?;
    wait_producer(child, stderr, program, database).await?;
    let (compressed, counted) = compressed.map_err(|e| Error::io("reading the dump stream", e))?;
    store.complete_upload(key, &upload_id, parts).await?;
    if let Ok(mut p) = pending.lock() {
        p.retain(|(k, _)| k != key);
    }
    check_stored_size(store, key, compressed.size_bytes).await?;
    Ok((compressed, counted.map_err(|e| e.to_string())))
}

/// Starts the multipart upload, remembered in `pending` so it is aborted if the dump fails.
async fn begin_upload(store: &Store, key: &str, pending: &PendingUpload) -> Result<String> {
    let upload_id = store.create_upload(key, "application/zstd").await?;
    if let Ok(mut p) = pending.lock() {
        p.push((key.to_string(), upload_id.clone()));
    }
    Ok(upload_id)
}

/// The producer's exit (pg_dump's or psql's): a failure says why in its own words (the tail
/// of its stderr).
async fn wait_producer(
    mut child: tokio::process::Child,
    stderr: tokio::task::JoinHandle<String>,
    program: &str,
    database: &str,
) -> Result<()> {
    let status = child
        .wait()
        .await
        .map_err(|e| pg::pg_error(program, database, e.to_string()))?;
    let stderr_tail = stderr.await.unwrap_or_default();
    if !status.success() {
        return Err(pg::pg_error(
            program,
            database,
            format!("{status}: {}", pg::tail_text(&stderr_tail)),
        ));
    }
    Ok(())
}

/// pg_dump in the custom format, uncompressed (zstd does that), on the exported snapshot: the
/// stream's part of the dump.
fn spawn_pg_dump(tools: &PgTools, server: &ServerFacts, args: &[String]) -> Result<Producing> {
    let database = &server.database;
    let mut child = tools
        .command("pg_dump", server.server_major)
        .args([
            "--format=custom",
            "--compress=0",
            "--no-password",
            "--snapshot",
        ])
        .arg(&server.snapshot)
        .args(args)
        .env("PGDATABASE", database)
        .spawn()
        .map_err(|e| pg::pg_error("pg_dump", database, format!("cannot run pg_dump: {e}")))?;
    let stderr = pg::collect_stderr(&mut child, "pg_dump");
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| pg::pg_error("pg_dump", database, "no stdout pipe"))
        .and_then(|s| {
            pg::stdout_file(s).map_err(|e| pg::pg_error("pg_dump", database, e.to_string()))
        })?;
    Ok((child, stderr, stdout))
}

/// A running producer of a stream: the process, its stderr's tail to come, its stdout.
type Producing = (
    tokio::process::Child,
    tokio::task::JoinHandle<String>,
    std::fs::File,
);

/// psql running a slice's session script (given on its input, so nothing of it is on a
/// command line): the slice's rows in `COPY` text on its output.
fn spawn_copy(tools: &PgTools, server: &ServerFacts, script: String) -> Result<Producing> {
    use tokio::io::AsyncWriteExt;
    let database = &server.database;
    let failed = |e: String| pg::pg_error("psql", database, e);
    let mut child = tools
        .command("psql", server.server_major)
        .args(["-X", "-w", "-q", "-v", "ON_ERROR_STOP=1"])
        .env("PGDATABASE", database)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot run psql: {e}")))?;
    let stderr = pg::collect_stderr(&mut child, "psql");
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| failed("no stdin pipe".into()))?;
    // Written apart from the reading: a long column list may not fit in the pipe at once.
    tokio::spawn(async move {
        let _ = stdin.write_all(script.as_bytes()).await;
    });
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| failed("no stdout pipe".into()))
        .and_then(|s| pg::stdout_file(s).map_err(|e| failed(e.to_string())))?;
    Ok((child, stderr, stdout))
}

/// The stored object must have exactly the bytes that were uploaded.
pub(crate) async fn check_stored_size(store: &Store, key: &str, uploaded: u64) -> Result<()> {
    let stored = store.head(key).await?;
    if stored != Some(uploaded) {
        return Err(Error::Integrity {
            key: key.to_string(),
            detail: format!("stored object has {stored:?} bytes, {uploaded} were uploaded"),
        });
    }
    Ok(())
}

/// The manifest of the dumps (the first, the application database's, also in the top-level
/// fields older agents read).
fn manifest_of(
    opts: &DumpOptions,
    target: &Target,
    engine_version: &str,
    started: chrono::DateTime<Utc>,
    mut dumps: Vec<DatabaseDump>,
) -> Manifest {
    let sliced = dumps
        .iter()
        .flat_map(|d| &d.parts)
        .any(|p| p.copy.is_some());
    let format = match dumps.iter().any(|d| !d.parts.is_empty()) {
        true if sliced => manifest::FORMAT_SLICED,
        true => manifest::FORMAT_PARTS,
        false => manifest::FORMAT,
    };
    let first = (!dumps.is_empty()).then(|| dumps.remove(0));
    let first = first.unwrap_or_else(|| DatabaseDump {
        name: String::new(),
        dump_file: layout::DUMP_FILE.into(),
        raw_bytes: 0,
        size_bytes: 0,
        sha256: String::new(),
        row_counts: BTreeMap::new(),
        definition: None,
        parts: vec![],
    });
    Manifest {
        manifest_version: manifest::MANIFEST_VERSION,
        backup_id: target.backup_id.clone(),
        database: first.name,
        engine: "postgresql".into(),
        engine_version: engine_version.to_string(),
        started_at: started,
        completed_at: Utc::now(),
        raw_bytes: first.raw_bytes,
        size_bytes: first.size_bytes,
        sha256: first.sha256,
        format: format.into(),
        compression: manifest::COMPRESSION.into(),
        compression_level: opts.compression_level,
        agent_version: crate::AGENT_VERSION.into(),
        dump_file: first.dump_file,
        row_counts: first.row_counts,
        parts: first.parts,
        globals: None,
        definition: first.definition,
        other_databases: dumps,
        encryption: opts.key.as_ref().map(|k| EncryptionInfo {
            algorithm: crypto::ALGORITHM.into(),
            key_name: k.name.clone(),
            key_fingerprint: k.fingerprint(),
        }),
    }
}

fn completion_message(m: &Manifest, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    tracing::info!(
        database = m.database,
        backup_id = m.backup_id,
        raw_bytes = m.raw_bytes,
        size_bytes = m.size_bytes,
        secs,
        "dump complete"
    );
    let dumps = m.dumps();
    let raw: u64 = dumps.iter().map(|d| d.raw_bytes).sum();
    let stored: u64 = dumps.iter().map(|d| d.size_bytes).sum();
    let tables: usize = dumps.iter().map(|d| d.row_counts.len()).sum();
    let objects: usize = dumps.iter().map(|d| d.objects().len()).sum();
    format!(
        "backup {} of database '{}' complete: {} databases in {objects} objects, {raw} raw bytes, {stored} stored, {tables} tables, {:.1} MB/s",
        m.backup_id,
        m.database,
        dumps.len(),
        raw as f64 / secs / 1e6
    )
}

/// Applies `--keep-last`/`--max-age` after a successful dump; a failed prune is reported in
/// the message, never fails the dump.
async fn prune_after(
    store: &Store,
    layout: &Layout,
    database: &str,
    opts: &DumpOptions,
) -> Option<String> {
    if opts.policy.is_empty() {
        return None;
    }
    let pruned = crate::prune::prune_database(
        store,
        layout,
        database,
        opts.policy,
        opts.incomplete_grace,
        false,
    )
    .await;
    Some(crate::prune::after_backup_message(pruned, "dump"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes() {
        const MIB: usize = 1 << 20;
        let cases: [(usize, u64, usize); 5] = [
            (8 * MIB, 0, 8 * MIB),
            (8 * MIB, 10 << 30, 8 * MIB),
            (8 * MIB, 100 << 30, 23 * MIB),
            (64 * MIB, 100 << 30, 64 * MIB),
            (8 * MIB, u64::MAX, 5 << 30),
        ];
        for (requested, db, want) in cases {
            assert_eq!(part_size_for(requested, db), want, "{requested} {db}");
        }
    }
}
