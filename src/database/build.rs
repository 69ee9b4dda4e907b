//! Build: every object one pass of a Database writes, from the decision (and, for what must
//! keep what the server has, what was observed): the credentials and replication Secrets, the
//! pods' role labels, the NetworkPolicy, the Services, the server configuration ConfigMap, the TLS Secrets, the
//! StatefulSet, the init, restore, preflight and verify Jobs, the `DatabaseBackup`s, and what
//! is patched or deleted. `apply` then writes what differs, in the order of `Desired`'s fields.
//!
//! Pure: no client, no clock, no randomness (a new password and new certificates come in). Every object is built by
//! its builder in `resources` (or `backup::job`); this only chooses which, from the steps.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

use super::accounts::{AccountsPlan, missing_event, password};
use super::certificates::Issued;
use super::decide::{Decision, Steps};
use super::facts::Observed;
use super::restart;
use super::restore;
use super::roles::{Failover, HandoverWhy, RolesPlan};
use super::tls::TlsSteps;
use crate::api::{Database, DatabaseBackup, InstanceRole};
use crate::backup::job::verify_job;
use crate::backup::plan::BackupPlan;
use crate::backup::verify::VerifyPlan;
use crate::objects::{EventSpec, NamedEvent};
use crate::release;
use crate::resources::accounts::{accounts_secret, application_secret, password_sources};
use crate::resources::cert_manager::{self, Certificate};
use crate::resources::credentials::{generated_secret, secret_name, superuser_name};
use crate::resources::database_backup::{pre_upgrade_backup, scheduled_backup};
use crate::resources::init_job::{init_job, init_sql_config_map};
use crate::resources::network_policy::network_policy;
use crate::resources::preflight_job::preflight_job;
use crate::resources::primary_lease;
use crate::resources::recovery_job::{data_claim, recovery_job};
use crate::resources::replication::topology_of;
use crate::resources::replication::{disruption_budgets, replication_secret};
use crate::resources::restore_job::restore_job;
use crate::resources::server_config::server_config_map;
use crate::resources::services;
use crate::resources::statefulset::{set_partition, statefulset_running};
use crate::resources::template_origin;
use crate::resources::{Names, tls};
use crate::settings::Settings;
use dbop_contract::topology::Topology;

/// What one pass writes, built. `apply` destructures it without `..`: a new object does not
/// compile until it is written.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    /// The generated credentials Secret to create, and the Event that says a Database that ran
    /// lost it (its clients must read the new password).
    pub secret: Option<(Secret, Option<EventSpec>)>,
    /// The retained generated Secret (its name) that takes our owner reference.
    pub adopt_secret: Option<String>,
    /// The replication, application and accounts Secrets.
    pub accounts: AccountWrites,
    /// The primary Lease, what makes the instances able to keep it, and the pods' role labels.
    pub roles: RoleWrites,
    /// The NetworkPolicy of `spec.networkPolicy`: applied where it drifted (before the
    /// Services and the StatefulSet: new pods start behind it), or deleted (`None`: not asked).
    pub network_policy: Option<Option<NetworkPolicy>>,
    /// The Services: headless, `-rw`, `-ro`, `-r` (applied where they drifted).
    pub services: Vec<Service>,
    /// The PodDisruptionBudgets by name (`replication::disruption_budgets`): applied (with
    /// standbys), or deleted (`None`: one instance).
    pub disruption_budgets: Option<[(String, Option<PodDisruptionBudget>); 2]>,
    /// The server configuration the database pods mount (applied before the StatefulSet).
    pub server_config: Option<ConfigMap>,
    pub statefulset: Option<StatefulSet>,
    /// The upgrade's preflight Job and pre-upgrade backup.
    pub upgrade: UpgradeWrites,
    /// Pods stuck on an image being rolled back.
    pub delete_pods: Vec<String>,
    /// The size every data claim grows to.
    pub claims_size: Option<String>,
    /// Why, when `spec.storage.autoGrow` grows them (the Event's note).
    pub volume_growth: Option<String>,
    /// The init Job and the ConfigMap of its inline SQL (created first).
    pub init_job: Option<(Option<ConfigMap>, Job)>,
    /// The failed init Job to delete, and the ConfigMap of its SQL (the SQL changed).
    pub replace_init_job: Option<super::init::FailedInitJob>,
    /// The restore Job; a physical recovery's comes with the first data claim (created first).
    pub restore_job: Option<(Option<PersistentVolumeClaim>, Job)>,
    /// The schedule's backup, the history's pruning and the backup plan's Events.
    pub backups: BackupWrites,
    pub verify_job: Option<Job>,
    /// The CA Secret (created once), the server certificate's Secret (applied), the CA
    /// patched into the generated credentials Secret.
    pub tls: TlsWrites,
}

