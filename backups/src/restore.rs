//! `restore` (and, for `verify`, one database's restore): download → SHA-256 and size check → zstd decode (frame checksums
//! checked) → pg_restore in one transaction, streaming; `restore` first refuses a dump of a
//! newer major version and recreates the backup's roles (`globals`). The SHA-256 is only known at the end,
//! so the last decoded bytes are held back until it matches: pg_restore cannot reach the end
//! of the archive, hence cannot commit, before the whole object has been checked. On any
//! mismatch or error pg_restore is killed before its input is closed, and the target database
//! is left as it was.

use std::io::{Read, Write};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::catalog;
use crate::crypto::{self, Decrypt, Key, KeyRing};
use crate::databases::{self, Step};
use crate::error::{Error, Result};
use crate::globals;
use crate::layout::{self, Layout};
use crate::manifest::{
    DatabaseDump, GlobalsInfo, MAX_MANIFEST_BYTES, Manifest, SealedManifest, Stored, object_context,
};
use crate::pg::{self, PgTools};
use crate::result::BackupResult;
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::upload::Sealing;

/// Decoded bytes held back from pg_restore until the object's checksum has been checked.
pub const HOLD_BACK: usize = 64 << 10;
const CHUNK: usize = 256 << 10;

#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Backup id or `latest`.
    pub backup: String,
    pub source_database: Option<String>,
    /// Target; `None` means PGDATABASE.
    pub target_database: Option<String>,
    pub no_owner: bool,
    pub no_acl: bool,
    /// Recreate the backup's roles and memberships before the data (not for `verify`, whose
    /// scratch database shares the source's server and roles).
    pub restore_globals: bool,
    /// Restore only this one of the backup's databases, into the target (`--database`); `None`:
    /// every database, the backup's own into the target and each other one under its name.
    pub only_database: Option<String>,
    /// Where the encryption keys are (`--encryption-key-dir`): an encrypted backup is read
    /// with the key its manifest names.
    pub keys: Option<KeyRing>,
}

pub(crate) fn env_database() -> Option<String> {
    std::env::var("PGDATABASE").ok().filter(|d| !d.is_empty())
}

/// Finds the backup (resolving `latest`) and reads its manifest: a sealed one is opened with
/// the key it names, from `keys`, which is returned for its objects.
pub async fn resolve(
    store: &Store,
    layout: &Layout,
    source: &str,
    backup: &str,
    keys: Option<&KeyRing>,
) -> Result<(String, Manifest, Option<Key>)> {
    layout::validate_database_name(source).map_err(Error::Usage)?;
    let id = if backup == "latest" {
        let objects = store.list(&layout.database_prefix(source)).await?;
        let entries = catalog::group(layout, &objects);
        catalog::latest(&entries, source)
            .map(|e| e.backup_id.clone())
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "no complete backup of database '{source}' in bucket '{}' under '{}' at {}",
                    store.bucket,
                    layout.database_prefix(source),
                    store.endpoint
                ))
            })?
    } else {
        layout::validate_backup_id(backup).map_err(Error::Usage)?;
        backup.to_string()
    };
    let manifest_key = layout.manifest_key(source, &id);
    let bytes = store
        .get_small(&manifest_key, MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "backup {id} of database '{source}' has no manifest in bucket '{}' at {}: it is missing or incomplete",
                store.bucket, store.endpoint
            ))
        })?;
    let integrity = |detail| Error::Integrity {
        key: manifest_key.clone(),
        detail,
    };
    match Stored::parse(&bytes).map_err(integrity)? {
        Stored::Plain(m) => Ok((id, m, None)),
        Stored::Sealed(sealed) => {
            let key = key_from_ring(&sealed, keys)?;
            let m = sealed.open(&key).map_err(integrity)?;
            Ok((id, m, Some(key)))
        }
    }
}

/// What to do about a missing or wrong key, in every refusal.
const KEY_FIX: &str = "in dbop, `encryption.secretName` must name a Secret holding that key under that name (keep old keys in the Secret when you rotate); nothing was read from the backup";

