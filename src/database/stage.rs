//! Where a Database's rollout stands (`Rollout`: serving, settled, upgrading, the version and
//! image to record) and the stage that follows from it with the init SQL and the pods' health
//! (`Stage`), worded as the phase, `Ready` and when to look again (`stage_outcome`). A part of
//! `decide`; pure.

use std::time::Duration;

use crate::api::conditions::{self, ConditionStatus, ConditionType};
use crate::api::{Database, InstanceRole, Phase};
use crate::resources::Names;
use crate::upgrade::plan::UpgradePlan;

use super::facts::{Facts, InstanceFailureFact, StatefulSetFact, UnschedulableFact};
use super::init::InitOutcome;
use super::roles::{self, RolesPlan};
use dbop_contract::InstanceFailure;

use ConditionType::{Initialized, Ready, Upgrading};

/// Nothing is watched that would wake us (a user's Secret or ConfigMap): look again soon.
pub const REQUEUE_WAITING_ON_USER: Duration = Duration::from_secs(30);
/// Something we watch is moving: its events wake us; this is only a safety net.
pub const REQUEUE_IN_PROGRESS: Duration = Duration::from_secs(60);
/// Steady state: an occasional look, which writes nothing when nothing drifted.
pub const REQUEUE_STEADY: Duration = Duration::from_secs(300);
/// Only a spec change helps, and a spec change wakes us anyway.
pub const REQUEUE_FAILED: Duration = Duration::from_secs(3600);

/// A failed init runs again once its SQL changed (`init::changed_since`): a spec change wakes
/// us, an edit of the user's ConfigMap (`spec.init.configMapRef`, not watched) does not.
fn failed_init_requeue(db: &Database) -> Duration {
    let users_config_map = db
        .spec
        .init
        .as_ref()
        .is_some_and(|i| i.config_map_ref.is_some());
    match users_config_map && db.spec.bootstrap.is_none() {
        true => REQUEUE_WAITING_ON_USER,
        false => REQUEUE_FAILED,
    }
}

/// Where the StatefulSet stands against the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Rollout {
    /// The version every instance ran when the last rollout settled.
    current_version: Option<String>,
    /// Enough instances are ready.
    serving: bool,
    /// Serving, and every pod runs the desired template.
    settled: bool,
    /// The spec's version differs from the one that ran.
    version_changed: bool,
    /// A rollout of a Database that has served once (new version, resources, undone hand edit).
    upgrading: bool,
    /// `Initialized` was True before this pass.
    already_initialized: bool,
    /// The version the pod template runs.
    template_version: String,
    /// The image every instance ran when the last rollout settled.
    current_image: Option<String>,
    /// The image the pod template runs.
    template_image: String,
}

impl Rollout {
    /// Where the StatefulSet stands against what the upgrade plan says the pods run. A version
    /// upgrade under way is `upgrade.active`; a stopped or refused one leaves the pods on the
    /// old version, which is then not a rollout.
    pub(super) fn of(db: &Database, facts: &Facts, upgrade: &UpgradePlan) -> Rollout {
        let status = db.status.clone().unwrap_or_default();
        let current_version = status.current_version;
        let was_ready_once = current_version.is_some();
        let sts = facts.statefulset.as_ref();
        let serving = sts.is_some_and(|s| s.ready_replicas >= db.spec.instances);
        let rolled_out = sts.is_some_and(|s| is_rolled_out(s, &upgrade.template.image));
        // A new template on its way to the pods. A lost pod is not one: the StatefulSet
        // recreates it from the same template, and the Database is Degraded until it serves.
        let template_change = was_ready_once
            && upgrade.condition.is_none()
            && sts.is_some_and(|s| is_template_rolling(s, &upgrade.template.image));
        Rollout {
            serving,
            settled: serving && rolled_out && !upgrade.active,
            version_changed: upgrade.active,
            upgrading: upgrade.active || template_change,
            already_initialized: conditions::is_true(&status.conditions, Initialized),
            current_version,
            template_version: upgrade.template.version.clone(),
            current_image: status.current_image,
            template_image: upgrade.template.image.clone(),
        }
    }

    pub(super) fn was_ready_once(&self) -> bool {
        self.current_version.is_some()
    }

    /// Init runs once, after the first time the server is serving on the desired spec.
    pub(super) fn server_has_run(&self) -> bool {
        self.settled || self.already_initialized || self.was_ready_once()
    }

