//! Test helpers shared by the `DatabaseBackup` controller's table tests.

use chrono::{DateTime, TimeZone, Utc};

use crate::api::{
    BackupPhase, BackupReason, DatabaseBackup, DatabaseBackupSpec, DatabaseBackupStatus,
};

pub fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 5, 1, 2, 0, 30).unwrap()
}

pub fn backup(
    name: &str,
    reason: BackupReason,
    phase: Option<BackupPhase>,
    age: i64,
) -> DatabaseBackup {
    let mut b = DatabaseBackup::new(
        name,
        DatabaseBackupSpec {
            database: "orders".into(),
            reason,
            method: crate::api::BackupMethod::Logical,
        },
    );
    b.metadata.namespace = Some("shop".into());
    b.metadata.creation_timestamp = Some(crate::api::conditions::to_meta_time(
        now() - chrono::TimeDelta::seconds(age),
    ));
    b.status = phase.map(|p| DatabaseBackupStatus {
        phase: Some(p),
        ..Default::default()
    });
    b
}