/// The key a sealed manifest names, read from the key directory. A missing directory or key,
/// a malformed key or a different key under that name is refused before anything is
/// decrypted, saying which key (name and fingerprint) the backup needs.
pub(crate) fn key_from_ring(sealed: &SealedManifest, keys: Option<&KeyRing>) -> Result<Key> {
    let info = &sealed.encryption;
    let needs = format!(
        "backup {} is encrypted with key {:?} (fingerprint {})",
        sealed.backup_id, info.key_name, info.key_fingerprint
    );
    let Some(ring) = keys else {
        return Err(Error::Key(format!(
            "{needs}, and no key was given: pass --encryption-key-dir with a file named {:?}; {KEY_FIX}",
            info.key_name
        )));
    };
    let key = ring
        .get(&info.key_name)
        .map_err(|e| Error::Key(format!("{needs}: {e}; {KEY_FIX}")))?;
    key_for(sealed, Some(&key))
}

/// `given` if it is the key the sealed manifest names (same name and fingerprint).
pub(crate) fn key_for(sealed: &SealedManifest, given: Option<&Key>) -> Result<Key> {
    let info = &sealed.encryption;
    let needs = format!(
        "backup {} is encrypted with key {:?} (fingerprint {})",
        sealed.backup_id, info.key_name, info.key_fingerprint
    );
    match given {
        None => Err(Error::Key(format!(
            "{needs}, and no key was given; {KEY_FIX}"
        ))),
        Some(k) if k.name != info.key_name => Err(Error::Key(format!(
            "{needs}, not with key {:?}; {KEY_FIX}",
            k.name
        ))),
        Some(k) if k.fingerprint() != info.key_fingerprint => Err(Error::Key(format!(
            "{needs}, but the key under that name now has fingerprint {}: it holds other bytes than the key the backup was written with (put the original key back, under this or another name); {KEY_FIX}",
            k.fingerprint()
        ))),
        Some(k) => Ok(k.clone()),
    }
}

/// Restores a backup: its application database into the target database, each other database
/// into a database of its own name (created, unless the server has it empty). On failure the
/// databases this run created are dropped again, so a retry starts from the same server.
pub async fn restore(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &RestoreOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
) -> Result<Manifest> {
    let mut created = Vec::new();
    let outcome = tokio::select! {
        r = restore_inner(store, layout, tools, opts, result, &mut created) => r,
        s = interrupt.wait() => Err(Error::Interrupted(s)),
    };
    if outcome.is_err() {
        let maintenance = result.database.clone();
        for name in created.iter().rev() {
            drop_database(tools, maintenance.as_deref(), name).await;
        }
    }
    outcome
}

/// Drops a database, logging (not failing on) an error.
async fn drop_database(tools: &PgTools, from: Option<&str>, name: &str) {
    let sql = format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        databases::quote_ident(name)
    );
    match tools.query(from, &sql).await {
        Ok(_) => tracing::info!(database = name, "database dropped"),
        Err(e) => tracing::error!(database = name, error = %e, "could not drop the database"),
    }
}

