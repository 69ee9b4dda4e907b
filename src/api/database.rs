//! The `Database` custom resource: what a platform team asks for (spec) and what dbop reports
//! (status). Every field is documented here because this text is what `kubectl explain` shows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.version` may move to a newer minor of the same major, or back (not below) to the version
/// the server runs (`status.currentVersion`): that is how a failed upgrade is abandoned.
/// A root rule, because a field's rule cannot see the status.
pub const VERSION_TRANSITION_RULE: &str = "self.spec.version == oldSelf.spec.version || \
(int(self.spec.version.split('.')[0]) == int(oldSelf.spec.version.split('.')[0]) && \
(int(self.spec.version.split('.')[1]) >= int(oldSelf.spec.version.split('.')[1]) || \
(has(self.status) && has(self.status.currentVersion) && \
self.spec.version.split('.')[0] == self.status.currentVersion.split('.')[0] && \
int(self.spec.version.split('.')[1]) >= int(self.status.currentVersion.split('.')[1]))))";
/// What the API server says when `VERSION_TRANSITION_RULE` refuses a change.
pub const VERSION_TRANSITION_MESSAGE: &str = "spec.version may only move to a newer minor release of the same major version, or back to the running version (status.currentVersion) to abandon a failed upgrade; a major upgrade needs a new Database restored from a backup";

/// A PostgreSQL database run by dbop: storage, credentials, the server itself and its lifecycle.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "dbop.dev",
    version = "v1alpha1",
    kind = "Database",
    namespaced,
    shortname = "db",
    category = "dbop",
    status = "DatabaseStatus",
    derive = "PartialEq",
    doc = "A PostgreSQL database run by dbop with its whole lifecycle.",
    validation = Rule::new("self.metadata.name.size() <= 40").message("metadata.name must be at most 40 characters: dbop derives the names of Services, Pods and Jobs from it"),
    validation = Rule::new(VERSION_TRANSITION_RULE).message(VERSION_TRANSITION_MESSAGE).field_path(".spec.version"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, no dots): it names the Database's Services"),
    validation = Rule::new("!has(self.spec.deletionPolicy) || self.spec.deletionPolicy != 'Snapshot' || has(self.spec.backup)").message("deletionPolicy Snapshot needs spec.backup: the final backup is stored where spec.backup.s3 says"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Where the database is in its lifecycle"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.currentVersion", description = "The version the running server is on"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", description = "Whether the database accepts connections"),
    printcolumn(name = "Last Backup", type_ = "date", json_path = ".status.backup.lastSuccessfulTime", description = "When the last backup succeeded"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.credentials) == has(oldSelf.credentials) && (!has(self.credentials) || self.credentials == oldSelf.credentials)",
        "message": "credentials cannot change after creation: the superuser's name is set when the data directory is initialised (rotate the password by editing the Secret's password key)"
    }
]))]
pub struct DatabaseSpec {
    /// The database engine. Only `postgres` today; immutable.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "engine is immutable"}]))]
    pub engine: Engine,

    /// The engine version as `MAJOR.MINOR`, e.g. `"16.4"`. It selects the image (the operator's
    /// `--postgres-image-template`). It may only move forward within the same major version, or
    /// back to the version the server runs (`status.currentVersion`) after a failed upgrade. A
    /// newer minor starts a staged upgrade (see `upgrade` and docs/upgrades.md).
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"), length(max = 7))]
    pub version: String,

    /// A container image to run instead of the one derived from `version` (a mirror, a build with
    /// extensions). It must contain the PostgreSQL release named by `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// The number of instances. Only 1 until streaming replication exists: several independent
    /// primaries behind one Service would split the data.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 1))]
    pub replicas: i32,

    /// CPU and memory requests and limits of the database container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// The data volume.
    pub storage: StorageSpec,

