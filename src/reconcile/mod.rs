//! One reconcile of a Database: observe → decide → act.
//!
//! - `observe` reads the Database's owned objects (the only reads) and reduces them to `Facts`;
//! - `decide` is a pure function of the Database, the facts and `now`: the phase, the
//!   conditions and the steps to take — all the domain knowledge lives there;
//! - `act` builds the desired objects, writes only what drifted, patches status only when it
//!   changed, and emits Events on transitions;
//! - `cleanup` is the finalizer's deletion policy; `upgrade_gate` makes it wait while an
//!   upgrade's pods change version.
//!
//! Writes go through `kube_io`; `backup::plan` decides the backup part, `upgrade::plan` the
//! version upgrade (its stages, the image and partition the pods run). Must not import
//! `controller` (it runs this, not the other way round).

pub mod act;
pub mod cleanup;
pub mod decide;
pub mod events;
pub mod observe;
pub mod quantity;
pub mod upgrade_gate;

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::{Database, DatabaseStatus};
use crate::context::Context;
use crate::error::Result;

/// observe → decide → act for a Database that is not being deleted.
pub async fn reconcile_database(ctx: &Context, db: &Database) -> Result<Action> {
    let snapshot = observe::snapshot(&ctx.client, db).await?;
    let facts = observe::Facts::from_snapshot(db, &snapshot);
    let mut decision = decide::decide(db, &facts, &ctx.settings);
    for condition in act::apply_steps(ctx, db, &snapshot, &decision).await? {
        decision.override_condition(condition);
    }
    act::apply_backups(ctx, db, &decision).await?;
    let status = act::next_status(db, &decision, Utc::now());
    let key = (db.namespace_or_default(), db.name_any());
    act::update_status(ctx, db, status.clone()).await?;
    record(ctx, db, key, &status);
    Ok(Action::requeue(decision.requeue_after))
}

/// The Database's status as metrics: its phase, its conditions, its last successful backup.
fn record(ctx: &Context, db: &Database, key: (String, String), status: &DatabaseStatus) {
    let scheduled = db.spec.backup.as_ref().is_some_and(|b| !b.suspend);
    ctx.metrics
        .database_conditions(key.clone(), &status.conditions, scheduled);
    let last_success = status.backup.as_ref().and_then(|b| b.last_successful_time);
    if let Some(time) = last_success {
        let seconds = time.timestamp_millis() as f64 / 1000.0;
        ctx.metrics.backup_succeeded(key.clone(), seconds, None);
    }
    let stage = status.upgrade.as_ref().map(|u| u.stage);
    ctx.metrics.upgrade_stage(key.clone(), stage);
    ctx.metrics.database_phase(key, status.phase);
}
