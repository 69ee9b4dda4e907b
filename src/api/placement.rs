//! Where a Database's pods run and how they are watched: the scheduling fields of its database
//! and Job pods (`spec.placement`, `spec.backup.placement`) and the timings of the database
//! container's probes (`spec.probes`). Pure data: the builders in `resources/` apply them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration, TopologySpreadConstraint};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The scheduling fields of a pod, with Kubernetes' own meaning (see the Pod's `spec`).
///
/// `spec.placement` applies to the database pods and to every Job dbop runs for the Database
/// (init, restore, preflight, backup, verify); `spec.backup.placement`, when set, replaces it
/// as a whole for the backup and verify Jobs. A change rolls the database pods (the
/// StatefulSet's template changes) and applies to Jobs created afterwards.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// Labels a node must have for the pods to run on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the pods tolerate, e.g. those of a dedicated database node pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,

    /// Node affinity, pod affinity and pod anti-affinity rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// How the pods spread over zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,

    /// The PriorityClass of the pods (it must exist; the API server refuses pods naming one
    /// that does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,
}

/// The timings of the database container's probes; each field left out keeps its default.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbesSpec {
    /// Until it first succeeds, the other probes wait (default every 10s, 360 failures: an
    /// hour, for the crash recovery of a large database after an unclean stop). Raise
    /// `failureThreshold` if recovery can take longer: when it runs out, the kubelet restarts
    /// the container and recovery starts over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<ProbeTiming>,
    /// While it fails, the pod gets no client traffic (default every 10s, 3 failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ProbeTiming>,
    /// When it fails this often in a row, the kubelet restarts the container (default every
    /// 10s, 6 failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<ProbeTiming>,
}

/// How often one probe runs, how long one check may take, and how many failures in a row count.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeTiming {
    /// Seconds between two checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub period_seconds: Option<i32>,
    /// Seconds one check may take (default 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: Option<i32>,
    /// Failures in a row before the probe counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub failure_threshold: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_placement_and_probes_serialize_as_empty_objects() {
        assert_eq!(
            serde_json::to_string(&PlacementSpec::default()).unwrap(),
            "{}"
        );
        assert_eq!(serde_json::to_string(&ProbesSpec::default()).unwrap(), "{}");
        let placement: PlacementSpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"pool": "db"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "databases"
        }))
        .unwrap();
        let text = serde_json::to_string(&placement).unwrap();
        assert!(!text.contains("null"), "{text}");
    }
}