    /// Where the superuser credentials live. When absent, dbop generates a Secret named
    /// `<name>-credentials` with a random password. Immutable; the password in the Secret is
    /// not: the server follows it (edit the Secret's `password` key to rotate it). The
    /// application database is named after the superuser (`postgres` by default): clients get
    /// it by default, init SQL runs in it, backups dump it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,

    /// SQL run once, by an init Job, after the first successful start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitSpec>,

    /// What happens to the data when the Database is deleted: `Retain` (default) keeps the
    /// volume, the credentials Secret and the `DatabaseBackup`s; `Delete` removes them;
    /// `Snapshot` takes a final backup first and removes the volume only once it succeeded
    /// (the `DatabaseBackup`s are kept). Dumps in object storage are never deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Labels and annotations added to the database's pods and Job pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_metadata: Option<PodMetadata>,

    /// How a version upgrade proceeds: the pre-upgrade backup, the time each updated pod has to
    /// become Ready, and the automatic rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,

    /// Scheduled backups to S3-compatible storage. Without it, dbop makes no backups and the
    /// Database has no `BackupHealthy` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// Create this Database from a backup instead of running `init` (which is then not run: the
    /// backup holds what it made). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "bootstrap is immutable: it says how the Database was created"}]))]
    pub bootstrap: Option<BootstrapSpec>,
}

fn default_replicas() -> i32 {
    1
}

/// A database engine.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Postgres,
}

/// The data volume of each instance.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0",
        "message": "storage.size may not shrink (a volume can only grow)"
    },
    {
        "rule": "has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",
        "message": "storage.storageClassName is immutable"
    }
]))]
pub struct StorageSpec {
    /// The volume size, a Kubernetes quantity such as `10Gi`. It may grow (where the
    /// StorageClass allows expansion), never shrink.
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        "message": "storage.size must be a positive quantity such as 10Gi"
    }]))]
    pub size: String,

    /// The StorageClass of the volume; the cluster default when absent. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// A reference to a Secret holding the superuser credentials.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// The name of a Secret in the Database's namespace with the keys `username` (optional,
    /// default `postgres`; also the application database's name) and `password` (ASCII; the
    /// server takes a changed password within about a minute).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// SQL to run once after the first successful start: inline, or from a ConfigMap key.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.sql) != has(self.configMapRef)",
    "message": "init needs exactly one of sql or configMapRef"
}]))]
pub struct InitSpec {
    /// The SQL itself. It runs in one transaction and stops at the first error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 262144))]
    pub sql: Option<String>,

    /// A key of a ConfigMap in the Database's namespace that holds the SQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeyRef>,
}

/// A key of a ConfigMap or Secret in the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The object's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key inside it.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// What the finalizer does with the data when the Database is deleted.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the volumes and the generated credentials Secret (default).
    #[default]
    Retain,
    /// Delete the volumes and the generated credentials Secret.
    Delete,
    /// Take a final backup (a `DatabaseBackup` with reason `Final`), then delete the volumes
    /// and the generated credentials Secret. If the final backup fails or does not finish
    /// within `spec.backup.timeout`, nothing is deleted and the Database stays, saying so.
    /// Needs `spec.backup`.
    Snapshot,
}

/// Extra metadata for the pods dbop creates.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    /// Labels added to the pods (dbop's own `app.kubernetes.io/*` labels win on conflict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Scheduled backups: when, where, and how long they are kept.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When to back up, as a standard 5-field cron expression (`minute hour day-of-month month
    /// day-of-week`, e.g. `0 2 * * *` for 02:00 every night) or `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`, `@yearly`. Read in `timeZone`.
    #[schemars(length(min = 1, max = 256))]
    #[schemars(regex(
        pattern = r"^\s*(@(yearly|monthly|weekly|daily|hourly)|\S+\s+\S+\s+\S+\s+\S+\s+\S+)\s*$"
    ))]
    pub schedule: String,

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

    /// How many backups are kept, in object storage and as `DatabaseBackup` objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,

    /// The compression of the dumps.
    #[serde(default)]
    pub compression: Compression,

    /// Proof that the backups restore: a Job restores the latest backup into a scratch
    /// database and checks it. No verification when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
}

