//! The `Database`'s backup policy (`spec.backup`): the schedule, the S3 location and its
//! credentials, retention, compression and scheduled verification, and what `status.backup` and
//! `status.verification` report about them. Part of the `Database` kind (`database.rs`).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::placement::PlacementSpec;
use super::shared::{KeyRef, no_unsigned_format};
use k8s_openapi::api::core::v1::ResourceRequirements;

/// Scheduled backups: when, where, and how long they are kept.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.method) || self.method == 'Logical' || has(self.walArchiving)",
    "message": "method Physical needs walArchiving: a base backup restores only with the WAL archived after it"
}]))]
pub struct BackupSpec {
    /// When to back up, as a standard 5-field cron expression (`minute hour day-of-month month
    /// day-of-week`, e.g. `0 2 * * *` for 02:00 every night) or `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`, `@yearly`. Read in `timeZone`.
    #[schemars(length(min = 1, max = 256))]
    #[schemars(regex(
        pattern = r"^\s*(@(yearly|monthly|weekly|daily|hourly)|\S+\s+\S+\s+\S+\s+\S+\s+\S+)\s*$"
    ))]
    pub schedule: String,

    /// What the scheduled backups take. `Logical` (default): a dump of every database,
    /// portable to newer major versions. `Physical`: a base backup of the whole instance (from
    /// a healthy standby when there is one) which, with the archived WAL (`walArchiving`,
    /// required), restores to any point in time (`bootstrap.fromBackup.recoveryTarget`).
    /// Retention, history and `BackupHealthy` count the scheduled backups of this method; the
    /// pre-upgrade and final backups stay dumps, and either kind can be taken on demand.
    #[serde(default)]
    pub method: super::BackupMethod,

    /// The IANA time zone the schedule is read in, e.g. `Europe/Berlin`; UTC when absent.
    /// Across a daylight-saving change, a time that does not exist that day is skipped and a
    /// time that happens twice runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
    )]
    pub time_zone: Option<String>,

    /// Stop starting scheduled backups (running and on-demand ones are not affected).
    #[serde(default)]
    pub suspend: bool,

    /// How late a missed run may still start, as a duration such as `1h` or `30m` (default
    /// `1h`). After downtime, at most one missed run starts (the latest), and only within this
    /// deadline; older missed runs are skipped, never replayed in a burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub starting_deadline: Option<String>,

    /// The recovery point objective: `BackupHealthy` turns False when the last successful
    /// backup is older than this (a duration such as `26h`). Default: twice the longest interval
    /// between two scheduled runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub rpo: Option<String>,

    /// The longest a backup Job may run before it is stopped and marked Failed (a duration such
    /// as `6h`; default `6h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub timeout: Option<String>,

    /// The S3-compatible bucket the dumps go to.
    pub s3: S3Spec,

    /// Client-side encryption of everything the backups write (each database's dump, the
    /// roles script and the manifest's contents) with a key from a Secret, before it leaves
    /// the Job. The manifest names the key, so older backups keep restoring after a rotation
    /// as long as the Secret keeps their keys. No encryption when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<BackupEncryption>,

    /// How many backups are kept, in object storage and as `DatabaseBackup` objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,

    /// The compression of the dumps.
    #[serde(default)]
    pub compression: Compression,

    /// How many streams dump each database at once (1–16, default 1). With N > 1 the largest
    /// tables' rows are shared out among N streams, one of them with the rest of the dump, and
    /// a table much larger than its share (PostgreSQL 14+) is cut into ranges of pages dumped
    /// side by side; all of them read one exported snapshot, so the backup is as consistent as
    /// a single `pg_dump`, and it is restored in one transaction as before. Each stream takes a
    /// CPU core for compression and its own upload buffers, so set it to the cores the backup
    /// Job may use. Dumps only (`method: Logical`, pre-upgrade and final backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    #[schemars(transform = no_unsigned_format)]
    pub dump_streams: Option<u32>,

    /// Proof that the backups restore. For dumps, a Job restores the latest backup into a
    /// scratch database on the server and compares its row counts with the backup's. For base
    /// backups (`method: Physical`), a Job recovers the newest one and all the archived WAL
    /// into a scratch instance of its own (an emptyDir no larger than `storage.size`, never the
    /// live server), checks that it replayed up to the newest archived WAL file (a missing
    /// file in between would end a recovery early) and reads every table of every database.
    /// Either way the time the restore took is reported as the measured recovery time. No
    /// verification when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,

    /// Continuous archiving of the write-ahead log to the same bucket (under the Database's
    /// prefix, in `physical/wal/<timeline>/`): every completed WAL file is compressed,
    /// checksummed and encrypted with `encryption`'s key, never stored over a different object
    /// of the same name. A commit is archived at most `archiveTimeout` after it was made, which
    /// bounds what a lost volume loses. Enabling or disabling it restarts the pods (PostgreSQL
    /// reads `archive_mode` at start). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_archiving: Option<WalArchivingSpec>,

    /// Where the backup and verify Jobs run: replaces `spec.placement` for them as a whole
    /// (e.g. to keep dumps off the database's node pool). Default: `spec.placement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementSpec>,

    /// CPU and memory of the backup and verify Jobs' containers. Default: `spec.jobResources`,
    /// else the operator's `--job-resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// How the write-ahead log is archived (`spec.backup.walArchiving`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WalArchivingSpec {
    /// The longest a commit waits before its WAL file is archived on a quiet server
    /// (PostgreSQL's `archive_timeout`: a partly filled file is closed and archived), as a
    /// duration such as `60s` or `5m` (default `60s`; at least `10s`). A busy server fills
    /// files sooner. Shorter means a smaller loss when the volume is lost, and more objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub archive_timeout: Option<String>,

    /// WAL files uploaded at once when PostgreSQL has several ready (1 to 32, default 4): a
    /// busy primary keeps up with read-ahead instead of one upload after another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    #[schemars(transform = no_unsigned_format)]
    pub parallel: Option<u16>,
}

