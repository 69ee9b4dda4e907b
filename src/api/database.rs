//! The `Database` custom resource: what a platform team asks for (spec) and what dbop reports
//! (status). Every field is documented here because this text is what `kubectl explain` shows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_policy::{BackupSpec, BackupStatus, VerificationStatus};
use super::bootstrap::{BootstrapSpec, BootstrapStatus};
use super::placement::{PlacementSpec, ProbesSpec};
use super::security::PodSecuritySpec;
use super::shared::KeyRef;
use super::storage::StorageSpec;

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

/// `spec.podSecurity` may change only until the server first ran (`status.currentVersion`):
/// the data directory is owned by the uid that initialised it, and PostgreSQL refuses another.
pub const POD_SECURITY_TRANSITION_RULE: &str = "(has(self.spec.podSecurity) ? \
(has(oldSelf.spec.podSecurity) && self.spec.podSecurity == oldSelf.spec.podSecurity) : \
!has(oldSelf.spec.podSecurity)) || !has(self.status) || !has(self.status.currentVersion)";

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
    validation = Rule::new(POD_SECURITY_TRANSITION_RULE).message("spec.podSecurity cannot change once the server has run: its data directory belongs to the uid that created it").field_path(".spec.podSecurity"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, no dots): it names the Database's Services"),
    validation = Rule::new("!has(self.spec.deletionPolicy) || self.spec.deletionPolicy != 'Snapshot' || has(self.spec.backup)").message("deletionPolicy Snapshot needs spec.backup: the final backup is stored where spec.backup.s3 says"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Where the database is in its lifecycle"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.currentVersion", description = "The version the running server is on"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", description = "Whether the database accepts connections"),
    printcolumn(name = "Instances", type_ = "integer", json_path = ".spec.instances", description = "The PostgreSQL instances: a primary and its standbys"),
    printcolumn(name = "Primary", type_ = "string", json_path = ".status.primary", priority = 1, description = "The instance that runs as the primary"),
    printcolumn(name = "Last Backup", type_ = "date", json_path = ".status.backup.lastSuccessfulTime", description = "When the last backup succeeded"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.roles) || !has(self.application) || self.roles.all(r, r.name != self.application.owner)",
        "message": "spec.roles cannot declare the application's owner (spec.application.owner): dbop keeps that role itself"
    },
    {
        "rule": "has(self.application) == has(oldSelf.application) && (!has(self.application) || self.application == oldSelf.application)",
        "message": "application cannot change after creation: its database holds the application's data (make another database with spec.roles and init SQL instead)"
    },
    {
        "rule": "!has(self.synchronous) || self.synchronous.standbys < self.instances",
        "message": "spec.synchronous.standbys must be fewer than spec.instances (the primary does not confirm its own commits): add instances or ask fewer standbys"
    },
    {
        "rule": "has(self.credentials) == has(oldSelf.credentials) && (!has(self.credentials) || self.credentials == oldSelf.credentials)",
        "message": "credentials cannot change after creation: the superuser's name is set when the data directory is initialised (rotate the password by editing the Secret's password key)"
    },
    {
        "rule": "!has(self.upgrade) || !has(self.upgrade.inMaintenanceWindow) || !self.upgrade.inMaintenanceWindow || has(self.maintenanceWindow)",
        "message": "spec.upgrade.inMaintenanceWindow needs spec.maintenanceWindow: say when the window is, or drop inMaintenanceWindow"
    }
]))]
// The large sections most Databases leave out (placement, maintenanceWindow, backup, bootstrap)
// are boxed: the operator keeps every Database in memory, and inline they took 1.8 KiB of each
// one's 4.1 KiB (docs/benchmarks.md, "1,000 Databases with the dictionaries, and the boxed spec
// sections"). The schema is the same.
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

    /// The number of PostgreSQL instances, 1 to 5: one primary, the others hot standbys that
    /// clone it and stream its WAL through a replication slot each. `<name>-rw` reaches the
    /// primary, `<name>-ro` the ready standbys, `<name>-r` any ready instance
    /// (docs/high-availability.md).
    #[serde(default = "default_instances")]
    #[schemars(range(min = 1, max = 5))]
    pub instances: i32,

    /// Synchronous replication (opt-in): a commit is acknowledged only once `standbys` of the
    /// standbys have it on disk, so a failover loses no acknowledged commit. Without it,
    /// replication is asynchronous: a failover may lose the last commits no standby had
    /// received (docs/high-availability.md, "Synchronous replication").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<SynchronousSpec>,

    /// Replaced by `instances`. Only `1` (the default an earlier dbop stored) is accepted, so
    /// Databases made before the rename stay valid; any other value is refused with a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == 1", "message": "spec.replicas is replaced by spec.instances (1 to 5: one primary and its standbys): remove spec.replicas and set spec.instances"}]))]
    pub replicas: Option<i32>,

    /// CPU and memory requests and limits of the database container. Default: the operator's
    /// `--database-resources` (requests cpu 100m, memory 256Mi; limits cpu 1, memory 256Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Where the database pods and dbop's Jobs for this Database run: node selector,
    /// tolerations, affinity, topology spread, priority class (see docs/operations.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Box<PlacementSpec>>,

    /// The timings of the database container's startup, readiness and liveness probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<ProbesSpec>,

    /// CPU and memory of the containers of this Database's Jobs (init, restore, preflight;
    /// backup and verify unless `spec.backup.resources` is set). Default: the operator's
    /// `--job-resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_resources: Option<ResourceRequirements>,

    /// The data volume.
    pub storage: StorageSpec,

    /// PostgreSQL's own settings: parameters, preloaded libraries, extra pg_hba rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgresql: Option<super::postgresql::PostgresqlSpec>,

    /// PostgreSQL's metrics on each database pod (on by default) and custom queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<super::monitoring::MonitoringSpec>,

    /// Client connections: TLS always, with a certificate from a CA dbop makes for the
    /// Database (`<name>-ca`; its `ca.crt` is also in the generated credentials Secret), from a
    /// Secret of yours (`serverCertificate`) or from a cert-manager issuer (`issuerRef`); and
    /// whether clients without TLS are still admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::tls::TlsSpec>,

    /// A NetworkPolicy over the database pods (none when absent): PostgreSQL admits only the
    /// peers named here, the Database's own instances and dbop's Jobs; the metrics port only
    /// `metricsFrom`. Egress is not restricted. Enforced only where the cluster's network plugin
    /// enforces NetworkPolicy (docs/security.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<super::network_policy::NetworkPolicySpec>,

    /// Where the superuser credentials live. When absent, dbop generates a Secret named
    /// `<name>-credentials` with a random password. Immutable; the password in the Secret is
    /// not: the server follows it (edit the Secret's `password` key to rotate it). The
    /// application database is named after the superuser (`postgres` by default): clients get
    /// it by default, init SQL runs in it, backups dump it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,

    /// The application's database and its owner (default `app` and `app`): a login role that
    /// is not a superuser, whose credentials dbop puts in the Secret `<name>-app` (username,
    /// password, host, port, dbname, uri, jdbc-uri, pgpass, ca.crt). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<super::accounts::ApplicationSpec>,

    /// Roles dbop keeps on the primary besides the application's: created, altered to the
    /// spec, dropped only with `ensure: Absent` (docs/security.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub roles: Vec<super::accounts::ManagedRoleSpec>,

    /// SQL run once, by an init Job, after the first successful start. When it fails
    /// (`InitFailed`), fixing it — here, or in its ConfigMap — runs it again.
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

    /// When changes that restart the pods and are not urgent may run (days and hours in a time
    /// zone). Without it they run when they are made, and a new operator's instance manager
    /// waits for the Database's next rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<Box<super::maintenance::MaintenanceWindowSpec>>,

    /// Scheduled backups to S3-compatible storage. Without it, dbop makes no backups and the
    /// Database has no `BackupHealthy` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Box<BackupSpec>>,

    /// Create this Database from a backup instead of running `init` (which is then not run: the
    /// backup holds what it made). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "bootstrap is immutable: it says how the Database was created"}]))]
    pub bootstrap: Option<Box<BootstrapSpec>>,

    /// The user and groups the database pods (and dbop's Job pods beside them) run as. By
    /// default dbop derives them from the image (docs/operand-images.md); `assignedBy:
    /// Platform` leaves them to the platform (OpenShift `restricted-v2`). May change only until
    /// the server first ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecuritySpec>,
}

