//! `verify-base`, the I/O: proof that the newest base backup restores, in a scratch instance of
//! its own (never the live server). The bucket's newest archived WAL segment is noted first;
//! then the base backup and every WAL file after it are recovered (`recover`) into a scratch
//! data directory (absent or empty: the Job's own volume), the recovered server is started
//! privately once more to read every table of every database whole and name the WAL segment it
//! reached, and the directory is deleted whatever happened. The time the recovery took is the
//! measured recovery time. Every decision is `recovery_check`'s.

use std::path::Path;
use std::time::Instant;

use crate::base::Lsn;
use crate::base_restore::BaseRestoreOptions;
use crate::base_retention;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pg::PgTools;
use crate::recover;
use crate::recovery_check;
use crate::result::BackupResult;
use crate::s3::Store;
use crate::signals::Interrupt;
use crate::wal;

/// Verifies the base backup `opts` names (the newest by default) by recovering it and all the
/// archived WAL into `opts.data_dir`, which is deleted afterwards.
pub async fn verify_base(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseRestoreOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
) -> Result<()> {
    if recover::finished(&opts.data_dir)?.is_some() {
        return Err(Error::Usage(format!(
            "{} holds a finished recovery: verify-base needs an absent or empty directory, which it deletes afterwards",
            opts.data_dir.display()
        )));
    }
    let listing = store.list(&wal::wal_prefix(layout, &opts.database)).await?;
    let keys: Vec<String> = listing.into_iter().map(|o| o.key).collect();
    let newest = base_retention::newest_segment(layout, &opts.database, &keys);
    let outcome = recover_and_read(store, layout, tools, opts, interrupt, result, newest).await;
    remove(&opts.data_dir);
    outcome
}

async fn recover_and_read(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseRestoreOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
    newest: Option<(u32, base_retention::SegmentPosition)>,
) -> Result<()> {
    let started = Instant::now();
    recover::recover(store, layout, tools, opts, interrupt, result).await?;
    let took = started.elapsed();
    let lsn = Lsn::parse(result.recovered_lsn.as_deref().unwrap_or_default())
        .map_err(|e| Error::Verify(format!("the recovery reported no point reached: {e}")))?;
    let seen = recover::inspect(
        tools,
        result.engine_version.as_deref(),
        &opts.data_dir,
        &lsn,
        interrupt,
    )
    .await?;
    recovery_check::check_reached(newest, &seen.wal_file)?;
    let backup_id = result.backup_id.clone().unwrap_or_default();
    result.recovery_millis = Some(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
    result.databases = u32::try_from(seen.counts.len()).ok();
    result.message = Some(recovery_check::verified_message(
        &backup_id,
        &lsn,
        result.recovered_to,
        took,
        &seen.counts,
    ));
    result.completed_at = Some(chrono::Utc::now());
    Ok(())
}

/// Deletes the scratch instance (and what a failed run left beside it); a failure to is logged:
/// the verification's outcome stands either way.
fn remove(data_dir: &Path) {
    let mut scratch = data_dir.as_os_str().to_os_string();
    scratch.push(crate::recovery::SCRATCH_SUFFIX);
    for dir in [data_dir, Path::new(&scratch)] {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %dir.display(), error = %e, "could not delete the scratch instance");
            }
            _ => {}
        }
    }
}
