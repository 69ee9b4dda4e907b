//! Retention of physical backups, the I/O: after `base-backup`, lists and reads the base
//! backup records of one database, deletes the base backups `base_retention` gives up (the
//! record first, so a half-deleted one is never chosen for a restore, then its objects), then
//! the archived WAL segments no retained base backup needs, oldest first (a prune cut short
//! leaves no gap). Unfinished uploads of base backups older than the grace period are aborted
//! (as `prune` does); a younger one holds the WAL back. Every decision is `base_retention`'s.

use std::fmt;
use std::time::Duration;

use chrono::Utc;

use crate::base::{self, BaseRecord};
use crate::base_retention::{self as decide, Folder, RecordState};
use crate::error::Result;
use crate::layout::Layout;
use crate::retention::Policy;
use crate::s3::Store;
use crate::wal;

/// What a prune of physical backups did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BasePruneReport {
    pub deleted: Vec<String>,
    pub incomplete_removed: Vec<String>,
    pub kept: usize,
    pub wal_deleted: usize,
    /// Abandoned multipart uploads of base backups aborted.
    pub uploads_aborted: usize,
    /// Why no WAL was deleted, when none was looked at.
    pub wal_skipped: Option<String>,
}

impl fmt::Display for BasePruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pruned {} base backups [{}] and {} incomplete ones, kept {}, aborted {} unfinished uploads; pruned {} WAL files",
            self.deleted.len(),
            self.deleted.join(", "),
            self.incomplete_removed.len(),
            self.kept,
            self.uploads_aborted,
            self.wal_deleted
        )?;
        match &self.wal_skipped {
            Some(why) => write!(f, " (WAL kept: {why})"),
            None => Ok(()),
        }
    }
}

/// Applies the policy to the base backups of `database`, then to its WAL; `just_taken` (this
/// run's backup) is never deleted.
pub async fn prune_base(
    store: &Store,
    layout: &Layout,
    database: &str,
    (policy, grace): (Policy, Duration),
    just_taken: &str,
) -> Result<BasePruneReport> {
    let folders = read_folders(store, layout, database).await?;
    let mut plan = decide::plan_bases(&folders, policy, grace, Utc::now(), just_taken);
    let prefix = base::base_prefix(layout, database);
    let uploads = crate::prune::abort_abandoned_uploads(store, &prefix, grace, false)
        .await?
        .unwrap_or_default();
    // A recent unfinished upload is a base backup being written: it may need the WAL too.
    plan.recent_incomplete += uploads.in_progress;
    let mut report = BasePruneReport {
        kept: plan.kept.len(),
        uploads_aborted: uploads.aborted,
        ..Default::default()
    };
    delete_bases(store, &folders, &plan, &mut report).await?;
    match decide::wal_boundary(&plan, &folders) {
        Ok(boundary) => report.wal_deleted = prune_wal(store, layout, database, boundary).await?,
        Err(why) => {
            tracing::info!("no WAL pruned: {why}");
            report.wal_skipped = Some(why);
        }
    }
    Ok(report)
}

/// Deletes the base backups the plan gives up, complete ones first.
async fn delete_bases(
    store: &Store,
    folders: &[Folder],
    plan: &decide::BasePlan,
    report: &mut BasePruneReport,
) -> Result<()> {
    for id in &plan.unreadable {
        tracing::warn!(backup_id = id, "kept: its record cannot be read");
    }
    for (id, why) in &plan.delete {
        tracing::info!(backup_id = id, why, "deleting base backup");
        delete_folder(store, folders, id).await?;
        report.deleted.push(id.clone());
    }
    for id in &plan.delete_incomplete {
        tracing::info!(
            backup_id = id,
            "deleting an incomplete base backup older than the grace period"
        );
        delete_folder(store, folders, id).await?;
        report.incomplete_removed.push(id.clone());
    }
    Ok(())
}

/// The base backup folders, with each record read.
async fn read_folders(store: &Store, layout: &Layout, database: &str) -> Result<Vec<Folder>> {
    let objects = store.list(&base::base_prefix(layout, database)).await?;
    let mut folders = decide::folders(layout, database, &objects);
    for f in &mut folders {
        if f.state == RecordState::Unreadable {
            f.state = read_record(store, layout, database, &f.id).await?;
        }
    }
    Ok(folders)
}

async fn read_record(
    store: &Store,
    layout: &Layout,
    database: &str,
    id: &str,
) -> Result<RecordState> {
    let key = base::record_key(layout, database, id);
    let Some(bytes) = store.get_small(&key, base::MAX_RECORD_BYTES).await? else {
        return Ok(RecordState::Missing);
    };
    Ok(match BaseRecord::parse(&bytes) {
        Ok(r) if r.backup_id == id => RecordState::Complete(Box::new(r)),
        Ok(_) => {
            tracing::warn!(key, "the base backup record names another backup id");
            RecordState::Unreadable
        }
        Err(e) => {
            tracing::warn!(key, "unreadable base backup record: {e}");
            RecordState::Unreadable
        }
    })
}

/// Deletes a base backup's objects, its record first.
async fn delete_folder(store: &Store, folders: &[Folder], id: &str) -> Result<()> {
    let Some(folder) = folders.iter().find(|f| f.id == id) else {
        return Ok(());
    };
    let record_suffix = format!("/{}", base::RECORD_FILE);
    let mut keys = folder.keys.clone();
    keys.sort_by_key(|k| !k.ends_with(&record_suffix));
    for key in keys {
        store.delete(&key).await?;
    }
    Ok(())
}

/// Deletes the WAL segments wholly before `boundary`, oldest first; the number deleted.
async fn prune_wal(
    store: &Store,
    layout: &Layout,
    database: &str,
    boundary: decide::SegmentPosition,
) -> Result<usize> {
    let objects = store.list(&wal::wal_prefix(layout, database)).await?;
    let keys: Vec<String> = objects.into_iter().map(|o| o.key).collect();
    let plan = decide::plan_wal(layout, database, &keys, boundary);
    for key in &plan.unknown {
        tracing::warn!(key, "kept: not a WAL file name this agent knows");
    }
    tracing::info!(
        delete = plan.delete.len(),
        kept = plan.kept,
        boundary = format!("{:08X}{:08X}", boundary.0, boundary.1),
        "pruning WAL before the oldest retained base backup's start segment"
    );
    for key in &plan.delete {
        store.delete(key).await?;
    }
    Ok(plan.delete.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_was_pruned_and_why_wal_was_kept() {
        let mut r = BasePruneReport {
            deleted: vec!["b1".into(), "b2".into()],
            incomplete_removed: vec!["x".into()],
            kept: 2,
            wal_deleted: 7,
            uploads_aborted: 1,
            wal_skipped: None,
        };
        assert_eq!(
            r.to_string(),
            "pruned 2 base backups [b1, b2] and 1 incomplete ones, kept 2, aborted 1 unfinished uploads; pruned 7 WAL files"
        );
        r.wal_deleted = 0;
        r.wal_skipped = Some("there is no complete base backup".into());
        assert!(
            r.to_string()
                .ends_with("pruned 0 WAL files (WAL kept: there is no complete base backup)")
        );
    }
}
