//! The stage machine of one upgrade: from the Database (its spec, `status.upgrade`), the
//! observed `UpgradeFacts` and `now`, the next `status.upgrade`, the pod template to run (image
//! and StatefulSet partition), what to create or delete, and the `Upgrading` condition.
//!
//! Stages: Preflight → PreUpgradeBackup (when backups are configured and wanted) → RollingOut
//! (highest ordinal first) → Verifying → Complete; a failure before RollingOut → Failed (nothing
//! that serves was touched); a failure from RollingOut on → RollingBack → RolledBack, or Failed
//! when `rollbackOnFailure` is false.
//!
//! A new `spec.version` during an upgrade: before RollingOut the upgrade is abandoned (nothing
//! that serves was touched) and the new version is judged afresh; from RollingOut on, the
//! upgrade in progress runs to its end first.
//!
//! Resumable: every name derives from `status.upgrade.startedAt`, which is written before
//! anything is created, so a restarted operator finds what it made instead of making it twice.
//!
//! Pure: no client, no clock.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::facts::{PodFact, UpgradeFacts};
use super::policy::{Transition, image_of, transition};
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{BackupPhase, Database, UpgradeStage, UpgradeStageTime, UpgradeStatus};
use crate::maintenance::Gate;
use crate::objects::JobState;
use crate::settings::Settings;

use UpgradeStage::{
    Complete, Failed, PreUpgradeBackup, Preflight, RolledBack, RollingBack, RollingOut, Verifying,
};

/// How long an updated pod may take to be Ready when `upgrade.podReadyTimeout` is not set.
pub const DEFAULT_POD_READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How often an upgrade under way looks again (pods and image pulls are not watched).
pub const REQUEUE_UPGRADING: Duration = Duration::from_secs(5);

/// What the StatefulSet's pod template runs (image, version, partition).
pub use crate::resources::statefulset::PodRun as Template;

/// The outcome of `plan`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradePlan {
    pub template: Template,
    /// The next `status.upgrade`.
    pub status: Option<UpgradeStatus>,
    /// The `Upgrading` condition, when the upgrade has something to say (None: no upgrade).
    pub condition: Option<ConditionStatus>,
    /// An upgrade is under way: the phase is Upgrading, scheduled backups wait.
    pub active: bool,
    /// Create the preflight Job of this name.
    pub create_preflight: Option<String>,
    /// Create the pre-upgrade `DatabaseBackup` of this name.
    pub create_backup: Option<String>,
    /// Delete these pods (stuck on the image being rolled back).
    pub delete_pods: Vec<String>,
    pub requeue_after: Option<Duration>,
    /// The upgrade that waits for the maintenance window, in words (None: none waits).
    pub waiting_for_window: Option<String>,
}

/// The `spec.upgrade` settings with their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub pre_upgrade_backup: bool,
    pub pod_ready_timeout: Duration,
    pub rollback_on_failure: bool,
}

impl Options {
    pub fn of(db: &Database) -> Options {
        let spec = db.spec.upgrade.clone().unwrap_or_default();
        Options {
            pre_upgrade_backup: spec.pre_upgrade_backup.unwrap_or(true),
            pod_ready_timeout: spec
                .pod_ready_timeout
                .as_deref()
                .and_then(|t| dbop_contract::units::parse_duration(t).ok())
                .unwrap_or(DEFAULT_POD_READY_TIMEOUT),
            rollback_on_failure: spec.rollback_on_failure.unwrap_or(true),
        }
    }
}

/// The preflight Job of the upgrade started at `started`.
pub fn preflight_job_name(database: &str, started: DateTime<Utc>) -> String {
    format!("{database}-preflight-{}", started.timestamp())
}

/// The pre-upgrade `DatabaseBackup` of the upgrade started at `started`.
pub fn backup_name(database: &str, started: DateTime<Utc>) -> String {
    format!("{database}-preupgrade-{}", started.timestamp())
}

/// Everything `plan` reads.
pub struct Input<'a> {
    pub db: &'a Database,
    pub settings: &'a Settings,
    pub facts: &'a UpgradeFacts,
    pub now: DateTime<Utc>,
    /// The maintenance window's gate (an upgrade marked `inMaintenanceWindow` starts in it).
    pub gate: &'a Gate,
}

impl Input<'_> {
    fn running(&self) -> Option<&str> {
        self.db.status.as_ref()?.current_version.as_deref()
    }

    fn previous(&self) -> Option<&UpgradeStatus> {
        self.db.status.as_ref()?.upgrade.as_ref()
    }

    fn wanted_image(&self) -> String {
        image_of(self.db, self.settings, &self.db.spec.version)
    }

    /// The image the running version runs: what the StatefulSet has, else the version's.
    fn running_image(&self, running: &str) -> String {
        self.facts
            .statefulset
            .as_ref()
            .and_then(|s| s.image.clone())
            .unwrap_or_else(|| image_of(self.db, self.settings, running))
    }
}

