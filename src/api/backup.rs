//! The `DatabaseBackup` custom resource: one backup of one Database, made by the schedule, before
//! an upgrade, or on demand by a user.

// clippy reads the repeated `type_ = "string"` of the printcolumn attributes as duplicates.
#![allow(clippy::duplicated_attributes)]

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One backup of a Database. dbop creates one per scheduled run and before each upgrade; apply one
/// yourself (reason `Manual`) for a backup now.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "dbop.dev",
    version = "v1alpha1",
    kind = "DatabaseBackup",
    namespaced,
    shortname = "dbb",
    category = "dbop",
    status = "DatabaseBackupStatus",
    derive = "PartialEq",
    doc = "One backup of a dbop Database.",
    printcolumn(name = "Database", type_ = "string", json_path = ".spec.database"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(name = "Method", type_ = "string", json_path = ".spec.method"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.sizeBytes",
        description = "Compressed size in bytes"
    ),
    printcolumn(name = "Completed", type_ = "date", json_path = ".status.completedAt"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "a DatabaseBackup's spec is immutable; create a new one"}]))]
pub struct DatabaseBackupSpec {
    /// The name of the Database (in the same namespace) to back up.
    #[schemars(length(min = 1, max = 63))]
    pub database: String,

    /// Why this backup exists.
    #[serde(default)]
    pub reason: BackupReason,

    /// `Logical` (default): a dump of every database, portable to newer major versions.
    /// `Physical`: a base backup of the whole instance, compressed by the server and streamed
    /// to the bucket, from a healthy standby when there is one; with the archived WAL
    /// (`spec.backup.walArchiving`, required) it restores to any point in time
    /// (`bootstrap.fromBackup.recoveryTarget`).
    #[serde(default)]
    pub method: BackupMethod,
}

/// What a backup holds and what it restores to.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupMethod {
    /// A dump (`pg_dump`) of every database, restored into a new Database.
    #[default]
    Logical,
    /// A base backup (`pg_basebackup`) of the whole instance, recovered with archived WAL.
    Physical,
}

/// Why a backup was taken.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupReason {
    /// Made by the schedule in `spec.backup.schedule`.
    Scheduled,
    /// Asked for by a user.
    #[default]
    Manual,
    /// Made before a version upgrade.
    PreUpgrade,
    /// Made when the Database is deleted with `deletionPolicy: Snapshot`.
    Final,
}

/// Where a backup is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum BackupPhase {
    /// Waiting for its turn (one backup at a time per Database) or for the Database.
    Pending,
    /// The backup Job is running.
    Running,
    /// The dump and its manifest are in object storage.
    Succeeded,
    /// It failed; `message` says why.
    Failed,
}

impl BackupPhase {
    pub const ALL: [BackupPhase; 4] = [
        BackupPhase::Pending,
        BackupPhase::Running,
        BackupPhase::Succeeded,
        BackupPhase::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            BackupPhase::Pending => "Pending",
            BackupPhase::Running => "Running",
            BackupPhase::Succeeded => "Succeeded",
            BackupPhase::Failed => "Failed",
        }
    }

    /// Succeeded and Failed are final: nothing changes a finished backup.
    pub fn is_finished(self) -> bool {
        matches!(self, BackupPhase::Succeeded | BackupPhase::Failed)
    }
}

/// The outcome of a backup as reported by the backup agent.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseBackupStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,
    /// When the backup Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When the backup finished, successfully or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
    /// The backup's id in object storage (sorts by time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_id: Option<String>,
    /// The bucket holding the dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// The object key of the dump; `manifest.json` sits beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The compressed size of the dump in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// The SHA-256 of the stored (compressed) dump, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The server version the dump was taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    /// What happened, in a sentence; on failure, what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_phase_labels_match_serialization() {
        for p in BackupPhase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.label());
        }
    }
}
