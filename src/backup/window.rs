//! The restorable window of a Database that archives its WAL: a point-in-time recovery can reach
//! any moment from the end of its oldest succeeded physical backup (the first consistent point)
//! to its last archived commit, which is "now" while archiving keeps up and the moment it began
//! to fail while it does not.
//!
//! Pure: the Database and its `DatabaseBackup`s in, the window out.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::conditions::ConditionType;
use crate::api::{BackupMethod, BackupPhase, Database, DatabaseBackup};
use crate::objects::to_chrono;
use crate::resources::wal_archiving::{archive_timeout, enabled};

/// From the oldest base backup to the last archived commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorableWindow {
    /// The oldest succeeded physical `DatabaseBackup` and when it ended; `None` before the first.
    pub earliest: Option<(String, DateTime<Utc>)>,
    pub latest: Latest,
}

/// How far the archive reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Latest {
    /// Archiving keeps up: every commit but at most the last `archive_timeout` of them.
    Now { archive_timeout: Duration },
    /// Archiving has failed since this moment: later commits wait on the volume.
    FailingSince(DateTime<Utc>),
    /// The primary has not reported on archiving yet.
    Unknown,
}

/// The window; `None` when the Database does not archive its WAL.
pub fn restorable_window(db: &Database, backups: &[DatabaseBackup]) -> Option<RestorableWindow> {
    let (_, spec) = enabled(db)?;
    let earliest = backups
        .iter()
        .filter(|b| b.spec.database == db.name() && b.spec.method == BackupMethod::Physical)
        .filter_map(|b| {
            let status = b.status.as_ref()?;
            let ended = status
                .completed_at
                .filter(|_| status.phase == Some(BackupPhase::Succeeded))?;
            Some((b.metadata.name.clone()?, ended))
        })
        .min_by_key(|(name, ended)| (*ended, name.clone()));
    let archiving = db.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ConditionType::ContinuousArchiving.label())
    });
    let latest = match archiving {
        Some(c) if c.status == "True" => Latest::Now {
            archive_timeout: archive_timeout(spec),
        },
        Some(c) => Latest::FailingSince(to_chrono(&c.last_transition_time)),
        None => Latest::Unknown,
    };
    Some(RestorableWindow { earliest, latest })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn database(conditions: serde_json::Value) -> Database {
        serde_json::from_value(json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "16.4", "storage": {"size": "1Gi"}, "backup": {
                "schedule": "0 2 * * *", "method": "Physical",
                "walArchiving": {"archiveTimeout": "5m"},
                "s3": {"bucket": "backups", "credentials": {"secretName": "s3"}}}},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn archiving(status: &str, at: &str) -> serde_json::Value {
        json!([{"type": "ContinuousArchiving", "status": status, "reason": "r",
                "lastTransitionTime": at, "message": "m"}])
    }

    fn backup(
        name: &str,
        database: &str,
        method: &str,
        status: serde_json::Value,
    ) -> DatabaseBackup {
        serde_json::from_value(json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"database": database, "reason": "Scheduled", "method": method},
            "status": status,
        }))
        .unwrap()
    }

    fn succeeded(at: &str) -> serde_json::Value {
        json!({"phase": "Succeeded", "completedAt": at})
    }

    #[test]
    fn the_window_opens_at_the_oldest_succeeded_base_backup_of_this_database() {
        let backups = [
            backup(
                "dump",
                "orders",
                "Logical",
                succeeded("2026-11-01T02:00:00Z"),
            ),
            backup(
                "other",
                "invoices",
                "Physical",
                succeeded("2026-11-02T02:00:00Z"),
            ),
            backup(
                "failed",
                "orders",
                "Physical",
                json!({"phase": "Failed", "completedAt": "2026-11-03T02:00:00Z"}),
            ),
            backup(
                "newer",
                "orders",
                "Physical",
                succeeded("2026-11-05T02:00:00Z"),
            ),
            backup(
                "oldest",
                "orders",
                "Physical",
                succeeded("2026-11-04T02:00:00Z"),
            ),
            backup("running", "orders", "Physical", json!({"phase": "Running"})),
        ];
        let db = database(archiving("True", "2026-11-01T00:00:00Z"));
        let window = restorable_window(&db, &backups).unwrap();
        assert_eq!(
            window.earliest,
            Some(("oldest".into(), "2026-11-04T02:00:00Z".parse().unwrap()))
        );
        assert_eq!(
            window.latest,
            Latest::Now {
                archive_timeout: Duration::from_secs(300)
            }
        );
        // A dump, another Database's base backup and a failed one open no window.
        assert_eq!(
            restorable_window(&db, &backups[..3]).unwrap().earliest,
            None
        );
    }

    #[test]
    fn the_window_closes_when_archiving_began_to_fail_and_is_unknown_before_a_report() {
        let failing = database(archiving("False", "2026-11-30T09:00:00Z"));
        assert_eq!(
            restorable_window(&failing, &[]).unwrap().latest,
            Latest::FailingSince("2026-11-30T09:00:00Z".parse().unwrap())
        );
        let unreported = database(json!([]));
        assert_eq!(
            restorable_window(&unreported, &[]).unwrap().latest,
            Latest::Unknown
        );
        let mut not_archiving = unreported;
        not_archiving.spec.backup.as_mut().unwrap().wal_archiving = None;
        assert_eq!(restorable_window(&not_archiving, &[]), None);
    }
}