/// Decides the next step of the Database's upgrade, if it has one.
pub fn plan(input: &Input) -> UpgradePlan {
    if let Some(previous) = input.previous().filter(|u| !u.stage.is_finished()) {
        let abandoned = previous.partition.is_none()
            && (previous.to != input.db.spec.version || previous.to_image != input.wanted_image());
        if !abandoned {
            return advance(input, previous);
        }
        let mut out = judge(input);
        if out.status.as_ref() == Some(previous) {
            let message = format!(
                "abandoned before any pod changed: spec.version is now {}",
                input.db.spec.version
            );
            let mut superseded = enter(previous, Failed, input.now, message);
            superseded.reason = Some(SUPERSEDED.into());
            out.status = Some(superseded);
        }
        return out;
    }
    judge(input)
}

/// No upgrade under way: is `spec.version` one to start?
fn judge(input: &Input) -> UpgradePlan {
    let spec_version = input.db.spec.version.clone();
    match transition(input.running(), &spec_version) {
        Transition::Stay => {
            let mut out = idle(input, spec_version);
            if let Some(p) = input.previous().filter(|p| is_stopped(p)) {
                out.status = Some(abandoned(input, p));
            }
            out
        }
        Transition::Refused { refusal, from } => {
            let mut out = idle(input, from.clone());
            out.template.image = input.running_image(&from);
            out.condition = Some(upgrading(
                false,
                refusal.reason(),
                refusal.message(&from, &spec_version),
            ));
            out
        }
        Transition::Upgrade { from, to } => match input.previous() {
            // The same upgrade stopped before: it stays stopped until the spec changes.
            Some(p)
                if still_stopped(input, p) && p.to == to && p.to_image == input.wanted_image() =>
            {
                stopped(input, p)
            }
            _ if waits_for_window(input) => waiting(input, from, to),
            _ => start(input, from, to),
        },
    }
}

/// The upgrade is marked `inMaintenanceWindow` and the window holds restarts now.
fn waits_for_window(input: &Input) -> bool {
    let marked = input
        .db
        .spec
        .upgrade
        .as_ref()
        .and_then(|u| u.in_maintenance_window)
        .unwrap_or(false);
    marked && input.gate.holds()
}

/// The reason of `Upgrading` while an upgrade waits for the maintenance window.
pub const WAITING_FOR_WINDOW: &str = "WaitingForMaintenanceWindow";

/// An upgrade that waits for the maintenance window: nothing starts, the pods stay as they are.
fn waiting(input: &Input, from: String, to: String) -> UpgradePlan {
    let mut out = idle(input, from.clone());
    out.template.image = input.running_image(&from);
    out.condition = Some(upgrading(
        false,
        WAITING_FOR_WINDOW,
        format!(
            "the upgrade from {from} to {to} waits for the maintenance window \
             (spec.upgrade.inMaintenanceWindow); see MaintenancePending"
        ),
    ));
    out.waiting_for_window = Some(format!("the upgrade to {to}"));
    out
}

/// An upgrade that ended without reaching its version and was not abandoned since.
fn is_stopped(u: &UpgradeStatus) -> bool {
    matches!(u.stage, RolledBack | Failed)
        && !matches!(u.reason.as_deref(), Some(ABANDONED | SUPERSEDED))
}

/// A stopped upgrade whose spec has not changed since it stopped: it stays stopped. Any later
/// change of the spec (set the version back and forth, raise `podReadyTimeout`) tries again.
fn still_stopped(input: &Input, u: &UpgradeStatus) -> bool {
    is_stopped(u)
        && u.stopped_at_generation
            .is_none_or(|g| Some(g) == input.db.metadata.generation)
}

/// The reason of a stopped upgrade the spec gave up (set back to the running version).
pub const ABANDONED: &str = "Abandoned";
/// The reason of an upgrade replaced by a new `spec.version` before any pod changed.
pub const SUPERSEDED: &str = "Superseded";

/// A stopped upgrade given up: the spec is back at the running version. Its stage stays; its
/// reason says so, and setting the same version again starts a new attempt.
fn abandoned(input: &Input, u: &UpgradeStatus) -> UpgradeStatus {
    let mut next = u.clone();
    next.message = Some(format!(
        "abandoned: spec.version is back at {} (it had stopped: {}: {})",
        input.db.spec.version,
        u.reason.as_deref().unwrap_or(u.stage.label()),
        u.message.as_deref().unwrap_or("")
    ));
    next.reason = Some(ABANDONED.into());
    next
}

/// Nothing to do: the template runs `version`; the last upgrade (if any) is history.
fn idle(input: &Input, version: String) -> UpgradePlan {
    UpgradePlan {
        template: Template {
            image: image_of(input.db, input.settings, &version),
            version,
            partition: None,
        },
        status: input.previous().cloned(),
        condition: None,
        active: false,
        create_preflight: None,
        create_backup: None,
        delete_pods: vec![],
        requeue_after: None,
        waiting_for_window: None,
    }
}

/// An upgrade that ended without reaching its version, with the spec still asking for it.
fn stopped(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let mut out = idle(input, u.from.clone());
    out.template = template_of(u);
    out.condition = Some(stage_condition(u));
    out
}

