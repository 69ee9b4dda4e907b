//! The `DatabaseBackup`s a Database asks for: a scheduled one and a pre-upgrade one, owned by
//! it (garbage-collected with it), and the final one of a `Snapshot` deletion, which is not
//! owned (it must outlive the Database).
//!
//! Pure: plain functions of the Database and the name decided for the backup.

use chrono::{DateTime, SecondsFormat, Utc};

use super::{labels, owned_meta};
use crate::api::{BackupMethod, BackupReason, Database, DatabaseBackup, DatabaseBackupSpec};

/// The annotation holding a scheduled backup's due time.
pub const SCHEDULED_AT_ANNOTATION: &str = "dbop.dev/scheduled-at";

fn spec(db: &Database, reason: BackupReason) -> DatabaseBackupSpec {
    DatabaseBackupSpec {
        database: db.name(),
        reason,
        method: BackupMethod::Logical,
    }
}

/// The scheduled backup `name` due at `scheduled_at`, of `spec.backup.method`, owned by the
/// Database.
pub fn scheduled_backup(db: &Database, name: &str, scheduled_at: DateTime<Utc>) -> DatabaseBackup {
    let mut metadata = owned_meta(db, name.to_string(), "backup");
    metadata.annotations = Some(
        [(
            SCHEDULED_AT_ANNOTATION.to_string(),
            scheduled_at.to_rfc3339_opts(SecondsFormat::Secs, true),
        )]
        .into(),
    );
    let method = db
        .spec
        .backup
        .as_ref()
        .map(|b| b.method)
        .unwrap_or_default();
    DatabaseBackup {
        metadata,
        spec: DatabaseBackupSpec {
            method,
            ..spec(db, BackupReason::Scheduled)
        },
        status: None,
    }
}

/// The backup `name` an upgrade takes before it touches a pod, owned by the Database.
pub fn pre_upgrade_backup(db: &Database, name: &str) -> DatabaseBackup {
    DatabaseBackup {
        metadata: owned_meta(db, name.to_string(), "backup"),
        spec: spec(db, BackupReason::PreUpgrade),
        status: None,
    }
}

/// The final backup `name` of a `Snapshot` deletion: labelled, not owned by the Database.
pub fn final_backup(db: &Database, name: &str) -> DatabaseBackup {
    let mut backup = DatabaseBackup::new(name, spec(db, BackupReason::Final));
    backup.metadata.namespace = db.metadata.namespace.clone();
    backup.metadata.labels = Some(labels(&db.name(), "backup"));
    backup
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use serde_json::json;

    fn db(method: Option<&str>) -> Database {
        let mut backup = json!({
            "schedule": "@daily",
            "s3": {"bucket": "backups", "credentials": {"secretName": "s3-key"}},
            "walArchiving": {},
        });
        if let Some(m) = method {
            backup["method"] = json!(m);
        }
        testing::database(json!({"version": "16.4", "storage": {"size": "1Gi"}, "backup": backup}))
    }

    #[test]
    fn scheduled_backups_take_the_policy_s_method_and_the_others_stay_dumps() {
        let at = DateTime::UNIX_EPOCH;
        let method = |b: DatabaseBackup| (b.spec.reason, b.spec.method);
        let physical = db(Some("Physical"));
        assert_eq!(
            method(scheduled_backup(&physical, "orders-1", at)),
            (BackupReason::Scheduled, BackupMethod::Physical)
        );
        assert_eq!(
            method(pre_upgrade_backup(&physical, "orders-pre")),
            (BackupReason::PreUpgrade, BackupMethod::Logical)
        );
        assert_eq!(
            method(final_backup(&physical, "orders-final")),
            (BackupReason::Final, BackupMethod::Logical)
        );
        assert_eq!(
            method(scheduled_backup(&db(None), "orders-1", at)),
            (BackupReason::Scheduled, BackupMethod::Logical)
        );
    }
}
