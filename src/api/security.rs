//! `spec.podSecurity`: the user and groups the database pods, and the Job pods that read the
//! same data and credentials files, run as. Which ids follow from it is decided in
//! `resources::pod::run_as` (defaults from the image's name, docs/operand-images.md).
//!
//! Pure data: no client, no clock, no I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who chooses the user and groups of the database and Job pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IdsAssignedBy {
    /// dbop sets `runAsUser`, `runAsGroup` and `fsGroup`: the values given here, else the
    /// defaults for the image (999 for the official Debian images, 70 for a tag with
    /// `alpine`, 26 for `cloudnative-pg/postgresql`, 1001 for `bitnami/postgresql`).
    #[default]
    Dbop,
    /// dbop sets none of them: the platform assigns them (OpenShift's `restricted-v2` SCC
    /// gives a uid and fsGroup from the namespace's range). A uid without an entry in the
    /// image's `/etc/passwd` is given one with nss_wrapper when the image has it.
    Platform,
}

/// The user and groups the database pods and dbop's Job pods run as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.assignedBy) || self.assignedBy != 'Platform' || (!has(self.runAsUser) && !has(self.runAsGroup) && !has(self.fsGroup))",
    "message": "assignedBy Platform lets the platform choose the ids: remove runAsUser, runAsGroup and fsGroup (or use assignedBy Dbop)"
}]))]
pub struct PodSecuritySpec {
    /// `Dbop` (default): dbop sets the ids below, or the image's defaults; `Platform`: dbop
    /// sets none, the platform assigns them (OpenShift `restricted-v2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_by: Option<IdsAssignedBy>,
    /// The uid PostgreSQL runs as. Default: the image's (see `assignedBy`). A uid without an
    /// entry in the image's `/etc/passwd` works only if the image has libnss_wrapper (the
    /// official Debian images do); otherwise the Ready condition says `ImageUserNotFound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// The primary gid. Default: `runAsUser` when it is set, else the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// The group that owns the data volume and may read the credentials files. Default:
    /// `runAsGroup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub fs_group: Option<i64>,
}