/// Records a new upgrade; nothing is created until this status is written (names derive
/// from `startedAt`).
fn start(input: &Input, from: String, to: String) -> UpgradePlan {
    let started = input.now;
    let u = UpgradeStatus {
        from_image: input.running_image(&from),
        to_image: input.wanted_image(),
        stage: Preflight,
        started_at: started,
        stages: vec![UpgradeStageTime {
            stage: Preflight,
            started_at: started,
        }],
        reason: None,
        message: Some(format!(
            "checking that image {} runs PostgreSQL {to}",
            input.wanted_image()
        )),
        preflight_job: Some(preflight_job_name(&input.db.name(), started)),
        verified_image_id: None,
        pre_upgrade_backup: None,
        partition: None,
        partition_since: None,
        stopped_at_generation: None,
        from,
        to,
    };
    under_way(input, u)
}

/// The plan for an upgrade whose stage is `u.stage`, with nothing to create.
fn under_way(input: &Input, mut u: UpgradeStatus) -> UpgradePlan {
    if matches!(u.stage, RolledBack | Failed) && u.stopped_at_generation.is_none() {
        u.stopped_at_generation = input.db.metadata.generation;
    }
    let condition = if u.stage.is_finished() {
        stage_condition(&u)
    } else {
        upgrading(true, u.stage.label(), u.message.clone().unwrap_or_default())
    };
    let active = !u.stage.is_finished();
    let mut out = idle(input, u.from.clone());
    out.template = template_of(&u);
    out.condition = Some(condition);
    out.active = active;
    out.requeue_after = active.then_some(REQUEUE_UPGRADING);
    out.status = Some(u);
    out
}

/// The `Upgrading` condition of a finished upgrade.
fn stage_condition(u: &UpgradeStatus) -> ConditionStatus {
    let message = u.message.clone().unwrap_or_default();
    match u.stage {
        Complete => upgrading(false, "UpgradeComplete", message),
        RolledBack => upgrading(false, "RolledBack", message),
        _ => upgrading(
            false,
            u.reason.as_deref().unwrap_or("UpgradeFailed"),
            message,
        ),
    }
}

/// What the pod template runs in each stage: the old image until the rollout, the new one
/// from then on, the old one again once rolling back.
fn template_of(u: &UpgradeStatus) -> Template {
    let old = Template {
        image: u.from_image.clone(),
        version: u.from.clone(),
        partition: None,
    };
    let new = Template {
        image: u.to_image.clone(),
        version: u.to.clone(),
        partition: u.partition.filter(|p| *p > 0),
    };
    match u.stage {
        Preflight | PreUpgradeBackup | RollingBack | RolledBack => old,
        RollingOut | Verifying | Complete => new,
        // Stopped without rollback: as it was left (the old image when nothing was touched).
        Failed if u.partition.is_some() => new,
        Failed => old,
    }
}

fn upgrading(status: bool, reason: &str, message: impl Into<String>) -> ConditionStatus {
    ConditionStatus::new(ConditionType::Upgrading, status, reason, message)
}

/// Moves `u` to `stage` at `now` with `message`.
fn enter(
    u: &UpgradeStatus,
    stage: UpgradeStage,
    now: DateTime<Utc>,
    message: String,
) -> UpgradeStatus {
    let mut next = u.clone();
    next.stage = stage;
    next.message = Some(message);
    next.stages.push(UpgradeStageTime {
        stage,
        started_at: now,
    });
    next
}

/// A stop: with `reason`, to RollingBack when pods changed and rollback is on, else Failed.
fn stop(input: &Input, u: &UpgradeStatus, reason: &str, why: String) -> UpgradeStatus {
    let touched = u.partition.is_some();
    let rollback = touched && Options::of(input.db).rollback_on_failure;
    let (stage, message) = if rollback {
        (
            RollingBack,
            format!("{why}; rolling back to {} ({})", u.from, u.from_image),
        )
    } else if touched {
        (
            Failed,
            format!(
                "{why}; rollbackOnFailure is false: the pods are left as they are. Set \
                 spec.version back to {} to return to it",
                u.from
            ),
        )
    } else {
        (
            Failed,
            format!(
                "{why}; nothing that serves was touched: the database runs {}. Fix the image, \
                 or set spec.version back to {}",
                u.from, u.from
            ),
        )
    };
    let mut next = enter(u, stage, input.now, message);
    next.reason = Some(reason.to_string());
    next
}

/// One step of the upgrade under way.
fn advance(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    match u.stage {
        Preflight => preflight(input, u),
        PreUpgradeBackup => pre_upgrade_backup(input, u),
        RollingOut => rolling_out(input, u),
        Verifying => verifying(input, u),
        RollingBack => rolling_back(input, u),
        Complete | RolledBack | Failed => under_way(input, u.clone()),
    }
}

fn preflight(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let name = preflight_job_name(&input.db.name(), u.started_at);
    let Some(fact) = &input.facts.preflight else {
        let mut out = under_way(input, u.clone());
        out.create_preflight = Some(name);
        return out;
    };
    let failed = |why: String| under_way(input, stop(input, u, "PreflightFailed", why));
    if let Some(pull) = &fact.pull_error {
        return failed(format!("the image {} cannot be pulled: {pull}", u.to_image));
    }
    match &fact.job {
        JobState::Running => under_way(input, u.clone()),
        JobState::Failed { reason, detail } => {
            let found = match &fact.reported {
                Some(text) => format!("it reports {text:?}"),
                None => JobState::failure_text(reason, detail),
            };
            failed(format!(
                "preflight Job {name}: image {} does not run PostgreSQL {} ({found})",
                u.to_image, u.to
            ))
        }
        JobState::Succeeded => {
            let mut next = after_preflight(input, u);
            next.verified_image_id = fact.image_id.clone();
            under_way(input, next)
        }
    }
}