    /// The version to record: a verified upgrade's target; the template's once settled on it;
    /// else the one that ran. (A verified upgrade does not wait for the StatefulSet's own
    /// revision bookkeeping: seen as not yet current, it would be started again.)
    pub(super) fn new_version(&self, upgrade: &UpgradePlan) -> Option<String> {
        let verified = upgrade
            .status
            .as_ref()
            .filter(|u| u.stage == crate::api::UpgradeStage::Complete);
        if let Some(u) = verified.filter(|u| u.to == self.template_version) {
            Some(u.to.clone())
        } else if self.settled && !upgrade.active {
            Some(self.template_version.clone())
        } else {
            self.current_version.clone()
        }
    }

    /// The image to record, settled as the version is (`new_version`).
    pub(super) fn new_image(&self, upgrade: &UpgradePlan) -> Option<String> {
        let verified = upgrade
            .status
            .as_ref()
            .is_some_and(|u| u.stage == crate::api::UpgradeStage::Complete);
        if (verified
            && upgrade
                .status
                .as_ref()
                .is_some_and(|u| u.to == self.template_version))
            || (self.settled && !upgrade.active)
        {
            Some(self.template_image.clone())
        } else {
            self.current_image.clone()
        }
    }

    pub(super) fn message(&self, db: &Database) -> String {
        if self.version_changed {
            format!(
                "rolling out version {} (from {})",
                db.spec.version,
                self.current_version.as_deref().unwrap_or("?")
            )
        } else {
            "rolling out a change of the pod template".to_string()
        }
    }

    /// The `Upgrading` condition.
    pub(super) fn condition(&self, db: &Database) -> ConditionStatus {
        if self.upgrading && !self.settled {
            ConditionStatus::new(Upgrading, true, "RollingOut", self.message(db))
        } else {
            ConditionStatus::new(
                Upgrading,
                false,
                "NoUpgrade",
                "running the requested version",
            )
        }
    }
}

/// The phase a Database is in, before it is worded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// The init SQL's source is missing: the user must act.
    InitBlocked {
        reason: &'static str,
        message: String,
    },
    InitFailed {
        reason: &'static str,
        message: String,
    },
    /// A pod's instance manager stopped for a reason only a spec change fixes.
    InstanceFailed(InstanceFailureFact),
    Upgrading,
    Degraded,
    Provisioning,
    Initializing,
    Ready,
}

impl Stage {
    pub(super) fn of(
        init: &InitOutcome,
        rollout: &Rollout,
        instance_failure: Option<&InstanceFailureFact>,
    ) -> Stage {
        if let Some(failure) = instance_failure.filter(|_| !rollout.serving) {
            return Stage::InstanceFailed(failure.clone());
        }
        match (init, rollout.serving, rollout.settled) {
            (InitOutcome::Blocked { reason, message }, _, _) => Stage::InitBlocked {
                reason,
                message: message.clone(),
            },
            (InitOutcome::Failed { reason, message }, _, _) => Stage::InitFailed {
                reason,
                message: message.clone(),
            },
            (_, _, false) if rollout.upgrading => Stage::Upgrading,
            (_, false, _) if rollout.was_ready_once() => Stage::Degraded,
            (_, false, _) | (_, true, false) => Stage::Provisioning,
            (InitOutcome::Pending, true, true) => Stage::Initializing,
            (InitOutcome::Done, true, true) => Stage::Ready,
        }
    }
}

