//! `spec.bootstrap`: how a new Database gets its data — a logical dump restored into a
//! started server, or a physical base backup recovered with archived WAL to a point in time
//! before the server first starts — and `status.bootstrap`, what the restore did.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_policy::{EncryptionKeysRef, S3Spec};

/// How a new Database gets its data. Immutable: it describes how the Database was created.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore a backup into the new Database instead of running `init`. A dump: the server
    /// starts empty, then a restore Job (`<name>-restore`) recreates the backup's roles and
    /// restores its data in one transaction; `Initialized` turns True (reason
    /// `RestoredFromBackup`) only when the restore succeeded. With `recoveryTarget`: the Job
    /// recovers a base backup and the archived WAL into the first volume before the server
    /// first starts (reason `RecoveredToTarget`).
    pub from_backup: FromBackupSpec,
}

/// Which backup to restore: a `DatabaseBackup` in this namespace, or a location in S3.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.databaseBackup) != has(self.s3)",
        "message": "fromBackup needs exactly one of databaseBackup or s3"
    },
    {
        "rule": "!has(self.databaseBackup) || (!has(self.backupId) && !has(self.database) && !has(self.namespace))",
        "message": "backupId, database and namespace go with s3; a databaseBackup names its backup itself"
    }
]))]
pub struct FromBackupSpec {
    /// The name of a succeeded `DatabaseBackup` in this namespace. Its Database must still
    /// exist: the bucket and credentials are read from its `spec.backup.s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub database_backup: Option<String>,

    /// The bucket holding the backup, with the same fields as `spec.backup.s3` (the credentials
    /// Secret and CA must be in this Database's namespace). Objects are read under
    /// `<prefix>/<namespace>/<database>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Spec>,

    /// With `s3`: the backup id (as in `DatabaseBackup.status.backupId`), or `latest` (default)
    /// for the newest complete backup. With `recoveryTarget`: the base backup to start from
    /// (default: the newest that ends before the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    pub backup_id: Option<String>,

    /// With `s3`: the name of the Database whose backups to read (default: this Database's
    /// name, e.g. to bring back a deleted Database under its old name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub database: Option<String>,

    /// With `s3`: the namespace that Database was in (default: this Database's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub namespace: Option<String>,

    /// The Secret holding the key(s) of an encrypted backup (in this Database's namespace).
    /// Default with `databaseBackup`: its Database's `spec.backup.encryption.secretName`.
    /// An encrypted backup without it is refused, saying which key it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionKeysRef>,

    /// Recover the whole instance to a point in time instead of restoring a dump: a Job
    /// unpacks the newest base backup before the target into the new volume, replays the
    /// archived WAL of `<prefix>/<namespace>/<database>/physical/` up to the target and promotes
    /// it on a new timeline; the server starts only then. The source must have archived WAL
    /// (`spec.backup.walArchiving`) and base backups. A target no backup can reach fails with
    /// the earliest and latest restorable points. With `databaseBackup`, it must name a
    /// physical backup (`method: Physical`), which is the base backup recovered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_target: Option<RecoveryTarget>,

    /// How many sessions restore a dump taken with `dumpStreams` > 1 at once (1–16, default
    /// 1). With 1, the dump is restored in one transaction: all or nothing. With N > 1, in
    /// steps, each its own transaction committed once its objects are checked whole: the
    /// schema, then the dump's data streams N at once, then indexes, constraints and
    /// triggers. Faster, but a failure after the schema leaves the application database
    /// partly restored: the Database is marked failed, never initialised, and must be
    /// created again to retry. Dumps of one stream are always restored in one transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    #[schemars(transform = super::shared::no_unsigned_format)]
    pub restore_streams: Option<u32>,
}

/// Where a point-in-time recovery stops: exactly one of a moment, a WAL location, a named
/// restore point, or the end of the archived WAL.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.time) ? 1 : 0) + (has(self.lsn) ? 1 : 0) + (has(self.restorePoint) ? 1 : 0) + ((has(self.latest) && self.latest) ? 1 : 0) == 1",
    "message": "recoveryTarget needs exactly one of time, lsn, restorePoint or latest: true"
}]))]
pub struct RecoveryTarget {
    /// Stop before the first transaction that committed after this moment (RFC 3339, e.g.
    /// `2026-12-04T10:15:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<DateTime<Utc>>,
    /// Stop at this WAL location (`X/Y`, as `pg_current_wal_lsn()` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"))]
    pub lsn: Option<String>,
    /// Stop at this restore point (made with `pg_create_restore_point(name)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub restore_point: Option<String>,
    /// Replay every archived WAL file: the newest point the archive holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<bool>,
}

impl RecoveryTarget {
    /// The target in words, for messages and `status.bootstrap.recoveryTarget`.
    pub fn describe(&self) -> String {
        match (&self.time, &self.lsn, &self.restore_point) {
            (Some(time), _, _) => format!(
                "time {}",
                time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            ),
            (None, Some(lsn), _) => format!("LSN {lsn}"),
            (None, None, Some(name)) => format!("restore point {name}"),
            (None, None, None) => "the latest archived WAL".into(),
        }
    }
}

/// What the restore of `spec.bootstrap.fromBackup` did.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapStatus {
    /// The id of the backup that was restored (resolved when `latest` was asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_backup_id: Option<String>,
    /// The object key of the restored dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_key: Option<String>,
    /// When the restore finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<DateTime<Utc>>,
    /// With `recoveryTarget`: the target, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_target: Option<String>,
    /// With `recoveryTarget`: the commit time of the last transaction replayed — the point the
    /// data actually reached (absent when the base backup needed no transaction replayed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_to: Option<DateTime<Utc>>,
    /// With `recoveryTarget`: the WAL location the server was promoted at.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "recoveredLSN"
    )]
    pub recovered_lsn: Option<String>,
    /// With `recoveryTarget`: the timeline the Database started on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::shared::no_unsigned_format)]
    pub timeline: Option<u32>,
}
