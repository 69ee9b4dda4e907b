//! The `ContinuousArchiving` condition of a Database that archives its WAL
//! (`spec.backup.walArchiving`): from what the primary's manager reports of `pg_stat_archiver`,
//! whether the last WAL file PostgreSQL handed to the agent was stored or not, and, while it was
//! not, that WAL waits on the volume. The messages name no moving count, so a steady archive
//! writes no status.
//!
//! Pure.

use std::time::Duration;

use dbop_contract::position::Archiver;

use super::facts::StorageFact;
use crate::api::Database;
use crate::api::conditions::{ConditionStatus, ConditionType, find};
use crate::resources::agent::PHYSICAL_FOLDER;
use crate::resources::backup_job::storage_prefix;
use crate::resources::wal_archiving::{archive_timeout, enabled};

/// How often a Database that archives is looked at (its primary's archiver read): a failing
/// archive shows within this.
pub const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// A data volume this full (in percent) while archiving fails is named as filling with WAL.
pub const FILLING_PERCENT: u64 = 90;

/// The condition, when the Database archives and its primary reported; `None` otherwise (no
/// archiving: the status drops it; no report: the last one stands). A failing archive whose
/// WAL fills the volume (`storage`: the instances' volumes, read with archiving on) is named as
/// such, and a server that stopped on a full volume while the archive failed is too.
pub fn condition(
    db: &Database,
    archiver: Option<&Archiver>,
    storage: &StorageFact,
) -> Option<ConditionStatus> {
    let (backup, spec) = enabled(db)?;
    let to = format!(
        "s3://{}/{}/{PHYSICAL_FOLDER}/wal/",
        backup.s3.bucket,
        storage_prefix(db, backup)
    );
    let Some(archiver) = archiver else {
        return stopped_full_of_wal(db, storage, &to);
    };
    // The claims' own volumes only: a hostPath's is the node's disk.
    let filling = storage
        .own_volumes()
        .any(|u| u.used_percent() >= FILLING_PERCENT);
    Some(match (archiver.failing(), filling) {
        (true, filling) => {
            let file = archiver.last_failed_wal.as_deref().unwrap_or("a WAL file");
            let last = match &archiver.last_archived_wal {
                Some(wal) => format!("the last one archived is {wal}"),
                None => "none was archived since the server started".into(),
            };
            let (reason, effect) = match filling {
                false => (
                    "ArchiveFailing",
                    "WAL files wait on the data volume until they are archived, and fill it if \
                     this lasts",
                ),
                true => (
                    "ArchiveFailingVolumeFilling",
                    "the WAL files waiting fill the data volume, now over 90 % full, and the \
                     server stops when it is full",
                ),
            };
            let mut message = format!(
                "PostgreSQL cannot archive {file} to {to} ({last}): {effect}. Check the bucket \
                 and its credentials; the database pod's log has the agent's error."
            );
            if filling {
                message.push_str(BUY_TIME);
            }
            ConditionStatus::new(ConditionType::ContinuousArchiving, false, reason, message)
        }
        (false, _) => ConditionStatus::new(
            ConditionType::ContinuousArchiving,
            true,
            "Archiving",
            format!(
                "Every completed WAL file goes to {to}, on a quiet server at most {}s after a \
                 commit.",
                archive_timeout(spec).as_secs()
            ),
        ),
    })
}

const BUY_TIME: &str = " To buy time, grow the volume (spec.storage.size, or \
     spec.storage.autoGrow). Never delete files from pg_wal: they hold commits in no backup.";

