//! The `DatabaseBackup`s a Database asks for: a scheduled one and a pre-upgrade one, owned by
//! it (garbage-collected with it), and the final one of a `Snapshot` deletion, which is not
//! owned (it must outlive the Database).
//!
//! Pure: plain functions of the Database and the name decided for the backup.

use chrono::{DateTime, SecondsFormat, Utc};

use super::{labels, owned_meta};
use crate::api::{BackupReason, Database, DatabaseBackup, DatabaseBackupSpec};

/// The annotation holding a scheduled backup's due time.
pub const SCHEDULED_AT_ANNOTATION: &str = "dbop.dev/scheduled-at";

fn spec(db: &Database, reason: BackupReason) -> DatabaseBackupSpec {
    DatabaseBackupSpec {
        database: db.name(),
        reason,
        method: crate::api::BackupMethod::Logical,
    }
}

/// The scheduled backup `name` due at `scheduled_at`, owned by the Database.
pub fn scheduled_backup(db: &Database, name: &str, scheduled_at: DateTime<Utc>) -> DatabaseBackup {
    let mut metadata = owned_meta(db, name.to_string(), "backup");
    metadata.annotations = Some(
        [(
            SCHEDULED_AT_ANNOTATION.to_string(),
            scheduled_at.to_rfc3339_opts(SecondsFormat::Secs, true),
        )]
        .into(),
    );
    DatabaseBackup {
        metadata,
        spec: spec(db, BackupReason::Scheduled),
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
