//! Decide: from the Database and the observed facts, the next phase, the conditions and the
//! steps to take. This is where every phase transition is decided.
//!
//! Pure: no client, no I/O, no clock of its own (time comes in the facts: the backups' `now`).
//!
//! The steps, in order: the version and the credentials (`credential_steps`, or a `Blocker`),
//! where the rollout stands (`Rollout`), the init SQL (`init::decide_init`), the phase (`Stage`,
//! worded by `stage_outcome`), storage, and the backups (`plan_backups`). The maintenance
//! window's gate (`maintenance::Gate`) decides which template the pods get and whether an
//! upgrade may start.

use super::accounts::{self, AccountsPlan};
use std::time::Duration;

use crate::api::Phase;
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{BootstrapStatus, Database, InstanceRole, NetworkPolicySpec};
use crate::api::{UpgradeStage, UpgradeStatus};
use crate::maintenance::{self, Gate};
use crate::release::{self, Turn};
use crate::resources::statefulset::PodRun;
use crate::resources::template_origin::{self, TemplateChoice};
use crate::resources::{Names, check_version, quantity};
use crate::settings::Settings;
use crate::upgrade::plan::{Input as UpgradeInput, UpgradePlan, plan as plan_upgrade};

use crate::backup::plan::{BackupPlan, plan_backups};

use super::blocker::Blocker;
use super::facts::{CredentialsFact, Facts};
use super::init::{InitOutcome, decide_init};
use super::restart;
use super::roles::{self, RolesFact, RolesPlan, VersionUpgrade};
use super::stage::{REQUEUE_FAILED, REQUEUE_WAITING_ON_USER, Rollout, Stage, stage_outcome};
use super::tls::{self, TlsSteps};
use super::wave;

/// What to do to the world. Every step is idempotent; `apply` skips writes that change nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Create the generated credentials Secret (it does not exist).
    pub create_secret: bool,
    /// Put our owner reference on a retained generated Secret.
    pub adopt_secret: bool,
    /// Apply the Services (headless, `-rw`, `-ro`, `-r`).
    pub apply_services: bool,
    /// Apply the StatefulSet.
    pub apply_statefulset: bool,
    /// Grow the data claims to this size.
    pub expand_volumes: Option<String>,
    /// Why `expand_volumes` grows them, when `spec.storage.autoGrow` does (the Event's note).
    pub volume_growth: Option<String>,
    /// Create the init Job.
    pub create_init_job: bool,
    /// Delete this failed init Job: the SQL changed since it ran.
    pub replace_init_job: Option<super::init::FailedInitJob>,
    /// Create the restore Job of `spec.bootstrap.fromBackup` (in the init Job's place).
    pub create_restore_job: bool,
    /// Create the upgrade's preflight Job of this name.
    pub create_preflight_job: Option<String>,
    /// Create the upgrade's pre-upgrade `DatabaseBackup` of this name.
    pub create_pre_upgrade_backup: Option<String>,
    /// Delete these pods (stuck on an image being rolled back).
    pub delete_pods: Vec<String>,
    /// The CA, the server certificate, the CA in the credentials Secret (`tls`).
    pub tls: TlsSteps,
    /// Set these pods' role labels (before the Services, which select by them).
    pub label_pods: Vec<(String, InstanceRole)>,
    /// Tell these pods the versions of the Secrets they mount (pod, versions).
    pub refresh_pods: Vec<(String, String)>,
}

/// The outcome of `decide`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub phase: Phase,
    /// One entry for each condition this controller owns.
    pub conditions: Vec<ConditionStatus>,
    pub steps: Steps,
    /// The version every instance runs, once known.
    pub current_version: Option<String>,
    /// The image they run it from, once known.
    pub current_image: Option<String>,
    /// When to look again if nothing else happens first.
    pub requeue_after: Duration,
    /// Scheduled backups, history and `BackupHealthy` (None while the Database is blocked:
    /// then backups are left as they are).
    pub backup: Option<BackupPlan>,
    /// What the restore of `spec.bootstrap.fromBackup` restored, when it just finished (None:
    /// keep what the status says).
    pub bootstrap: Option<BootstrapStatus>,
    /// What the StatefulSet's pods run (the upgrade decides the image and the partition).
    pub pod_run: PodRun,
    /// The restart-needing parameters the pods still restart for (`restart::pending`).
    pub restart_pending: Vec<String>,
    /// Whether the pod template built now replaces the observed one (`template_origin`).
    pub template: TemplateChoice,
    /// This pass's step in the operator's release (`crate::release`).
    pub release: release::Step,
    /// The next `status.upgrade`.
    pub upgrade: Option<UpgradeStatus>,
    /// The primary, the replication Secret, each instance's status (`roles`).
    pub roles: RolesPlan,
    /// The application's Secret and the accounts Secret to write (`accounts`).
    pub accounts: AccountsPlan,
}

impl Decision {
    /// Replaces the decided condition of the same type: what act learned while acting (a
    /// refused volume expansion) overrides what decide expected.
    pub fn override_condition(&mut self, condition: ConditionStatus) {
        self.conditions.retain(|c| c.type_ != condition.type_);
        self.conditions.push(condition);
    }
}

use ConditionType::{Ready, StorageReady};

/// Decides the next step of a Database that is not being deleted.
pub fn decide(db: &Database, facts: &Facts, settings: &Settings) -> Decision {
    let current_version = db.status.as_ref().and_then(|s| s.current_version.clone());
    let mut steps = match credential_steps(db, &facts.credentials) {
        Ok(steps) => steps,
        Err(blocker) => return blocked(db, &blocker, current_version),
    };
    let now = facts.backups.now;
    let gate = Gate::of(db, now);
    let turn = wave::turn(db, facts, settings);
    let (upgrade, template) = pod_template(db, facts, settings, &gate, turn == Turn::Go);
    let release = wave::step(&template, facts, settings);
    let release_waits = wave::waits(&template, facts, settings, &gate);
    let marker = facts.release.marker.as_ref();
    let release_look = release::look_again(marker, &release.release, &turn, release_waits);
    let release_condition = release::condition(&release, marker, &turn, release_waits);
    let roles = plan_roles(db, facts, &upgrade);
    let autogrow = super::autogrow::plan(db, &facts.storage);
    pod_and_volume_steps(&mut steps, db, facts, settings, &upgrade, &roles, &autogrow);
    let rollout = Rollout::of(db, facts, &upgrade);
    let init = decide_init(db, facts, rollout.server_has_run());
    let stage = init_steps(&mut steps, db, facts, &init, &rollout);
    let (phase, ready, requeue_after) = stage_outcome(db, &stage, &rollout, facts, &roles);
    let progress = (upgrade.condition.clone()).unwrap_or_else(|| rollout.condition(db));

    // Backups: the due run, the history and BackupHealthy; a run waits while the phase says
    // it is being rolled out.
    let backup = plan_backups(db, &facts.backups, phase);
    // Ready too: while the only pod is replaced, the StatefulSet controller counts 0 of 0 pods
    // ready and moves currentRevision on before the new pod has started.
    let restarted = wave::serving_settled(facts);
    let restart_pending = restart::pending(db, &facts.restart, restarted);
    steps.tls = tls::steps(db, &facts.tls, facts.backups.now);
    let tls_ready = tls::condition(db, &facts.tls, &steps.tls, restarted);
    let waiting = waiting_for_window(&template, &restart_pending, &upgrade);
    let requeue_after = soonest(
        requeue_after,
        [
            backup.requeue_after,
            upgrade.requeue_after,
            roles.look_again,
            super::archiving::look_again(db),
            super::autogrow::look_again(db),
            gate.next_change(now),
            release_look,
        ],
    );
    Decision {
        phase,
        conditions: [
            ready,
            storage_condition(db, facts),
            init.condition,
            progress,
        ]
        .into_iter()
        .chain(backup.condition.clone())
        .chain([
            restart::condition(&restart_pending),
            tls_ready,
            accounts::condition(db, &facts.accounts),
        ])
        .chain(growth_and_policy_conditions(db, facts, autogrow.condition))
        .chain(maintenance::condition(&gate, &waiting))
        .chain(release_condition)
        .collect(),
        steps,
        current_version: rollout.new_version(&upgrade),
        current_image: rollout.new_image(&upgrade),
        requeue_after,
        backup: Some(backup),
        bootstrap: init.restored,
        pod_run: upgrade.template,
        restart_pending,
        template,
        release,
        upgrade: upgrade.status,
        roles,
        accounts: accounts::plan(&facts.accounts),
    }
}

