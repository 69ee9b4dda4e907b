//! The Database controller, and one reconcile of a Database: observe → decide → build → apply
//! → status.
//!
//! - `controller` runs it: its triggers, kube's finalizer helper, a Database it cannot read,
//!   the error policy and Events;
//! - `observe` reads the Database's owned objects (the only reads) into a `Observed`, and
//!   `facts` reduces it to the `Facts` `decide` reads (pure; one `now` for the pass);
//! - `decide` is a pure function of the Database and the facts: the phase, the conditions and
//!   the steps to take — all the domain knowledge lives there;
//! - `build` builds every object the steps ask for (pure, with the builders of `resources`);
//! - `apply` writes what differs (through `kube_io`), then the status if it changed, and
//!   publishes the Events of a transition; `status` derives that status (pure);
//! - `positions` reads each instance's WAL position from its manager (`observe` calls it);
//! - `verification` reads the verify Jobs `backup::verify` decides from;
//! - `deletion` decides the deletion policy (pure); `cleanup` is the finalizer's I/O for it,
//!   and makes it wait while an upgrade's pods change version;
//! - `stage` decides where the rollout stands and the phase it gives, a part of `decide`;
//! - `init` decides the init SQL (`Initialized`), a part of `decide`;
//! - `accounts` decides the application's Secret and the accounts Secret the instances mount
//!   (the application role, its database, the declared roles);
//! - `instances` holds what the roles are decided from (each pod, the positions, the Lease);
//! - `roles` decides the instances' roles: the primary, the pods' role labels, the replication
//!   Secret, each instance's status line;
//! - `archiving` decides `ContinuousArchiving` from the primary's WAL archiver;
//! - `autogrow` decides when the data volumes grow (`spec.storage.autoGrow`);
//! - `restart` decides whether the pods must restart for `spec.postgresql` (`RestartPending`);
//! - `tls` decides the CA and server certificate (`TLSReady`), `certificates` makes them;
//! - `wave` decides the Database's part in the operator's release (its turn in the wave, a
//!   rollback), a part of `decide`;
//! - `restore` decides a restore from a backup (`spec.bootstrap.fromBackup`), which takes the
//!   init SQL's place.
//!
//! Writes go through `kube_io`; `backup::plan` decides the backup part, `upgrade::plan` the
//! version upgrade (its stages, the image and partition the pods run). Must not import
//! `runtime` (it runs this, not the other way round) nor `database_backup`.

pub mod accounts;
pub mod apply;
pub mod archiving;
pub mod autogrow;
pub mod blocker;
pub mod build;
pub mod certificates;
pub mod cleanup;
pub mod controller;
pub mod decide;
pub mod deletion;
pub mod events;
pub mod facts;
pub mod init;
pub mod instances;
pub mod lanes;
pub mod observe;
pub mod positions;
pub mod restart;
pub mod restore;
pub mod roles;
pub mod stage;
pub mod status;
pub mod stuck;
pub mod tls;
pub mod verification;
pub mod wave;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::{Database, DatabaseBackup, DatabaseStatus};
use crate::backup::verify::{VerifyPlan, plan_verification};
use crate::context::Context;
use crate::error::{During, Result, Step};

