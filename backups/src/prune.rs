//! `prune`: apply the retention rule (from `dbop_contract::retention`) to one database's
//! backups in the bucket, and abort abandoned multipart uploads. Used by the `prune` command
//! and by `dump --keep-last/--max-age` after a successful dump; `base_prune` shares its upload
//! clean-up and message.

use std::fmt;
use std::time::Duration;

use chrono::Utc;

use crate::catalog::{self, BackupEntry};
use crate::error::Result;
use crate::layout::{Layout, MANIFEST_FILE};
use crate::retention::{self, Candidate, Policy, Verdict};
use crate::s3::Store;

/// What a prune did.
#[derive(Debug, Default)]
pub struct PruneReport {
    pub deleted: Vec<String>,
    pub kept: usize,
    pub incomplete_removed: Vec<String>,
    pub uploads_aborted: usize,
    /// `false` when the server cannot list unfinished uploads.
    pub uploads_listed: bool,
    pub dry_run: bool,
}

impl fmt::Display for PruneReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "prune{}: kept {}, deleted {} [{}], removed {} incomplete, aborted {} unfinished uploads{}",
            if self.dry_run { " (dry run)" } else { "" },
            self.kept,
            self.deleted.len(),
            self.deleted.join(", "),
            self.incomplete_removed.len(),
            self.uploads_aborted,
            if self.uploads_listed {
                ""
            } else {
                " (the server cannot list uploads)"
            }
        )
    }
}

/// Applies the policy to one database's backups.
pub async fn prune_database(
    store: &Store,
    layout: &Layout,
    database: &str,
    policy: Policy,
    grace: Duration,
    dry_run: bool,
) -> Result<PruneReport> {
    let now = Utc::now();
    let prefix = layout.database_prefix(database);
    let objects = store.list(&prefix).await?;
    let entries = catalog::group(layout, &objects);
    let mut report = PruneReport {
        dry_run,
        ..Default::default()
    };
    let candidates: Vec<Candidate> = entries.iter().map(candidate).collect();
    for d in retention::verdicts(&candidates, policy, grace, now) {
        let Some(entry) = entries.iter().find(|e| e.backup_id == d.backup_id) else {
            continue;
        };
        match d.verdict {
            Verdict::Keep(why) => {
                tracing::debug!(backup_id = d.backup_id, why, "kept");
                if entry.complete {
                    report.kept += 1;
                }
            }
            Verdict::Delete(why) => {
                tracing::info!(backup_id = d.backup_id, why, dry_run, "deleting");
                if !dry_run {
                    // The manifest first: a half-deleted backup must not look complete.
                    let mut keys = entry.keys.clone();
                    keys.sort_by_key(|k| !k.ends_with(&format!("/{MANIFEST_FILE}")));
                    for key in keys {
                        store.delete(&key).await?;
                    }
                }
                if entry.complete {
                    report.deleted.push(d.backup_id);
                } else {
                    report.incomplete_removed.push(d.backup_id);
                }
            }
        }
    }
    if let Some(uploads) = abort_abandoned_uploads(store, &prefix, grace, dry_run).await? {
        report.uploads_listed = true;
        report.uploads_aborted = uploads.aborted;
    }
    Ok(report)
}

/// The unfinished multipart uploads under a prefix.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Uploads {
    /// Started longer than the grace period ago: aborted.
    pub aborted: usize,
    /// Within the grace period: left alone (a backup may be being written).
    pub in_progress: usize,
}

/// Aborts the multipart uploads under `prefix` started longer than `grace` ago; `None` when
/// the server cannot list unfinished uploads.
pub async fn abort_abandoned_uploads(
    store: &Store,
    prefix: &str,
    grace: Duration,
    dry_run: bool,
) -> Result<Option<Uploads>> {
    let now = Utc::now();
    let Some(uploads) = store.list_uploads(prefix).await? else {
        tracing::warn!(
            endpoint = store.endpoint,
            "the server does not implement ListMultipartUploads: unfinished uploads not checked"
        );
        return Ok(None);
    };
    let mut counts = Uploads::default();
    for u in uploads {
        if !retention::upload_abandoned(u.initiated, grace, now) {
            counts.in_progress += 1;
        } else {
            tracing::info!(
                key = u.key,
                dry_run,
                "aborting an abandoned multipart upload"
            );
            if !dry_run {
                store.abort_upload(&u.key, &u.upload_id).await?;
            }
            counts.aborted += 1;
        }
    }
    Ok(Some(counts))
}

/// The part of a backup's message that says what the prune after it did, or why it failed (a
/// failed prune never fails the backup).
pub fn after_backup_message<R: fmt::Display>(pruned: Result<R>, what: &str) -> String {
    match pruned {
        Ok(report) => report.to_string(),
        Err(e) => {
            tracing::error!(error = %e, "pruning after the {what} failed");
            format!("pruning failed: {e}")
        }
    }
}

/// What the retention rule needs of a catalog entry.
fn candidate(entry: &BackupEntry) -> Candidate {
    Candidate {
        backup_id: entry.backup_id.clone(),
        complete: entry.complete,
        completed_at: entry.completed_at,
    }
}