/// The key the backups are encrypted with: `keyName` in the Secret `secretName`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupEncryption {
    /// The Secret (in the Database's namespace) holding the keys, one per Secret key, each the
    /// base64 of 32 random bytes (`openssl rand -base64 32`). Keep old keys in it after a
    /// rotation: backups made with them are read with them. It is mounted into the backup,
    /// verify and restore Jobs as files; dbop reads only its key names.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub secret_name: String,
    /// The key in that Secret that new backups are encrypted with. To rotate: add a new key
    /// to the Secret and name it here.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key_name: String,
}

/// The Secret holding the keys an encrypted backup may have been written with.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionKeysRef {
    /// The Secret (in this Database's namespace) holding the keys, one per Secret key; the
    /// restore uses the key the backup's manifest names.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub secret_name: String,
}

/// When the latest backup is restored into a scratch database (or, for base backups, a scratch
/// instance) to prove it restores: on a schedule or after every Nth successful backup (exactly
/// one of them).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.schedule) != has(self.everyNthBackup)",
    "message": "verify needs exactly one of schedule or everyNthBackup"
}]))]
pub struct VerifySpec {
    /// A standard 5-field cron expression (or `@daily`, `@weekly`, …), read in
    /// `spec.backup.timeZone`: verify the latest successful backup at these times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    #[schemars(regex(
        pattern = r"^\s*(@(yearly|monthly|weekly|daily|hourly)|\S+\s+\S+\s+\S+\s+\S+\s+\S+)\s*$"
    ))]
    pub schedule: Option<String>,
    /// Verify after every Nth successful backup (1: after each one). At most
    /// `retention.keepLast` is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    #[schemars(transform = no_unsigned_format)]
    pub every_nth_backup: Option<u32>,
}

/// The latest verification of a backup (`spec.backup.verify`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationStatus {
    /// When the latest verification succeeded (the agent's completion time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verified_time: Option<DateTime<Utc>>,
    /// The backup id that verification restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verified_backup_id: Option<String>,
    /// How long the latest successful verification took to restore the backup (for a base
    /// backup: unpacking it and replaying the WAL), in seconds, e.g. `72.3s`: the recovery time
    /// measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_time: Option<String>,
    /// When the latest verification failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<DateTime<Utc>>,
    /// The outcome of the latest finished verification: `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// What the latest finished verification reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The verify Job of the latest trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The time of the latest trigger: the scheduled time, or the completion of the backup
    /// that made it the Nth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trigger_time: Option<DateTime<Utc>>,
}