/// One pass of a Database that is not being deleted: observe → decide → build → apply →
/// status, each step named in its error.
pub async fn reconcile_database(ctx: &Context, db: &Database) -> Result<Action> {
    // Boxed, like apply below: what a pass observes and builds is large, and it runs deep
    // inside the controller's futures.
    let observed = Box::pin(observe::observe(ctx, db))
        .await
        .during(Step::Observe)?;
    let facts = facts::Facts::from_observed(db, &observed);
    let decision = decide::decide(db, &facts, &ctx.settings);
    if !release_turn_taken(ctx, db, &facts, &decision) {
        return Ok(Action::requeue(crate::release::LOOK_AGAIN));
    }
    // Logged once per reason: the status's Ready condition says it from the next pass on.
    if let Some(wait) = &decision.roles.failover_waits {
        let said = db.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.message.contains(wait.as_str()))
        });
        if !said {
            tracing::info!(primary = %decision.roles.primary, "{wait}");
        }
    }
    let verification = Box::pin(verification_plan(ctx, db, &facts, &decision))
        .await
        .during(Step::Observe)?;
    let password = decision.steps.create_secret.then(apply::new_password);
    let replication_password = decision
        .roles
        .create_replication_secret
        .then(apply::new_password);
    let accounts = &decision.accounts;
    let made = accounts.create_application_secret.then(apply::new_password);
    let application_password = match (&accounts.rebuild, made) {
        (Some(_), made) => observe::application_password(ctx, db, made.as_deref())
            .await
            .during(Step::Observe)?,
        (None, made) => made,
    };
    let ca = Box::pin(observe::signing_ca(ctx, db, &decision.steps.tls))
        .await
        .during(Step::Observe)?;
    let issued =
        certificates::issue(db, &decision.steps.tls, ca, facts.backups.now).during(Step::Build)?;
    let desired = build::build(
        db,
        &observed,
        &decision,
        verification.as_ref(),
        &ctx.settings,
        build::Fresh {
            password: password.as_deref(),
            replication_password: replication_password.as_deref(),
            accounts,
            application_password: application_password.as_deref(),
            issued,
        },
    );
    // Boxed: the desired objects are large, and a pass runs deep inside the controller's
    // futures.
    let applied = Box::pin(apply::apply(ctx, db, &observed, desired))
        .await
        .during(Step::Apply)?;
    let now = facts.backups.now;
    let status = status::status(db, &decision, &applied, verification.as_ref(), now);
    let key = (db.namespace_or_default(), db.name_any());
    apply::update_status(ctx, db, status.clone())
        .await
        .during(Step::Status)?;
    record(ctx, db, key, &status, &observed.backups);
    let verify_requeue = verification.and_then(|p| p.requeue_after);
    Ok(Action::requeue(
        verify_requeue.map_or(decision.requeue_after, |v| v.min(decision.requeue_after)),
    ))
}

/// A Database the release restarts in this pass takes its turn (`release::Turns`): false when
/// another reconcile took the last one since this pass observed (the pass then writes nothing
/// and looks again).
fn release_turn_taken(
    ctx: &Context,
    db: &Database,
    facts: &facts::Facts,
    decision: &decide::Decision,
) -> bool {
    if decision.template != crate::resources::template_origin::TemplateChoice::Release {
        return true;
    }
    let key = crate::release::key(&db.namespace_or_default(), &db.name_any());
    let taken = ctx
        .release_turns
        .take(&key, &facts.release.fleet, ctx.settings.release.wave);
    if !taken {
        tracing::debug!("another Database took the release's last turn first; looking again");
    }
    taken
}

/// Backup verification (`spec.backup.verify`): observe its Jobs, decide. None while the
/// Database is blocked or has no `verify`.
async fn verification_plan(
    ctx: &Context,
    db: &Database,
    facts: &facts::Facts,
    decision: &decide::Decision,
) -> Result<Option<VerifyPlan>> {
    if decision.backup.is_none() {
        return Ok(None);
    }
    let succeeded = verification::succeeded_backups(&facts.backups.records);
    let now = facts.backups.now;
    let observed =
        verification::observe_verification(ctx, db, decision.phase, succeeded, now).await?;
    Ok(observed.map(|f| plan_verification(db, &f)))
}

/// The Database's status as metrics: its phase, its conditions, its last successful backup,
/// where its restorable window begins.
fn record(
    ctx: &Context,
    db: &Database,
    key: (String, String),
    status: &DatabaseStatus,
    backups: &[DatabaseBackup],
) {
    let window = crate::backup::window::restorable_window(db, backups);
    let since = window.and_then(|w| w.earliest).map(|(_, ended)| ended);
    let seconds = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis() as f64 / 1000.0;
    ctx.metrics
        .restorable_since(key.clone(), since.map(seconds));
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
