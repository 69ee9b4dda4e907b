//! `spec.monitoring`: PostgreSQL's own metrics, served by the instance manager on every
//! database pod (port `metrics`, 9187), and the user's queries added to them.
//!
//! Pure data: no client, no I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::KeyRef;

/// The database pods' metrics endpoint (docs/operations.md, "PostgreSQL's metrics").
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Serve `/metrics` on port 9187 of each database pod (named `metrics`). Default true.
    /// Turning it off or on rolls the pods (the endpoint is part of the pod template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// A ConfigMap key holding custom queries (YAML: `queries:` with name, help, sql, type,
    /// labels, values, database, timeout_seconds; docs/operations.md), read at every scrape: an
    /// edit needs no restart. A missing ConfigMap or key means no custom queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_queries: Option<KeyRef>,
}

impl MonitoringSpec {
    /// Whether the endpoint is served (absent: yes).
    pub fn enabled(spec: Option<&MonitoringSpec>) -> bool {
        spec.and_then(|m| m.enabled).unwrap_or(true)
    }
}