/// After a passed preflight: the backup when configured and wanted, else the rollout.
fn after_preflight(input: &Input, u: &UpgradeStatus) -> UpgradeStatus {
    let wanted = Options::of(input.db).pre_upgrade_backup && input.db.spec.backup.is_some();
    if wanted {
        let name = backup_name(&input.db.name(), u.started_at);
        let mut next = enter(
            u,
            PreUpgradeBackup,
            input.now,
            format!("taking backup {name} before any pod changes"),
        );
        next.pre_upgrade_backup = Some(name);
        next
    } else {
        begin_rollout(input, u)
    }
}

fn pre_upgrade_backup(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let name = backup_name(&input.db.name(), u.started_at);
    let Some(fact) = &input.facts.backup else {
        let mut out = under_way(input, u.clone());
        out.create_backup = Some(name);
        return out;
    };
    match fact.phase {
        Some(BackupPhase::Succeeded) => under_way(input, begin_rollout(input, u)),
        Some(BackupPhase::Failed) => {
            let why = format!(
                "pre-upgrade backup {name} failed: {}",
                fact.message.as_deref().unwrap_or("see the DatabaseBackup")
            );
            under_way(input, stop(input, u, "PreUpgradeBackupFailed", why))
        }
        _ => {
            let mut next = u.clone();
            next.message = Some(format!(
                "waiting for backup {name}: {}",
                fact.message.as_deref().unwrap_or("pending")
            ));
            under_way(input, next)
        }
    }
}

/// Releases the highest ordinal to the target image.
fn begin_rollout(input: &Input, u: &UpgradeStatus) -> UpgradeStatus {
    let highest = input.db.spec.instances.max(1) - 1;
    let mut next = enter(u, RollingOut, input.now, rollout_message(u, highest));
    next.partition = Some(highest);
    next.partition_since = Some(input.now);
    next
}

fn rollout_message(u: &UpgradeStatus, ordinal: i32) -> String {
    format!(
        "moving instance {ordinal} to {} ({}), highest ordinal first",
        u.to, u.to_image
    )
}

/// The StatefulSet runs `image` and its controller has seen that spec.
fn template_applied(input: &Input, image: &str) -> Option<String> {
    let sts = input.facts.statefulset.as_ref()?;
    (sts.observed_current && sts.image.as_deref() == Some(image))
        .then(|| sts.update_revision.clone())
        .flatten()
}

/// The pod is Ready on the update revision.
fn pod_done(pod: &PodFact, revision: &str) -> bool {
    pod.ready && !pod.terminating && pod.revision.as_deref() == Some(revision)
}

fn pod_at<'a>(input: &'a Input, ordinal: i32) -> Option<&'a PodFact> {
    input.facts.pods.iter().find(|p| p.ordinal == ordinal)
}

/// Past the Ready deadline of the ordinal being updated (or of verification).
fn overdue(input: &Input, since: Option<DateTime<Utc>>) -> bool {
    let timeout = Options::of(input.db).pod_ready_timeout;
    since.is_some_and(|s| (input.now - s).to_std().unwrap_or_default() > timeout)
}

fn rolling_out(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let ordinal = u.partition.unwrap_or(0);
    let revision = template_applied(input, &u.to_image);
    let done = revision
        .as_deref()
        .is_some_and(|r| pod_at(input, ordinal).is_some_and(|p| pod_done(p, r)));
    if done {
        let next = if ordinal > 0 {
            let mut next = u.clone();
            next.partition = Some(ordinal - 1);
            next.partition_since = Some(input.now);
            next.message = Some(rollout_message(u, ordinal - 1));
            next
        } else {
            let message = format!("every instance runs {}: confirming the version", u.to_image);
            enter(u, Verifying, input.now, message)
        };
        return under_way(input, next);
    }
    if overdue(input, u.partition_since) {
        let why = format!(
            "instance {ordinal} was not Ready on {} within podReadyTimeout",
            u.to_image
        );
        return under_way(input, stop(input, u, "PodNotReady", why));
    }
    under_way(input, u.clone())
}

/// Why a pod does not run the verified server, if it does not.
fn wrong_version(u: &UpgradeStatus, pod: &PodFact) -> Option<String> {
    let mismatch = match (&u.verified_image_id, &pod.image_id) {
        (Some(want), Some(have)) => want != have,
        _ => false,
    };
    mismatch.then(|| {
        format!(
            "instance {} runs image {} which is not the one preflight proved to be PostgreSQL {}",
            pod.ordinal,
            pod.image_id.as_deref().unwrap_or("?"),
            u.to
        )
    })
}