/// The restore, step by step: find the backup, reach the target (refusing a dump of a newer
/// major), map the backup's databases onto the server and check every object (both before
/// anything is created), recreate the roles, then each database: create it, stream S3 →
/// pg_restore (one transaction) while hashing, judge how it ended.
async fn restore_inner(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &RestoreOptions,
    result: &mut BackupResult,
    created: &mut Vec<String>,
) -> Result<Manifest> {
    result.started_at = Some(chrono::Utc::now());
    result.bucket = Some(store.bucket.clone());
    let (target, source) = databases(tools, opts).await?;
    result.database = Some(target.clone());
    let (id, m, key) = resolve(store, layout, &source, &opts.backup, opts.keys.as_ref()).await?;
    note_backup(result, layout, &source, &id, &m);
    // Reach the target first: a bad password or missing database fails before any download.
    let (major, version) = tools.reach_target(Some(&target)).await?;
    check_major(&m, major, &version)?;
    result.engine_version = Some(version);
    let dumps = m.dumps();
    let steps = match &opts.only_database {
        Some(name) => vec![only_step(&dumps, name, &target, &id)?],
        None => plan_restore(tools, &dumps, &target).await?,
    };
    let folder = layout.backup_prefix(&source, &id);
    check_objects(store, &folder, &dumps).await?;
    let roles = match (&m.globals, opts.restore_globals) {
        (Some(g), true) => {
            let object = layout.globals_key(&source, &id);
            let sealing = key.clone().map(|k| (k, object_context(&id, &g.file)));
            restore_globals(store, tools, (&object, sealing), &target, g).await?
        }
        _ => 0,
    };
    for step in &steps {
        let dump = &dumps[step.index];
        if opts.only_database.is_none() {
            prepare_database(tools, opts, &target, step, dump, created).await?;
        }
        let object = format!("{folder}{}", dump.dump_file);
        let sealing = key
            .clone()
            .map(|k| (k, object_context(&id, &dump.dump_file)));
        let job = OneRestore {
            major,
            key: &object,
            dump,
            target: &step.target,
            sealing,
        };
        restore_one(store, tools, opts, job).await?;
    }
    result.completed_at = Some(chrono::Utc::now());
    result.message = Some(format!(
        "backup {id} of database '{source}' restored into '{target}' ({} raw bytes, sha256 checked, {roles} roles recreated; {} databases, {} created)",
        m.raw_bytes,
        dumps.len(),
        created.len()
    ));
    Ok(m)
}

/// Says in the result which backup is read.
pub(crate) fn note_backup(
    result: &mut BackupResult,
    layout: &Layout,
    source: &str,
    id: &str,
    m: &Manifest,
) {
    result.backup_id = Some(id.to_string());
    result.key = Some(layout.dump_key(source, id));
    result.manifest_key = Some(layout.manifest_key(source, id));
    result.sha256 = Some(m.sha256.clone());
    result.size_bytes = Some(m.size_bytes);
    result.raw_bytes = Some(m.raw_bytes);
    result.databases = u32::try_from(m.dumps().len()).ok();
}

/// The one step of `--database NAME`: that database's dump into the target, as it is (its
/// definition's owner and settings are the source's, not the target's).
fn only_step(dumps: &[DatabaseDump], name: &str, target: &str, id: &str) -> Result<Step> {
    let index = dumps.iter().position(|d| d.name == name).ok_or_else(|| {
        let names: Vec<&str> = dumps.iter().map(|d| d.name.as_str()).collect();
        Error::Usage(format!(
            "backup {id} has no database {name:?} (it has {}); nothing was restored",
            names.join(", ")
        ))
    })?;
    Ok(Step {
        index,
        target: target.to_string(),
        create: false,
    })
}

/// Where each of the backup's databases goes: a backup of one database (every backup of an
/// older agent) goes into the target as before; otherwise `databases::plan` decides from the
/// server's databases, refusing before anything is created.
async fn plan_restore(tools: &PgTools, dumps: &[DatabaseDump], target: &str) -> Result<Vec<Step>> {
    if dumps.len() <= 1 {
        return Ok(vec![Step {
            index: 0,
            target: target.to_string(),
            create: false,
        }]);
    }
    let existing = databases::existing(tools, target).await?;
    let names: Vec<String> = dumps.iter().map(|d| d.name.clone()).collect();
    databases::plan(&names, target, &existing)
        .map_err(|e| Error::Usage(format!("{e}; nothing was restored")))
}

/// Creates the step's database (or readies the empty one the server has) with the owner,
/// settings and grants of its definition. The application database is restored into as it is.
async fn prepare_database(
    tools: &PgTools,
    opts: &RestoreOptions,
    maintenance: &str,
    step: &Step,
    dump: &DatabaseDump,
    created: &mut Vec<String>,
) -> Result<()> {
    let Some(def) = dump.definition.as_ref().filter(|_| step.index > 0) else {
        return Ok(());
    };
    let setup = databases::setup_script(&step.target, def, opts.no_owner, opts.no_acl)
        .map_err(|e| Error::Usage(format!("database {:?}: {e}", dump.name)))?;
    if step.create {
        let sql = databases::create_statement(&step.target, def, opts.no_owner);
        tools.query(Some(maintenance), &sql).await?;
        created.push(step.target.clone());
        tracing::info!(database = step.target, "database created");
    }
    tools.run_script(maintenance, &setup).await
}

