//! Which Events a status change deserves: one on every phase transition (Warning when the new
//! phase needs attention), one when the reason a Database is blocked changes, and one when what
//! waits for the maintenance window changes (Warning when the window cannot be read), and one
//! at each step of the operator's release (Warning when it failed or stopped). Pure.

use crate::api::conditions::{ConditionType, find};
use crate::api::{DatabaseStatus, Phase};
use crate::maintenance::INVALID;
use crate::objects::EventSpec;
use crate::release;

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

/// The Event for a new `MaintenancePending` state: what now waits for the window (Normal), the
/// window opened on what waited (Normal), or a window that cannot be read (Warning).
pub fn maintenance_events(old: &DatabaseStatus, new: &DatabaseStatus) -> Vec<EventSpec> {
    let pending = |s: &DatabaseStatus| {
        find(&s.conditions, ConditionType::MaintenancePending)
            .map(|c| (c.status == "True", c.reason.clone(), c.message.clone()))
    };
    let (Some((waits, reason, message)), before) = (pending(new), pending(old)) else {
        return vec![];
    };
    let waited = before.as_ref().is_some_and(|(waited, _, _)| *waited);
    let event = |warning: bool, reason: &str| {
        vec![EventSpec {
            warning,
            reason: reason.to_string(),
            note: message.clone(),
        }]
    };
    if reason == INVALID {
        let unchanged = before.is_some_and(|(_, r, m)| r == reason && m == message);
        return if unchanged {
            vec![]
        } else {
            event(true, INVALID)
        };
    }
    if waits && before.is_none_or(|(_, _, m)| m != message) {
        return event(false, "MaintenanceWaiting");
    }
    if !waits && waited && reason == "WindowOpen" {
        return event(false, "MaintenanceWindowOpened");
    }
    vec![]
}

/// The Event for a new `ReleasePending` state: the operator's release started restarting the
/// Database (Normal), finished (Normal), failed on it (Warning), or stopped because it failed
/// elsewhere (Warning).
pub fn release_events(old: &DatabaseStatus, new: &DatabaseStatus) -> Vec<EventSpec> {
    let reason = |s: &DatabaseStatus| {
        find(&s.conditions, ConditionType::ReleasePending)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (before, now) = (reason(old), reason(new));
    if before.as_ref().map(|b| &b.0) == now.as_ref().map(|n| &n.0) {
        return vec![];
    }
    let event = |warning: bool, reason: &str, note: String| {
        vec![EventSpec {
            warning,
            reason: reason.to_string(),
            note,
        }]
    };
    match (before, now) {
        (_, Some((reason, note))) if reason == release::ROLLING_OUT => {
            event(false, "ReleaseStarted", note)
        }
        (_, Some((reason, note))) if reason == release::FAILED => {
            event(true, reason.as_str(), note)
        }
        (_, Some((reason, note))) if reason == release::PAUSED => {
            event(true, reason.as_str(), note)
        }
        (Some((reason, note)), None) if reason == release::ROLLING_OUT => event(
            false,
            "ReleaseFinished",
            format!("healthy again after {note}"),
        ),
        _ => vec![],
    }
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

    fn pending(status: bool, reason: &str, message: &str) -> DatabaseStatus {
        DatabaseStatus {
            conditions: merge(
                &[],
                &[ConditionStatus::new(
                    ConditionType::MaintenancePending,
                    status,
                    reason,
                    message,
                )],
                Some(1),
                Utc.timestamp_opt(0, 0).unwrap(),
            ),
            ..DatabaseStatus::default()
        }
    }

    fn releasing(reason: Option<&str>) -> DatabaseStatus {
        let conditions: Vec<ConditionStatus> = reason
            .map(|r| ConditionStatus::new(ConditionType::ReleasePending, true, r, "why"))
            .into_iter()
            .collect();
        DatabaseStatus {
            conditions: merge(&[], &conditions, Some(1), Utc.timestamp_opt(0, 0).unwrap()),
            ..DatabaseStatus::default()
        }
    }

    #[test]
    fn release_events_table() {
        let (none, waiting) = (releasing(None), releasing(Some("WaitingForWave")));
        let rolling = releasing(Some(release::ROLLING_OUT));
        let (failed, paused) = (
            releasing(Some(release::FAILED)),
            releasing(Some(release::PAUSED)),
        );
        let table = [
            (&none, &waiting, vec![]),
            (&waiting, &rolling, vec![(false, "ReleaseStarted")]),
            (&rolling, &rolling, vec![]),
            (&rolling, &none, vec![(false, "ReleaseFinished")]),
            (&rolling, &failed, vec![(true, "ReleaseFailed")]),
            (&failed, &paused, vec![(true, "ReleasePaused")]),
            (&paused, &paused, vec![]),
            (&waiting, &none, vec![]),
        ];
        for (old, new, want) in table {
            let got: Vec<_> = release_events(old, new)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect();
            let want: Vec<_> = want.into_iter().map(|(w, r)| (w, r.to_string())).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn maintenance_events_table() {
        let waits = pending(true, "WaitingForMaintenanceWindow", "opens Sat: a restart");
        let more = pending(
            true,
            "WaitingForMaintenanceWindow",
            "opens Sat: a restart; image x",
        );
        let nothing = pending(false, "NothingPending", "opens Sat");
        let open = pending(false, "WindowOpen", "open until 04:00");
        let invalid = pending(true, INVALID, "timeZone \"Nowhere\"");
        let table = [
            (
                "no window",
                DatabaseStatus::default(),
                DatabaseStatus::default(),
                vec![],
            ),
            (
                "something waits",
                nothing.clone(),
                waits.clone(),
                vec![(false, "MaintenanceWaiting")],
            ),
            ("it still waits", waits.clone(), waits.clone(), vec![]),
            (
                "more waits",
                waits.clone(),
                more.clone(),
                vec![(false, "MaintenanceWaiting")],
            ),
            (
                "the window opens",
                waits.clone(),
                open.clone(),
                vec![(false, "MaintenanceWindowOpened")],
            ),
            (
                "open, nothing waited",
                nothing.clone(),
                open.clone(),
                vec![],
            ),
            ("closes with nothing", open.clone(), nothing.clone(), vec![]),
            (
                "unreadable",
                nothing.clone(),
                invalid.clone(),
                vec![(true, INVALID)],
            ),
            ("still unreadable", invalid.clone(), invalid.clone(), vec![]),
        ];
        for (name, old, new, want) in table {
            let got: Vec<_> = maintenance_events(&old, &new)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect();
            let want: Vec<_> = want.into_iter().map(|(w, r)| (w, r.to_string())).collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
