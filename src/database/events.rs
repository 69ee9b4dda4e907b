//! Which Events a status change deserves: one on every phase transition (Warning when the new
//! phase needs attention), and one when the reason a Database is blocked changes. Pure.

use crate::api::conditions::{ConditionType, find};
use crate::api::{DatabaseStatus, Phase};
use crate::objects::EventSpec;

/// The Events that describe the move from `old` to `new`.
pub fn transition_events(old: &DatabaseStatus, new: &DatabaseStatus) -> Vec<EventSpec> {
    let ready = |s: &DatabaseStatus| {
        find(&s.conditions, ConditionType::Ready).map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (Some(phase), Some((reason, message))) = (new.phase, ready(new)) else {
        return vec![];
    };
    let warning = matches!(phase, Phase::Pending | Phase::Degraded | Phase::Failed);
    if old.phase != Some(phase) {
        return vec![EventSpec {
            warning,
            reason: phase.label().to_string(),
            note: message,
        }];
    }
    // Same phase, a new reason to be stuck (e.g. a Secret now exists but lacks a password).
    if warning && ready(old).map(|r| r.0) != Some(reason.clone()) {
        return vec![EventSpec {
            warning,
            reason,
            note: message,
        }];
    }
    vec![]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{ConditionStatus, merge};
    use chrono::{TimeZone, Utc};

    fn status(phase: Option<Phase>, ready: bool, reason: &str) -> DatabaseStatus {
        DatabaseStatus {
            phase,
            conditions: merge(
                &[],
                &[ConditionStatus::new(
                    ConditionType::Ready,
                    ready,
                    reason,
                    format!("because {reason}"),
                )],
                Some(1),
                Utc.timestamp_opt(0, 0).unwrap(),
            ),
            ..DatabaseStatus::default()
        }
    }

    #[test]
    fn events_table() {
        let table = [
            (
                "first status",
                DatabaseStatus::default(),
                status(Some(Phase::Provisioning), false, "Provisioning"),
                vec![(false, "Provisioning")],
            ),
            (
                "to ready",
                status(Some(Phase::Initializing), false, "Initializing"),
                status(Some(Phase::Ready), true, "DatabaseReady"),
                vec![(false, "Ready")],
            ),
            (
                "to degraded",
                status(Some(Phase::Ready), true, "DatabaseReady"),
                status(Some(Phase::Degraded), false, "NotServing"),
                vec![(true, "Degraded")],
            ),
            (
                "nothing changed",
                status(Some(Phase::Ready), true, "DatabaseReady"),
                status(Some(Phase::Ready), true, "DatabaseReady"),
                vec![],
            ),
            (
                "stuck for a new reason",
                status(Some(Phase::Pending), false, "CredentialsSecretNotFound"),
                status(Some(Phase::Pending), false, "CredentialsSecretInvalid"),
                vec![(true, "CredentialsSecretInvalid")],
            ),
            (
                "still stuck",
                status(Some(Phase::Pending), false, "CredentialsSecretNotFound"),
                status(Some(Phase::Pending), false, "CredentialsSecretNotFound"),
                vec![],
            ),
        ];
        for (name, old, new, want) in table {
            let got: Vec<_> = transition_events(&old, &new)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect();
            let want: Vec<_> = want.into_iter().map(|(w, r)| (w, r.to_string())).collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