/// Checks every object of a backup of several databases against the manifest (size and
/// SHA-256, read whole) before anything is created: a tampered or missing dump of any database
/// refuses the whole restore. A backup of one database is checked as it streams, as before.
pub(crate) async fn check_objects(
    store: &Store,
    folder: &str,
    dumps: &[DatabaseDump],
) -> Result<()> {
    if dumps.len() <= 1 {
        return Ok(());
    }
    for dump in dumps {
        let key = format!("{folder}{}", dump.dump_file);
        let (mut body, _) = store.get_stream(&key).await?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Error::S3 {
                operation: "GetObject",
                endpoint: store.endpoint.clone(),
                bucket: store.bucket.clone(),
                key: Some(key.clone()),
                detail: aws_sdk_s3::error::DisplayErrorContext(&e).to_string(),
            })?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
        }
        let sha = hex::encode(hasher.finalize());
        if size != dump.size_bytes || sha != dump.sha256 {
            return Err(Error::Integrity {
                key,
                detail: format!(
                    "the dump of database {:?} has {size} bytes and sha256 {sha}, the manifest says {} and {}; nothing was restored",
                    dump.name, dump.size_bytes, dump.sha256
                ),
            });
        }
    }
    Ok(())
}

/// One database's dump to restore: which object, into which database, decrypted how.
pub(crate) struct OneRestore<'a> {
    pub(crate) major: Option<u32>,
    /// The object's key in the bucket.
    pub(crate) key: &'a str,
    pub(crate) dump: &'a DatabaseDump,
    pub(crate) target: &'a str,
    pub(crate) sealing: Sealing,
}

/// Restores one database's dump into `target`: S3 → checks (→ decryption) → pg_restore in
/// one transaction.
pub(crate) async fn restore_one(
    store: &Store,
    tools: &PgTools,
    opts: &RestoreOptions,
    job: OneRestore<'_>,
) -> Result<()> {
    let OneRestore {
        major,
        key,
        dump,
        target,
        sealing,
    } = job;
    tracing::info!(database = dump.name, target, key, "restore starting");
    let body = open_dump(store, key, dump.size_bytes).await?;
    let restore = spawn_pg_restore(tools, major, opts, target)?;
    let expected = Expected {
        sha256: dump.sha256.clone(),
        size_bytes: dump.size_bytes,
        raw_bytes: dump.raw_bytes,
        decrypt: sealing.map(|(k, context)| Decrypt::new(k, &context)),
    };
    let fed = pump(body, restore.stdin, expected, restore.pid).await;
    let mut child = restore.child;
    let status = child
        .wait()
        .await
        .map_err(|e| pg::pg_error("pg_restore", target, e.to_string()))?;
    let tail = restore.stderr.await.unwrap_or_default();
    judge(store, key, target, fed, status, &tail)
}

/// The target database (`target_database`, else PGDATABASE, else the database libpq connects
/// to by default, the user's name) and the source whose backups are read (`--source-database`,
/// else the target's name).
async fn databases(tools: &PgTools, opts: &RestoreOptions) -> Result<(String, String)> {
    let target = match opts.target_database.clone().or_else(env_database) {
        Some(t) => t,
        None => tools.query(None, "SELECT current_database()").await?,
    };
    let source = opts
        .source_database
        .clone()
        .unwrap_or_else(|| target.clone());
    Ok((target, source))
}

/// A dump of a newer major version than the target server is refused before any download:
/// pg_restore cannot be trusted to read it, nor the server to run its SQL.
pub(crate) fn check_major(
    m: &Manifest,
    target_major: Option<u32>,
    target_version: &str,
) -> Result<()> {
    let source_major = m
        .engine_version
        .split('.')
        .next()
        .and_then(|v| v.parse::<u32>().ok());
    match (source_major, target_major) {
        (Some(source), Some(target)) if source > target => Err(Error::Incompatible(format!(
            "backup {} was taken from PostgreSQL {}, a newer major version than the target server's {target_version}: restore it into a server of major version {source} or newer",
            m.backup_id, m.engine_version
        ))),
        _ => Ok(()),
    }
}