/// The pods and volumes to change: the roles' labels and refreshes, the claims grown (by
/// `spec.storage.autoGrow`, or to a larger `spec.storage.size`), the upgrade's Jobs and the
/// pods it replaces. An upgrade places its pods itself (partition, rollback); otherwise a pod
/// held back on an earlier revision is replaced (or the fixed template would never reach it),
/// and so is a pod stopped on a full volume that grew, and one a failed release rolled back.
fn pod_and_volume_steps(
    steps: &mut Steps,
    db: &Database,
    facts: &Facts,
    settings: &Settings,
    upgrade: &UpgradePlan,
    roles: &RolesPlan,
    autogrow: &super::autogrow::Plan,
) {
    steps.label_pods = roles.label_pods.clone();
    steps.refresh_pods = roles.refresh_pods.clone();
    steps.expand_volumes = match &autogrow.grow {
        Some(growth) => Some(growth.size.clone()),
        None => volume_to_expand(db, facts),
    };
    steps.volume_growth = autogrow.grow.as_ref().map(|g| g.note.clone());
    steps.create_preflight_job = upgrade.create_preflight.clone();
    steps.create_pre_upgrade_backup = upgrade.create_backup.clone();
    steps.delete_pods = upgrade.delete_pods.clone();
    if !upgrade.active {
        steps.delete_pods.extend(facts.stuck_pods.iter().cloned());
        steps.delete_pods.extend(autogrow.restart.iter().cloned());
        steps
            .delete_pods
            .extend(wave::rolled_back_pods(facts, settings));
        steps.delete_pods.sort();
        steps.delete_pods.dedup();
    }
}

/// The roles' plan, knowing whether a version upgrade is under way.
fn plan_roles(db: &Database, facts: &Facts, upgrade: &UpgradePlan) -> RolesPlan {
    roles::plan(
        db,
        &RolesFact {
            version_upgrade: version_upgrade(upgrade),
            ..facts.roles.clone()
        },
    )
}

/// The init steps (with `spec.bootstrap`, the restore Job takes the init Job's place), and the
/// stage the Database is at. A physical recovery fills the first data volume before the server
/// ever starts on it: while it runs, waits or failed there is no server (one would initialise
/// an empty volume).
fn init_steps(
    steps: &mut Steps,
    db: &Database,
    facts: &Facts,
    init: &super::init::InitDecision,
    rollout: &Rollout,
) -> Stage {
    steps.create_init_job = init.create_job && db.spec.bootstrap.is_none();
    steps.replace_init_job = init.replace_job.clone();
    steps.create_restore_job = init.create_job && db.spec.bootstrap.is_some();
    let physical = super::restore::is_physical(db) && init.outcome != InitOutcome::Done;
    if physical {
        steps.apply_statefulset = false;
    }
    match physical && init.outcome == InitOutcome::Pending {
        true => Stage::Initializing,
        false => Stage::of(&init.outcome, rollout, facts.instance_failure.as_ref()),
    }
}

/// The conditions of the NetworkPolicy, WAL archiving and `spec.storage.autoGrow`, in that
/// order (each only when its spec asks for it).
fn growth_and_policy_conditions(
    db: &Database,
    facts: &Facts,
    autogrow: Option<ConditionStatus>,
) -> Vec<ConditionStatus> {
    network_policy_condition(db)
        .into_iter()
        .chain(super::archiving::condition(
            db,
            facts.archiver.as_ref(),
            &facts.storage,
        ))
        .chain(autogrow)
        .collect()
}

/// The soonest of `first` and the looks again that are due at all.
fn soonest(first: Duration, others: impl IntoIterator<Item = Option<Duration>>) -> Duration {
    others.into_iter().flatten().fold(first, Duration::min)
}

/// What the pods run: the upgrade's plan (image, version, partition), and whether the template
/// built from it replaces the observed one (both under the maintenance window's `gate`). A held
/// template keeps its image, so the plan then says that image: a new one that waits for the
/// window is no rollout under way.
fn pod_template(
    db: &Database,
    facts: &Facts,
    settings: &Settings,
    gate: &Gate,
    release_turn: bool,
) -> (UpgradePlan, TemplateChoice) {
    let mut upgrade = plan_upgrade(&UpgradeInput {
        db,
        settings,
        facts: &facts.upgrade,
        now: facts.backups.now,
        gate,
    });
    let run = upgrade.template.origin();
    let template = template_origin::choose(
        facts.template.as_ref(),
        db,
        run,
        settings,
        gate,
        release_turn,
    );
    let kept_image = facts.statefulset.as_ref().and_then(|s| s.image.clone());
    if let (TemplateChoice::Hold(_), Some(image)) = (&template, kept_image) {
        upgrade.template.image = image;
    }
    (upgrade, template)
}

/// What waits for the maintenance window, in words: what the held template keeps from the pods
/// and the upgrade that has not started.
fn waiting_for_window(
    template: &TemplateChoice,
    restart_pending: &[String],
    upgrade: &UpgradePlan,
) -> Vec<String> {
    let mut waiting = match template {
        TemplateChoice::Hold(held) => held.describe(),
        _ => vec![],
    };
    if matches!(template, TemplateChoice::Hold(_)) && !restart_pending.is_empty() {
        waiting.push(format!("a restart for {}", restart_pending.join(", ")));
    }
    waiting.extend(upgrade.waiting_for_window.clone());
    waiting
}

/// `NetworkPolicyReady` True when the spec asks for a NetworkPolicy (it is applied with the
/// Services; apply overrides it when the API server refuses the policy). None without one:
/// the status then drops the condition.
fn network_policy_condition(db: &Database) -> Option<ConditionStatus> {
    NetworkPolicySpec::enabled(db.spec.network_policy.as_ref()).then(|| {
        ConditionStatus::new(
            ConditionType::NetworkPolicyReady,
            true,
            "Applied",
            format!(
                "NetworkPolicy {} admits only spec.networkPolicy's peers, the instances and dbop's Jobs",
                db.name()
            ),
        )
    })
}