/// The phase, the `Ready` condition and when to look again, for a stage.
pub(super) fn stage_outcome(
    db: &Database,
    stage: &Stage,
    rollout: &Rollout,
    facts: &Facts,
    roles: &RolesPlan,
) -> (Phase, ConditionStatus, Duration) {
    let names = Names::of(db);
    let sts = facts.statefulset.as_ref();
    let not_ready =
        |reason: &str, message: String| ConditionStatus::new(Ready, false, reason, message);
    // A pod no node takes: the scheduler's reason says more than a count of ready pods. Pods
    // are not watched, so look again for its next word.
    let phase = match stage {
        Stage::Provisioning => Some(Phase::Provisioning),
        Stage::Degraded => Some(Phase::Degraded),
        _ => None,
    };
    if let (Some(phase), Some(pod)) = (phase, &facts.unschedulable) {
        let reason = not_ready("Unschedulable", unschedulable_message(pod));
        return (phase, reason, REQUEUE_IN_PROGRESS);
    }
    match stage {
        Stage::InitBlocked { reason, message } => (
            Phase::Pending,
            not_ready(reason, message.clone()),
            REQUEUE_WAITING_ON_USER,
        ),
        Stage::InitFailed { reason, message } => (
            Phase::Failed,
            not_ready(reason, message.clone()),
            failed_init_requeue(db),
        ),
        Stage::InstanceFailed(failure) => (
            Phase::Failed,
            not_ready(
                instance_failure_reason(failure.failure),
                format!("pod {}: {}", failure.pod, failure.message),
            ),
            // Pods are not watched: look again for the pod that replaces it.
            REQUEUE_IN_PROGRESS,
        ),
        // Ready says whether the database serves, throughout an upgrade.
        Stage::Upgrading if rollout.serving => (
            Phase::Upgrading,
            ready_condition(db, &names),
            REQUEUE_IN_PROGRESS,
        ),
        Stage::Upgrading => (
            Phase::Upgrading,
            not_ready("RollingOut", rollout.message(db)),
            REQUEUE_IN_PROGRESS,
        ),
        Stage::Degraded => (
            Phase::Degraded,
            not_ready(degraded_reason(roles), degraded_message(db, sts, roles)),
            REQUEUE_IN_PROGRESS,
        ),
        Stage::Provisioning => (
            Phase::Provisioning,
            not_ready("Provisioning", provisioning_message(&names, sts)),
            REQUEUE_IN_PROGRESS,
        ),
        Stage::Initializing => (
            Phase::Initializing,
            not_ready("Initializing", initializing_message(db, &names)),
            REQUEUE_IN_PROGRESS,
        ),
        Stage::Ready => (Phase::Ready, ready_condition(db, &names), REQUEUE_STEADY),
    }
}

/// The `Ready` condition's reason for an instance manager's failure.
fn instance_failure_reason(failure: InstanceFailure) -> &'static str {
    match failure {
        InstanceFailure::NoUserEntry => "ImageUserNotFound",
        InstanceFailure::VolumeFull => "VolumeFull",
    }
}

/// What an initialising Database is doing: restoring its backup, or running its init SQL.
fn initializing_message(db: &Database, names: &Names) -> String {
    match &db.spec.bootstrap {
        Some(b) if b.from_backup.recovery_target.is_some() => format!(
            "recovery Job {} is recovering a base backup and the archived WAL \
             (spec.bootstrap.fromBackup.recoveryTarget); the server starts when it is done",
            names.restore_job()
        ),
        Some(_) => format!(
            "restore Job {} is restoring the backup (spec.bootstrap.fromBackup)",
            names.restore_job()
        ),
        None => format!("init Job {} is running the init SQL", names.init_job()),
    }
}

fn ready_condition(db: &Database, names: &Names) -> ConditionStatus {
    let endpoint = format!(
        "{}:{}",
        names.endpoint(&db.namespace_or_default()),
        crate::resources::POSTGRES_PORT
    );
    ConditionStatus::new(
        Ready,
        true,
        "DatabaseReady",
        format!("accepting connections at {endpoint}"),
    )
}

fn is_rolled_out(sts: &StatefulSetFact, desired_image: &str) -> bool {
    sts.rolled_out && sts.image.as_deref() == Some(desired_image)
}

fn is_template_rolling(sts: &StatefulSetFact, desired_image: &str) -> bool {
    sts.template_rolling || !sts.observed_current || sts.image.as_deref() != Some(desired_image)
}

fn provisioning_message(names: &Names, sts: Option<&StatefulSetFact>) -> String {
    match sts {
        None => format!("creating StatefulSet {}", names.statefulset()),
        Some(s) => format!(
            "waiting for StatefulSet {}: {}/{} ready, {} updated",
            names.statefulset(),
            s.ready_replicas,
            s.replicas,
            s.updated_replicas
        ),
    }
}

/// A pod no node can take: the scheduler's reason, and what in the spec decides it.
fn unschedulable_message(pod: &UnschedulableFact) -> String {
    format!(
        "pod {} cannot be scheduled: {} (the nodes it may use come from spec.placement, what it needs from spec.resources)",
        pod.pod,
        pod.message.trim_end_matches('.')
    )
}

/// `StandbyNotReady` while the primary serves and only standbys are missing; `NotServing`
/// otherwise.
fn degraded_reason(roles: &RolesPlan) -> &'static str {
    if roles.failover_waits.is_some() {
        return "FailoverWaiting";
    }
    let primary_ready = roles
        .instances
        .iter()
        .any(|i| i.role == InstanceRole::Primary && i.ready);
    if primary_ready {
        "StandbyNotReady"
    } else {
        "NotServing"
    }
}