/// The Secrets of the roles the instances keep.
#[derive(Clone, Debug, Default)]
pub struct AccountWrites {
    /// The replication Secret to create (the Database has standbys).
    pub replication_secret: Option<Secret>,
    /// The application's Secret to create, the accounts Secret to write, and the Event of a
    /// role password that could not be read.
    pub application_secret: Option<Secret>,
    pub accounts_secret: Option<Secret>,
    pub accounts_event: Option<EventSpec>,
}

/// What the roles plan writes, in this order (`apply::write_roles`): the failover's Event, the
/// instances' access and the Lease, the role Events, the answered promotion request, the pods'
/// labels and annotations.
#[derive(Clone, Debug, Default)]
pub struct RoleWrites {
    /// The instances' ServiceAccount, Role and RoleBinding, made with the primary Lease.
    pub instance_access: Option<(ServiceAccount, Role, RoleBinding)>,
    /// The primary Lease to create, or to replace with a new designation (compare-and-swap):
    /// written before the labels and the topology file, so the instances hear it first.
    pub primary_lease: Option<Lease>,
    /// A designation that loses its compare-and-swap to a renewal by the same holder may be
    /// carried over onto the renewed Lease (`primary_lease::carried_over`): every designation
    /// but a failover's.
    pub primary_lease_carries_over: bool,
    /// The Event of a failover, published once under its own name before the Lease
    /// designates the new primary (`failover_event`).
    pub failover_event: Option<NamedEvent>,
    /// The Events of an answered promotion request and of a switchover.
    pub role_events: Vec<EventSpec>,
    /// Remove the promotion request (`PROMOTE_ANNOTATION`): it has been answered.
    pub promotion_answered: bool,
    /// Role labels to set on pods (before the Services that select by them).
    pub label_pods: Vec<(String, InstanceRole)>,
    /// The versions of their mounted Secrets to tell pods (`roles::SECRETS_SEEN_ANNOTATION`).
    pub refresh_pods: Vec<(String, String)>,
}

/// What a staged upgrade creates before it replaces a pod.
#[derive(Clone, Debug, Default)]
pub struct UpgradeWrites {
    pub preflight_job: Option<Job>,
    pub pre_upgrade_backup: Option<DatabaseBackup>,
}

/// What the backup plan writes.
#[derive(Clone, Debug, Default)]
pub struct BackupWrites {
    /// The schedule's `DatabaseBackup` that is due.
    pub scheduled: Option<DatabaseBackup>,
    /// `DatabaseBackup`s the history policy drops.
    pub prune: Vec<String>,
    /// Events of the backup plan that are not condition transitions.
    pub events: Vec<EventSpec>,
}

/// What the TLS steps write (before the StatefulSet: a new pod mounts the certificate).
#[derive(Clone, Debug, Default)]
pub struct TlsWrites {
    pub ca: Option<Secret>,
    pub server: Option<Secret>,
    /// The superuser's client certificate Secret (applied: a renewal replaces it).
    pub superuser: Option<Secret>,
    /// The credentials Secret's name and the merge patch that gives it `ca.crt`.
    pub credentials_ca: Option<(String, serde_json::Value)>,
    /// The cert-manager Certificate of `spec.tls.issuerRef` (applied where it drifted).
    pub certificate: Option<Certificate>,
    /// `spec.tls.issuerRef` was taken away: delete the Certificate.
    pub drop_certificate: bool,
}

