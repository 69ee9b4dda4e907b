//! `restore`: finds the backup (`resolve`: the newest succeeded one, or the one named, its
//! manifest's seal checked with the keys given), refuses a dump of a newer major version,
//! recreates the backup's roles (`globals`), then restores each database in its plan through
//! `restore_database` (download, checks, pg_restore in one transaction), dropping what it created
//! when a step fails. `verify` shares the resolution and the checks.

use sha2::{Digest, Sha256};

use crate::catalog;
use crate::crypto::{self, Key, KeyRing};
use crate::databases::{self, Step};
use crate::error::{Error, Result};
use crate::globals;
use crate::layout::{self, Layout};
use crate::manifest::{
    DatabaseDump, GlobalsInfo, MAX_MANIFEST_BYTES, Manifest, SealedManifest, Stored, object_context,
};
use crate::pg::PgTools;
use crate::restore_database::{Restored, restore_one};
use crate::restore_stream::OneRestore;
use crate::result::BackupResult;
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::upload::Sealing;

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
    /// Sessions restoring a dump in parts at once (`--jobs`); 1 (or 0): one transaction.
    pub jobs: usize,
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
    let mut in_steps = 0;
    for step in &steps {
        let dump = &dumps[step.index];
        if opts.only_database.is_none() {
            prepare_database(tools, opts, &target, step, dump, created).await?;
        }
        let job = OneRestore {
            major,
            folder: &folder,
            backup_id: &id,
            dump,
            target: &step.target,
            key: key.clone(),
            no_owner: opts.no_owner,
            no_acl: opts.no_acl,
            jobs: opts.jobs,
        };
        if restore_one(store, tools, job).await? == Restored::InSteps {
            in_steps += 1;
        }
    }
    result.completed_at = Some(chrono::Utc::now());
    let how = match in_steps {
        0 => "each in one transaction".to_string(),
        n => format!("{n} in steps with {} sessions", opts.jobs),
    };
    result.message = Some(format!(
        "backup {id} of database '{source}' restored into '{target}' ({} raw bytes, sha256 checked, {roles} roles recreated; {} databases, {} created, {how})",
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
    for (dump, part) in dumps
        .iter()
        .flat_map(|d| d.objects().into_iter().map(move |p| (d, p)))
    {
        let key = format!("{folder}{}", part.file);
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
        if size != part.size_bytes || sha != part.sha256 {
            return Err(Error::Integrity {
                key,
                detail: format!(
                    "the dump of database {:?} has {size} bytes and sha256 {sha}, the manifest says {} and {}; nothing was restored",
                    dump.name, part.size_bytes, part.sha256
                ),
            });
        }
    }
    Ok(())
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
}
