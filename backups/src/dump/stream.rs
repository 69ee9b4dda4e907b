//! One database's dump in its snapshot: the streams `streams::plan` makes of it, lane by lane,
//! each from its producer (pg_dump, or psql's `COPY` of a table's slice) through zstd into a
//! multipart upload of its own, and the row counts read on the way.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{DumpOptions, PendingUpload, ServerFacts, Target, part_size_for};
use crate::archive::RowCounter;
use crate::error::{Error, Result};
use crate::manifest::{DatabaseDump, DumpPart, TableCopy, object_context};
use crate::pg::{self, PgTools, PsqlSession};
use crate::s3::Store;
use crate::streams::{self, Producer, Stream, Table};
use crate::upload::{Compressed, compress, upload_parts};

/// One database's dump in its snapshot: one stream, or (`--jobs` > 1) the streams of
/// `streams::plan` run at once, each its own object. The row counts are read from the archives
/// as they stream past; should the agent not read one (a pg_dump format it does not know),
/// they are counted by the server in the same snapshot instead, which `session` still holds.
#[allow(clippy::too_many_arguments)]
pub(super) async fn dump_database(
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