/// The Secrets of what `certificates::issue` made; the CA for the credentials Secret from
/// there, or from the user's own certificate Secret.
fn tls_writes(db: &Database, snap: &Observed, steps: &TlsSteps, issued: Issued) -> TlsWrites {
    let own_ca = snap
        .own_certificate
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get(dbop_contract::instance::TLS_CA_FILE))
        .map(|pem| String::from_utf8_lossy(&pem.0).into_owned());
    let certificate = cert_manager::certificate(db);
    // The pods still mount cert-manager's Secret while the spec names no issuer and mounts
    // another: the spec changed (the StatefulSet, applied in the same pass, mounts the other
    // Secret from now on, so a settled pass sends nothing).
    let cert_managers = Names::of(db).cert_manager_secret();
    let drop_certificate = certificate.is_none()
        && tls::mounted_secret(db) != cert_managers
        && tls::mounted_by(snap.statefulset.as_ref()).is_some_and(|name| name == cert_managers);
    TlsWrites {
        certificate,
        drop_certificate,
        ca: issued
            .new_ca
            .map(|ca| tls::ca_secret(db, &ca.cert_pem, &ca.key_pem)),
        server: issued.server.map(|cert| tls::server_secret(db, &cert)),
        superuser: issued
            .superuser
            .map(|cert| tls::superuser_secret(db, &cert)),
        credentials_ca: issued
            .ca_cert_pem
            .or(own_ca)
            .filter(|_| steps.credentials_ca)
            .map(|pem| (secret_name(db), tls::credentials_ca_patch(&pem))),
    }
}

/// What a pass made anew, outside `build` (randomness): the generated passwords of the Secrets
/// the decision creates, and the certificates it issues.
pub struct Fresh<'a> {
    /// The credentials Secret's password, when the decision creates that Secret.
    pub password: Option<&'a str>,
    /// The replication role's password, when the decision creates its Secret.
    pub replication_password: Option<&'a str>,
    /// The accounts: what the pass decided, the application's password when it makes its
    /// Secret or rebuilds the accounts Secret, and the declared roles' Secrets as observed.
    pub accounts: &'a AccountsPlan,
    pub application_password: Option<&'a str>,
    pub issued: Issued,
}

