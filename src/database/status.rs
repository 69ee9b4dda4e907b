//! Status: the Database's next status, derived from the decision, what applying it taught
//! (`Applied`) and the verification plan. Pure: `now` comes in (the pass's one clock read).

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::decide::Decision;
use crate::api::conditions::{ConditionStatus, ConditionType, merge};
use crate::api::{Database, DatabaseStatus, NetworkPolicySpec};
use crate::backup::verify::VerifyPlan;
use crate::resources::Names;
use crate::resources::credentials::secret_name;

/// What writing taught: the conditions it overrides (a volume expansion the StorageClass
/// refused). Only `apply` makes one, so the status is derived from what was applied.
#[derive(Debug, Default)]
pub struct Applied {
    pub(super) overrides: Vec<ConditionStatus>,
}

/// The status after a pass: the decision with what applying it overrode and the verification
/// plan's conditions, merged into the previous status at `now`.
pub fn status(
    db: &Database,
    decision: &Decision,
    applied: &Applied,
    verification: Option<&VerifyPlan>,
    now: DateTime<Utc>,
) -> DatabaseStatus {
    let mut decision = decision.clone();
    for condition in &applied.overrides {
        decision.override_condition(condition.clone());
    }
    if let Some(plan) = verification {
        with_verification(&mut decision, plan);
    }
    let mut status = next_status(db, &decision, now);
    if let Some(plan) = verification {
        status.verification = plan.status.clone();
    }
    // No `verify` (or none finished yet): no BackupVerified; the last outcome stays in status.
    let verifying = db.spec.backup.as_ref().is_some_and(|b| b.verify.is_some());
    if !verifying || verification.is_some_and(|p| p.condition.is_none()) {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::BackupVerified.label());
    }
    // No NetworkPolicy asked for: no NetworkPolicyReady.
    if !NetworkPolicySpec::enabled(db.spec.network_policy.as_ref()) {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::NetworkPolicyReady.label());
    }
    // The release has nothing to say about it: no ReleasePending.
    if !decision
        .conditions
        .iter()
        .any(|c| c.type_ == ConditionType::ReleasePending)
    {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::ReleasePending.label());
    }
    // No WAL archiving: no ContinuousArchiving.
    if crate::resources::wal_archiving::enabled(db).is_none() {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::ContinuousArchiving.label());
    }
    // No autoGrow: no StorageAutoGrow.
    if db.spec.storage.auto_grow.is_none() {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::StorageAutoGrow.label());
    }
    // No maintenance window: no MaintenancePending.
    if db.spec.maintenance_window.is_none() {
        status
            .conditions
            .retain(|c| c.type_ != ConditionType::MaintenancePending.label());
    }
    status
}

/// The verification plan's conditions in the decision: `BackupVerified`, and `BackupHealthy`
/// False (`VerificationFailed`) over a True one while the latest verification failed.
fn with_verification(decision: &mut Decision, plan: &VerifyPlan) {
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

/// The status a decision leads to, from the previous one.
pub fn next_status(db: &Database, decision: &Decision, now: DateTime<Utc>) -> DatabaseStatus {
    let previous = db.status.clone().unwrap_or_default();
    let generation = db.metadata.generation;
    DatabaseStatus {
        phase: Some(decision.phase),
        conditions: without_backup_health(
            merge(&previous.conditions, &decision.conditions, generation, now),
            decision,
        ),
        observed_generation: generation,
        current_version: decision.current_version.clone(),
        current_image: decision.current_image.clone(),
        target_version: Some(db.spec.version.clone()),
        endpoint: Some(Names::of(db).endpoint(&db.namespace_or_default())),
        credentials_secret: Some(secret_name(db)),
        application_secret: Some(Names::of(db).application_secret()),
        backup: match &decision.backup {
            Some(plan) => plan.status.clone(),
            None => previous.backup,
        },
        bootstrap: decision.bootstrap.clone().or(previous.bootstrap),
        // Written by the verification step (`backup::verify`), kept otherwise.
        verification: previous.verification,
        upgrade: decision.upgrade.clone(),
        primary: Some(decision.roles.primary.clone()),
        instances: decision.roles.instances.clone(),
        positions_read_at: decision.roles.positions_read_at,
    }
}

/// Removes `BackupHealthy` when the backup plan has none (no `spec.backup`): `merge` keeps the
/// types a decision does not mention, so an absent condition must be dropped here.
fn without_backup_health(mut conditions: Vec<Condition>, decision: &Decision) -> Vec<Condition> {
    if decision
        .backup
        .as_ref()
        .is_some_and(|p| p.condition.is_none())
    {
        conditions.retain(|c| c.type_ != ConditionType::BackupHealthy.label());
    }
    conditions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::find;

    #[test]
    fn a_database_without_backups_loses_an_old_backup_not_configured_condition() {
        use crate::database::facts::Facts;
        use chrono::TimeZone;
        let mut db = crate::resources::testing::minimal();
        let old = ConditionStatus::new(
            ConditionType::BackupHealthy,
            false,
            "BackupNotConfigured",
            "spec.backup is not set",
        );
        let t = Utc.timestamp_opt(0, 0).unwrap();
        db.status = Some(DatabaseStatus {
            conditions: merge(&[], &[old], Some(1), t),
            ..DatabaseStatus::default()
        });
        let facts = Facts::nothing_made_yet();
        let decision =
            crate::database::decide::decide(&db, &facts, &crate::settings::Settings::default());
        let status = next_status(&db, &decision, t);
        assert_eq!(find(&status.conditions, ConditionType::BackupHealthy), None);
        assert!(find(&status.conditions, ConditionType::Ready).is_some());
    }
}