/// When the latest backup is restored into a scratch database to prove it restores: on a
/// schedule or after every Nth successful backup (exactly one of them).
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

    /// The Secret holding the access key. Only the backup Jobs read it; dbop itself never does
    /// more than check that its keys exist.
    pub credentials: S3CredentialsRef,

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

/// Where a Database is in its lifecycle.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Waiting for something the user must provide (a Secret, a ConfigMap).
    Pending,
    /// Creating the volume, Services and StatefulSet; waiting for the server to become ready.
    Provisioning,
    /// The server is up; the init Job is running the init SQL.
    Initializing,
    /// Initialised and accepting connections.
    Ready,
    /// A change (a new version, new resources) is being rolled out to the running pods.
    Upgrading,
    /// It was ready once and is not now (a pod lost readiness, the StatefulSet is gone).
    Degraded,
    /// It cannot proceed without a change to the spec; the conditions say what to fix.
    Failed,
    /// The Database is being deleted; the finalizer applies the deletion policy.
    Deleting,
}

impl Phase {
    pub const ALL: [Phase; 8] = [
        Phase::Pending,
        Phase::Provisioning,
        Phase::Initializing,
        Phase::Ready,
        Phase::Upgrading,
        Phase::Degraded,
        Phase::Failed,
        Phase::Deleting,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Initializing => "Initializing",
            Phase::Ready => "Ready",
            Phase::Upgrading => "Upgrading",
            Phase::Degraded => "Degraded",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

/// What dbop observed and decided, as of `observedGeneration`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// Where the database is in its lifecycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Ready, StorageReady, Initialized, BackupHealthy, Upgrading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The version every instance runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 7))]
    pub current_version: Option<String>,

    /// The version the spec asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,

    /// The DNS name clients connect to (read-write, port 5432).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// The Secret that holds the superuser credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,

    /// The schedule's progress and the latest backup outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupStatus>,

    /// The backup `spec.bootstrap.fromBackup` restored, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapStatus>,
    /// The latest verification of a backup (`spec.backup.verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationStatus>,
    /// The latest version upgrade: where it stands, or how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
}

/// How a version upgrade proceeds (all optional; see docs/upgrades.md).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// Take a `DatabaseBackup` (reason `PreUpgrade`) before any pod changes, when `spec.backup`
    /// is set (default true). A failed backup stops the upgrade on the old version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_upgrade_backup: Option<bool>,

    /// How long each updated pod has to become Ready on the new version (a duration such as
    /// `10m`; default `10m`). A pod not Ready in time stops the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub pod_ready_timeout: Option<String>,

    /// Return the updated pods to the previous image when the upgrade fails (default true;
    /// safe within a major version: the data format is the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_on_failure: Option<bool>,
}

/// The stages of a version upgrade, in order; the last four end it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum UpgradeStage {
    /// A short Job in the target image proves it pulls and reports the target version.
    Preflight,
    /// A `DatabaseBackup` with reason `PreUpgrade` is being taken.
    PreUpgradeBackup,
    /// The pods move to the target image one at a time, highest ordinal first.
    RollingOut,
    /// Every pod runs the target image and is Ready; the version is being confirmed.
    Verifying,
    /// Every instance runs the target version.
    Complete,
    /// A pod failed on the target version: the pods are returning to the previous image.
    RollingBack,
    /// The upgrade failed and every pod runs the previous version again.
    RolledBack,
    /// The upgrade stopped; `message` says why and what to do.
    Failed,
}