/// Downloads the backup's globals script, checks its size and SHA-256 against the manifest,
/// and runs it in the target's server. Returns the number of roles it names.
async fn restore_globals(
    store: &Store,
    tools: &PgTools,
    (key, sealing): (&str, Sealing),
    target: &str,
    info: &GlobalsInfo,
) -> Result<u32> {
    let bytes = store
        .get_small(key, MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "the roles script {key} named by the manifest is missing from bucket '{}' at {}",
                store.bucket, store.endpoint
            ))
        })?;
    let sha = hex::encode(Sha256::digest(&bytes));
    if bytes.len() as u64 != info.size_bytes || sha != info.sha256 {
        return Err(Error::Integrity {
            key: key.to_string(),
            detail: format!(
                "the roles script has {} bytes and sha256 {sha}, the manifest says {} and {}; nothing was restored",
                bytes.len(),
                info.size_bytes,
                info.sha256
            ),
        });
    }
    let bytes = match sealing {
        Some((k, context)) => crypto::open(&k, &context, &bytes).map_err(|e| Error::Integrity {
            key: key.to_string(),
            detail: format!("the roles script: {e}; nothing was restored"),
        })?,
        None => bytes.to_vec(),
    };
    let script = String::from_utf8(bytes).map_err(|_| Error::Integrity {
        key: key.to_string(),
        detail: "the roles script is not UTF-8".into(),
    })?;
    globals::apply(tools, target, &script).await?;
    tracing::info!(roles = info.roles, "roles and memberships recreated");
    Ok(info.roles)
}

/// The dump object's body, refused when the server announces another size than the manifest.
async fn open_dump(
    store: &Store,
    dump_key: &str,
    size_bytes: u64,
) -> Result<aws_sdk_s3::primitives::ByteStream> {
    let (body, announced) = store.get_stream(dump_key).await?;
    if announced.is_some_and(|n| n != size_bytes) {
        return Err(Error::Integrity {
            key: dump_key.to_string(),
            detail: format!(
                "object has {} bytes, the manifest says {}",
                announced.unwrap_or(0),
                size_bytes
            ),
        });
    }
    Ok(body)
}

/// A running pg_restore and its pipes.
struct PgRestore {
    child: tokio::process::Child,
    stderr: tokio::task::JoinHandle<String>,
    pid: u32,
    stdin: std::fs::File,
}

fn spawn_pg_restore(
    tools: &PgTools,
    major: Option<u32>,
    opts: &RestoreOptions,
    target: &str,
) -> Result<PgRestore> {
    let mut cmd = tools.command("pg_restore", major);
    cmd.args([
        "--format=custom",
        "--single-transaction",
        "--exit-on-error",
        "--no-password",
    ]);
    if opts.no_owner {
        cmd.arg("--no-owner");
    }
    if opts.no_acl {
        cmd.arg("--no-acl");
    }
    // An empty --dbname makes pg_restore connect (rather than print SQL) with the database
    // from PGDATABASE, so no name is ever parsed as a connection string.
    cmd.args(["--dbname", ""])
        .env("PGDATABASE", target)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| pg::pg_error("pg_restore", target, format!("cannot run pg_restore: {e}")))?;
    let stderr = pg::collect_stderr(&mut child, "pg_restore");
    let pid = child.id().unwrap_or(0);
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| pg::pg_error("pg_restore", target, "no stdin pipe"))
        .and_then(|s| {
            pg::stdin_file(s).map_err(|e| pg::pg_error("pg_restore", target, e.to_string()))
        })?;
    Ok(PgRestore {
        child,
        stderr,
        pid,
        stdin,
    })
}

