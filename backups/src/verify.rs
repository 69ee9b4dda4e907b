//! `verify`: every database of a backup restored into a scratch database of its own (created
//! with the source's encoding and locale, dropped whatever happens), its row counts compared
//! with the manifest's; a difference in any database fails the verification, naming it. The
//! objects are checked before anything is created, and each restore is `restore`'s own.

use std::collections::BTreeMap;

use crate::crypto::{Key, KeyRing};
use crate::databases::{self, quote_ident};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::manifest::{DatabaseDump, first_difference};
use crate::pg::{self, PgTools};
use crate::restore::{check_major, check_objects, env_database, note_backup, resolve};
use crate::restore_database::restore_one;
use crate::restore_stream::OneRestore;
use crate::result::BackupResult;
use crate::s3::Store;
use crate::signals::Interrupt;

#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    pub backup: String,
    pub source_database: Option<String>,
    pub scratch_database: Option<String>,
    /// Where the encryption keys are (`--encryption-key-dir`).
    pub keys: Option<KeyRing>,
    /// Sessions restoring a dump in parts at once (`--jobs`).
    pub jobs: usize,
}

/// The database whose backup is verified (`--source-database` or PGDATABASE), and the scratch
/// database to restore it into (`--scratch-database`, or a fresh name).
fn verify_names(opts: &VerifyOptions) -> Result<(String, String)> {
    let source = opts
        .source_database
        .clone()
        .or_else(env_database)
        .ok_or_else(|| {
            Error::Usage(
                "--source-database or PGDATABASE must name the database whose backup to verify"
                    .into(),
            )
        })?;
    let scratch = opts.scratch_database.clone().unwrap_or_else(|| {
        format!(
            "dbop_verify_{}_{}",
            chrono::Utc::now().format("%Y%m%d%H%M%S"),
            std::process::id()
        )
    });
    Ok((source, scratch))
}

/// Verifies every database of a backup: each restored into a scratch database of its own
/// (created, then dropped), its row counts compared with the manifest's. A difference in any
/// database fails the verification, naming it.
pub async fn verify(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &VerifyOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
) -> Result<()> {
    let (source, scratch) = verify_names(opts)?;
    result.started_at = Some(chrono::Utc::now());
    result.bucket = Some(store.bucket.clone());
    let (id, m, key) = resolve(store, layout, &source, &opts.backup, opts.keys.as_ref()).await?;
    note_backup(result, layout, &source, &id, &m);
    let (major, version) = tools.reach_target(None).await?;
    check_major(&m, major, &version)?;
    let dumps = m.dumps();
    let folder = layout.backup_prefix(&source, &id);
    check_objects(store, &folder, &dumps).await?;
    let mut reports = Vec::new();
    let started = std::time::Instant::now();
    for (index, dump) in dumps.iter().enumerate() {
        let scratch = scratch_name(&scratch, index);
        let job = ScratchRestore {
            major,
            folder: &folder,
            backup_id: &id,
            dump,
            scratch: &scratch,
            key: key.clone(),
            jobs: opts.jobs,
        };
        let actual = verify_one(store, tools, &job, interrupt).await?;
        if let Some(diff) = first_difference(&dump.row_counts, &actual) {
            return Err(Error::Verify(format!(
                "backup {id} of database '{source}', database {:?}: {diff}",
                dump.name
            )));
        }
        reports.push(format!("{:?}: {} tables", dump.name, dump.row_counts.len()));
    }
    result.recovery_millis = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    m.fill_result(result);
    result.database = Some(source.clone());
    result.completed_at = Some(chrono::Utc::now());
    result.message = Some(format!(
        "backup {id} of database '{source}' verified: {} databases restored into scratch databases, row counts match ({})",
        dumps.len(),
        reports.join(", ")
    ));
    Ok(())
}

/// The scratch database of the `index`th database: the given name for the first, then
/// `<name>_<index>`. Pure.
pub fn scratch_name(base: &str, index: usize) -> String {
    if index == 0 {
        base.to_string()
    } else {
        format!("{base}_{index}")
    }
}

/// One database's dump to restore into a scratch database.
struct ScratchRestore<'a> {
    major: Option<u32>,
    folder: &'a str,
    backup_id: &'a str,
    dump: &'a DatabaseDump,
    scratch: &'a str,
    key: Option<Key>,
    jobs: usize,
}

/// Creates the scratch database (with the source's encoding and locale when known), restores
/// the dump into it, counts its rows, and drops it whatever happened.
async fn verify_one(
    store: &Store,
    tools: &PgTools,
    job: &ScratchRestore<'_>,
    interrupt: &Interrupt,
) -> Result<BTreeMap<String, u64>> {
    let create = match &job.dump.definition {
        Some(def) => databases::create_statement(job.scratch, def, true),
        None => format!(
            "CREATE DATABASE {} TEMPLATE template0",
            quote_ident(job.scratch)
        ),
    };
    tools.query(None, &create).await?;
    tracing::info!(
        scratch = job.scratch,
        database = job.dump.name,
        "scratch database created"
    );
    let outcome = tokio::select! {
        r = async {
            let one = OneRestore {
                major: job.major,
                folder: job.folder,
                backup_id: job.backup_id,
                dump: job.dump,
                target: job.scratch,
                key: job.key.clone(),
                no_owner: false,
                no_acl: false,
                jobs: job.jobs,
            };
            restore_one(store, tools, one).await?;
            let counts = tools.query(Some(job.scratch), pg::ROW_COUNT_SQL).await?;
            serde_json::from_str(counts.trim()).map_err(|e| {
                pg::pg_error("psql", job.scratch, format!("unexpected row count output: {e}"))
            })
        } => r,
        s = interrupt.wait() => Err(Error::Interrupted(s)),
    };
    let dropped = tools
        .query(
            None,
            &format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(job.scratch)
            ),
        )
        .await;
    if let Err(e) = &dropped {
        tracing::error!(scratch = job.scratch, error = %e, "could not drop the scratch database");
    }
    let actual = outcome?;
    dropped?;
    Ok(actual)
}
