//! One reconcile of a Database: observe → decide → act.
//!
//! - `observe` reads the Database's owned objects (the only reads) and reduces them to `Facts`;
//! - `decide` is a pure function of the Database, the facts and `now`: the phase, the
//!   conditions and the steps to take — all the domain knowledge lives there;
//! - `act` builds the desired objects, writes only what drifted, patches status only when it
//!   changed, and emits Events on transitions;
//! - `deletion` decides the deletion policy (pure); `cleanup` is the finalizer's I/O for it;
//!   `upgrade_gate` makes it wait while an upgrade's pods change version;
//! - `bootstrap` decides a restore from a backup (`spec.bootstrap.fromBackup`), which takes the
//!   init SQL's place.
//!
//! Writes go through `kube_io`; `backup::plan` decides the backup part, `upgrade::plan` the
//! version upgrade (its stages, the image and partition the pods run). Must not import
//! `controller` (it runs this, not the other way round).

pub mod act;
pub mod bootstrap;
pub mod cleanup;
pub mod decide;
pub mod deletion;
pub mod events;
pub mod observe;
pub mod quantity;
pub mod upgrade_gate;

use chrono::Utc;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::conditions::ConditionType;
use crate::api::{Database, DatabaseStatus};
use crate::backup::verify::{VerifyPlan, plan_verification};
use crate::backup::verify_io;
use crate::context::Context;
use crate::error::Result;

/// observe → decide → act for a Database that is not being deleted.
pub async fn reconcile_database(ctx: &Context, db: &Database) -> Result<Action> {
    let snapshot = observe::snapshot(ctx, db).await?;
    let facts = observe::Facts::from_snapshot(db, &snapshot);
    let mut decision = decide::decide(db, &facts, &ctx.settings);
    let verification = verification(ctx, db, &facts, &decision).await?;
    for condition in act::apply_steps(ctx, db, &snapshot, &decision).await? {
        decision.override_condition(condition);
    }
    act::apply_backups(ctx, db, &decision).await?;
    if let Some(plan) = &verification {
        verify_io::apply_verification(ctx, db, plan).await?;
        with_verification(&mut decision, plan);
    }
    let mut status = act::next_status(db, &decision, Utc::now());
    if let Some(plan) = &verification {
        status.verification = plan.status.clone();
    }
    // No `verify` (or none finished yet): no BackupVerified; the last outcome stays in status.
    let verifying = db.spec.backup.as_ref().is_some_and(|b| b.verify.is_some());
    if !verifying || verification.as_ref().is_some_and(|p| p.condition.is_none()) {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::BackupVerified.label());
    }
    let key = (db.namespace_or_default(), db.name_any());
    act::update_status(ctx, db, status.clone()).await?;
    record(ctx, db, key, &status);
    let verify_requeue = verification.and_then(|p| p.requeue_after);
    Ok(Action::requeue(
        verify_requeue.map_or(decision.requeue_after, |v| v.min(decision.requeue_after)),
    ))
}

/// Backup verification (`spec.backup.verify`): observe its Jobs, decide. None while the
/// Database is blocked or has no `verify`.
async fn verification(
    ctx: &Context,
    db: &Database,
    facts: &observe::Facts,
    decision: &decide::Decision,
) -> Result<Option<VerifyPlan>> {
    if decision.backup.is_none() {
        return Ok(None);
    }
    let succeeded = verify_io::succeeded_backups(&facts.backups.records);
    let observed =
        verify_io::observe_verification(ctx, db, decision.phase, succeeded, Utc::now()).await?;
    Ok(observed.map(|f| plan_verification(db, &f)))
}

/// The verification plan's conditions in the decision: `BackupVerified`, and `BackupHealthy`
/// False (`VerificationFailed`) over a True one while the latest verification failed.
fn with_verification(decision: &mut decide::Decision, plan: &VerifyPlan) {
    let healthy = decision
        .conditions
        .iter()
        .any(|c| c.type_ == ConditionType::BackupHealthy && c.status);
    if let Some(condition) = &plan.condition {
        decision.override_condition(condition.clone());
    }
    if let Some(unhealthy) = plan.unhealthy.clone().filter(|_| healthy) {
        decision.override_condition(unhealthy);
    }
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
    let verified = status
        .verification
        .as_ref()
        .and_then(|v| v.last_verified_time);
    if let Some(time) = verified {
        let seconds = time.timestamp_millis() as f64 / 1000.0;
        ctx.metrics.backup_verified(key.clone(), seconds);
    }
    let stage = status.upgrade.as_ref().map(|u| u.stage);
    ctx.metrics.upgrade_stage(key.clone(), stage);
    ctx.metrics
        .upgrade_stopped(key.clone(), status.upgrade.as_ref());
    ctx.metrics.database_phase(key, status.phase);
}