/// Downloads the body into the feeder thread, which hashes it and writes it to pg_restore.
async fn pump(
    mut body: aws_sdk_s3::primitives::ByteStream,
    stdin: std::fs::File,
    expected: Expected,
    pid: u32,
) -> std::result::Result<(), FeedError> {
    let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, String>>(16);
    let feeder = tokio::task::spawn_blocking(move || feed(rx, stdin, expected, pid));
    let download = async move {
        loop {
            match body.next().await {
                Some(Ok(chunk)) => {
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                }
                Some(Err(e)) => {
                    let _ = tx
                        .send(Err(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))
                        .await;
                    return;
                }
                None => return,
            }
        }
    };
    let (_, fed) = tokio::join!(download, feeder);
    fed.unwrap_or_else(|e| Err(FeedError::Internal(e.to_string())))
}

/// How the restore ended: committed, or the error that says why not.
fn judge(
    store: &Store,
    dump_key: &str,
    target: &str,
    fed: std::result::Result<(), FeedError>,
    status: std::process::ExitStatus,
    tail: &str,
) -> Result<()> {
    let restore_failed = |what: &str| {
        pg::pg_error(
            "pg_restore",
            target,
            format!("{what}; nothing was committed: {}", pg::tail_text(tail)),
        )
    };
    let stopped = "the restore was stopped before committing";
    match fed {
        Ok(()) if status.success() => Ok(()),
        Ok(()) => Err(restore_failed(&status.to_string())),
        Err(FeedError::PgRestoreStopped(_)) if !status.success() => {
            Err(restore_failed(&status.to_string()))
        }
        Err(FeedError::PgRestoreStopped(e)) => {
            Err(restore_failed(&format!("pg_restore stopped reading: {e}")))
        }
        Err(FeedError::Integrity(detail)) => Err(Error::Integrity {
            key: dump_key.to_string(),
            detail: format!("{detail}; {stopped}"),
        }),
        Err(FeedError::Download(detail)) => Err(Error::S3 {
            operation: "GetObject",
            endpoint: store.endpoint.clone(),
            bucket: store.bucket.clone(),
            key: Some(dump_key.to_string()),
            detail: format!("{detail}; {stopped}"),
        }),
        Err(FeedError::Internal(detail)) => {
            Err(Error::io("restore", std::io::Error::other(detail)))
        }
    }
}

struct Expected {
    sha256: String,
    size_bytes: u64,
    raw_bytes: u64,
    /// The object is encrypted: decrypted (each segment authenticated) after it is hashed.
    decrypt: Option<Decrypt>,
}

#[derive(Debug)]
enum FeedError {
    /// Writing to pg_restore failed: it exited (its own error says why).
    PgRestoreStopped(std::io::Error),
    /// The object is not what the manifest says.
    Integrity(String),
    Download(String),
    Internal(String),
}

/// Reads the downloaded chunks, hashing and counting them (the stored bytes), and gives out
/// their plaintext: decrypted when the object is encrypted.
struct HashingReader {
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    current: Bytes,
    hasher: Sha256,
    count: u64,
    download_error: Option<String>,
    decrypt: Option<Decrypt>,
    decrypt_error: Option<String>,
    ended: bool,
}

impl HashingReader {
    /// The plaintext of a downloaded chunk (`None`: the end of the object).
    fn plaintext(&mut self, chunk: Option<&[u8]>) -> std::io::Result<Bytes> {
        let Some(d) = self.decrypt.as_mut() else {
            return Ok(Bytes::copy_from_slice(chunk.unwrap_or_default()));
        };
        let mut out = Vec::new();
        let r = match chunk {
            Some(c) => d.push(c, &mut out),
            None => d.finish(&mut out),
        };
        match r {
            Ok(()) => Ok(Bytes::from(out)),
            Err(e) => {
                self.decrypt_error = Some(e.clone());
                Err(std::io::Error::other(e))
            }
        }
    }
}

