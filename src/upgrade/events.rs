//! The Events of an upgrade: one when it starts, one per stage it enters (Warning for a stop or
//! a rollback), and one when a version change is refused. Pure.

use crate::api::conditions::{ConditionType, find};
use crate::api::{DatabaseStatus, UpgradeStage, UpgradeStatus};
use crate::objects::EventSpec;

/// The Events of the move from `old` to `new`.
pub fn upgrade_events(old: &DatabaseStatus, new: &DatabaseStatus) -> Vec<EventSpec> {
    let mut out = Vec::new();
    if let Some(u) = &new.upgrade
        && let Some(event) = stage_event(old.upgrade.as_ref(), u)
    {
        out.push(event);
    }
    out.extend(refusal_event(old, new));
    out
}

fn stage_event(old: Option<&UpgradeStatus>, new: &UpgradeStatus) -> Option<EventSpec> {
    let same = old.is_some_and(|o| o.started_at == new.started_at && o.stage == new.stage);
    if same {
        return None;
    }
    let warning = matches!(
        new.stage,
        UpgradeStage::RollingBack | UpgradeStage::RolledBack | UpgradeStage::Failed
    );
    let reason = match (new.stage, old.map(|o| o.started_at)) {
        (UpgradeStage::Preflight, started) if started != Some(new.started_at) => {
            "UpgradeStarted".to_string()
        }
        (UpgradeStage::Complete, _) => "UpgradeComplete".to_string(),
        (UpgradeStage::Failed, _) => new.reason.clone().unwrap_or_else(|| "UpgradeFailed".into()),
        (stage, _) => format!("Upgrade{}", stage.label()),
    };
    let note = format!(
        "{} → {}: {}",
        new.from,
        new.to,
        new.message.as_deref().unwrap_or(new.stage.label())
    );
    Some(EventSpec {
        warning,
        reason,
        note,
    })
}

/// A Warning when `Upgrading` turns to a refusal (a downgrade, a major change).
fn refusal_event(old: &DatabaseStatus, new: &DatabaseStatus) -> Option<EventSpec> {
    let reason = |s: &DatabaseStatus| {
        find(&s.conditions, ConditionType::Upgrading).map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (new_reason, message) = reason(new)?;
    let refused = matches!(
        new_reason.as_str(),
        "DowngradeRefused" | "MajorUpgradeUnsupported" | "VersionUnreadable"
    );
    (refused && reason(old).map(|r| r.0) != Some(new_reason.clone())).then_some(EventSpec {
        warning: true,
        reason: new_reason,
        note: message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{ConditionStatus, merge};
    use chrono::{TimeZone, Utc};

    fn upgrade(stage: UpgradeStage, started: i64) -> UpgradeStatus {
        UpgradeStatus {
            reason: Some("PreflightFailed".into()),
            message: Some("m".into()),
            ..crate::upgrade::testing::upgrade(stage, Utc.timestamp_opt(started, 0).unwrap())
        }
    }

    fn status(u: Option<UpgradeStatus>, upgrading: Option<&str>) -> DatabaseStatus {
        let decided: Vec<_> = upgrading
            .map(|r| ConditionStatus::new(ConditionType::Upgrading, false, r, "why"))
            .into_iter()
            .collect();
        DatabaseStatus {
            upgrade: u,
            conditions: merge(&[], &decided, Some(1), Utc.timestamp_opt(0, 0).unwrap()),
            ..DatabaseStatus::default()
        }
    }

    #[test]
    fn events_table() {
        use UpgradeStage::*;
        let table = [
            (
                "start",
                None,
                Some(upgrade(Preflight, 1)),
                None,
                vec![(false, "UpgradeStarted")],
            ),
            (
                "same stage",
                Some(upgrade(Preflight, 1)),
                Some(upgrade(Preflight, 1)),
                None,
                vec![],
            ),
            (
                "backup",
                Some(upgrade(Preflight, 1)),
                Some(upgrade(PreUpgradeBackup, 1)),
                None,
                vec![(false, "UpgradePreUpgradeBackup")],
            ),
            (
                "restart after a finished one",
                Some(upgrade(RolledBack, 1)),
                Some(upgrade(Preflight, 2)),
                None,
                vec![(false, "UpgradeStarted")],
            ),
            (
                "stopped",
                Some(upgrade(Preflight, 1)),
                Some(upgrade(Failed, 1)),
                None,
                vec![(true, "PreflightFailed")],
            ),
            (
                "rolling back",
                Some(upgrade(RollingOut, 1)),
                Some(upgrade(RollingBack, 1)),
                None,
                vec![(true, "UpgradeRollingBack")],
            ),
            (
                "complete",
                Some(upgrade(Verifying, 1)),
                Some(upgrade(Complete, 1)),
                None,
                vec![(false, "UpgradeComplete")],
            ),
            (
                "refused",
                None,
                None,
                Some("DowngradeRefused"),
                vec![(true, "DowngradeRefused")],
            ),
        ];
        for (name, old, new, refusal, want) in table {
            let old = status(old, None);
            let new = status(new, refusal);
            let got: Vec<_> = upgrade_events(&old, &new)
                .into_iter()
                .map(|e| (e.warning, e.reason))
                .collect();
            let want: Vec<_> = want.into_iter().map(|(w, r)| (w, r.to_string())).collect();
            assert_eq!(got, want, "{name}");
        }
        // A refusal is announced once.
        let refused = status(None, Some("DowngradeRefused"));
        assert!(upgrade_events(&refused, &refused).is_empty());
    }
}