fn default_instances() -> i32 {
    1
}

/// A database engine.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Postgres,
}

/// A reference to a Secret holding the superuser credentials.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// The name of a Secret in the Database's namespace with the keys `username` (optional,
    /// default `postgres`; also the application database's name) and `password` (ASCII; the
    /// server takes a changed password within seconds).
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
    /// The SQL itself. It stops at the first error; see `singleTransaction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 262144))]
    pub sql: Option<String>,

    /// A key of a ConfigMap in the Database's namespace that holds the SQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeyRef>,

    /// `true` (default): the SQL runs in one transaction, all or nothing. `false`: each
    /// statement commits on its own, so `CREATE DATABASE`, `ALTER SYSTEM` or `VACUUM` can run;
    /// it still stops at the first error, and a retry runs the whole SQL again, so every
    /// statement must then be idempotent (`IF NOT EXISTS`, or `\gexec` guards).
    #[serde(default = "single_transaction", skip_serializing_if = "is_true")]
    pub single_transaction: bool,
}

fn single_transaction() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
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

    /// The image every instance runs (the one `currentVersion` is for). dbop's backup,
    /// verification and preflight Jobs that read this server's data run it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_image: Option<String>,

    /// The version the spec asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,

    /// The DNS name clients connect to (read-write, port 5432).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// The Secret that holds the superuser credentials (dbop's and break-glass use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,

    /// The Secret applications connect with: the application role's credentials, the
    /// application database, and ready-made `uri`, `jdbc-uri` and `pgpass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_secret: Option<String>,

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

    /// The instance (pod) that runs as the primary. dbop records it when the Database is first
    /// provisioned and changes it only by a promotion; it is never assumed from the ordinal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub primary: Option<String>,

    /// Every instance: its role and whether it is ready (a standby is ready when it streams
    /// from the primary).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5))]
    pub instances: Vec<InstanceStatus>,
    /// When the instances' WAL positions were read (they are refreshed at most every 10 s, so
    /// a busy Database's status is not rewritten at every pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions_read_at: Option<DateTime<Utc>>,
}