/// Every object the decision asks for, with what the pass made anew (`fresh`).
pub fn build(
    db: &Database,
    snap: &Observed,
    decision: &Decision,
    verification: Option<&VerifyPlan>,
    settings: &Settings,
    fresh: Fresh<'_>,
) -> Desired {
    let Steps {
        create_secret,
        adopt_secret,
        apply_services,
        apply_statefulset,
        expand_volumes,
        volume_growth,
        create_init_job,
        replace_init_job,
        create_restore_job,
        create_preflight_job,
        create_pre_upgrade_backup,
        delete_pods,
        tls,
        // Written by `role_writes`.
        label_pods: _,
        refresh_pods: _,
    } = &decision.steps;
    // The instances the StatefulSet keeps (more than the spec's while a scale-down waits for
    // the primary's switchover), as the Lease and the mounted ConfigMap name them.
    let members = decision.roles.statefulset_replicas.max(db.spec.instances);
    let topology = topology_of(db, &decision.roles.primary, members);
    Desired {
        secret: (fresh.password)
            .filter(|_| *create_secret)
            .map(|password| (generated_secret(db, password), regenerated(db))),
        adopt_secret: adopt_secret.then(|| secret_name(db)),
        accounts: AccountWrites {
            replication_secret: (fresh.replication_password)
                .filter(|_| decision.roles.create_replication_secret)
                .map(|password| replication_secret(db, password)),
            ..account_writes(db, snap, fresh.accounts, fresh.application_password)
        },
        roles: role_writes(db, snap, decision, &topology),
        network_policy: apply_services.then(|| network_policy(db)),
        services: (apply_services.then(|| services::all(db))).unwrap_or_default(),
        disruption_budgets: apply_statefulset.then(|| disruption_budgets(db)),
        server_config: apply_statefulset.then(|| server_config(db, snap, &topology)),
        statefulset: apply_statefulset.then(|| statefulset(db, snap, decision, settings)),
        upgrade: upgrade_writes(
            db,
            decision,
            create_preflight_job,
            create_pre_upgrade_backup,
            settings,
        ),
        delete_pods: delete_pods.clone(),
        claims_size: expand_volumes.clone(),
        volume_growth: volume_growth.clone(),
        init_job: create_init_job
            .then(|| init_job(db, settings, snap.init_config_map.as_ref()))
            .flatten()
            .map(|job| (init_sql_config_map(db), job)),
        replace_init_job: replace_init_job.clone(),
        restore_job: create_restore_job
            .then(|| restore_writes(db, snap, settings))
            .flatten(),
        backups: backup_writes(db, decision.backup.as_ref()),
        // The Database was read in this pass; a spec the Job cannot be built from shows in
        // BackupHealthy already.
        verify_job: verification
            .and_then(|plan| plan.create.as_ref())
            .and_then(|name| verify_job(db, name, settings).ok()),
        tls: tls_writes(db, snap, tls, fresh.issued),
    }
}

/// The roles plan's writes; the Lease and the instances' access only with the StatefulSet.
fn role_writes(
    db: &Database,
    snap: &Observed,
    decision: &Decision,
    topology: &Topology,
) -> RoleWrites {
    let Steps {
        apply_statefulset,
        label_pods,
        refresh_pods,
        ..
    } = &decision.steps;
    RoleWrites {
        instance_access: (*apply_statefulset && snap.primary_lease.is_none())
            .then(|| instance_access(db)),
        primary_lease: apply_statefulset
            .then(|| designated_lease(db, snap, topology))
            .flatten(),
        primary_lease_carries_over: decision.roles.failover.is_none(),
        failover_event: decision
            .roles
            .failover
            .as_ref()
            .map(|f| failover_event(db, f)),
        role_events: role_events(&decision.roles),
        promotion_answered: decision.roles.promotion.is_some(),
        label_pods: label_pods.clone(),
        refresh_pods: refresh_pods.clone(),
    }
}

/// The server configuration the pods mount, for `topology`.
fn server_config(db: &Database, snap: &Observed, topology: &Topology) -> ConfigMap {
    let superuser = superuser_name(db, snap.credentials_secret.as_ref());
    server_config_map(db, topology, &superuser)
}

/// The upgrade's preflight Job and pre-upgrade backup, when the steps create them.
fn upgrade_writes(
    db: &Database,
    decision: &Decision,
    preflight: &Option<String>,
    backup: &Option<String>,
    settings: &Settings,
) -> UpgradeWrites {
    UpgradeWrites {
        preflight_job: (preflight.as_ref())
            .zip(decision.upgrade.as_ref())
            .map(|(name, u)| preflight_job(db, settings, name, &u.to_image, &u.to)),
        pre_upgrade_backup: backup.as_ref().map(|name| pre_upgrade_backup(db, name)),
    }
}

/// The application's Secret (when the accounts plan makes it) and the accounts Secret (when it
/// rebuilds it), with the application's fresh password; the Event of a role password that
/// could not be read. (The replication Secret is the roles plan's.)
fn account_writes(
    db: &Database,
    snap: &Observed,
    accounts: &AccountsPlan,
    application_password: Option<&str>,
) -> AccountWrites {
    AccountWrites {
        replication_secret: None,
        application_secret: application_password
            .filter(|_| accounts.create_application_secret)
            .map(|password| application_secret(db, password)),
        accounts_secret: accounts.rebuild.as_ref().zip(application_password).map(
            |(inputs, password)| accounts_secret(db, password, &role_passwords(db, snap), inputs),
        ),
        accounts_event: missing_event(accounts),
    }
}