/// A server stopped on a full volume (no report) while the archive was failing: the WAL it could
/// not archive filled the volume.
fn stopped_full_of_wal(db: &Database, storage: &StorageFact, to: &str) -> Option<ConditionStatus> {
    let pod = storage.stopped_full.keys().next()?;
    let was_failing = db
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, ConditionType::ContinuousArchiving))
        .is_some_and(|c| c.status == "False");
    was_failing.then(|| {
        ConditionStatus::new(
            ConditionType::ContinuousArchiving,
            false,
            "VolumeFullOfWal",
            format!(
                "PostgreSQL in pod {pod} stopped: its data volume is full of WAL files it could \
                 not archive to {to}. Fix the archive (the bucket and its credentials), then grow \
                 the volume so the server starts and archives them (spec.storage.size, or \
                 spec.storage.autoGrow, which grows a full volume too). Never delete files from \
                 pg_wal: they hold commits in no backup."
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
    use crate::database::facts::ClaimSize;
    use crate::resources::testing;
    use dbop_contract::volume::VolumeUsage;
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
        let ok = condition(&db(true), Some(&archiver), &none()).unwrap();
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
        let failing = condition(&db(true), Some(&archiver), &none()).unwrap();
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
        assert_eq!(
            condition(&db(true), Some(&archiver), &none()),
            Some(failing)
        );
        // Archived again since: True.
        archiver.last_archived_wal = Some("000000010000000000000004".into());
        archiver.last_archived_at = Some(230);
        assert!(
            condition(&db(true), Some(&archiver), &none())
                .unwrap()
                .status
        );
    }

    fn none() -> StorageFact {
        StorageFact::default()
    }

    fn volume(used_percent: u64) -> StorageFact {
        let usage = VolumeUsage {
            size_bytes: 100 << 20,
            free_bytes: (100 - used_percent) << 20,
        };
        StorageFact {
            claims: vec![ClaimSize {
                name: "data-orders-0".into(),
                requested: Some(100 << 20),
                capacity: Some(100 << 20),
            }],
            usage: [("orders-0".to_string(), usage)].into(),
            ..StorageFact::default()
        }
    }

    #[test]
    fn a_failing_archive_that_fills_the_volume_says_so_and_what_to_do() {
        let mut archiver = Archiver {
            last_archived_wal: Some("000000010000000000000003".into()),
            last_archived_at: Some(100),
            failed_count: 2,
            last_failed_wal: Some("000000010000000000000004".into()),
            last_failed_at: Some(160),
            waiting: 40,
            ..Archiver::default()
        };
        let at = |used, archiver: &Archiver| {
            condition(&db(true), Some(archiver), &volume(used)).unwrap()
        };
        assert_eq!(at(89, &archiver).reason, "ArchiveFailing");
        let filling = at(90, &archiver);
        assert_eq!(
            (filling.status, filling.reason.as_str()),
            (false, "ArchiveFailingVolumeFilling")
        );
        assert!(filling.message.contains("over 90 % full"), "{filling:?}");
        assert!(
            filling.message.contains("Never delete files from pg_wal"),
            "{filling:?}"
        );
        // A hostPath volume: the node's disk, 99 % full behind a 1Mi claim, is not the claim's.
        let mut host = volume(99);
        host.claims[0].capacity = Some(1 << 20);
        let c = condition(&db(true), Some(&archiver), &host).unwrap();
        assert_eq!(c.reason, "ArchiveFailing");
        // No capacity known yet: nothing said of the volume.
        host.claims[0].capacity = None;
        let c = condition(&db(true), Some(&archiver), &host).unwrap();
        assert_eq!(c.reason, "ArchiveFailing");
        // A full volume that archives: not the archive's doing.
        archiver.last_archived_at = Some(200);
        archiver.last_archived_wal = archiver.last_failed_wal.clone();
        assert_eq!(at(99, &archiver).reason, "Archiving");
    }

    #[test]
    fn a_server_stopped_on_a_full_volume_while_the_archive_failed_is_named() {
        let mut db = db(true);
        let mut stopped = none();
        stopped
            .stopped_full
            .insert("orders-0".into(), VolumeUsage::default());
        // No report; archiving was fine: the last condition stands.
        assert_eq!(condition(&db, None, &stopped), None);
        db.status = Some(crate::api::DatabaseStatus {
            conditions: crate::api::conditions::merge(
                &[],
                &[ConditionStatus::new(
                    ConditionType::ContinuousArchiving,
                    false,
                    "ArchiveFailing",
                    "x",
                )],
                Some(1),
                chrono::DateTime::UNIX_EPOCH,
            ),
            ..Default::default()
        });
        let c = condition(&db, None, &stopped).unwrap();
        assert_eq!((c.status, c.reason.as_str()), (false, "VolumeFullOfWal"));
        assert!(c.message.contains("pod orders-0 stopped"), "{c:?}");
        assert_eq!(condition(&db, None, &none()), None);
    }

    #[test]
    fn nothing_is_said_without_archiving_or_without_a_report() {
        let archiver = Archiver::default();
        assert_eq!(condition(&db(false), Some(&archiver), &none()), None);
        assert_eq!(condition(&db(true), None, &none()), None);
        assert!(
            condition(&db(true), Some(&archiver), &none())
                .unwrap()
                .status
        );
        assert_eq!(look_again(&db(false)), None);
        assert_eq!(look_again(&db(true)), Some(LOOK_AGAIN));
    }
}
