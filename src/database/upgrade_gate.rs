//! The finalizer's wait for an upgrade's safe point: while pods change version, a deleted
//! Database keeps reconciling (so the rollout or rollback can end) and says why deletion waits;
//! `upgrade::gate` decides, bounded.

use chrono::Utc;
use kube::runtime::controller::Action;

use super::apply::publish;
use crate::api::Database;
use crate::context::Context;
use crate::error::Result;
use crate::objects::EventSpec;
use crate::upgrade::gate::{DeletionGate, deletion_gate};

/// `None` when the deletion policy may run now; while it must wait, the `Action` of a pass of
/// the upgrade (which wrote its status), after a `DeletionWaitsForUpgrade` Event. A wait, not
/// an error: no backoff, no Warning.
pub async fn wait_for_safe_point(ctx: &Context, db: &Database) -> Result<Option<Action>> {
    let now = Utc::now();
    let deleted_at = db
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0))
        .unwrap_or(now);
    match deletion_gate(db, deleted_at, now) {
        DeletionGate::Proceed => Ok(None),
        DeletionGate::GiveUp { message } => {
            let event = EventSpec {
                warning: true,
                reason: "DeletionStopsUpgrade".into(),
                note: message,
            };
            publish(ctx, db, &event).await;
            Ok(None)
        }
        DeletionGate::Wait { message } => {
            // Keep the upgrade going; the finalizer stays until the upgrade reaches a safe point.
            let action = super::reconcile_database(ctx, db).await?;
            let event = EventSpec {
                warning: false,
                reason: "DeletionWaitsForUpgrade".into(),
                note: message,
            };
            publish(ctx, db, &event).await;
            Ok(Some(action))
        }
    }
}