/// The restore Job of `spec.bootstrap`; a physical recovery's comes with the first data claim.
/// The source was checked by decide; it is read again from what was observed to build the Job.
fn restore_writes(
    db: &Database,
    snap: &Observed,
    settings: &Settings,
) -> Option<(Option<PersistentVolumeClaim>, Job)> {
    let source = restore::source(db, &snap.restore).ok()?;
    Some(match source.target {
        Some(_) => (Some(data_claim(db)), recovery_job(db, &source, settings)),
        None => (None, restore_job(db, &source, settings)),
    })
}

/// The instances' ServiceAccount, Role and RoleBinding (the primary Lease's readers).
fn instance_access(db: &Database) -> (ServiceAccount, Role, RoleBinding) {
    (
        primary_lease::service_account(db),
        primary_lease::role(db),
        primary_lease::role_binding(db),
    )
}

/// The primary Lease designating the primary of `topology`, when it changes.
fn designated_lease(db: &Database, snap: &Observed, topology: &Topology) -> Option<Lease> {
    primary_lease::designate(
        db,
        snap.primary_lease.as_ref(),
        topology,
        snap.observed_at.timestamp_millis(),
    )
}

/// The backup plan's writes: the due scheduled backup, the pruned history, the Events.
fn backup_writes(db: &Database, plan: Option<&BackupPlan>) -> BackupWrites {
    let Some(plan) = plan else {
        return BackupWrites::default();
    };
    BackupWrites {
        scheduled: (plan.create.as_ref())
            .map(|new| scheduled_backup(db, &new.name, new.scheduled_at)),
        prune: plan.prune.clone(),
        events: plan.events.clone(),
    }
}

/// The StatefulSet, with the claim templates it has (they are immutable), the template an
/// earlier operator built kept, or one held for the maintenance window (`template_origin`) and
/// the restart record.
fn statefulset(
    db: &Database,
    snap: &Observed,
    decision: &Decision,
    settings: &Settings,
) -> StatefulSet {
    let observed = snap.statefulset.as_ref();
    let claims = observed.and_then(|s| s.spec.volume_claim_templates.clone());
    let mut desired = statefulset_running(db, settings, claims, &decision.pod_run);
    template_origin::settle(&mut desired, observed, &decision.template);
    release::settle(&mut desired, observed, &decision.release);
    restart::record(&mut desired, &decision.restart_pending, observed);
    // A scale-down keeps the primary's pod until it has handed over (`roles::handover`).
    desired.spec.replicas = Some(decision.roles.statefulset_replicas.max(db.spec.instances));
    // A rollout replaces the primary's pod last (`roles::primary_last`): while one is under
    // way, and in the write that starts one, so the StatefulSet never starts with it.
    if let Some(partition) = decision.roles.primary_last_partition {
        let rolling = observed.and_then(super::facts::rolling_to).is_some();
        // Our write that set it, not yet seen by the StatefulSet controller (its status still
        // shows no rollout): keep it, or the next pass would lower it before the rollout shows.
        let held =
            observed.is_some_and(|o| !controller_saw(o) && partition_of(o) == Some(partition));
        if rolling || held || template_changes(&desired, observed) {
            // A version upgrade's own partition moves down from the top: the higher one holds.
            let upgrade = partition_of(&desired).unwrap_or(0);
            set_partition(&mut desired, partition.max(upgrade));
        }
    }
    desired
}

/// The StatefulSet controller has seen the latest spec.
fn controller_saw(sts: &StatefulSet) -> bool {
    let observed = sts.status.as_ref().and_then(|s| s.observed_generation);
    observed.is_some() && observed >= sts.metadata.generation
}