/// The version check, then the credentials: the steps they need (with the Services and the
/// StatefulSet applied), or what blocks the Database.
fn credential_steps(db: &Database, credentials: &CredentialsFact) -> Result<Steps, Blocker> {
    // A version dbop cannot run: stop before touching anything that runs.
    check_version(&db.spec.version).map_err(Blocker::Version)?;
    let mut steps = Steps {
        apply_services: true,
        apply_statefulset: true,
        ..Steps::default()
    };
    match credentials {
        CredentialsFact::Usable => {}
        CredentialsFact::GeneratedMissing => steps.create_secret = true,
        CredentialsFact::GeneratedOrphaned => steps.adopt_secret = true,
        CredentialsFact::UserSecretProblem(problem) => {
            return Err(Blocker::Credentials(problem.clone()));
        }
    }
    Ok(steps)
}

/// A Database that cannot proceed: only the Ready condition speaks, nothing is written.
fn blocked(db: &Database, blocker: &Blocker, current_version: Option<String>) -> Decision {
    Decision {
        phase: blocker.phase(),
        conditions: vec![ConditionStatus::new(
            Ready,
            false,
            blocker.reason(),
            blocker.message(db),
        )],
        steps: Steps::default(),
        current_version,
        current_image: db.status.as_ref().and_then(|s| s.current_image.clone()),
        requeue_after: blocked_requeue(blocker),
        backup: None,
        bootstrap: None,
        pod_run: PodRun {
            image: String::new(),
            version: db.spec.version.clone(),
            partition: None,
        },
        restart_pending: Vec::new(),
        template: TemplateChoice::Build,
        release: release::Step::default(),
        upgrade: db.status.as_ref().and_then(|s| s.upgrade.clone()),
        roles: RolesPlan {
            primary: roles::primary(db),
            instances: db
                .status
                .as_ref()
                .map(|s| s.instances.clone())
                .unwrap_or_default(),
            ..RolesPlan::default()
        },
        // A blocked Database makes nothing (its Ready condition says why).
        accounts: AccountsPlan::default(),
    }
}

/// When to look again at a blocked Database.
fn blocked_requeue(blocker: &Blocker) -> Duration {
    match blocker {
        // Only a spec change helps.
        Blocker::Version(_) => REQUEUE_FAILED,
        // A user's Secret is not watched.
        Blocker::Credentials(_) => REQUEUE_WAITING_ON_USER,
    }
}

/// Where the version upgrade stands, for the roles: rolling out (the primary's pod last, after
/// a switchover), in another stage (it places the pods itself), or none.
fn version_upgrade(upgrade: &UpgradePlan) -> VersionUpgrade {
    let stage = upgrade.status.as_ref().map(|u| u.stage);
    match (upgrade.active, stage) {
        (false, _) => VersionUpgrade::None,
        (true, Some(UpgradeStage::RollingOut)) => VersionUpgrade::RollingOut,
        (true, _) => VersionUpgrade::PlacesPods,
    }
}

fn storage_condition(db: &Database, facts: &Facts) -> ConditionStatus {
    let claim = Names::of(db).data_pvc(0);
    let Some(volume) = &facts.volume else {
        return ConditionStatus::new(
            StorageReady,
            false,
            "ClaimMissing",
            format!("waiting for PersistentVolumeClaim {claim}"),
        );
    };
    if !volume.bound {
        return ConditionStatus::new(
            StorageReady,
            false,
            "ClaimPending",
            pending_claim(db, facts),
        );
    }
    let want = quantity::bytes(&db.spec.storage.size);
    let have = volume.capacity.as_deref().and_then(quantity::bytes);
    match (want, have) {
        (Some(want), Some(have)) if have < want => ConditionStatus::new(
            StorageReady,
            false,
            "Resizing",
            format!(
                "PersistentVolumeClaim {claim} is growing from {} to {} (the StorageClass must allow volume expansion)",
                volume.capacity.as_deref().unwrap_or("?"),
                db.spec.storage.size
            ),
        ),
        _ => ConditionStatus::new(
            StorageReady,
            true,
            "Bound",
            format!("PersistentVolumeClaim {claim} is bound"),
        ),
    }
}

/// Why the data claim is not bound, as far as the facts tell. A claim of a `WaitForFirstConsumer`
/// StorageClass binds only once its pod exists, so when the StatefulSet has created no pod the
/// cause is usually the pod's refusal (a ResourceQuota, a LimitRange, an admission policy), not
/// the storage.
fn pending_claim(db: &Database, facts: &Facts) -> String {
    let claim = Names::of(db).data_pvc(0);
    if facts.statefulset.as_ref().is_some_and(|s| s.replicas == 0) {
        let name = db.name();
        format!(
            "PersistentVolumeClaim {claim} is not bound and StatefulSet {name} has created no pod \
             yet: a claim that waits for its first consumer binds only once the pod exists. \
             `kubectl describe statefulset {name}` shows a refused pod (ResourceQuota, \
             LimitRange, admission); otherwise check that a StorageClass or a free \
             PersistentVolume can serve the claim"
        )
    } else {
        format!(
            "PersistentVolumeClaim {claim} is not bound yet: check that a StorageClass or a free \
             PersistentVolume can serve it"
        )
    }
}

/// The size to grow the data claims to, when the spec asks for more than they request.
/// The size every data claim should ask for when one asks for less: `spec.storage.size`, or the
/// largest claim's when it grew past it (`autoGrow`, or a claim added after a growth: the
/// StatefulSet's claim template keeps the size it was made with).
fn volume_to_expand(db: &Database, facts: &Facts) -> Option<String> {
    let volume = facts.volume.as_ref().filter(|v| v.bound)?;
    let want = quantity::bytes(&db.spec.storage.size)?;
    let first = volume.requested.as_deref().and_then(quantity::bytes)?;
    let requested = facts.storage.claims.iter().filter_map(|c| c.requested);
    let largest = requested.clone().chain([first, want]).max()?;
    let smallest = requested.chain([first]).min()?;
    (smallest < largest).then(|| match largest == want {
        true => db.spec.storage.size.clone(),
        false => super::autogrow::quantity_of(largest),
    })
}

#[cfg(test)]
mod tests {
    use super::super::facts::{
        InitJobFact, InitSourceFact, InstanceFailureFact, StatefulSetFact, UnschedulableFact,
    };
    use super::super::stage::REQUEUE_IN_PROGRESS;
    use super::*;
    use crate::api::DatabaseStatus;
    use crate::api::conditions::merge;
    use crate::objects::JobState;
    use crate::resources::VersionProblem;
    use crate::resources::credentials::SecretProblem;
    use crate::resources::testing;
    use ConditionType::{Initialized, Upgrading};
    use chrono::{TimeZone, Utc};
    use dbop_contract::InstanceFailure;

    const IMAGE: &str = "docker.io/library/postgres:16.4";