/// Every pod Ready on the update revision, running the image preflight proved: Complete.
fn verifying(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let replicas = input.db.spec.instances.max(1);
    if let Some(why) = input.facts.pods.iter().find_map(|p| wrong_version(u, p)) {
        return under_way(input, stop(input, u, "WrongVersion", why));
    }
    let revision = template_applied(input, &u.to_image);
    let all_done = revision
        .as_deref()
        .is_some_and(|r| (0..replicas).all(|o| pod_at(input, o).is_some_and(|p| pod_done(p, r))));
    if all_done {
        let message = format!("upgraded from {} to {}", u.from, u.to);
        return under_way(input, enter(u, Complete, input.now, message));
    }
    let since = u.stages.last().map(|s| s.started_at);
    if overdue(input, since) {
        let why = format!(
            "not every instance is Ready on {} within podReadyTimeout",
            u.to
        );
        return under_way(input, stop(input, u, "PodNotReady", why));
    }
    under_way(input, u.clone())
}

/// The template is back on the old image; pods the StatefulSet controller would wait on forever
/// (not Ready on another revision) are deleted so they come back on the old one.
fn rolling_back(input: &Input, u: &UpgradeStatus) -> UpgradePlan {
    let replicas = input.db.spec.instances.max(1);
    let Some(revision) = template_applied(input, &u.from_image) else {
        return under_way(input, u.clone());
    };
    if (0..replicas).all(|o| pod_at(input, o).is_some_and(|p| pod_done(p, &revision))) {
        let message = format!(
            "{}; every instance runs {} again. The pre-upgrade backup{} is kept. Set spec.version \
             back to {} (or fix the image and set it again)",
            u.message.as_deref().unwrap_or("the upgrade failed"),
            u.from,
            u.pre_upgrade_backup
                .as_deref()
                .map(|b| format!(" {b}"))
                .unwrap_or_default(),
            u.from
        );
        return under_way(input, enter(u, RolledBack, input.now, message));
    }
    let stuck = input
        .facts
        .pods
        .iter()
        .filter(|p| !p.ready && !p.terminating && p.revision.as_deref() != Some(&revision))
        .map(|p| p.name.clone())
        .collect();
    let mut out = under_way(input, u.clone());
    out.delete_pods = stuck;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BackupPhase, DatabaseStatus};
    use crate::resources::testing;
    use crate::upgrade::facts::{PodFact, PreUpgradeBackupFact, PreflightFact, RevisionFact};
    use chrono::TimeZone;

    const OLD: &str = "dbop.local/postgres:15.18";
    const NEW: &str = "dbop.local/postgres:15.20";

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_000_000 + s, 0).unwrap()
    }

    fn settings() -> Settings {
        Settings {
            postgres_image_template: "dbop.local/postgres:{version}".into(),
            ..Settings::default()
        }
    }

    /// A Database running 15.18 whose spec asks for `version`, with `upgrade` in its status.
    fn db(version: &str, upgrade: Option<UpgradeStatus>, extra: serde_json::Value) -> Database {
        let mut spec = serde_json::json!({"version": version, "storage": {"size": "1Gi"}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let mut db = testing::database(spec);
        db.status = Some(DatabaseStatus {
            current_version: Some("15.18".into()),
            upgrade,
            ..DatabaseStatus::default()
        });
        db
    }

    fn with_backups() -> serde_json::Value {
        serde_json::json!({"backup": {"schedule": "@daily", "s3": {"bucket": "bkt",
            "credentials": {"secretName": "s3"}}}})
    }

    fn at(stage: UpgradeStage) -> UpgradeStatus {
        let touched = matches!(stage, RollingOut | Verifying | RollingBack | RolledBack);
        UpgradeStatus {
            from_image: OLD.into(),
            to_image: NEW.into(),
            stages: vec![UpgradeStageTime {
                stage,
                started_at: t(10),
            }],
            preflight_job: Some("orders-preflight-1000000".into()),
            verified_image_id: Some("sha256:new".into()),
            partition: touched.then_some(0),
            partition_since: touched.then(|| t(10)),
            ..crate::upgrade::testing::upgrade(stage, t(0))
        }
    }

    fn abandoned_at(stage: UpgradeStage) -> UpgradeStatus {
        UpgradeStatus {
            reason: Some(ABANDONED.into()),
            ..at(stage)
        }
    }

    fn sts(image: &str, revision: &str) -> Option<RevisionFact> {
        Some(RevisionFact {
            image: Some(image.into()),
            observed_current: true,
            update_revision: Some(revision.into()),
        })
    }

    fn pod(ordinal: i32, ready: bool, revision: &str, image_id: &str) -> PodFact {
        PodFact {
            name: format!("orders-{ordinal}"),
            ordinal,
            ready,
            terminating: false,
            revision: Some(revision.into()),
            image: None,
            image_id: Some(image_id.into()),
        }
    }

    fn preflight(job: JobState, pull_error: Option<&str>) -> Option<PreflightFact> {
        Some(PreflightFact {
            job,
            pull_error: pull_error.map(Into::into),
            reported: Some("15.18".into()),
            image_id: Some("sha256:new".into()),
        })
    }

    fn backup(phase: BackupPhase) -> Option<PreUpgradeBackupFact> {
        Some(PreUpgradeBackupFact {
            phase: Some(phase),
            message: Some("m".into()),
        })
    }

    fn run(db: &Database, facts: UpgradeFacts, now: i64) -> UpgradePlan {
        plan(&Input {
            db,
            settings: &settings(),
            facts: &facts,
            now: t(now),
            gate: &Gate::NoWindow,
        })
    }

    /// What a plan says, in short: (stage, template image, partition, Upgrading reason,
    /// preflight to create, backup to create, pods to delete, active).
    type Summary = (
        Option<UpgradeStage>,
        String,
        Option<i32>,
        Option<String>,
        bool,
        bool,
        Vec<String>,
        bool,
    );

    fn summary(p: &UpgradePlan) -> Summary {
        (
            p.status.as_ref().map(|u| u.stage),
            p.template.image.clone(),
            p.template.partition,
            p.condition.as_ref().map(|c| c.reason.clone()),
            p.create_preflight.is_some(),
            p.create_backup.is_some(),
            p.delete_pods.clone(),
            p.active,
        )
    }

    #[test]
    fn stage_transitions_table() {
        let none = UpgradeFacts::default;
        let on_new = |pods: Vec<PodFact>| UpgradeFacts {
            statefulset: sts(NEW, "r2"),
            pods,
            ..UpgradeFacts::default()
        };
        let on_old = |pods: Vec<PodFact>| UpgradeFacts {
            statefulset: sts(OLD, "r1"),
            pods,
            ..UpgradeFacts::default()
        };
        let no_rollback = serde_json::json!({"upgrade": {"rollbackOnFailure": false}});
        let no = serde_json::json!({});
        let s = |x: &str| Some(x.to_string());
        let v = Vec::<String>::new;
        let failed_job = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let mut no_pre_backup = with_backups();
        no_pre_backup["upgrade"] = serde_json::json!({"preUpgradeBackup": false});
        let short_timeout = serde_json::json!({"upgrade": {"podReadyTimeout": "30s"}});
        #[rustfmt::skip]
        let table: Vec<(&str, Database, UpgradeFacts, i64, Summary)> = vec![
            ("same version: nothing",
             db("15.18", None, no.clone()), none(), 0,
             (None, OLD.into(), None, None, false, false, v(), false)),
            ("downgrade refused, keeps the running image",
             db("15.16", None, no.clone()), on_old(vec![]), 0,
             (None, OLD.into(), None, s("DowngradeRefused"), false, false, v(), false)),
            ("major change refused",
             db("16.4", None, no.clone()), on_old(vec![]), 0,
             (None, OLD.into(), None, s("MajorUpgradeUnsupported"), false, false, v(), false)),
            ("newer minor: recorded first, nothing created, old image",
             db("15.20", None, no.clone()), on_old(vec![]), 0,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("preflight: the Job is created once the upgrade is recorded",
             db("15.20", Some(at(Preflight)), no.clone()), none(), 5,
             (Some(Preflight), OLD.into(), None, s("Preflight"), true, false, v(), true)),
            ("preflight running: nothing to create (resumed)",
             db("15.20", Some(at(Preflight)), no.clone()),
             UpgradeFacts { preflight: preflight(JobState::Running, None), ..none() }, 5,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("image does not pull: stopped, nothing touched",
             db("15.20", Some(at(Preflight)), no.clone()),
             UpgradeFacts { preflight: preflight(JobState::Running, Some("ErrImagePull")), ..none() }, 5,
             (Some(Failed), OLD.into(), None, s("PreflightFailed"), false, false, v(), false)),
            ("image reports another version: stopped",
             db("15.20", Some(at(Preflight)), no.clone()),
             UpgradeFacts { preflight: preflight(failed_job, None), ..none() }, 5,
             (Some(Failed), OLD.into(), None, s("PreflightFailed"), false, false, v(), false)),
            ("preflight passed, backups configured: the backup",
             db("15.20", Some(at(Preflight)), with_backups()),
             UpgradeFacts { preflight: preflight(JobState::Succeeded, None), ..none() }, 5,
             (Some(PreUpgradeBackup), OLD.into(), None, s("PreUpgradeBackup"), false, false, v(), true)),
            ("preflight passed, no backups: the rollout",
             db("15.20", Some(at(Preflight)), no.clone()),
             UpgradeFacts { preflight: preflight(JobState::Succeeded, None), ..none() }, 5,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
            ("preflight passed, preUpgradeBackup false: the rollout",
             db("15.20", Some(at(Preflight)), no_pre_backup),
             UpgradeFacts { preflight: preflight(JobState::Succeeded, None), ..none() }, 5,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
            ("backup stage: created once",
             db("15.20", Some(at(PreUpgradeBackup)), with_backups()), none(), 5,
             (Some(PreUpgradeBackup), OLD.into(), None, s("PreUpgradeBackup"), false, true, v(), true)),
            ("backup running: no pod changes",
             db("15.20", Some(at(PreUpgradeBackup)), with_backups()),
             UpgradeFacts { backup: backup(BackupPhase::Running), ..none() }, 5,
             (Some(PreUpgradeBackup), OLD.into(), None, s("PreUpgradeBackup"), false, false, v(), true)),
            ("backup failed: stopped on the old version",
             db("15.20", Some(at(PreUpgradeBackup)), with_backups()),
             UpgradeFacts { backup: backup(BackupPhase::Failed), ..none() }, 5,
             (Some(Failed), OLD.into(), None, s("PreUpgradeBackupFailed"), false, false, v(), false)),
            ("backup succeeded: the rollout",
             db("15.20", Some(at(PreUpgradeBackup)), with_backups()),
             UpgradeFacts { backup: backup(BackupPhase::Succeeded), ..none() }, 5,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
            ("rollout: the StatefulSet not applied yet, the old pod Ready is no proof",
             db("15.20", Some(at(RollingOut)), no.clone()),
             on_old(vec![pod(0, true, "r1", "sha256:old")]), 20,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
            ("rollout: the pod Ready on the update revision",
             db("15.20", Some(at(RollingOut)), no.clone()),
             on_new(vec![pod(0, true, "r2", "sha256:new")]), 20,
             (Some(Verifying), NEW.into(), None, s("Verifying"), false, false, v(), true)),
            ("rollout: not Ready in time, rolled back",
             db("15.20", Some(at(RollingOut)), no.clone()),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 10 + 601,
             (Some(RollingBack), OLD.into(), None, s("RollingBack"), false, false, v(), true)),
            ("rollout: not Ready yet, within the timeout",
             db("15.20", Some(at(RollingOut)), no.clone()),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 10 + 599,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
            ("rollout: not Ready in time, no rollback wanted",
             db("15.20", Some(at(RollingOut)), no_rollback),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 10 + 601,
             (Some(Failed), NEW.into(), None, s("PodNotReady"), false, false, v(), false)),
            ("rollout: a shorter podReadyTimeout",
             db("15.20", Some(at(RollingOut)), short_timeout),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 10 + 31,
             (Some(RollingBack), OLD.into(), None, s("RollingBack"), false, false, v(), true)),
            ("verifying: the proven image, Ready: complete",
             db("15.20", Some(at(Verifying)), no.clone()),
             on_new(vec![pod(0, true, "r2", "sha256:new")]), 20,
             (Some(Complete), NEW.into(), None, s("UpgradeComplete"), false, false, v(), false)),
            ("verifying: another image digest: wrong version, rolled back",
             db("15.20", Some(at(Verifying)), no.clone()),
             on_new(vec![pod(0, true, "r2", "sha256:other")]), 20,
             (Some(RollingBack), OLD.into(), None, s("RollingBack"), false, false, v(), true)),
            ("rolling back: the pod stuck on the new revision is deleted",
             db("15.20", Some(at(RollingBack)), no.clone()),
             on_old(vec![pod(0, false, "r2", "sha256:new")]), 20,
             (Some(RollingBack), OLD.into(), None, s("RollingBack"), false, false, vec!["orders-0".into()], true)),
            ("rolling back: template not applied yet, nothing deleted",
             db("15.20", Some(at(RollingBack)), no.clone()),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 20,
             (Some(RollingBack), OLD.into(), None, s("RollingBack"), false, false, v(), true)),
            ("rolled back once the old pod is Ready",
             db("15.20", Some(at(RollingBack)), no.clone()),
             on_old(vec![pod(0, true, "r1", "sha256:old")]), 20,
             (Some(RolledBack), OLD.into(), None, s("RolledBack"), false, false, v(), false)),
            ("rolled back, spec unchanged: stays stopped on the old image",
             db("15.20", Some(at(RolledBack)), no.clone()), on_old(vec![]), 30,
             (Some(RolledBack), OLD.into(), None, s("RolledBack"), false, false, v(), false)),
            ("rolled back, spec set back to the running version: idle",
             db("15.18", Some(at(RolledBack)), no.clone()), on_old(vec![]), 30,
             (Some(RolledBack), OLD.into(), None, None, false, false, v(), false)),
            ("rolled back, set back, then the same version again: a new attempt",
             db("15.20", Some(abandoned_at(RolledBack)), no.clone()), on_old(vec![]), 40,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("rolled back, spec changed since (generation 1 → 2): a new attempt",
             { let mut d = db("15.20", Some(UpgradeStatus { stopped_at_generation: Some(1), ..at(RolledBack) }), no.clone()); d.metadata.generation = Some(2); d },
             on_old(vec![]), 40,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("rolled back at this generation: stays stopped",
             db("15.20", Some(UpgradeStatus { stopped_at_generation: Some(1), ..at(RolledBack) }), no.clone()),
             on_old(vec![]), 40,
             (Some(RolledBack), OLD.into(), None, s("RolledBack"), false, false, v(), false)),
            ("stopped, spec moves to another newer version: a new upgrade",
             db("15.19", Some(at(Failed)), no.clone()), on_old(vec![]), 30,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("new version during preflight: superseded, the new one starts",
             db("15.19", Some(at(Preflight)), no.clone()), on_old(vec![]), 30,
             (Some(Preflight), OLD.into(), None, s("Preflight"), false, false, v(), true)),
            ("back to the running version during preflight: superseded, idle",
             db("15.18", Some(at(Preflight)), no.clone()), on_old(vec![]), 30,
             (Some(Failed), OLD.into(), None, None, false, false, v(), false)),
            ("new version during the rollout: the rollout runs to its end",
             db("15.21", Some(at(RollingOut)), no.clone()),
             on_new(vec![pod(0, false, "r2", "sha256:new")]), 20,
             (Some(RollingOut), NEW.into(), None, s("RollingOut"), false, false, v(), true)),
        ];
        // Set back to the running version, a stopped upgrade is marked abandoned.
        let back = run(
            &db("15.18", Some(at(RolledBack)), no.clone()),
            on_old(vec![]),
            30,
        );
        assert_eq!(back.status.unwrap().reason.as_deref(), Some(ABANDONED));
        let mut reached = std::collections::HashSet::new();
        for (name, db, facts, now, want) in table {
            let got = run(&db, facts, now);
            assert_eq!(summary(&got), want, "{name}");
            reached.extend(got.status.map(|u| u.stage));
        }
        for stage in UpgradeStage::ALL {
            assert!(reached.contains(&stage), "{stage:?} is never reached");
        }
    }

    #[test]
    fn the_highest_ordinal_goes_first_then_one_at_a_time() {
        let mut db = db("15.20", Some(at(PreUpgradeBackup)), with_backups());
        db.spec.instances = 3;
        let facts = UpgradeFacts {
            backup: backup(BackupPhase::Succeeded),
            ..UpgradeFacts::default()
        };
        let p = run(&db, facts, 5);
        let u = p.status.clone().unwrap();
        assert_eq!(
            (u.stage, u.partition, p.template.partition),
            (RollingOut, Some(2), Some(2))
        );
        db.status.as_mut().unwrap().upgrade = Some(u);
        let facts = UpgradeFacts {
            statefulset: sts(NEW, "r2"),
            pods: vec![
                pod(0, true, "r1", "sha256:old"),
                pod(1, true, "r1", "sha256:old"),
                pod(2, true, "r2", "sha256:new"),
            ],
            ..UpgradeFacts::default()
        };
        let u = run(&db, facts, 6).status.unwrap();
        assert_eq!(
            (u.stage, u.partition, u.partition_since),
            (RollingOut, Some(1), Some(t(6)))
        );
    }

    #[test]
    fn names_derive_from_the_start_and_everything_is_recorded() {
        let db = db("15.20", None, with_backups());
        let p = run(&db, UpgradeFacts::default(), 0);
        let u = p.status.unwrap();
        assert_eq!((u.from.as_str(), u.to.as_str()), ("15.18", "15.20"));
        assert_eq!((u.from_image.as_str(), u.to_image.as_str()), (OLD, NEW));
        assert_eq!(u.preflight_job, Some(preflight_job_name("orders", t(0))));
        assert_eq!(u.stages.len(), 1);
        assert_eq!(backup_name("orders", t(0)), "orders-preupgrade-1000000");
        assert_eq!(p.requeue_after, Some(REQUEUE_UPGRADING));
        // The same pass again (status not written yet) decides the same: deterministic.
        assert_eq!(run(&db, UpgradeFacts::default(), 0).status.unwrap(), u);
    }

    #[test]
    fn spec_image_overrides_the_target_image_never_the_policy() {
        let up = db(
            "15.20",
            None,
            serde_json::json!({"image": "mirror/pg:15.20-x"}),
        );
        let u = run(&up, UpgradeFacts::default(), 0).status.unwrap();
        assert_eq!(u.to_image, "mirror/pg:15.20-x");
        let refused = db(
            "15.10",
            None,
            serde_json::json!({"image": "mirror/pg:15.10"}),
        );
        let p = run(&refused, UpgradeFacts::default(), 0);
        assert_eq!(p.condition.unwrap().reason, "DowngradeRefused");
        assert_eq!(p.template.image, OLD);
    }

    #[test]
    fn an_upgrade_marked_for_the_window_waits_for_it_and_one_under_way_goes_on() {
        let mut marked = db("15.20", None, serde_json::json!({}));
        marked.spec.upgrade = Some(crate::api::UpgradeSpec {
            in_maintenance_window: Some(true),
            ..Default::default()
        });
        let closed = Gate::Closed {
            opens: "Sat 02:00".into(),
            at: t(3600),
        };
        let plan_at = |db: &Database, gate: &Gate| {
            plan(&Input {
                db,
                settings: &settings(),
                facts: &UpgradeFacts::default(),
                now: t(0),
                gate,
            })
        };
        let waiting = plan_at(&marked, &closed);
        assert_eq!(waiting.status, None);
        assert_eq!(waiting.template.image, OLD);
        assert_eq!(waiting.condition.unwrap().reason, WAITING_FOR_WINDOW);
        assert_eq!(
            waiting.waiting_for_window.as_deref(),
            Some("the upgrade to 15.20")
        );
        assert!(!waiting.active && waiting.create_preflight.is_none());
        // In the window it starts.
        let open = Gate::Open {
            closes: "Sat 04:00".into(),
            at: t(3600),
        };
        let started = plan_at(&marked, &open);
        assert_eq!(started.status.unwrap().stage, Preflight);
        // Not marked: the window does not hold it.
        let unmarked = db("15.20", None, serde_json::json!({}));
        assert_eq!(plan_at(&unmarked, &closed).status.unwrap().stage, Preflight);
        // Under way when the window closes: it goes on.
        let mut under_way = marked.clone();
        under_way.status.as_mut().unwrap().upgrade = Some(at(RollingOut));
        let going_on = plan_at(&under_way, &closed);
        assert!(going_on.active, "{going_on:?}");
        assert_eq!(going_on.waiting_for_window, None);
    }
}