fn degraded_message(db: &Database, sts: Option<&StatefulSetFact>, roles: &RolesPlan) -> String {
    let message = instances_message(db, sts, roles);
    match &roles.failover_waits {
        Some(wait) => format!("{message}; {wait}"),
        None => message,
    }
}

fn instances_message(db: &Database, sts: Option<&StatefulSetFact>, roles: &RolesPlan) -> String {
    let not_ready = roles::not_ready(roles);
    match sts {
        None => format!("StatefulSet {} is missing; recreating it", db.name()),
        Some(s) if not_ready.is_empty() => format!(
            "{}/{} instances ready; see the pods' events and logs",
            s.ready_replicas, db.spec.instances
        ),
        Some(s) => format!(
            "{}/{} instances ready; not ready: {} ({})",
            s.ready_replicas,
            db.spec.instances,
            not_ready.join(", "),
            not_ready_hint(roles)
        ),
    }
}

/// Where to look for the instances that are not ready: a standby is ready only while it streams
/// from the primary, which its log says; a primary's pod says why in its events and log.
fn not_ready_hint(roles: &RolesPlan) -> &'static str {
    let standby_waits = roles
        .instances
        .iter()
        .any(|i| !i.ready && i.role != InstanceRole::Primary);
    if standby_waits {
        "a standby is ready only while it streams from the primary: see the pod's log"
    } else {
        "see the pod's events and log"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_waiting_standby_is_pointed_at_streaming() {
        let instance = |name: &str, role, ready| crate::api::InstanceStatus {
            name: name.into(),
            role,
            ready,
            ..Default::default()
        };
        let roles = |instances| RolesPlan {
            instances,
            ..Default::default()
        };
        let primary_down = roles(vec![
            instance("orders-0", InstanceRole::Primary, false),
            instance("orders-1", InstanceRole::Standby, true),
        ]);
        assert_eq!(
            not_ready_hint(&primary_down),
            "see the pod's events and log"
        );
        let standby_down = roles(vec![
            instance("orders-0", InstanceRole::Primary, true),
            instance("orders-1", InstanceRole::Standby, false),
        ]);
        assert!(
            not_ready_hint(&standby_down).starts_with("a standby is ready only while it streams")
        );
    }

    #[test]
    fn stage_table() {
        let rollout = |serving, settled, upgrading, ran: bool| Rollout {
            current_version: ran.then(|| "16.4".to_string()),
            serving,
            settled,
            version_changed: false,
            upgrading,
            already_initialized: false,
            template_version: "16.4".into(),
            current_image: None,
            template_image: "pg:16.4".into(),
        };
        let blocked = InitOutcome::Blocked {
            reason: "InitConfigMapNotFound",
            message: "m".into(),
        };
        let failed = InitOutcome::Failed {
            reason: "InitFailed",
            message: "m".into(),
        };
        let table = [
            (
                "init blocked wins",
                &blocked,
                rollout(true, true, false, true),
                "InitBlocked",
            ),
            (
                "init failed",
                &failed,
                rollout(false, false, true, true),
                "InitFailed",
            ),
            (
                "upgrading",
                &InitOutcome::Done,
                rollout(true, false, true, true),
                "Upgrading",
            ),
            (
                "degraded",
                &InitOutcome::Done,
                rollout(false, false, false, true),
                "Degraded",
            ),
            (
                "first start",
                &InitOutcome::Pending,
                rollout(false, false, false, false),
                "Provisioning",
            ),
            (
                "serving, rolling out",
                &InitOutcome::Done,
                rollout(true, false, false, false),
                "Provisioning",
            ),
            (
                "init running",
                &InitOutcome::Pending,
                rollout(true, true, false, false),
                "Initializing",
            ),
            (
                "ready",
                &InitOutcome::Done,
                rollout(true, true, false, true),
                "Ready",
            ),
        ];
        for (name, init, rollout, want) in table {
            let stage = format!("{:?}", Stage::of(init, &rollout, None));
            assert!(stage.starts_with(want), "{name}: {stage}");
        }
        // A pod that cannot start for a reason the spec fixes, until the Database serves.
        let failure = InstanceFailureFact {
            pod: "orders-0".into(),
            failure: InstanceFailure::NoUserEntry,
            message: "no entry".into(),
        };
        let not_serving = rollout(false, false, false, false);
        let stage = Stage::of(&InitOutcome::Pending, &not_serving, Some(&failure));
        assert_eq!(stage, Stage::InstanceFailed(failure.clone()));
        let serving = rollout(true, true, false, true);
        let stage = Stage::of(&InitOutcome::Done, &serving, Some(&failure));
        assert_eq!(stage, Stage::Ready);
    }
}
