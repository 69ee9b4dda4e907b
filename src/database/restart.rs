//! The restart decision of the server's parameters: which of the spec's restart-needing
//! parameters (`resources::server_config`) the pods must still restart for, the
//! `RestartPending` condition that names them, and the StatefulSet annotation that remembers
//! them while the pods roll.
//!
//! Reloadable parameters never restart anything: the instance manager reloads the server when
//! the mounted ConfigMap changes. Restart-needing ones travel in a pod-template annotation, so
//! a change rolls the StatefulSet's pods one at a time; the condition stays True until that
//! rollout is over.
//!
//! Once the template carries the new values, only the StatefulSet knows which parameters its
//! rollout is for, so the pass that changes the template records their names on it
//! ([`PENDING_ANNOTATION`]), and the pass that sees the rollout over clears them. The
//! Database's own status is not that memory: a pass may read it from a cache that has not seen
//! the last status write, and would then say the restart was over while the pod still starts.
//!
//! Pure: the observed template, its record and the rollout state in.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::api::Database;
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::resources::server_config::{parameters, parse_restart_annotation, restart_parameters};

/// On a StatefulSet: the restart-needing parameters its pods are rolling out for,
/// comma-separated (empty: none).
pub const PENDING_ANNOTATION: &str = "dbop.dev/restart-pending";

/// What the restart decision reads about the StatefulSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartFact {
    /// The restart-needing parameters its pod template carries (None: no StatefulSet yet).
    pub template: Option<BTreeMap<String, String>>,
    /// What its [`PENDING_ANNOTATION`] records (None: it has none).
    pub recorded: Option<Vec<String>>,
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
            recorded: sts
                .and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|a| a.get(PENDING_ANNOTATION))
                .map(|names| {
                    names
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(String::from)
                        .collect()
                }),
        }
    }
}

/// The names whose values differ between `a` and `b` (set in one only, or set differently).
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    a.keys()
        .chain(b.keys())
        .filter(|n| a.get(*n) != b.get(*n))
        .cloned()
        .collect()
}

/// The restart-needing parameters the pods still restart for: those the template does not
/// carry yet (this pass applies them), and, until every pod runs the template
/// (`rolled_out`), those the StatefulSet recorded when its template changed. Sorted, unique.
pub fn pending(db: &Database, fact: &RestartFact, rolled_out: bool) -> Vec<String> {
    let desired = restart_parameters(&parameters(db));
    let mut names: Vec<String> = fact
        .template
        .as_ref()
        .map(|template| changed(template, &desired))
        .unwrap_or_default();
    if !rolled_out {
        names.extend(fact.recorded.iter().flatten().cloned());
    }
    names.sort_unstable();
    names.dedup();
    names
}

const PENDING: &str = "RestartPending";

/// The `RestartPending` condition of the [`pending`] names.
pub fn condition(pending: &[String]) -> ConditionStatus {
    if pending.is_empty() {
        return ConditionStatus::new(
            ConditionType::RestartPending,
            false,
            "NoRestartPending",
            "the server runs with the restart-needing parameters of the spec; other parameters are reloaded in place",
        );
    }
    let message = format!(
        "{} changed and PostgreSQL reads it only at start: the pods restart one at a time to apply it",
        pending.join(", ")
    );
    ConditionStatus::new(ConditionType::RestartPending, true, PENDING, message)
}

/// Records the [`pending`] names on the StatefulSet about to be applied; an earlier record on
/// the `observed` one with nothing pending any more is cleared to empty (an annotation left
/// out would be no drift, and stay).
pub fn record(sts: &mut StatefulSet, pending: &[String], observed: Option<&StatefulSet>) {
    let recorded = RestartFact::of(observed).recorded.is_some();
    if pending.is_empty() && !recorded {
        return;
    }
    sts.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(PENDING_ANNOTATION.into(), pending.join(","));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

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
            recorded: None,
        }
    }

    /// The fact of a StatefulSet applied with `pending` recorded on it, as the next pass reads it.
    fn applied(fact: &RestartFact, pending: &[String]) -> RestartFact {
        let mut observed = StatefulSet::default();
        if let Some(names) = &fact.recorded {
            observed.metadata.annotations =
                Some([(PENDING_ANNOTATION.to_string(), names.join(","))].into());
        }
        let mut sts = StatefulSet::default();
        record(&mut sts, pending, Some(&observed));
        RestartFact {
            recorded: RestartFact::of(Some(&sts)).recorded,
            ..fact.clone()
        }
    }

    /// The pass after the template changed may read a Database whose status predates the
    /// condition it wrote: the StatefulSet's record, not the status, keeps it pending.
    #[test]
    fn a_restart_needing_change_is_pending_until_the_pods_rolled() {
        let d = db(serde_json::json!({"max_connections": "200", "work_mem": "8MB"}));
        // The template still has the old value: pending, named, recorded with the template.
        let before = template(&[("max_connections", "100")]);
        let names = pending(&d, &before, true);
        assert_eq!(names, ["max_connections"]);
        let announced = condition(&names);
        assert!(announced.status);
        assert!(
            announced.message.starts_with("max_connections changed"),
            "{}",
            announced.message
        );
        // Applied, the pods still rolling: still pending, still named.
        let now = applied(&template(&[("max_connections", "200")]), &names);
        assert_eq!(condition(&pending(&d, &now, false)), announced);
        // Without the record it would have been over already.
        assert!(pending(&d, &template(&[("max_connections", "200")]), false).is_empty());
        // Rolled out: done, and the record is cleared.
        let done = pending(&d, &now, true);
        assert!(!condition(&done).status);
        assert_eq!(applied(&now, &done).recorded, Some(vec![]));
        // Cleared, nothing more is written.
        let mut sts = StatefulSet::default();
        record(&mut sts, &[], Some(&StatefulSet::default()));
        assert!(sts.metadata.annotations.is_none());
    }

    /// A second change while the pods roll for the first keeps both named.
    #[test]
    fn a_change_during_a_rollout_adds_to_the_names() {
        let d = db(serde_json::json!({"max_connections": "200", "shared_buffers": "256MB"}));
        let rolling = RestartFact {
            recorded: Some(vec!["max_connections".into()]),
            ..template(&[("max_connections", "200"), ("shared_buffers", "128MB")])
        };
        assert_eq!(
            pending(&d, &rolling, false),
            ["max_connections", "shared_buffers"]
        );
        assert_eq!(pending(&d, &rolling, true), ["shared_buffers"]);
    }

    #[test]
    fn reloadable_changes_and_new_databases_restart_nothing() {
        let d = db(serde_json::json!({"work_mem": "64MB", "log_min_duration_statement": "1s"}));
        assert!(pending(&d, &template(&[]), true).is_empty());
        assert!(pending(&d, &template(&[]), false).is_empty());
        // No StatefulSet yet: the first pod starts with the parameters.
        let new = db(serde_json::json!({"max_connections": "300"}));
        assert!(pending(&new, &RestartFact::default(), false).is_empty());
        // A removed restart parameter is a change too.
        let removed = condition(&pending(&d, &template(&[("shared_buffers", "1GB")]), true));
        assert!(removed.status && removed.message.starts_with("shared_buffers"));
    }
}
