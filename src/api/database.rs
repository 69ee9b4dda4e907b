//! The `Database` custom resource: what a platform team asks for (spec) and what dbop reports
//! (status). Every field is documented here because this text is what `kubectl explain` shows.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
        "message": "credentials cannot change after creation: the superuser password is set when the data directory is initialised"
    }
]))]
pub struct DatabaseSpec {
    /// The database engine. Only `postgres` today; immutable.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "engine is immutable"}]))]
    pub engine: Engine,

    /// The engine version as `MAJOR.MINOR`, e.g. `"16.4"`. It selects the image
    /// (`<image repository>:<version>`). It may only move forward within the same major version.
    #[schemars(regex(pattern = r"^[0-9]{1,3}\.[0-9]{1,3}$"), length(max = 7))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "int(self.split('.')[0]) == int(oldSelf.split('.')[0]) && int(self.split('.')[1]) >= int(oldSelf.split('.')[1])",
        "message": "version may only move to a newer minor release of the same major version; a major upgrade needs a new Database restored from a backup"
    }]))]
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
    /// `<name>-credentials` with a random password. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,

    /// SQL run once, by an init Job, after the first successful start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitSpec>,

    /// What happens to the data when the Database is deleted: `Retain` (default) keeps the
    /// volume and the credentials Secret, `Delete` removes them.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Labels and annotations added to the database's pods and Job pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_metadata: Option<PodMetadata>,
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
    /// default `postgres`) and `password`.
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
        assert_eq!(spec.replicas, 1);
        assert_eq!(spec.deletion_policy, DeletionPolicy::Retain);
        let status = serde_json::to_string(&DatabaseStatus::default()).unwrap();
        assert_eq!(status, "{}");
    }
}
