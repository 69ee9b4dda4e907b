//! The finalizer's wait for an upgrade's safe point: while pods change version, a deleted
//! Database keeps reconciling (so the rollout or rollback can end) and says why deletion waits;
//! `upgrade::gate` decides, bounded.

use chrono::Utc;

use super::act::publish;
use crate::api::Database;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kube_io::EventSpec;
use crate::upgrade::gate::{DeletionGate, deletion_gate};

/// Ok when the deletion policy may run now; `Error::DeletionWaitsForUpgrade` (after a pass of
/// the upgrade) while it must wait.
pub async fn wait_for_safe_point(ctx: &Context, db: &Database) -> Result<()> {
    let now = Utc::now();
    let deleted_at = db
        .metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0))
        .unwrap_or(now);
    match deletion_gate(db, deleted_at, now) {
        DeletionGate::Proceed => Ok(()),
        DeletionGate::GiveUp { message } => {
            let event = EventSpec {
                warning: true,
                reason: "DeletionStopsUpgrade".into(),
                note: message,
            };
            publish(ctx, db, &event).await;
            Ok(())
        }
        DeletionGate::Wait { message } => {
            // Keep the upgrade going, then refuse to finish: the error path requeues, and its
            // Event (reason DeletionWaitsForUpgrade) says why the deletion waits.
            super::reconcile_database(ctx, db).await?;
            Err(Error::DeletionWaitsForUpgrade(message))
        }
    }
}
