//! The `ContinuousArchiving` condition of a Database that archives its WAL
//! (`spec.backup.walArchiving`): from what the primary's manager reports of `pg_stat_archiver`,
//! whether the last WAL file PostgreSQL handed to the agent was stored or not, and, while it was
//! not, that WAL waits on the volume. The messages name no moving count, so a steady archive
//! writes no status.
//!
//! Pure.

use std::time::Duration;

use dbop_contract::position::Archiver;

use crate::api::Database;
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::resources::agent::PHYSICAL_FOLDER;
use crate::resources::backup_job::storage_prefix;
use crate::resources::wal_archiving::{archive_timeout, enabled};

/// How often a Database that archives is looked at (its primary's archiver read): a failing
/// archive shows within this.
pub const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// The condition, when the Database archives and its primary reported; `None` otherwise (no
/// archiving: the status drops it; no report: the last one stands).
pub fn condition(db: &Database, archiver: Option<&Archiver>) -> Option<ConditionStatus> {
    let (backup, spec) = enabled(db)?;
    let archiver = archiver?;
    let to = format!(
        "s3://{}/{}/{PHYSICAL_FOLDER}/wal/",
        backup.s3.bucket,
        storage_prefix(db, backup)
    );
    Some(if archiver.failing() {
        let file = archiver.last_failed_wal.as_deref().unwrap_or("a WAL file");
        let last = match &archiver.last_archived_wal {
            Some(wal) => format!("the last one archived is {wal}"),
            None => "none was archived since the server started".into(),
        };
        ConditionStatus::new(
            ConditionType::ContinuousArchiving,
            false,
            "ArchiveFailing",
            format!(
                "PostgreSQL cannot archive {file} to {to} ({last}): WAL files wait on the data \
                 volume until they are archived, and fill it if this lasts. Check the bucket and \
                 its credentials; the database pod's log has the agent's error."
            ),
        )
    } else {
        ConditionStatus::new(
            ConditionType::ContinuousArchiving,
            true,
            "Archiving",
            format!(
                "Every completed WAL file goes to {to}, on a quiet server at most {}s after a \
                 commit.",
                archive_timeout(spec).as_secs()
            ),
        )
    })
}

/// When to look again at a Database that archives.
pub fn look_again(db: &Database) -> Option<Duration> {
    enabled(db).map(|_| LOOK_AGAIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use serde_json::json;

    fn db(archiving: bool) -> Database {
        let mut backup = json!({"schedule": "@daily", "s3": {"bucket": "backups"}});
        if archiving {
            backup["walArchiving"] = json!({"archiveTimeout": "30s"});
        }
        testing::database(json!({"version": "16.4", "storage": {"size": "1Gi"}, "backup": backup}))
    }

    #[test]
    fn archiving_is_true_until_the_last_attempt_fails() {
        let mut archiver = Archiver {
            archived_count: 3,
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_at: Some(100),
            ..Archiver::default()
        };
        let ok = condition(&db(true), Some(&archiver)).unwrap();
        assert!(ok.status, "{ok:?}");
        assert_eq!(ok.reason, "Archiving");
        assert!(
            ok.message
                .contains("s3://backups/shop/orders/physical/wal/"),
            "{ok:?}"
        );
        assert!(ok.message.contains("30s"), "{ok:?}");
        // A failure after the last success.
        archiver.failed_count = 2;
        archiver.last_failed_wal = Some("000000010000000000000004".into());
        archiver.last_failed_at = Some(160);
        archiver.waiting = 5;
        let failing = condition(&db(true), Some(&archiver)).unwrap();
        assert!(!failing.status);
        assert_eq!(failing.reason, "ArchiveFailing");
        assert!(
            failing.message.contains("000000010000000000000004"),
            "{failing:?}"
        );
        assert!(
            failing.message.contains("000000010000000000000003"),
            "{failing:?}"
        );
        // More failures, more files waiting: the same condition (no status write per pass).
        archiver.failed_count = 9;
        archiver.waiting = 7;
        archiver.last_failed_at = Some(220);
        assert_eq!(condition(&db(true), Some(&archiver)), Some(failing));
        // Archived again since: True.
        archiver.last_archived_wal = Some("000000010000000000000004".into());
        archiver.last_archived_at = Some(230);
        assert!(condition(&db(true), Some(&archiver)).unwrap().status);
    }

    #[test]
    fn nothing_is_said_without_archiving_or_without_a_report() {
        let archiver = Archiver::default();
        assert_eq!(condition(&db(false), Some(&archiver)), None);
        assert_eq!(condition(&db(true), None), None);
        assert!(condition(&db(true), Some(&archiver)).unwrap().status);
        assert_eq!(look_again(&db(false)), None);
        assert_eq!(look_again(&db(true)), Some(LOOK_AGAIN));
    }
}