fn partition_of(sts: &StatefulSet) -> Option<i32> {
    sts.spec
        .update_strategy
        .as_ref()?
        .rolling_update
        .as_ref()?
        .partition
}

/// The desired pod template differs from the observed one in a field dbop sets (or there is
/// no StatefulSet yet, which is no change of a running pod).
fn template_changes(desired: &StatefulSet, observed: Option<&StatefulSet>) -> bool {
    let Some(observed) = observed else {
        return false;
    };
    let template = |s: &StatefulSet| serde_json::to_value(&s.spec.template).unwrap_or_default();
    crate::resources::drift::needs_apply(&template(desired), Some(&template(observed)))
}

/// The Event of a failover (which instance was lost, why, which one takes its place), named
/// after the Database, the lost primary and its Lease's last renewal: an operator killed after
/// publishing it and before the Lease designates the new primary decides the same failover
/// again after its restart, and its Event has the same name, so there is exactly one.
pub fn failover_event(db: &Database, f: &Failover) -> NamedEvent {
    NamedEvent {
        name: format!("{}.failedover.{}.{}", db.name(), f.from, f.since_ms),
        event: EventSpec {
            warning: true,
            reason: "FailedOver".into(),
            note: format!(
                "the primary {} is lost: {}; promoting the standby {}, {} (the old primary rejoins as a standby when it returns)",
                f.from, f.why, f.to, f.chosen
            ),
        },
    }
}

/// The Events of the roles: the answer to a promotion request, and a switchover before a
/// scale-down, a rollout or a drain.
fn role_events(roles: &RolesPlan) -> Vec<EventSpec> {
    let promotion = roles.promotion.iter().map(|p| EventSpec {
        warning: p.refused,
        reason: if p.refused {
            "PromoteRefused"
        } else {
            "Switchover"
        }
        .into(),
        note: p.note.clone(),
    });
    let handover = roles.handover.iter().map(|h| {
        let (reason, before) = match h.why {
            HandoverWhy::ScaleDown => (
                "ScaleDownSwitchover",
                format!("before the scale-down removes {}", h.from),
            ),
            HandoverWhy::Rollout => (
                "RolloutSwitchover",
                format!("before the rollout replaces the pod of {}", h.from),
            ),
            HandoverWhy::NodeDrain => (
                "DrainSwitchover",
                format!("before the drain of its cordoned node evicts {}", h.from),
            ),
            HandoverWhy::Upgrade => (
                "UpgradeSwitchover",
                format!(
                    "before the version upgrade replaces the pod of {}",
                    h.from
                ),
            ),
        };
        EventSpec {
            warning: false,
            reason: reason.into(),
            note: format!(
                "switching over from {} to {} {before}: {} stops after sending its standbys all of its WAL, then {} is promoted",
                h.from, h.to, h.from, h.to
            ),
        }
    });
    promotion.chain(handover).collect()
}

/// The Event of a generated Secret made again for a Database that ran: the instance manager
/// sets the server's password from the mounted Secret when the kubelet updates the volume, and
/// clients holding the old password fail until they read it again.
/// The declared roles' passwords that could be read, by their index in `spec.roles`.
fn role_passwords(db: &Database, snap: &Observed) -> BTreeMap<usize, Vec<u8>> {
    password_sources(db)
        .into_iter()
        .enumerate()
        .filter_map(|(i, source)| {
            let secret = snap.role_password_secrets.get(i).and_then(Option::as_ref);
            password(secret, &source?.key).map(|p| (i, p))
        })
        .collect()
}

