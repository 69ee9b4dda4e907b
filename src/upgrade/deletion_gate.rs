//! The deletion gate: a Database deleted while its pods are changing version waits for a safe
//! point (the rollout or rollback ends), for at most twice `podReadyTimeout` (a rollout, then a
//! rollback), before the deletion policy runs. Before the rollout nothing that serves has
//! changed, so deletion proceeds at once. Pure.

use chrono::{DateTime, Utc};

use super::plan::Options;
use crate::api::{Database, UpgradeStage};

/// What the finalizer does about an upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionGate {
    /// No pod is mid-change: apply the deletion policy.
    Proceed,
    /// Pods are changing version: keep the upgrade going, look again soon.
    Wait { message: String },
    /// Waited as long as allowed: apply the deletion policy anyway, and say so.
    GiveUp { message: String },
}

/// The gate for `db`, deleted at `deleted_at`.
pub fn deletion_gate(db: &Database, deleted_at: DateTime<Utc>, now: DateTime<Utc>) -> DeletionGate {
    let Some(u) = db.status.as_ref().and_then(|s| s.upgrade.as_ref()) else {
        return DeletionGate::Proceed;
    };
    let mid_change = matches!(
        u.stage,
        UpgradeStage::RollingOut | UpgradeStage::Verifying | UpgradeStage::RollingBack
    );
    if !mid_change {
        return DeletionGate::Proceed;
    }
    let bound = Options::of(db).pod_ready_timeout * 2;
    let waited = (now - deleted_at).to_std().unwrap_or_default();
    if waited >= bound {
        return DeletionGate::GiveUp {
            message: format!(
                "the upgrade to {} is still at {} after {}s: deleting anyway",
                u.to,
                u.stage.label(),
                bound.as_secs()
            ),
        };
    }
    DeletionGate::Wait {
        message: format!(
            "deletion waits for the upgrade to {} to reach a safe point (stage {}; at most {}s)",
            u.to,
            u.stage.label(),
            bound.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::resources::testing;
    use chrono::TimeZone;

    fn db(stage: Option<UpgradeStage>) -> Database {
        let mut db = testing::database(serde_json::json!({
            "version": "15.20", "storage": {"size": "1Gi"},
            "upgrade": {"podReadyTimeout": "60s"}
        }));
        db.status = Some(DatabaseStatus {
            upgrade: stage.map(|stage| {
                crate::upgrade::testing::upgrade(stage, Utc.timestamp_opt(0, 0).unwrap())
            }),
            ..DatabaseStatus::default()
        });
        db
    }

    #[test]
    fn deletion_waits_only_while_pods_change_and_not_forever() {
        let t = |s| Utc.timestamp_opt(s, 0).unwrap();
        let proceed = |d: &Database| deletion_gate(d, t(0), t(1)) == DeletionGate::Proceed;
        assert!(proceed(&db(None)));
        for stage in UpgradeStage::ALL {
            let waits = matches!(
                deletion_gate(&db(Some(stage)), t(0), t(1)),
                DeletionGate::Wait { .. }
            );
            let mid = matches!(
                stage,
                UpgradeStage::RollingOut | UpgradeStage::Verifying | UpgradeStage::RollingBack
            );
            assert_eq!(waits, mid, "{stage:?}");
        }
        let rolling = db(Some(UpgradeStage::RollingOut));
        assert!(matches!(
            deletion_gate(&rolling, t(0), t(119)),
            DeletionGate::Wait { .. }
        ));
        assert!(matches!(
            deletion_gate(&rolling, t(0), t(120)),
            DeletionGate::GiveUp { .. }
        ));
    }
}