impl Read for HashingReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.hasher.update(&chunk);
                    self.count += chunk.len() as u64;
                    self.current = if self.decrypt.is_some() {
                        self.plaintext(Some(&chunk))?
                    } else {
                        chunk
                    };
                }
                Some(Err(e)) => {
                    self.download_error = Some(e.clone());
                    return Err(std::io::Error::other(e));
                }
                None => {
                    self.ended = true;
                    self.current = self.plaintext(None)?;
                }
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// The feeder thread. On error it kills pg_restore before dropping its stdin, so pg_restore
/// never sees a clean end of input it could mistake for the end of the archive.
fn feed(
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    mut stdin: std::fs::File,
    mut expected: Expected,
    pid: u32,
) -> std::result::Result<(), FeedError> {
    let r = feed_inner(rx, &mut stdin, &mut expected);
    if r.is_err() && pid > 0 {
        // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    drop(stdin);
    r
}

fn feed_inner(
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    stdin: &mut std::fs::File,
    expected: &mut Expected,
) -> std::result::Result<(), FeedError> {
    let reader = HashingReader {
        rx,
        current: Bytes::new(),
        hasher: Sha256::new(),
        count: 0,
        download_error: None,
        decrypt: expected.decrypt.take(),
        decrypt_error: None,
        ended: false,
    };
    let mut decoder =
        zstd::stream::read::Decoder::new(reader).map_err(|e| FeedError::Internal(e.to_string()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut held: Vec<u8> = Vec::with_capacity(HOLD_BACK + CHUNK);
    let mut raw: u64 = 0;
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let inner = decoder.get_ref().get_ref();
                return Err(match (&inner.download_error, &inner.decrypt_error) {
                    (Some(d), _) => FeedError::Download(d.clone()),
                    (None, Some(d)) => FeedError::Integrity(format!("the object {d}")),
                    (None, None) => FeedError::Integrity(format!(
                        "the object does not decompress ({e}) after {} bytes: corrupted or truncated",
                        inner.count
                    )),
                });
            }
        };
        raw += n as u64;
        if raw > expected.raw_bytes {
            return Err(FeedError::Integrity(format!(
                "decompressed data is longer than the manifest's {} bytes",
                expected.raw_bytes
            )));
        }
        held.extend_from_slice(&buf[..n]);
        if held.len() > HOLD_BACK {
            let release = held.len() - HOLD_BACK;
            stdin
                .write_all(&held[..release])
                .map_err(FeedError::PgRestoreStopped)?;
            held.drain(..release);
        }
    }
    check_whole(decoder.finish(), raw, expected)?;
    // Checked: let pg_restore see the end of the archive, then EOF.
    stdin
        .write_all(&held)
        .map_err(FeedError::PgRestoreStopped)?;
    Ok(())
}