fn regenerated(db: &Database) -> Option<EventSpec> {
    let ran = db
        .status
        .as_ref()
        .is_some_and(|s| s.current_version.is_some());
    ran.then(|| EventSpec {
        warning: true,
        reason: "CredentialsRegenerated".into(),
        note: format!(
            "the credentials Secret {} was deleted and has been generated again with a new password; \
             the server takes the new password within about a minute: clients must read it again (see docs/runbooks.md)",
            secret_name(db)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::super::facts::Facts;
    use super::*;
    use crate::resources::testing;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn decided(db: &Database, settings: &Settings) -> Decision {
        super::super::decide::decide(db, &Facts::nothing_made_yet(), settings)
    }

    #[test]
    fn a_failover_event_is_named_by_the_failover_it_announces() {
        let db = testing::minimal();
        let failover = |to: &str, since_ms: i64| Failover {
            from: "orders-0".into(),
            to: to.into(),
            why: "orders-0 has not held the primary Lease for 10 s".into(),
            chosen: "it received the most WAL".into(),
            since_ms,
        };
        let first = failover_event(&db, &failover("orders-1", 1_764_000_000_123));
        // Decided again by a restarted operator: the same Event.
        assert_eq!(
            first,
            failover_event(&db, &failover("orders-1", 1_764_000_000_123))
        );
        assert_eq!(first.name, "orders.failedover.orders-0.1764000000123");
        assert!(
            first.event.warning
                && first.event.reason == "FailedOver"
                && first.event.note.contains("promoting the standby orders-1"),
            "{first:?}"
        );
        // A later loss of the same instance (after it renewed again) is another failover.
        assert_ne!(
            first.name,
            failover_event(&db, &failover("orders-1", 1_764_000_100_000)).name
        );
    }

    /// The partition the StatefulSet is written with, for a primary-last partition of 1.
    fn partition_written(observed: Option<StatefulSet>) -> Option<i32> {
        let mut db = testing::minimal();
        db.spec.instances = 3;
        let settings = Settings::default();
        let mut decision = decided(&db, &settings);
        decision.roles.primary_last_partition = Some(1);
        let snap = Observed {
            statefulset: observed,
            ..Observed::default()
        };
        partition_of(&statefulset(&db, &snap, &decision, &settings))
    }

    /// The StatefulSet as the last pass wrote it, seen by its controller, not rolling.
    fn settled(db_image: Option<&str>) -> StatefulSet {
        let mut db = testing::minimal();
        db.spec.instances = 3;
        let settings = Settings::default();
        let decision = decided(&db, &settings);
        let snap = Observed::default();
        let mut sts = statefulset(&db, &snap, &decision, &settings);
        if let Some(image) = db_image {
            sts.spec.template.spec.as_mut().unwrap().containers[0].image = Some(image.into());
        }
        sts.metadata.generation = Some(1);
        sts.status = Some(StatefulSetStatus {
            observed_generation: Some(1),
            current_revision: Some("r1".into()),
            update_revision: Some("r1".into()),
            ..StatefulSetStatus::default()
        });
        sts
    }

    #[test]
    fn the_primary_last_partition_is_written_with_a_new_template_and_kept_while_it_rolls() {
        // Nothing changes: the partition stays as it was (0), no write.
        assert_eq!(partition_written(Some(settled(None))), Some(0));
        // A new template (here: the observed one runs another image): written with it.
        assert_eq!(partition_written(Some(settled(Some("old:1")))), Some(1));
        // Written, not seen by the controller yet: kept, not lowered for a pass.
        let mut unseen = settled(None);
        set_partition(&mut unseen, 1);
        unseen.metadata.generation = Some(2);
        assert_eq!(partition_written(Some(unseen.clone())), Some(1));
        // Seen, rolling: kept.
        unseen.status.as_mut().unwrap().observed_generation = Some(2);
        unseen.status.as_mut().unwrap().update_revision = Some("r2".into());
        assert_eq!(partition_written(Some(unseen.clone())), Some(1));
        // Rolled out: lowered.
        unseen.status.as_mut().unwrap().current_revision = Some("r2".into());
        assert_eq!(partition_written(Some(unseen)), Some(0));
        // A new StatefulSet: nothing to hold.
        assert_eq!(partition_written(None), Some(0));
    }
}
