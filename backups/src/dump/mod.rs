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
//!
//! This module lists, opens and records the databases; `stream` dumps one of them.

mod stream;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::Utc;
use sha2::{Digest, Sha256};

use crate::crypto::{self, Key};
use crate::databases::{self, Listed};
use crate::error::{Error, Result};
use crate::globals;
use crate::layout::{self, GLOBALS_FILE, Layout};
use crate::manifest::{
    self, DatabaseDump, EncryptionInfo, GlobalsInfo, MAX_MANIFEST_BYTES, Manifest, Stored,
    object_context,
};
use crate::pg::{self, PgTools, PsqlSession};
use crate::result::BackupResult;
use crate::retention::Policy;
use crate::s3::Store;
use crate::signals::Interrupt;
pub(crate) use stream::check_stored_size;
use stream::dump_database;

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