    fn sts(ready: i32, rolled_out: bool, image: &str) -> StatefulSetFact {
        StatefulSetFact {
            replicas: 1,
            ready_replicas: ready,
            updated_replicas: if rolled_out { 1 } else { 0 },
            observed_current: true,
            rolled_out,
            template_rolling: !rolled_out,
            image: Some(image.into()),
        }
    }

    fn bound(size: &str) -> Option<super::super::facts::VolumeFact> {
        Some(super::super::facts::VolumeFact {
            bound: true,
            predates_database: false,
            requested: Some(size.into()),
            capacity: Some(size.into()),
        })
    }

    fn facts() -> Facts {
        Facts::nothing_made_yet()
    }

    fn with_status(mut db: Database, current_version: Option<&str>, initialized: bool) -> Database {
        let mut decided = vec![];
        if initialized {
            decided.push(ConditionStatus::new(Initialized, true, "Completed", "ok"));
        }
        db.status = Some(DatabaseStatus {
            current_version: current_version.map(str::to_string),
            conditions: merge(&[], &decided, Some(1), Utc.timestamp_opt(0, 0).unwrap()),
            ..DatabaseStatus::default()
        });
        db
    }

    fn with_init(mut db: Database) -> Database {
        db.spec.init = Some(crate::api::InitSpec {
            sql: Some("select 1".into()),
            config_map_ref: None,
            single_transaction: true,
        });
        db
    }

    fn cond(d: &Decision, t: ConditionType) -> &ConditionStatus {
        d.conditions
            .iter()
            .find(|c| c.type_ == t)
            .expect("condition present")
    }

    /// A pod held back on an earlier revision is deleted, unless an upgrade places the pods.
    #[test]
    fn a_stuck_pod_is_replaced_outside_an_upgrade() {
        let db = with_status(testing::minimal(), Some("16.4"), true);
        let stuck = Facts {
            statefulset: Some(sts(0, false, IMAGE)),
            volume: bound("1Gi"),
            stuck_pods: vec!["orders-0".into()],
            ..facts()
        };
        let d = decide(&db, &stuck, &Settings::default());
        assert_eq!(d.steps.delete_pods, ["orders-0"]);
        let mut upgrading = db.clone();
        upgrading.spec.version = "16.5".into();
        let d = decide(&upgrading, &stuck, &Settings::default());
        assert!(d.steps.delete_pods.is_empty());
    }

    /// A restart-needing change stays pending while the replaced pod starts: the StatefulSet
    /// controller reports the new revision as current (0 of 0 ready) before the pod serves.
    #[test]
    fn a_restart_stays_pending_until_the_new_pod_is_ready() {
        let db = with_status(testing::minimal(), Some("16.4"), true);
        let replaced = |ready| Facts {
            statefulset: Some(sts(ready, true, IMAGE)),
            volume: bound("1Gi"),
            restart: super::super::restart::RestartFact {
                template: Some(Default::default()),
                recorded: Some(vec!["max_connections".into()]),
            },
            ..facts()
        };
        let starting = decide(&db, &replaced(0), &Settings::default());
        assert!(cond(&starting, ConditionType::RestartPending).status);
        assert_eq!(starting.restart_pending, ["max_connections"]);
        let serving = decide(&db, &replaced(1), &Settings::default());
        assert!(!cond(&serving, ConditionType::RestartPending).status);
        assert!(serving.restart_pending.is_empty());
    }

    /// Three instances that served: a standby not ready leaves the Database Degraded with
    /// `StandbyNotReady` and names it; the primary lost is `NotServing`; every pod gets its
    /// role label and the replication Secret is made.
    #[test]
    fn a_standby_that_does_not_stream_degrades_the_database_and_is_named() {
        use super::super::roles::PodFact;
        let mut db = with_status(testing::minimal(), Some("16.4"), true);
        db.spec.instances = 3;
        let pod = |n: i32, ready: bool| PodFact {
            name: format!("orders-{n}"),
            role_label: None,
            ready,
            node: None,
            service_account: None,
            secrets_seen: None,
            revision: None,
        };
        let with = |ready: [bool; 3]| Facts {
            statefulset: Some(StatefulSetFact {
                replicas: 3,
                ready_replicas: ready.iter().filter(|r| **r).count() as i32,
                ..sts(1, true, IMAGE)
            }),
            volume: bound("1Gi"),
            roles: RolesFact {
                pods: (0..3).map(|n| pod(n, ready[n as usize])).collect(),
                replication_secret: false,
                ..RolesFact::default()
            },
            ..facts()
        };
        let d = decide(&db, &with([true, true, true]), &Settings::default());
        assert_eq!(d.phase, Phase::Ready);
        assert_eq!(d.steps.label_pods.len(), 3);
        assert!(d.roles.create_replication_secret);
        let d = decide(&db, &with([true, true, false]), &Settings::default());
        assert_eq!(d.phase, Phase::Degraded);
        let ready = cond(&d, Ready);
        assert_eq!(ready.reason, "StandbyNotReady");
        assert!(
            ready.message.contains("orders-2 (standby)"),
            "{}",
            ready.message
        );
        let d = decide(&db, &with([false, true, true]), &Settings::default());
        assert_eq!(cond(&d, Ready).reason, "NotServing");
    }

