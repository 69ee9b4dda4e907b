//! The restart decision of the server's parameters: whether the pods must still restart to
//! run with the spec's restart-needing parameters (`resources::server_config`), and the
//! `RestartPending` condition that says which ones until they have.
//!
//! Reloadable parameters never restart anything: the instance manager reloads the server when
//! the mounted ConfigMap changes. Restart-needing ones travel in a pod-template annotation, so
//! a change rolls the StatefulSet's pods one at a time; the condition stays True until that
//! rollout is over.
//!
//! Pure: the previous condition, the observed template's annotation and the rollout state in.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::api::Database;
use crate::api::conditions::{ConditionStatus, ConditionType, find};
use crate::resources::server_config::{parameters, parse_restart_annotation, restart_parameters};

/// What the restart decision reads about the StatefulSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartFact {
    /// The restart-needing parameters its pod template carries (None: no StatefulSet yet).
    pub template: Option<BTreeMap<String, String>>,
}

impl RestartFact {
    pub fn of(sts: Option<&StatefulSet>) -> RestartFact {
        RestartFact {
            template: sts.map(|s| {
                parse_restart_annotation(
                    s.spec
                        .template
                        .metadata
                        .as_ref()
                        .and_then(|m| m.annotations.as_ref()),
                )
            }),
        }
    }
}

/// The names whose values differ between `a` and `b` (set in one only, or set differently).
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let mut names: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|n| a.get(*n) != b.get(*n))
        .cloned()
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

const PENDING: &str = "RestartPending";

/// The `RestartPending` condition.
///
/// True, naming the parameters, when the StatefulSet's template does not carry the spec's
/// restart-needing parameters yet (this pass applies it), and afterwards while its pods roll
/// (kept from the previous status, which named them). False once every pod runs the template.
pub fn condition(db: &Database, fact: &RestartFact, rolled_out: bool) -> ConditionStatus {
    let desired = restart_parameters(&parameters(db));
    let previous = db
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, ConditionType::RestartPending))
        .filter(|c| c.status == "True" && c.reason == PENDING);
    let names = fact
        .template
        .as_ref()
        .map(|template| changed(template, &desired))
        .unwrap_or_default();
    if !names.is_empty() {
        let message = format!(
            "{} changed and PostgreSQL reads it only at start: the pods restart one at a time to apply it",
            names.join(", ")
        );
        return ConditionStatus::new(ConditionType::RestartPending, true, PENDING, message);
    }
    match previous {
        Some(c) if !rolled_out => ConditionStatus::new(
            ConditionType::RestartPending,
            true,
            PENDING,
            c.message.clone(),
        ),
        _ => ConditionStatus::new(
            ConditionType::RestartPending,
            false,
            "NoRestartPending",
            "the server runs with the restart-needing parameters of the spec; other parameters are reloaded in place",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::api::conditions::merge;
    use crate::resources::testing;
    use chrono::{TimeZone, Utc};

    fn db(parameters: serde_json::Value) -> Database {
        testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "postgresql": {"parameters": parameters}
        }))
    }

    fn template(pairs: &[(&str, &str)]) -> RestartFact {
        RestartFact {
            template: Some(
                pairs
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            ),
        }
    }

    fn with_previous(mut d: Database, c: &ConditionStatus) -> Database {
        let at = Utc.timestamp_opt(0, 0).unwrap();
        d.status = Some(DatabaseStatus {
            conditions: merge(&[], std::slice::from_ref(c), Some(1), at),
            ..DatabaseStatus::default()
        });
        d
    }

    #[test]
    fn a_restart_needing_change_is_pending_until_the_pods_rolled() {
        let d = db(serde_json::json!({"max_connections": "200", "work_mem": "8MB"}));
        // The template still has the old value: pending, named.
        let before = condition(&d, &template(&[("max_connections", "100")]), true);
        assert!(before.status);
        assert!(
            before.message.starts_with("max_connections changed"),
            "{}",
            before.message
        );
        // Applied, the pods still rolling: still pending, still named.
        let d = with_previous(d, &before);
        let now = template(&[("max_connections", "200")]);
        let rolling = condition(&d, &now, false);
        assert_eq!(rolling, before);
        // Rolled out: done.
        assert!(!condition(&d, &now, true).status);
    }

    #[test]
    fn reloadable_changes_and_new_databases_restart_nothing() {
        let d = db(serde_json::json!({"work_mem": "64MB", "log_min_duration_statement": "1s"}));
        assert!(!condition(&d, &template(&[]), true).status);
        assert!(!condition(&d, &template(&[]), false).status);
        // No StatefulSet yet: the first pod starts with the parameters.
        let new = db(serde_json::json!({"max_connections": "300"}));
        assert!(!condition(&new, &RestartFact::default(), false).status);
        // A removed restart parameter is a change too.
        let removed = condition(&d, &template(&[("shared_buffers", "1GB")]), true);
        assert!(removed.status && removed.message.starts_with("shared_buffers"));
    }
}
