//! `spec.networkPolicy`: an optional NetworkPolicy over the database pods, which admits
//! connections only from the peers named here, the Database's own instances and dbop's Jobs
//! for it (docs/security.md, "NetworkPolicy"). Built in `resources::network_policy`.
//!
//! The peers are spelled as Kubernetes spells `NetworkPolicyPeer` (`podSelector`,
//! `namespaceSelector`, `ipBlock`), so a peer copied from a NetworkPolicy works here. What the
//! schema can judge is refused by the API server (the CEL rules below); what it cannot (a label
//! key Kubernetes refuses) is refused when dbop applies the policy: the condition
//! `NetworkPolicyReady` and a Warning Event say so.
//!
//! Pure data: no client, no clock, no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The NetworkPolicy dbop keeps over the database pods. Absent: none (nothing is restricted).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Keep a NetworkPolicy `<name>` over the database pods. Default true once
    /// `networkPolicy` is set; false deletes the policy and keeps the peers written here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Who may connect to PostgreSQL (port 5432), besides the Database's own instances
    /// (replication) and dbop's Jobs for it (init, backup, verify, restore, preflight), which
    /// are always admitted. Each peer as in a NetworkPolicy: `podSelector` (this namespace's
    /// pods), `namespaceSelector` (every pod of those namespaces), both (those pods of those
    /// namespaces), or `ipBlock`. Empty: no client at all (never "everyone", as an empty `from`
    /// would mean in a NetworkPolicy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub allow_from: Vec<NetworkPeer>,

    /// Who may scrape PostgreSQL's metrics (port 9187, `spec.monitoring`), e.g. Prometheus'
    /// namespace. Empty: nobody (`kubectl dbop status` reads them through the API server's pod
    /// proxy: admit the API server's addresses here to keep its health figures).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub metrics_from: Vec<NetworkPeer>,
}

impl NetworkPolicySpec {
    /// Whether the Database keeps a NetworkPolicy (absent: no; present: unless `enabled: false`).
    pub fn enabled(spec: Option<&NetworkPolicySpec>) -> bool {
        spec.is_some_and(|n| n.enabled.unwrap_or(true))
    }
}

/// A source of connections, as a NetworkPolicy's `from` peer.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",
        "message": "a peer names podSelector, namespaceSelector or ipBlock (an empty selector, {}, selects every pod or namespace)"
    },
    {
        "rule": "!has(self.ipBlock) || (!has(self.podSelector) && !has(self.namespaceSelector))",
        "message": "ipBlock cannot be combined with podSelector or namespaceSelector in one peer: make them two peers"
    }
]))]
pub struct NetworkPeer {
    /// Pods by label: in the Database's namespace, or in the namespaces `namespaceSelector`
    /// selects when both are set. `{}` selects every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// Namespaces by label (`kubernetes.io/metadata.name` is each namespace's name): every pod
    /// in them, or those `podSelector` selects. `{}` selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Addresses outside the cluster's pods (a load balancer, a VPN). Pod addresses are
    /// ephemeral: select pods by label instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IpBlock>,
}

/// A range of addresses, as a NetworkPolicy's `ipBlock`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "isCIDR(self.cidr)",
        "message": "ipBlock.cidr must be a CIDR such as 10.0.0.0/16 or 2001:db8::/64"
    },
    {
        "rule": "!has(self.except) || !isCIDR(self.cidr) || self.except.all(e, isCIDR(e) && cidr(self.cidr).containsCIDR(e) && cidr(e).prefixLength() > cidr(self.cidr).prefixLength())",
        "message": "each ipBlock.except must be a CIDR strictly inside ipBlock.cidr"
    }
]))]
pub struct IpBlock {
    /// The range admitted, e.g. `10.0.0.0/16` or `2001:db8::/64`.
    #[schemars(length(min = 1, max = 49))]
    pub cidr: String,

    /// Ranges inside `cidr` that are not admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 49)))]
    pub except: Vec<String>,
}