impl UpgradeStage {
    pub const ALL: [UpgradeStage; 8] = [
        UpgradeStage::Preflight,
        UpgradeStage::PreUpgradeBackup,
        UpgradeStage::RollingOut,
        UpgradeStage::Verifying,
        UpgradeStage::Complete,
        UpgradeStage::RollingBack,
        UpgradeStage::RolledBack,
        UpgradeStage::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            UpgradeStage::Preflight => "Preflight",
            UpgradeStage::PreUpgradeBackup => "PreUpgradeBackup",
            UpgradeStage::RollingOut => "RollingOut",
            UpgradeStage::Verifying => "Verifying",
            UpgradeStage::Complete => "Complete",
            UpgradeStage::RollingBack => "RollingBack",
            UpgradeStage::RolledBack => "RolledBack",
            UpgradeStage::Failed => "Failed",
        }
    }

    /// Complete, RolledBack and Failed end an upgrade.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            UpgradeStage::Complete | UpgradeStage::RolledBack | UpgradeStage::Failed
        )
    }
}

/// When an upgrade entered one of its stages.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStageTime {
    pub stage: UpgradeStage,
    pub started_at: DateTime<Utc>,
}

/// One version upgrade: what it moves between, where it stands, and the objects it made.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The version the server ran when the upgrade started.
    pub from: String,
    /// The version it moves to.
    pub to: String,
    /// The image the pods ran when it started (the rollback target).
    pub from_image: String,
    /// The image of the target version.
    pub to_image: String,
    /// Where it stands.
    pub stage: UpgradeStage,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When each stage it went through began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<UpgradeStageTime>,
    /// The machine reason of a stop (`PreflightFailed`, `PreUpgradeBackupFailed`,
    /// `PodNotReady`, `WrongVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What is happening, or why it stopped and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The preflight Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight_job: Option<String>,
    /// The image digest the preflight Job ran: the updated pods must run the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_image_id: Option<String>,
    /// The `DatabaseBackup` taken before any pod changed (restore it by hand if needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_upgrade_backup: Option<String>,
    /// During the rollout: the lowest ordinal allowed on the target image (the StatefulSet's
    /// partition); updated one ordinal at a time, highest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// When the current ordinal was released to the target image (its Ready deadline starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_since: Option<DateTime<Utc>>,
    /// The Database's `metadata.generation` when the upgrade stopped: it stays stopped until
    /// the spec changes again, then the version it asks for is tried afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_generation: Option<i64>,
}

impl Database {
    /// The namespace, which every Database has (it is a namespaced kind).
    pub fn namespace_or_default(&self) -> String {
        self.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into())
    }

    /// The name (always set on objects read from the API server).
    pub fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
}

// --- spec.bootstrap: restore into a new Database -----------------------------------------

/// How a new Database gets its data. Immutable: it describes how the Database was created.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore a backup into the new Database instead of running `init`: the server starts
    /// empty, then a restore Job (`<name>-restore`) recreates the backup's roles and restores
    /// its data in one transaction. `Initialized` turns True (reason `RestoredFromBackup`) only
    /// when the restore succeeded.
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
    /// for the newest complete backup.
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
}

/// The API server knows the OpenAPI formats `int32` and `int64`, not schemars' `uint32`
/// (`kubectl apply` warns `unrecognized format "uint32"`): an unsigned field keeps its type and
/// its `minimum`/`maximum`, which do the validating, without the format.
fn no_unsigned_format(schema: &mut schemars::Schema) {
    if schema
        .get("format")
        .and_then(|f| f.as_str())
        .is_some_and(|f| f.starts_with("uint"))
    {
        schema.remove("format");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_labels_match_serialization() {
        for p in Phase::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.label());
        }
    }

    #[test]
    fn optional_fields_do_not_serialize_as_null() {
        let spec: DatabaseSpec = serde_json::from_value(
            serde_json::json!({"version": "16.4", "storage": {"size": "1Gi"}}),
        )
        .unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        assert!(!text.contains("null"), "{text}");
        assert_eq!(spec.replicas, 1);
        assert_eq!(spec.deletion_policy, DeletionPolicy::Retain);
        let status = serde_json::to_string(&DatabaseStatus::default()).unwrap();
        assert_eq!(status, "{}");
    }
}