    #[test]
    fn a_new_image_that_waits_for_the_window_is_no_rollout() {
        let settings = Settings::default();
        let running = with_status(testing::minimal(), Some("16.4"), true);
        let applied = crate::resources::statefulset::statefulset(&running, &settings, None);
        let mut db = running.clone();
        db.spec.image = Some("mirror/postgres:16.4-patched".into());
        // Closed at the facts' moment (the epoch): it opens at 02:00 UTC.
        db.spec.maintenance_window = Some(Box::new(crate::api::MaintenanceWindowSpec {
            start: "02:00".into(),
            duration: "1h".into(),
            ..Default::default()
        }));
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            template: Some(template_origin::TemplateRecord::of(&applied)),
            volume: bound("1Gi"),
            ..facts()
        };
        let d = decide(&db, &f, &settings);
        assert!(
            matches!(d.template, TemplateChoice::Hold(_)),
            "{:?}",
            d.template
        );
        assert_eq!(d.pod_run.image, IMAGE);
        assert_eq!(d.phase, Phase::Ready);
        assert_eq!(d.current_image.as_deref(), Some(IMAGE));
        let pending = cond(&d, ConditionType::MaintenancePending);
        assert!(pending.status);
        assert!(
            pending
                .message
                .ends_with(": image mirror/postgres:16.4-patched"),
            "{}",
            pending.message
        );
    }

    /// A new operator's release in an urgent wave of one: a healthy Database on the old
    /// operator's template restarts onto it when the wave has room, says why it waits when it
    /// has none, and stops for everyone once it failed somewhere.
    #[test]
    fn an_urgent_release_restarts_a_database_in_its_wave() {
        use crate::release::{Fleet, Progress};
        let old = Settings {
            agent_image: "dbop:old".into(),
            ..Settings::default()
        };
        let mut new = Settings {
            agent_image: "dbop:new".into(),
            ..Settings::default()
        };
        new.release.urgent = true;
        let mut db = with_status(testing::minimal(), Some("16.4"), true);
        db.metadata.namespace = Some("ns".into());
        let mut applied = crate::resources::statefulset::statefulset(&db, &old, None);
        template_origin::settle(&mut applied, None, &TemplateChoice::Build);
        let with_fleet = |fleet: Fleet| Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            template: Some(template_origin::TemplateRecord::of(&applied)),
            volume: bound("1Gi"),
            release: super::super::facts::ReleaseFact {
                fleet,
                ..Default::default()
            },
            ..facts()
        };
        let d = decide(&db, &with_fleet(Fleet::default()), &new);
        assert_eq!(d.template, TemplateChoice::Release);
        assert_eq!(d.release.progress, Progress::Start);
        assert_eq!(cond(&d, ConditionType::ReleasePending).reason, "RollingOut");

        let mut full = Fleet::default();
        full.rolling.insert("ns/other".into());
        let d = decide(&db, &with_fleet(full.clone()), &new);
        assert_eq!(d.template, TemplateChoice::Keep);
        assert_eq!(d.release.progress, Progress::Carry);
        let waiting = cond(&d, ConditionType::ReleasePending);
        assert_eq!(waiting.reason, "WaitingForWave");
        assert!(waiting.message.contains("ns/other"), "{}", waiting.message);
        assert_eq!(d.requeue_after, release::LOOK_AGAIN);

        let mut failed = Fleet::default();
        failed
            .failed
            .insert("ns/other".into(), "a pod fails".into());
        let d = decide(&db, &with_fleet(failed), &new);
        assert_eq!(d.template, TemplateChoice::Keep);
        assert_eq!(
            cond(&d, ConditionType::ReleasePending).reason,
            "ReleasePaused"
        );

        // Not urgent and no window: the release leaves it alone, and says nothing.
        new.release.urgent = false;
        let d = decide(&db, &with_fleet(Fleet::default()), &new);
        assert_eq!(d.template, TemplateChoice::Keep);
        assert!(
            !d.conditions
                .iter()
                .any(|c| c.type_ == ConditionType::ReleasePending)
        );
    }

    /// The phase table: (name, database, facts, expected phase, Ready reason).
    #[test]
    fn phase_table() {
        let plain = testing::minimal();
        let init = with_init(testing::minimal());
        let ready_once = with_status(testing::minimal(), Some("16.4"), true);
        let mut upgraded = with_status(testing::minimal(), Some("16.3"), true);
        upgraded.spec.version = "16.4".into();
        let mut user_secret = testing::minimal();
        user_secret.spec.credentials = Some(crate::api::CredentialsSpec {
            secret_name: "admin".into(),
        });
        let mut old_major = testing::minimal();
        old_major.spec.version = "9.6".into();
        let mut cm_init = testing::minimal();
        cm_init.spec.init = Some(crate::api::InitSpec {
            sql: None,
            config_map_ref: Some(crate::api::KeyRef {
                name: "schema".into(),
                key: "init.sql".into(),
            }),
            single_transaction: true,
        });

        let f = facts();
        let serving = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let starting = Facts {
            statefulset: Some(sts(0, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let pod_lost = Facts {
            statefulset: Some(StatefulSetFact {
                updated_replicas: 0,
                rolled_out: false,
                template_rolling: false,
                ..sts(0, true, IMAGE)
            }),
            volume: bound("1Gi"),
            ..facts()
        };
        let rolling = Facts {
            statefulset: Some(sts(0, false, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        let serving_old_image = Facts {
            statefulset: Some(sts(1, true, "docker.io/library/postgres:16.3")),
            volume: bound("1Gi"),
            ..facts()
        };

        let table: Vec<(&str, &Database, Facts, Phase, &str)> = vec![
            (
                "new database",
                &plain,
                f.clone(),
                Phase::Provisioning,
                "Provisioning",
            ),
            (
                "pods starting",
                &plain,
                starting.clone(),
                Phase::Provisioning,
                "Provisioning",
            ),
            (
                "serving, no init",
                &plain,
                serving.clone(),
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "serving, init to run",
                &init,
                serving.clone(),
                Phase::Initializing,
                "Initializing",
            ),
            (
                "init running",
                &init,
                Facts {
                    init_job: Some(InitJobFact::of(JobState::Running)),
                    ..serving.clone()
                },
                Phase::Initializing,
                "Initializing",
            ),
            (
                "init done",
                &init,
                Facts {
                    init_job: Some(InitJobFact::of(JobState::Succeeded)),
                    ..serving.clone()
                },
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "init failed",
                &init,
                Facts {
                    init_job: Some(InitJobFact::of(JobState::Failed {
                        reason: "BackoffLimitExceeded".into(),
                        detail: String::new(),
                    })),
                    ..serving.clone()
                },
                Phase::Failed,
                "InitFailed",
            ),
            (
                "lost readiness",
                &ready_once,
                starting.clone(),
                Phase::Degraded,
                "NotServing",
            ),
            (
                "pod deleted: fewer updated pods, the same template",
                &ready_once,
                pod_lost.clone(),
                Phase::Degraded,
                "NotServing",
            ),
            (
                "statefulset deleted",
                &ready_once,
                f.clone(),
                Phase::Degraded,
                "NotServing",
            ),
            (
                "back again",
                &ready_once,
                serving.clone(),
                Phase::Ready,
                "DatabaseReady",
            ),
            (
                "upgrade rolling",
                &upgraded,
                rolling.clone(),
                Phase::Upgrading,
                "RollingOut",
            ),
            (
                "new version: the upgrade starts, still serving the old image",
                &upgraded,
                serving_old_image.clone(),
                Phase::Upgrading,
                "DatabaseReady",
            ),
            (
                "new version, pods already on it: still staged (preflight first)",
                &upgraded,
                serving.clone(),
                Phase::Upgrading,
                "DatabaseReady",
            ),
            (
                "user secret missing",
                &user_secret,
                Facts {
                    credentials: CredentialsFact::UserSecretProblem(SecretProblem::NotFound),
                    ..f.clone()
                },
                Phase::Pending,
                "CredentialsSecretNotFound",
            ),
            (
                "user secret without password",
                &user_secret,
                Facts {
                    credentials: CredentialsFact::UserSecretProblem(SecretProblem::MissingPassword),
                    ..f.clone()
                },
                Phase::Pending,
                "CredentialsSecretInvalid",
            ),
            (
                "unsupported major",
                &old_major,
                serving.clone(),
                Phase::Failed,
                "UnsupportedVersion",
            ),
            (
                "init ConfigMap missing",
                &cm_init,
                Facts {
                    init_source: InitSourceFact::ConfigMapNotFound {
                        name: "schema".into(),
                    },
                    ..serving.clone()
                },
                Phase::Pending,
                "InitConfigMapNotFound",
            ),
            (
                "init ConfigMap key missing",
                &cm_init,
                Facts {
                    init_source: InitSourceFact::KeyNotFound {
                        name: "schema".into(),
                        key: "init.sql".into(),
                    },
                    ..serving.clone()
                },
                Phase::Pending,
                "InitConfigMapKeyNotFound",
            ),
        ];
        let mut reached = std::collections::HashSet::new();
        for (name, db, facts, phase, reason) in table {
            let d = decide(db, &facts, &Settings::default());
            assert_eq!(d.phase, phase, "{name}");
            assert_eq!(cond(&d, Ready).reason, reason, "{name}");
            assert_eq!(
                cond(&d, Ready).status,
                reason == "DatabaseReady",
                "{name}: Ready status"
            );
            reached.insert(d.phase);
        }
        // Deleting is decided by the finalizer path (cleanup), not here.
        for p in Phase::ALL {
            assert!(
                p == Phase::Deleting || reached.contains(&p),
                "phase {p:?} unreachable"
            );
        }
    }

    /// The facts of a Database restored from the latest backup, with its restore Job (state
    /// and termination message) once there is one.
    fn restoring(job: Option<(JobState, &str)>) -> Facts {
        use super::super::restore::{BootstrapFact, RestoreJobFact};
        Facts {
            bootstrap: Some(BootstrapFact {
                source: Ok("the latest backup".into()),
                job: job.map(|(state, result)| RestoreJobFact {
                    state,
                    result: dbop_contract::parse_termination_message(result),
                    output: None,
                }),
            }),
            ..facts()
        }
    }

    /// A Database restored from a backup: the restore Job in the init Job's place, its phase
    /// and conditions, and a failed restore that never looks initialised.
    #[test]
    fn restore_takes_the_place_of_init() {
        let mut db = with_init(testing::minimal());
        db.spec.bootstrap = Some(
            serde_json::from_value(serde_json::json!({"fromBackup": {"s3": {
                "bucket": "backups", "credentials": {"secretName": "s3-creds"}}}}))
            .unwrap(),
        );
        let with = |job: Option<(JobState, &str)>| Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..restoring(job)
        };
        let d = decide(&db, &with(None), &Settings::default());
        assert!(d.steps.create_restore_job && !d.steps.create_init_job);
        assert_eq!(d.phase, Phase::Initializing);

        let d = decide(
            &db,
            &with(Some((JobState::Running, ""))),
            &Settings::default(),
        );
        assert!(!d.steps.create_restore_job);
        assert_eq!(d.phase, Phase::Initializing);
        assert!(cond(&d, Ready).message.contains("orders-restore"));

        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let d = decide(
            &db,
            &with(Some((
                failed,
                r#"{"outcome":"Failed","failureKind":"integrity","message":"sha256 is x"}"#,
            ))),
            &Settings::default(),
        );
        assert_eq!(d.phase, Phase::Failed);
        assert_eq!(cond(&d, Ready).reason, "RestoreFailed");
        assert!(!cond(&d, Initialized).status);
        assert_eq!(cond(&d, Initialized).reason, "BackupChecksumMismatch");
        assert!(!d.steps.create_restore_job && !d.steps.create_init_job);
        assert_eq!(d.bootstrap, None);

        let done = r#"{"outcome":"Succeeded","backupId":"b9","key":"p/b9/dump.pgc.zst"}"#;
        let d = decide(
            &db,
            &with(Some((JobState::Succeeded, done))),
            &Settings::default(),
        );
        assert_eq!(d.phase, Phase::Ready);
        assert_eq!(cond(&d, Initialized).reason, "RestoredFromBackup");
        assert!(
            !d.steps.create_init_job,
            "the init SQL is not run after a restore"
        );
        assert_eq!(
            d.bootstrap.unwrap().restored_backup_id.as_deref(),
            Some("b9")
        );
    }

    /// A recovery to a point in time: the StatefulSet waits for the Job that fills its first
    /// volume (no server yet), and is applied once the recovery succeeded.
    #[test]
    fn a_physical_recovery_holds_the_statefulset_until_it_succeeded() {
        let mut db = testing::minimal();
        db.spec.bootstrap = Some(
            serde_json::from_value(serde_json::json!({"fromBackup": {
                "s3": {"bucket": "backups", "credentials": {"secretName": "s3-creds"}},
                "recoveryTarget": {"latest": true}}}))
            .unwrap(),
        );
        let with = restoring;
        let d = decide(&db, &with(None), &Settings::default());
        assert!(d.steps.create_restore_job && !d.steps.apply_statefulset);
        assert_eq!(d.phase, Phase::Initializing);
        let d = decide(
            &db,
            &with(Some((JobState::Running, ""))),
            &Settings::default(),
        );
        assert!(!d.steps.create_restore_job && !d.steps.apply_statefulset);
        let failed = JobState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
        };
        let unreachable =
            r#"{"outcome":"Failed","failureKind":"target-unreachable","message":"m"}"#;
        let d = decide(
            &db,
            &with(Some((failed, unreachable))),
            &Settings::default(),
        );
        assert_eq!(d.phase, Phase::Failed);
        assert!(
            !d.steps.apply_statefulset,
            "no server initialises the volume a failed recovery left"
        );
        let done = r#"{"outcome":"Succeeded","operation":"recover","backupId":"b9","timeline":2}"#;
        let d = decide(
            &db,
            &with(Some((JobState::Succeeded, done))),
            &Settings::default(),
        );
        assert!(d.steps.apply_statefulset && !d.steps.create_restore_job);
        assert_eq!(cond(&d, Initialized).reason, "RecoveredToTarget");
        assert_eq!(d.bootstrap.unwrap().timeline, Some(2));
    }

    #[test]
    fn blocked_databases_write_nothing() {
        let mut db = testing::minimal();
        db.spec.version = "99.0".into();
        let d = decide(&db, &facts(), &Settings::default());
        assert_eq!(d.steps, Steps::default());
        assert!(
            cond(&d, Ready).message.contains("13 to 18"),
            "{}",
            cond(&d, Ready).message
        );
    }

    #[test]
    fn steps_table() {
        let db = testing::minimal();
        let init = with_init(testing::minimal());
        let serving = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };

        let d = decide(
            &db,
            &Facts {
                credentials: CredentialsFact::GeneratedMissing,
                ..facts()
            },
            &Settings::default(),
        );
        assert!(d.steps.create_secret && d.steps.apply_services && d.steps.apply_statefulset);
        assert!(!d.steps.create_init_job);

        let d = decide(
            &db,
            &Facts {
                credentials: CredentialsFact::GeneratedOrphaned,
                ..facts()
            },
            &Settings::default(),
        );
        assert!(d.steps.adopt_secret && !d.steps.create_secret);

        // The init Job starts only once the server serves, and only once.
        assert!(
            !decide(&init, &facts(), &Settings::default())
                .steps
                .create_init_job
        );
        assert!(
            decide(&init, &serving, &Settings::default())
                .steps
                .create_init_job
        );
        let running = Facts {
            init_job: Some(InitJobFact::of(JobState::Running)),
            ..serving.clone()
        };
        assert!(
            !decide(&init, &running, &Settings::default())
                .steps
                .create_init_job
        );
        let initialized = with_status(with_init(testing::minimal()), Some("16.4"), true);
        let d = decide(&initialized, &serving, &Settings::default());
        assert!(
            !d.steps.create_init_job,
            "a deleted init Job is not run again"
        );
        assert_eq!(d.phase, Phase::Ready);
    }

    #[test]
    fn retained_data_is_not_initialised_again() {
        let db = with_init(testing::minimal());
        let mut volume = bound("1Gi");
        volume.as_mut().unwrap().predates_database = true;
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume,
            ..facts()
        };
        let d = decide(&db, &f, &Settings::default());
        assert!(!d.steps.create_init_job);
        assert_eq!(cond(&d, Initialized).reason, "ExistingData");
        assert_eq!(d.phase, Phase::Ready);
    }

    #[test]
    fn act_can_override_a_condition() {
        let mut d = decide(&testing::minimal(), &facts(), &Settings::default());
        d.override_condition(ConditionStatus::new(
            StorageReady,
            false,
            "ExpansionRefused",
            "no",
        ));
        let storage: Vec<_> = d
            .conditions
            .iter()
            .filter(|c| c.type_ == StorageReady)
            .collect();
        assert_eq!(storage.len(), 1);
        assert_eq!(storage[0].reason, "ExpansionRefused");
    }

    #[test]
    fn init_waits_for_a_config_map_without_starting_the_job() {
        let mut db = testing::minimal();
        db.spec.init = Some(crate::api::InitSpec {
            sql: None,
            config_map_ref: Some(crate::api::KeyRef {
                name: "schema".into(),
                key: "init.sql".into(),
            }),
            single_transaction: true,
        });
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            init_source: InitSourceFact::ConfigMapNotFound {
                name: "schema".into(),
            },
            ..facts()
        };
        let d = decide(&db, &f, &Settings::default());
        assert!(!d.steps.create_init_job);
        assert_eq!(d.requeue_after, REQUEUE_WAITING_ON_USER);
        assert!(cond(&d, Initialized).message.contains("create it"));
    }

    #[test]
    fn current_version_moves_only_when_the_upgrade_is_verified() {
        use crate::api::{UpgradeStage, UpgradeStatus};
        use crate::upgrade::facts::{PodFact, RevisionFact, UpgradeFacts};
        let mut db = with_status(testing::minimal(), Some("16.3"), true);
        db.spec.version = "16.4".into();
        // A new version alone starts the upgrade: current stays, the pods keep the old image.
        db.status.as_mut().unwrap().current_image = Some("docker.io/library/postgres:16.3".into());
        let d = decide(&db, &facts(), &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.3"));
        assert_eq!(d.current_image, db.status.as_ref().unwrap().current_image);
        assert_eq!(d.pod_run.image, "docker.io/library/postgres:16.3");
        assert_eq!(cond(&d, Upgrading).reason, "Preflight");
        let started = Utc.timestamp_opt(1000, 0).unwrap();
        db.status.as_mut().unwrap().upgrade = Some(UpgradeStatus {
            from: "16.3".into(),
            to: "16.4".into(),
            from_image: "docker.io/library/postgres:16.3".into(),
            to_image: IMAGE.into(),
            partition: Some(0),
            partition_since: Some(started),
            ..crate::upgrade::testing::upgrade(UpgradeStage::Verifying, started)
        });
        let mut verified = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            ..facts()
        };
        verified.backups.now = started;
        verified.upgrade = UpgradeFacts {
            statefulset: Some(RevisionFact {
                image: Some(IMAGE.into()),
                observed_current: true,
                update_revision: Some("r2".into()),
            }),
            pods: vec![PodFact {
                name: "orders-0".into(),
                ordinal: 0,
                ready: true,
                terminating: false,
                revision: Some("r2".into()),
                image: Some(IMAGE.into()),
                image_id: None,
            }],
            ..UpgradeFacts::default()
        };
        let d = decide(&db, &verified, &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.4"));
        assert_eq!(d.current_image.as_deref(), Some(IMAGE));
        assert_eq!(d.upgrade.as_ref().unwrap().stage, UpgradeStage::Complete);
        assert!(!cond(&d, Upgrading).status);
        // Verified while the StatefulSet's status still lags (current revision not yet the
        // update one): the version is recorded all the same, or the next pass would start again.
        let lagging = Facts {
            statefulset: Some(sts(1, false, IMAGE)),
            ..verified.clone()
        };
        let d = decide(&db, &lagging, &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.4"));
        // Not yet Ready on the new revision: still Verifying, still the old version.
        verified.upgrade.pods[0].ready = false;
        let d = decide(&db, &verified, &Settings::default());
        assert_eq!(d.current_version.as_deref(), Some("16.3"));
        assert_eq!(
            d.current_image.as_deref(),
            Some("docker.io/library/postgres:16.3")
        );
        assert_eq!(d.phase, Phase::Upgrading);
    }

    #[test]
    fn storage_table() {
        let mut db = testing::minimal();
        db.spec.storage.size = "2Gi".into();
        let vol = |bound: bool, requested: &str, capacity: Option<&str>| {
            Some(super::super::facts::VolumeFact {
                bound,
                predates_database: false,
                requested: Some(requested.into()),
                capacity: capacity.map(str::to_string),
            })
        };
        let table = [
            ("no claim", None, false, "ClaimMissing", None),
            (
                "pending",
                vol(false, "2Gi", None),
                false,
                "ClaimPending",
                None,
            ),
            (
                "bound big PV",
                vol(true, "2Gi", Some("100Gi")),
                true,
                "Bound",
                None,
            ),
            (
                "grow requested",
                vol(true, "1Gi", Some("1Gi")),
                false,
                "Resizing",
                Some("2Gi"),
            ),
            (
                "growing",
                vol(true, "2Gi", Some("1Gi")),
                false,
                "Resizing",
                None,
            ),
            ("grown", vol(true, "2Gi", Some("2Gi")), true, "Bound", None),
        ];
        for (name, volume, status, reason, expand) in table {
            let d = decide(&db, &Facts { volume, ..facts() }, &Settings::default());
            let c = cond(&d, StorageReady);
            assert_eq!((c.status, c.reason.as_str()), (status, reason), "{name}");
            assert_eq!(d.steps.expand_volumes.as_deref(), expand, "{name}");
        }
    }

    /// autoGrow's plan reaches the steps: the claims' size, the Event's note, the condition and
    /// the restart of a pod that stopped on a volume grown since; a claim added after a growth
    /// is brought to the others' size.
    #[test]
    fn auto_grow_reaches_the_steps() {
        use super::super::facts::{ClaimSize, ClassFact, StorageFact, VolumeFact};
        use dbop_contract::volume::VolumeUsage;
        const GIB: u128 = 1 << 30;
        let mut db = testing::minimal();
        db.spec.storage.size = "1Gi".into();
        db.spec.storage.auto_grow =
            serde_json::from_value(serde_json::json!({"increment": "1Gi", "maximum": "8Gi"}))
                .unwrap();
        let claim = |ordinal: u8, requested: u128, capacity: u128| ClaimSize {
            name: format!("data-orders-{ordinal}"),
            requested: Some(requested),
            capacity: Some(capacity),
        };
        let first = |requested: &str| VolumeFact {
            bound: true,
            predates_database: false,
            requested: Some(requested.into()),
            capacity: Some(requested.into()),
        };
        let usage = |size: u128, free: u128| VolumeUsage {
            size_bytes: size as u64,
            free_bytes: free as u64,
        };
        let full = Facts {
            volume: Some(first("1Gi")),
            storage: StorageFact {
                claims: vec![claim(0, GIB, GIB)],
                usage: [("orders-0".to_string(), usage(GIB, GIB / 10))].into(),
                stopped_full: Default::default(),
                class: ClassFact::Expands,
            },
            ..facts()
        };
        let d = decide(&db, &full, &Settings::default());
        assert_eq!(d.steps.expand_volumes.as_deref(), Some("2Gi"));
        let note = d.steps.volume_growth.clone().unwrap();
        assert!(
            note.contains("91% full") && note.contains("from 1Gi to 2Gi"),
            "{note}"
        );
        assert_eq!(cond(&d, ConditionType::StorageAutoGrow).reason, "Growing");

        // Grown to 2Gi; the server had stopped on the full 1Gi volume: it restarts now.
        let mut grown = full.clone();
        grown.volume = Some(first("2Gi"));
        grown.storage.claims = vec![claim(0, 2 * GIB, 2 * GIB)];
        grown.storage.usage.clear();
        grown.storage.stopped_full = [("orders-0".to_string(), usage(GIB, 0))].into();
        let d = decide(&db, &grown, &Settings::default());
        assert_eq!(
            (d.steps.expand_volumes, d.steps.volume_growth),
            (None, None)
        );
        assert_eq!(d.steps.delete_pods, vec!["orders-0".to_string()]);

        // A standby's claim made after the growth, from the StatefulSet's 1Gi template.
        let mut scaled = full.clone();
        scaled.volume = Some(first("2Gi"));
        scaled.storage.claims = vec![claim(0, 2 * GIB, 2 * GIB), claim(1, GIB, GIB)];
        scaled.storage.usage = [("orders-0".to_string(), usage(2 * GIB, GIB))].into();
        let d = decide(&db, &scaled, &Settings::default());
        assert_eq!(d.steps.expand_volumes.as_deref(), Some("2Gi"));
        assert_eq!(d.steps.volume_growth, None);
    }

    #[test]
    fn a_pending_claim_without_a_pod_points_at_the_pod() {
        let db = testing::minimal();
        let pending = Some(super::super::facts::VolumeFact {
            bound: false,
            predates_database: false,
            requested: Some("1Gi".into()),
            capacity: None,
        });
        let message = |replicas: i32| {
            let f = Facts {
                volume: pending.clone(),
                statefulset: Some(StatefulSetFact {
                    replicas,
                    ..sts(0, false, IMAGE)
                }),
                ..facts()
            };
            cond(&decide(&db, &f, &Settings::default()), StorageReady)
                .message
                .clone()
        };
        // Under a ResourceQuota that refuses the pod, the claim waits for a pod that never comes.
        let no_pod = message(0);
        assert!(no_pod.contains("has created no pod"), "{no_pod}");
        assert!(no_pod.contains("ResourceQuota"), "{no_pod}");
        // With a pod, the storage itself is what to check.
        let with_pod = message(1);
        assert!(!with_pod.contains("no pod"), "{with_pod}");
        assert!(with_pod.contains("StorageClass"), "{with_pod}");
    }

    #[test]
    fn decisions_are_deterministic() {
        let db = testing::minimal();
        let f = Facts {
            statefulset: Some(sts(1, true, IMAGE)),
            volume: bound("1Gi"),
            ..facts()
        };
        assert_eq!(
            decide(&db, &f, &Settings::default()),
            decide(&db, &f, &Settings::default())
        );
    }

    #[test]
    fn blockers_carry_their_reason() {
        let db = testing::minimal();
        let table = [
            (
                Blocker::Version(VersionProblem::Malformed),
                Phase::Failed,
                "UnsupportedVersion",
                "MAJOR.MINOR",
            ),
            (
                Blocker::Version(VersionProblem::UnsupportedMajor(9)),
                Phase::Failed,
                "UnsupportedVersion",
                "PostgreSQL 9 is not supported",
            ),
            (
                Blocker::Credentials(SecretProblem::NotFound),
                Phase::Pending,
                "CredentialsSecretNotFound",
                "does not exist",
            ),
            (
                Blocker::Credentials(SecretProblem::MissingPassword),
                Phase::Pending,
                "CredentialsSecretInvalid",
                "no non-empty `password` key",
            ),
        ];
        for (blocker, phase, reason, words) in table {
            let d = blocked(&db, &blocker, Some("16.4".into()));
            assert_eq!((d.phase, d.conditions[0].reason.as_str()), (phase, reason));
            assert!(d.conditions[0].message.contains(words), "{blocker:?}");
            assert_eq!(d.steps, Steps::default(), "{blocker:?} writes nothing");
            assert_eq!(d.current_version.as_deref(), Some("16.4"));
        }
    }

    #[test]
    fn a_pod_no_node_can_take_says_what_the_scheduler_said() {
        let unplaced = UnschedulableFact {
            pod: "orders-0".into(),
            message: "0/3 nodes are available: 3 Insufficient memory.".into(),
        };
        let facts = |ready, current_version| {
            let f = Facts {
                statefulset: Some(sts(ready, true, IMAGE)),
                volume: bound("1Gi"),
                unschedulable: Some(unplaced.clone()),
                ..facts()
            };
            (with_status(testing::minimal(), current_version, true), f)
        };
        for (ready, version, phase) in [
            (0, None, Phase::Provisioning),
            (0, Some("16.4"), Phase::Degraded),
        ] {
            let (db, f) = facts(ready, version);
            let d = decide(&db, &f, &Settings::default());
            assert_eq!(d.phase, phase);
            let ready = cond(&d, Ready);
            assert_eq!(ready.reason, "Unschedulable");
            assert!(
                ready.message.starts_with(
                    "pod orders-0 cannot be scheduled: 0/3 nodes are available: 3 Insufficient memory ("
                ),
                "{}",
                ready.message
            );
            assert_eq!(d.requeue_after, REQUEUE_IN_PROGRESS);
        }
        // Serving: a second pod waiting for a node does not make the Database unready.
        let (db, f) = facts(1, Some("16.4"));
        assert_eq!(decide(&db, &f, &Settings::default()).phase, Phase::Ready);
    }

    #[test]
    fn a_pod_without_a_user_fails_the_database_saying_what_to_set() {
        let facts = Facts {
            statefulset: Some(sts(0, true, IMAGE)),
            volume: bound("1Gi"),
            instance_failure: Some(InstanceFailureFact {
                pod: "orders-0".into(),
                failure: InstanceFailure::NoUserEntry,
                message: "set spec.podSecurity.runAsUser".into(),
            }),
            ..facts()
        };
        let d = decide(&testing::minimal(), &facts, &Settings::default());
        assert_eq!(d.phase, Phase::Failed);
        let ready = cond(&d, Ready);
        assert_eq!(ready.reason, "ImageUserNotFound");
        assert_eq!(
            ready.message,
            "pod orders-0: set spec.podSecurity.runAsUser"
        );
        assert_eq!(d.requeue_after, REQUEUE_IN_PROGRESS);
        assert!(
            d.steps.apply_statefulset,
            "a spec change still reaches the pods"
        );
    }
}