/// One instance of a Database, as the last pass saw it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// The pod's name.
    #[schemars(length(max = 63))]
    pub name: String,
    /// `primary` or `standby`.
    pub role: InstanceRole,
    /// The pod is Ready: the primary serves; a standby answers and streams from the primary.
    pub ready: bool,
    /// The node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// The timeline its server writes (a primary) or receives (a standby).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::shared::no_unsigned_format)]
    pub timeline: Option<u32>,
    /// Its WAL position (`X/Y`): where a primary writes, what a standby has received and
    /// flushed (what a promotion of it would keep). None while its manager does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub lsn: Option<String>,
    /// A standby's WAL replayed (`X/Y`): what its queries see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 17))]
    pub replayed_lsn: Option<String>,
    /// A standby's lag: bytes of WAL between the primary's position and what it replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::shared::no_unsigned_format)]
    pub lag_bytes: Option<u64>,
    /// A streaming standby's lag in time: how long its replay trails the primary's commits, in
    /// milliseconds, as the primary measures it (0 once it caught up and nothing is written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::shared::no_unsigned_format)]
    pub lag_milliseconds: Option<u64>,
    /// A streaming standby: how the primary counts it for synchronous commits
    /// (`pg_stat_replication.sync_state`): `quorum` (with `spec.synchronous`: it is one of the
    /// standbys any of which may confirm a commit), `async` (it confirms nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_state: Option<String>,
}

/// Synchronous replication: how many standbys confirm each commit, and what happens when fewer
/// can.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    /// How many standbys must have a commit on disk before it is acknowledged (any of them:
    /// a quorum). Fewer than `spec.instances`.
    #[schemars(range(min = 1, max = 4))]
    pub standbys: i32,
    /// When fewer standbys stream than `standbys`: `Wait` (the default) holds every commit
    /// until enough do (writes stop, no acknowledged commit can be lost); `Degrade` confirms
    /// with the standbys that stream, and with none acknowledges at once (writes go on, a
    /// failover then may lose the commits made meanwhile).
    #[serde(default)]
    pub when_too_few: WhenTooFew,
}

/// What a primary does when fewer standbys stream than synchronous replication asks.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WhenTooFew {
    /// Commits wait until enough standbys confirm them.
    #[default]
    Wait,
    /// Commits are confirmed by the standbys that stream, or by none.
    Degrade,
}

/// The role of an instance.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceRole {
    #[default]
    Primary,
    Standby,
}

impl InstanceRole {
    /// The value of the pods' role label.
    pub fn label(self) -> &'static str {
        match self {
            InstanceRole::Primary => "primary",
            InstanceRole::Standby => "standby",
        }
    }
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

    /// Start a version upgrade only inside `spec.maintenanceWindow` (default false: it starts
    /// when `spec.version` changes). Once started it runs to its end, window or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_maintenance_window: Option<bool>,
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
        assert_eq!(spec.instances, 1);
        assert_eq!(spec.replicas, None);
        assert_eq!(spec.deletion_policy, DeletionPolicy::Retain);
        let status = serde_json::to_string(&DatabaseStatus::default()).unwrap();
        assert_eq!(status, "{}");
    }
}