/// An S3-compatible bucket (AWS S3, MinIO, any S3 API).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Spec {
    /// The endpoint URL, e.g. `https://minio.storage.svc:9000`; AWS S3 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint: Option<String>,

    /// The bucket name.
    #[schemars(
        length(min = 3, max = 63),
        regex(pattern = r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$")
    )]
    pub bucket: String,

    /// A key prefix. Objects are stored under `<prefix>/<namespace>/<database>/…`, so several
    /// Databases can share a bucket and a prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), regex(pattern = r"^[A-Za-z0-9!_.*'()/\-]*$"))]
    pub prefix: Option<String>,

    /// The region (default `us-east-1`, which MinIO and most S3-compatible servers accept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,

    /// Path-style requests (`endpoint/bucket/key`), as MinIO and most S3-compatible servers
    /// need. Default false (virtual-hosted style, as AWS S3 prefers).
    #[serde(default)]
    pub force_path_style: bool,

    /// The Secret holding a static access key. Only the backup Jobs read it; dbop itself never
    /// does more than check that its keys exist. Absent: the Jobs take AWS's standard
    /// credential chain: web identity (IRSA: a ServiceAccount annotated
    /// `eks.amazonaws.com/role-arn`, see `serviceAccountName`), EKS Pod Identity and other
    /// container credentials, then the node's instance metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3CredentialsRef>,

    /// The ServiceAccount the Jobs that reach this bucket run as (backup, verify, restore): the
    /// one IRSA, EKS Pod Identity or GKE Workload Identity binds to a cloud role. Default: the
    /// namespace's `default`. No API token is mounted either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Server-side encryption of every object dbop writes (SSE-S3 or SSE-KMS). Absent: the
    /// bucket's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_side_encryption: Option<ServerSideEncryption>,

    /// A private CA to trust for the endpoint (PEM), from a key of a Secret or ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSource>,
}

/// A Secret with an S3 access key pair.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3CredentialsRef {
    /// The Secret's name, in the Database's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The key holding the access key id (default `AWS_ACCESS_KEY_ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub access_key_id_key: Option<String>,
    /// The key holding the secret access key (default `AWS_SECRET_ACCESS_KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_access_key_key: Option<String>,
    /// The key holding a session token, for temporary credentials (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub session_token_key: Option<String>,
}

impl S3CredentialsRef {
    pub const DEFAULT_ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
    pub const DEFAULT_SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";

    /// The key of the access key id.
    pub fn access_key_id_key(&self) -> &str {
        self.access_key_id_key
            .as_deref()
            .unwrap_or(Self::DEFAULT_ACCESS_KEY_ID_KEY)
    }

    /// The key of the secret access key.
    pub fn secret_access_key_key(&self) -> &str {
        self.secret_access_key_key
            .as_deref()
            .unwrap_or(Self::DEFAULT_SECRET_ACCESS_KEY_KEY)
    }
}

/// How the bucket encrypts what dbop writes.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.kmsKeyId) || self.algorithm == 'aws:kms'",
    "message": "kmsKeyId needs algorithm aws:kms"
}]))]
pub struct ServerSideEncryption {
    /// `AES256` (SSE-S3: keys the bucket manages) or `aws:kms` (SSE-KMS).
    pub algorithm: SseAlgorithm,
    /// The KMS key (id, ARN or alias) for `aws:kms`; absent: the account's default key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub kms_key_id: Option<String>,
}

/// A server-side encryption algorithm, as S3 names it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SseAlgorithm {
    #[serde(rename = "AES256")]
    Aes256,
    #[serde(rename = "aws:kms")]
    AwsKms,
}

impl SseAlgorithm {
    /// The agent's `--sse` value.
    pub fn as_arg(self) -> &'static str {
        match self {
            SseAlgorithm::Aes256 => "aes256",
            SseAlgorithm::AwsKms => "aws-kms",
        }
    }
}

/// Where a CA certificate (PEM) comes from: exactly one of a Secret key or a ConfigMap key.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
    "message": "ca needs exactly one of secretKeyRef or configMapKeyRef"
}]))]
pub struct CaSource {
    /// A key of a Secret in the Database's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    /// A key of a ConfigMap in the Database's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// How many backups are kept. One policy for both places: the agent prunes object storage after
/// each backup, and dbop deletes the `DatabaseBackup` objects of the same backups. The newest
/// successful backup is never deleted.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Keep at most this many successful backups (default 7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    #[schemars(transform = no_unsigned_format)]
    pub keep_last: Option<u32>,
    /// Delete successful backups older than this (a duration such as `30d`); no age limit when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub max_age: Option<String>,
    /// Keep at most this many failed `DatabaseBackup` objects, for their messages (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    #[schemars(transform = no_unsigned_format)]
    pub keep_failed: Option<u32>,
}

/// The compression of a dump.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Zstandard (level 3).
    #[default]
    Zstd,
}

/// The schedule's progress and the latest backup outcomes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The scheduled time of the latest run dbop started (a `DatabaseBackup` named
    /// `<database>-<yyyymmddhhmm>` in UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<DateTime<Utc>>,
    /// When the next scheduled run is due (absent while suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<DateTime<Utc>>,
    /// The `DatabaseBackup` that succeeded last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful: Option<String>,
    /// When that backup completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<DateTime<Utc>>,
    /// The `DatabaseBackup` that failed last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// When that backup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_time: Option<DateTime<Utc>>,
}