/// Reads what is left after the last frame (it still counts towards the checksum), then holds
/// the whole object against the manifest: its size, its sha256 and its decompressed length.
fn check_whole(
    mut reader: std::io::BufReader<HashingReader>,
    raw: u64,
    expected: &Expected,
) -> std::result::Result<(), FeedError> {
    let mut rest = [0u8; 4096];
    loop {
        match reader.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                let inner = reader.get_ref();
                if let Some(d) = &inner.decrypt_error {
                    return Err(FeedError::Integrity(format!("the object {d}")));
                }
                return Err(FeedError::Download(
                    inner
                        .download_error
                        .clone()
                        .unwrap_or_else(|| e.to_string()),
                ));
            }
        }
    }
    let mut reader = reader.into_inner();
    let sha = hex::encode(std::mem::take(&mut reader.hasher).finalize());
    if reader.count != expected.size_bytes {
        return Err(FeedError::Integrity(format!(
            "read {} bytes, the manifest says {}: truncated or replaced",
            reader.count, expected.size_bytes
        )));
    }
    if sha != expected.sha256 {
        return Err(FeedError::Integrity(format!(
            "sha256 is {sha}, the manifest says {}",
            expected.sha256
        )));
    }
    if raw != expected.raw_bytes {
        return Err(FeedError::Integrity(format!(
            "decompressed to {raw} bytes, the manifest says {}",
            expected.raw_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_of_a_newer_major_is_refused() {
        let manifest = |version: &str| {
            let mut m: Manifest = serde_json::from_value(serde_json::json!({
                "manifestVersion": 1, "backupId": "b", "database": "app", "engine": "postgresql",
                "engineVersion": version, "startedAt": "2025-01-01T00:00:00Z",
                "completedAt": "2025-01-01T00:00:01Z", "rawBytes": 1, "sizeBytes": 1,
                "sha256": "0".repeat(64), "format": "pg_dump-custom", "compression": "zstd",
                "compressionLevel": 1, "agentVersion": "0", "dumpFile": "d", "rowCounts": {}
            }))
            .unwrap();
            m.backup_id = "b1".into();
            m
        };
        let table = [
            ("16.4", Some(15), false),
            ("15.20", Some(15), true),
            ("14.1", Some(15), true),
            ("9.6", Some(15), true),
            ("16.4", None, true),
            ("garbage", Some(15), true),
        ];
        for (source, target, ok) in table {
            let r = check_major(&manifest(source), target, "15.20");
            assert_eq!(r.is_ok(), ok, "{source} into {target:?}");
            if let Err(e) = r {
                assert_eq!(e.label(), "incompatible-version");
                assert!(e.to_string().contains("PostgreSQL 16.4"), "{e}");
            }
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(databases::quote_ident("a"), "\"a\"");
        assert_eq!(databases::quote_ident("we\"ird"), "\"we\"\"ird\"");
    }

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_checksum(true).unwrap();
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    /// Runs the feeder over `object` with the given expectations; returns what reached "pg_restore".
    fn run_feed(
        object: Vec<u8>,
        expected: Expected,
    ) -> (std::result::Result<(), FeedError>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = std::fs::File::create(&path).unwrap();
        let (tx, rx) = mpsc::channel(4);
        let t = std::thread::spawn(move || feed(rx, file, expected, 0));
        for chunk in object.chunks(1000) {
            tx.blocking_send(Ok(Bytes::copy_from_slice(chunk))).unwrap();
        }
        drop(tx);
        let r = t.join().unwrap();
        (r, std::fs::read(&path).unwrap())
    }

    fn data() -> Vec<u8> {
        (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect()
    }

    fn expect(object: &[u8], raw: &[u8]) -> Expected {
        Expected {
            sha256: hex::encode(Sha256::digest(object)),
            size_bytes: object.len() as u64,
            raw_bytes: raw.len() as u64,
            decrypt: None,
        }
    }

    #[test]
    fn good_object_is_passed_whole() {
        let raw = data();
        let object = frame(&raw);
        let (r, out) = run_feed(object.clone(), expect(&object, &raw));
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(out, raw);
    }

    #[test]
    fn checksum_mismatch_holds_back_the_end() {
        let raw = data();
        let object = frame(&raw);
        let mut e = expect(&object, &raw);
        e.sha256 = "0".repeat(64);
        let (r, out) = run_feed(object, e);
        assert!(
            matches!(r, Err(FeedError::Integrity(ref m)) if m.contains("sha256")),
            "{r:?}"
        );
        assert_eq!(out.len(), raw.len() - HOLD_BACK);
    }

    #[test]
    fn truncated_object_fails_without_the_end() {
        let raw = data();
        let object = frame(&raw);
        let e = expect(&object, &raw);
        let cut = object[..object.len() - 100].to_vec();
        let (r, out) = run_feed(cut, e);
        assert!(matches!(r, Err(FeedError::Integrity(_))), "{r:?}");
        assert!(out.len() < raw.len());
    }

    #[test]
    fn flipped_byte_fails() {
        let raw = data();
        let mut object = frame(&raw);
        let e = expect(&object, &raw);
        let mid = object.len() / 2;
        object[mid] ^= 0x55;
        let (r, out) = run_feed(object, e);
        assert!(r.is_err());
        assert!(out.len() < raw.len());
    }

    #[test]
    fn download_error_is_reported_as_such() {
        let raw = data();
        let object = frame(&raw);
        let e = expect(&object, &raw);
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("out")).unwrap();
        let (tx, rx) = mpsc::channel(4);
        let t = std::thread::spawn(move || feed(rx, file, e, 0));
        tx.blocking_send(Ok(Bytes::copy_from_slice(&object[..500])))
            .unwrap();
        tx.blocking_send(Err("connection reset".into())).unwrap();
        drop(tx);
        let r = t.join().unwrap();
        assert!(
            matches!(r, Err(FeedError::Download(ref m)) if m.contains("reset")),
            "{r:?}"
        );
    }
}
