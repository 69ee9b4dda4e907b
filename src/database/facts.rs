//! The facts of one Database reconcile: `Observed`, what `observe` read, and `Facts`, what
//! `decide` knows about the world besides the Database itself, reduced from it.
//!
//! Pure: no client, no clock (`Observed.observed_at` is the `now` of the whole pass, carried
//! into `Facts` as `backups.now`). Must not import `observe`, `kube_io` or `context`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use dbop_contract::InstanceFailure;
use dbop_contract::position::{Archiver, Position};
use dbop_contract::volume::VolumeUsage;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerStatus, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::accounts::AccountsFact;
use super::restart::RestartFact;
use super::restore::{self, BootstrapFact, RestoreObjects};
use super::roles::{PodFact, RolesFact};
use super::stuck::{stuck_pods, unready_on_another_revision};
use super::tls::{OwnCertificateFact, TlsFact};
use crate::api::{Database, DatabaseBackup, TlsSpec};
use crate::backup::plan::BackupHistory;
use crate::backup::s3_secret::{S3SecretProblem, s3_secret_problem};
use crate::backup::schedule::BackupRecord;
use crate::objects::{JobState, job_state, owned_by, to_chrono};
use crate::release::{Fleet, Marker};
use crate::resources::cert_manager::Certificate;
use crate::resources::credentials::{self, SecretProblem};
use crate::resources::init_job::{
    CONFIG_MAP_ANNOTATION, GENERATION_ANNOTATION, SQL_DIGEST_ANNOTATION, sql_digest,
};
use crate::resources::owner_reference;
use crate::resources::primary_lease::LeaseFact;
use crate::resources::quantity;
use crate::resources::statefulset::template_image;
use crate::resources::template_origin::TemplateRecord;
use crate::upgrade::facts::{self as upgrade_facts, UpgradeFacts};

/// The objects of one Database as they were read (the owned ones as the watch caches have them).
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub credentials_secret: Option<Secret>,
    /// The CA and server certificate Secrets (metadata only, from the cache).
    pub ca_secret: Option<Secret>,
    pub server_tls_secret: Option<Secret>,
    /// The superuser's client certificate Secret (metadata only, from the cache).
    pub superuser_tls_secret: Option<Secret>,
    /// The user's own server certificate Secret (`spec.tls.serverCertificate`), read in full
    /// from the API server (dbop does not watch the user's Secrets).
    pub own_certificate: Option<Secret>,
    /// The cert-manager Certificate of `spec.tls.issuerRef`, read only then (None: it does
    /// not exist, or cert-manager is not installed).
    pub certificate: Option<Certificate>,
    pub init_config_map: Option<ConfigMap>,
    /// The server configuration `<name>-config` (from the cache).
    pub server_config: Option<ConfigMap>,
    /// The Services that exist of the Database's (headless, `-rw`, `-ro`, `-r`).
    pub services: Vec<Service>,
    pub statefulset: Option<StatefulSet>,
    pub init_job: Option<Job>,
    /// The database pods as the watch cache has them (role label, node, readiness).
    pub instance_pods: Vec<Pod>,
    /// The WAL position of each database pod whose manager answered (`positions`; read only
    /// for a Database with standbys).
    pub positions: BTreeMap<String, Position>,
    /// The primary's WAL archiving, as its manager reported it (read only for a Database that
    /// archives its WAL; None when no primary answered).
    pub archiver: Option<Archiver>,
    /// How full each instance's data volume is, by pod, as its manager reported it (read only
    /// for a Database with `spec.storage.autoGrow` or WAL archiving).
    pub volumes: BTreeMap<String, VolumeUsage>,
    /// Whether the data claims' StorageClass allows expansion (read only with
    /// `spec.storage.autoGrow`).
    pub storage_class: ClassFact,
    /// The database pods' PodDisruptionBudgets that exist, by name (from the cache).
    pub disruption_budgets: BTreeMap<String, PodDisruptionBudget>,
    /// The database pods' NetworkPolicy (from the cache).
    pub network_policy: Option<NetworkPolicy>,
    /// The replication Secret (metadata only, from the cache).
    pub replication_secret: Option<Secret>,
    /// The application's Secret `<name>-app` and the accounts Secret (metadata only, from the
    /// cache).
    pub application_secret: Option<Secret>,
    pub accounts_secret: Option<Secret>,
    /// The Secret of each declared role's password (`resources::accounts::password_sources`
    /// order; `None` where there is none), read in full from the API server.
    pub role_password_secrets: Vec<Option<Secret>>,
    /// The primary Lease (from the cache).
    pub primary_lease: Option<Lease>,
    /// The nodes of `instance_pods` that are cordoned (from the cache): a drain's first step.
    pub cordoned_nodes: BTreeSet<String>,
    /// Where every Database stands in this operator's release (`crate::release`): the
    /// StatefulSets in the cache, and the turns this process granted since.
    pub release_fleet: Fleet,
    /// The data claims of ordinals 0..instances that exist.
    pub data_claims: Vec<PersistentVolumeClaim>,
    /// The `DatabaseBackup` objects of this Database (scheduled and on demand).
    pub backups: Vec<DatabaseBackup>,
    /// The Secret named by `spec.backup.s3.credentials` (only its keys are ever looked at).
    pub s3_secret: Option<Secret>,
    /// What is wrong with the `spec.backup.s3.ca` source, if anything (read before any Job).
    pub s3_ca_problem: Option<String>,
    /// What is wrong with the `spec.backup.encryption` Secret, if anything (key names only).
    pub encryption_problem: Option<String>,
    /// When it was read: the `now` of every time-based decision of this pass.
    pub observed_at: DateTime<Utc>,
    /// What `spec.bootstrap.fromBackup` needs, read only until the Database is initialised.
    pub restore: RestoreObjects,
    /// What an upgrade under way reads (empty when none is).
    pub upgrade: UpgradeObjects,
    /// The database pods, read only while the StatefulSet has fewer ready pods than it wants
    /// (to say why a pod does not start).
    pub database_pods: Vec<Pod>,
}

/// The objects an upgrade under way reads: the database pods, its preflight Job and that
/// Job's pods.
#[derive(Clone, Debug, Default)]
pub struct UpgradeObjects {
    pub pods: Vec<Pod>,
    pub preflight_job: Option<Job>,
    pub preflight_pods: Vec<Pod>,
}

/// The upgrade's facts: its preflight Job and backup, the StatefulSet's revisions, the pods.
fn upgrade_fact(db: &Database, snap: &Observed) -> UpgradeFacts {
    let upgrade = db.status.as_ref().and_then(|s| s.upgrade.as_ref());
    let backup_name = upgrade.and_then(|u| u.pre_upgrade_backup.as_deref());
    UpgradeFacts {
        preflight: snap
            .upgrade
            .preflight_job
            .as_ref()
            .map(|job| upgrade_facts::preflight_fact(job, &snap.upgrade.preflight_pods)),
        backup: snap
            .backups
            .iter()
            .find(|b| b.metadata.name.as_deref() == backup_name && backup_name.is_some())
            .map(upgrade_facts::backup_fact),
        statefulset: snap.statefulset.as_ref().map(upgrade_facts::revision_fact),
        pods: snap
            .upgrade
            .pods
            .iter()
            .filter_map(upgrade_facts::pod_fact)
            .collect(),
    }
}

/// The state of the credentials Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialsFact {
    /// Usable: the user's Secret has a password, or the generated one exists and is ours.
    Usable,
    /// dbop generates the Secret and it does not exist yet.
    GeneratedMissing,
    /// The generated Secret exists without our owner reference (kept by `Retain` when an earlier
    /// Database of this name was deleted): adopt it, its password matches the retained data.
    GeneratedOrphaned,
    /// The user's Secret is missing or has no password.
    UserSecretProblem(SecretProblem),
}

/// What the StatefulSet controller reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatefulSetFact {
    pub replicas: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    /// The StatefulSet controller has seen the latest spec.
    pub observed_current: bool,
    /// Every pod runs the latest revision.
    pub rolled_out: bool,
    /// The StatefulSet is moving its pods to a new template: its update revision differs from
    /// the current one. A lost pod or a scale-up lowers `updated_replicas` too, but leaves
    /// the revisions equal, so this, not the counts, says whether a rollout is under way.
    pub template_rolling: bool,
    pub image: Option<String>,
}

/// The data volume of the primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFact {
    pub bound: bool,
    /// The claim is older than the Database: its data was kept (Retain) by an earlier
    /// Database of the same name.
    pub predates_database: bool,
    pub requested: Option<String>,
    pub capacity: Option<String>,
}

/// What `spec.storage.autoGrow` decides from (`autogrow`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageFact {
    /// Every data claim, by ordinal.
    pub claims: Vec<ClaimSize>,
    /// How full each answering instance's data volume is, by pod.
    pub usage: BTreeMap<String, VolumeUsage>,
    /// Pods whose server stopped on a full volume and has not run since, with the volume as
    /// it was then (the termination message's figures).
    pub stopped_full: BTreeMap<String, VolumeUsage>,
    pub class: ClassFact,
}

impl StorageFact {
    /// The smallest data claim's capacity, once every claim has one.
    pub fn current(&self) -> Option<u128> {
        let capacities: Option<Vec<u128>> = self.claims.iter().map(|c| c.capacity).collect();
        capacities.and_then(|c| c.into_iter().min())
    }

    /// Whether `usage` is of a filesystem far larger than a claim of `current` bytes: not a
    /// volume of its own (a hostPath, a shared disk), whose fullness says nothing of the claim.
    pub fn oversized(usage: &VolumeUsage, current: u128) -> bool {
        u128::from(usage.size_bytes) * 2 > current.saturating_mul(3)
    }

    /// The readings of volumes that are the claims' own (see `oversized`); none before every
    /// claim has a capacity.
    pub fn own_volumes(&self) -> impl Iterator<Item = &VolumeUsage> {
        let current = self.current();
        self.usage
            .values()
            .filter(move |u| current.is_some_and(|c| !Self::oversized(u, c)))
    }
}

/// One data claim's size: what it asks for and what it has (bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimSize {
    pub name: String,
    pub requested: Option<u128>,
    pub capacity: Option<u128>,
}

/// The data claims' StorageClass, as far as dbop could read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClassFact {
    /// Not read (no autoGrow, no class name known yet, or no permission to read classes).
    #[default]
    Unknown,
    Expands,
    /// `allowVolumeExpansion` is not true, or the class does not exist.
    CannotExpand {
        name: String,
        missing: bool,
    },
}

/// Whether the init SQL's source exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitSourceFact {
    /// Inline SQL, or no init at all.
    Available,
    ConfigMapNotFound {
        name: String,
    },
    KeyNotFound {
        name: String,
        key: String,
    },
}

/// The init Job: its state, and what it was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitJobFact {
    pub state: JobState,
    pub uid: String,
    /// The digest of the SQL it runs (None: made by a release before digests).
    pub sql_digest: Option<String>,
    /// The generation of the Database it was made from (None: as above).
    pub generation: Option<i64>,
    /// The ConfigMap dbop made for its SQL (None: the user's, or a release before).
    pub config_map: Option<String>,
}

#[cfg(test)]
impl InitJobFact {
    /// A Job in this state, made from nothing known (a release before digests).
    pub fn of(state: JobState) -> InitJobFact {
        InitJobFact {
            state,
            uid: String::new(),
            sql_digest: None,
            generation: None,
            config_map: None,
        }
    }
}

/// Everything `decide` knows about the world besides the Database itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub credentials: CredentialsFact,
    /// The primary's WAL archiving (`Observed::archiver`).
    pub archiver: Option<Archiver>,
    pub init_source: InitSourceFact,
    pub statefulset: Option<StatefulSetFact>,
    pub volume: Option<VolumeFact>,
    /// The data claims' sizes, their volumes' usage and class (`autogrow`).
    pub storage: StorageFact,
    pub init_job: Option<InitJobFact>,
    /// The digest of the init SQL as the spec has it now (`init_job::sql_digest`).
    pub init_sql: Option<String>,
    pub backups: BackupHistory,
    /// The restore of `spec.bootstrap.fromBackup` (None without one).
    pub bootstrap: Option<BootstrapFact>,
    pub upgrade: UpgradeFacts,
    /// A database pod whose instance manager stopped for a reason the user can fix.
    pub instance_failure: Option<InstanceFailureFact>,
    /// A database pod the scheduler cannot place, with the scheduler's reason.
    pub unschedulable: Option<UnschedulableFact>,
    /// The restart-needing parameters the StatefulSet's pod template carries.
    pub restart: RestartFact,
    /// Who built the StatefulSet's pod template, and from what (None: no StatefulSet yet).
    pub template: Option<TemplateRecord>,
    /// Database pods held back on a revision the StatefulSet has moved on from (`stuck`).
    pub stuck_pods: Vec<String>,
    /// The CA, the server certificate, and where the pods serve it (`tls`).
    pub tls: TlsFact,
    /// The instances' pods and the replication Secret (`roles`).
    pub roles: RolesFact,
    /// This Database's part in the operator's release, and the fleet's (`crate::release`).
    pub release: ReleaseFact,
    /// The application's and the accounts Secrets, the role passwords (`accounts`).
    pub accounts: AccountsFact,
}

/// A Database's part in the operator's release, and where the others stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseFact {
    /// Its StatefulSet's marker (`release::MARKER_ANNOTATION`).
    pub marker: Option<Marker>,
    pub fleet: Fleet,
    /// Database pods not ready on a revision the StatefulSet has moved on from: after a
    /// rollback, those on the release's template (`stuck::unready_on_another_revision`).
    pub unready_elsewhere: Vec<String>,
}

/// A database pod the scheduler found no node for (`PodScheduled` False, `Unschedulable`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnschedulableFact {
    pub pod: String,
    /// The scheduler's message: which nodes it tried and what each lacked.
    pub message: String,
}

/// Why a database pod's instance manager stopped, from its termination message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceFailureFact {
    pub pod: String,
    pub failure: InstanceFailure,
    /// The rest of the message: what is wrong and what to set.
    pub message: String,
}

impl Facts {
    pub fn from_observed(db: &Database, snap: &Observed) -> Facts {
        Facts {
            credentials: credentials_fact(db, snap.credentials_secret.as_ref()),
            archiver: snap.archiver.clone(),
            init_source: init_source_fact(db, snap.init_config_map.as_ref()),
            statefulset: snap.statefulset.as_ref().map(statefulset_fact),
            volume: snap.data_claims.first().map(|pvc| volume_fact(db, pvc)),
            storage: StorageFact {
                claims: snap.data_claims.iter().map(claim_size).collect(),
                usage: snap.volumes.clone(),
                stopped_full: snap.database_pods.iter().filter_map(stopped_full).collect(),
                class: snap.storage_class.clone(),
            },
            init_job: snap.init_job.as_ref().map(init_job_fact),
            init_sql: sql_digest(db, snap.init_config_map.as_ref()),
            backups: backups_fact(db, snap),
            bootstrap: restore::fact(db, &snap.restore),
            upgrade: upgrade_fact(db, snap),
            instance_failure: snap.database_pods.iter().find_map(instance_failure_fact),
            unschedulable: snap.database_pods.iter().find_map(unschedulable_fact),
            restart: RestartFact::of(snap.statefulset.as_ref()),
            template: snap.statefulset.as_ref().map(TemplateRecord::of),
            release: ReleaseFact {
                marker: snap.statefulset.as_ref().and_then(Marker::of),
                fleet: snap.release_fleet.clone(),
                unready_elsewhere: unready_on_another_revision(
                    snap.statefulset.as_ref(),
                    &snap.database_pods,
                ),
            },
            stuck_pods: stuck_pods(snap.statefulset.as_ref(), &snap.database_pods),
            roles: RolesFact {
                pods: snap.instance_pods.iter().map(PodFact::of).collect(),
                positions: snap.positions.clone(),
                replication_secret: snap.replication_secret.is_some(),
                lease: snap.primary_lease.as_ref().map(LeaseFact::of),
                now_ms: snap.observed_at.timestamp_millis(),
                mounted_secrets: crate::database::roles::mounted_secrets(&[
                    snap.credentials_secret.as_ref(),
                    snap.accounts_secret.as_ref(),
                    snap.replication_secret.as_ref(),
                    snap.server_tls_secret.as_ref(),
                ]),
                rolling_to: snap.statefulset.as_ref().and_then(rolling_to),
                cordoned_nodes: snap.cordoned_nodes.clone(),
                // (decide sets it: whether an upgrade is under way is its plan, not a fact)
                version_upgrade: Default::default(),
            },
            tls: TlsFact::of(
                snap.ca_secret.as_ref(),
                snap.server_tls_secret.as_ref(),
                TlsSpec::superuser_by_certificate(db.spec.tls.as_ref()).then(|| {
                    (
                        credentials::superuser_name(db, snap.credentials_secret.as_ref()),
                        snap.superuser_tls_secret.as_ref(),
                    )
                }),
                snap.credentials_secret
                    .as_ref()
                    .filter(|_| credentials::is_generated(db)),
                snap.statefulset.as_ref(),
                crate::resources::tls::external_certificate(db).map(|(name, origin)| {
                    OwnCertificateFact::of(&name, &origin, snap.own_certificate.as_ref())
                }),
            ),
            accounts: AccountsFact::of(
                db,
                snap.application_secret.as_ref(),
                snap.accounts_secret.as_ref(),
                &snap.role_password_secrets,
                snap.statefulset.as_ref(),
            ),
        }
    }
}

/// The status of a database pod's `postgres` container.
fn postgres_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "postgres")
}

/// The failure the `postgres` container's termination message names: the current one, or the
/// last one while it waits to restart (CrashLoopBackOff).
fn instance_failure_fact(pod: &Pod) -> Option<InstanceFailureFact> {
    let status = postgres_status(pod)?;
    let terminated = [&status.state, &status.last_state]
        .into_iter()
        .flatten()
        .filter_map(|s| s.terminated.as_ref());
    terminated
        .filter_map(|t| t.message.as_deref())
        .find_map(InstanceFailure::parse)
        .map(|(failure, message)| InstanceFailureFact {
            pod: pod.metadata.name.clone().unwrap_or_default(),
            failure,
            message: message.to_string(),
        })
}

/// A pod whose `postgres` container is not running and last stopped on a full volume, with
/// the volume's figures then.
fn stopped_full(pod: &Pod) -> Option<(String, VolumeUsage)> {
    let status = postgres_status(pod)?;
    if status.state.as_ref().is_some_and(|s| s.running.is_some()) {
        return None;
    }
    let failure = instance_failure_fact(pod)?;
    (failure.failure == InstanceFailure::VolumeFull)
        .then(|| VolumeUsage::from_full_message(&failure.message))
        .flatten()
        .map(|usage| (failure.pod, usage))
}

fn claim_size(pvc: &PersistentVolumeClaim) -> ClaimSize {
    let storage = |list: Option<&BTreeMap<String, Quantity>>| {
        list.and_then(|l| l.get("storage"))
            .and_then(|q| quantity::bytes(&q.0))
    };
    ClaimSize {
        name: pvc.metadata.name.clone().unwrap_or_default(),
        requested: storage(
            pvc.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        ),
        capacity: storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref())),
    }
}

/// The scheduler's word on a pod it could not place.
fn unschedulable_fact(pod: &Pod) -> Option<UnschedulableFact> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .filter(|c| c.reason.as_deref() == Some("Unschedulable"))?;
    Some(UnschedulableFact {
        pod: pod.metadata.name.clone().unwrap_or_default(),
        message: condition.message.clone().unwrap_or_default(),
    })
}

fn backups_fact(db: &Database, snap: &Observed) -> BackupHistory {
    BackupHistory {
        now: snap.observed_at,
        records: snap
            .backups
            .iter()
            .map(|b| {
                let status = b.status.clone().unwrap_or_default();
                BackupRecord {
                    name: b.metadata.name.clone().unwrap_or_default(),
                    phase: status.phase,
                    created: b
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(to_chrono)
                        .unwrap_or(snap.observed_at),
                    completed: status.completed_at,
                    message: status.message,
                }
            })
            .collect(),
        s3_problem: db
            .spec
            .backup
            .as_ref()
            .and_then(|spec| {
                s3_secret_problem(spec.s3.credentials.as_ref(), snap.s3_secret.as_ref())
            })
            .or_else(|| snap.s3_ca_problem.clone().map(S3SecretProblem::CaSource))
            .or_else(|| {
                snap.encryption_problem
                    .clone()
                    .map(S3SecretProblem::EncryptionKey)
            }),
    }
}

fn credentials_fact(db: &Database, secret: Option<&Secret>) -> CredentialsFact {
    if !credentials::is_generated(db) {
        return match credentials::check_secret(secret) {
            Ok(()) => CredentialsFact::Usable,
            Err(problem) => CredentialsFact::UserSecretProblem(problem),
        };
    }
    match secret {
        None => CredentialsFact::GeneratedMissing,
        Some(s) => {
            let ours = owner_reference(db)
                .is_some_and(|owner| owned_by(&s.metadata, None, Some(&owner.uid)));
            if ours {
                CredentialsFact::Usable
            } else {
                CredentialsFact::GeneratedOrphaned
            }
        }
    }
}

fn init_job_fact(job: &Job) -> InitJobFact {
    let annotation = |key| {
        job.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
    };
    InitJobFact {
        state: job_state(job),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        sql_digest: annotation(SQL_DIGEST_ANNOTATION),
        generation: annotation(GENERATION_ANNOTATION).and_then(|g| g.parse().ok()),
        config_map: annotation(CONFIG_MAP_ANNOTATION),
    }
}

fn init_source_fact(db: &Database, config_map: Option<&ConfigMap>) -> InitSourceFact {
    let Some(r) = db
        .spec
        .init
        .as_ref()
        .and_then(|i| i.config_map_ref.as_ref())
    else {
        return InitSourceFact::Available;
    };
    match config_map {
        None => InitSourceFact::ConfigMapNotFound {
            name: r.name.clone(),
        },
        Some(cm) if cm.data.as_ref().is_some_and(|d| d.contains_key(&r.key)) => {
            InitSourceFact::Available
        }
        Some(_) => InitSourceFact::KeyNotFound {
            name: r.name.clone(),
            key: r.key.clone(),
        },
    }
}

/// The revision a StatefulSet is rolling its pods to, while it differs from the current one.
pub fn rolling_to(sts: &StatefulSet) -> Option<String> {
    let status = sts.status.as_ref()?;
    let update = status.update_revision.clone()?;
    (status.current_revision.as_ref() != Some(&update)).then_some(update)
}

fn statefulset_fact(sts: &StatefulSet) -> StatefulSetFact {
    let replicas = sts.spec.replicas.unwrap_or(1);
    let status = sts.status.clone().unwrap_or_default();
    let observed_current = match (status.observed_generation, sts.metadata.generation) {
        (Some(observed), Some(generation)) => observed >= generation,
        _ => false,
    };
    let revisions_equal =
        status.current_revision.is_some() && status.current_revision == status.update_revision;
    let rolled_out =
        observed_current && status.updated_replicas.unwrap_or(0) >= replicas && revisions_equal;
    let template_rolling = status.update_revision.is_some() && !revisions_equal;
    StatefulSetFact {
        replicas,
        ready_replicas: status.ready_replicas.unwrap_or(0),
        updated_replicas: status.updated_replicas.unwrap_or(0),
        observed_current,
        rolled_out,
        template_rolling,
        image: template_image(sts),
    }
}

fn volume_fact(db: &Database, pvc: &PersistentVolumeClaim) -> VolumeFact {
    let status = pvc.status.clone().unwrap_or_default();
    let predates_database = match (
        &pvc.metadata.creation_timestamp,
        &db.metadata.creation_timestamp,
    ) {
        (Some(claim), Some(database)) => claim.0 < database.0,
        _ => false,
    };
    VolumeFact {
        bound: status.phase.as_deref() == Some("Bound"),
        predates_database,
        requested: pvc
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone()),
        capacity: status
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone()),
    }
}

#[cfg(test)]
impl Facts {
    /// A Database with nothing made yet and usable credentials: what table tests start from.
    pub fn nothing_made_yet() -> Facts {
        Facts {
            credentials: CredentialsFact::Usable,
            archiver: None,
            init_source: InitSourceFact::Available,
            statefulset: None,
            volume: None,
            storage: Default::default(),
            init_job: None,
            init_sql: None,
            backups: Default::default(),
            bootstrap: None,
            upgrade: Default::default(),
            instance_failure: None,
            unschedulable: None,
            restart: Default::default(),
            template: None,
            stuck_pods: vec![],
            tls: Default::default(),
            roles: Default::default(),
            release: Default::default(),
            accounts: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use crate::settings::Settings;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    #[test]
    fn generated_secret_ours_or_orphaned() {
        let db = testing::minimal();
        assert_eq!(
            credentials_fact(&db, None),
            CredentialsFact::GeneratedMissing
        );
        let mine = credentials::generated_secret(&db, "pw");
        assert_eq!(credentials_fact(&db, Some(&mine)), CredentialsFact::Usable);
        let mut orphan = mine.clone();
        orphan.metadata.owner_references = None;
        assert_eq!(
            credentials_fact(&db, Some(&orphan)),
            CredentialsFact::GeneratedOrphaned
        );
    }

    #[test]
    fn statefulset_rollout_state() {
        let db = testing::minimal();
        let mut sts = crate::resources::statefulset::statefulset(&db, &Settings::default(), None);
        sts.metadata.generation = Some(2);
        sts.status = Some(StatefulSetStatus {
            observed_generation: Some(2),
            ready_replicas: Some(1),
            updated_replicas: Some(1),
            current_revision: Some("r1".into()),
            update_revision: Some("r1".into()),
            replicas: 1,
            ..StatefulSetStatus::default()
        });
        let fact = statefulset_fact(&sts);
        assert!(fact.rolled_out && fact.observed_current && !fact.template_rolling);
        // A pod lost (or a scale-up): fewer updated pods, but no new template.
        sts.status.as_mut().unwrap().updated_replicas = Some(0);
        let lost = statefulset_fact(&sts);
        assert!(!lost.rolled_out && !lost.template_rolling);
        sts.status.as_mut().unwrap().update_revision = Some("r2".into());
        let rolling = statefulset_fact(&sts);
        assert!(!rolling.rolled_out && rolling.template_rolling);
        sts.metadata.generation = Some(3);
        assert!(!statefulset_fact(&sts).observed_current);
    }

    #[test]
    fn a_pod_the_scheduler_cannot_place_is_named_with_its_reason() {
        let pod = |reason: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "orders-0"},
                "status": {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": reason,
                    "message": "0/3 nodes are available: 3 Insufficient memory."}]}
            }))
            .unwrap()
        };
        assert_eq!(
            unschedulable_fact(&pod("Unschedulable")),
            Some(UnschedulableFact {
                pod: "orders-0".into(),
                message: "0/3 nodes are available: 3 Insufficient memory.".into()
            })
        );
        assert_eq!(unschedulable_fact(&pod("SchedulingGated")), None);
        assert_eq!(unschedulable_fact(&Pod::default()), None);
    }

    #[test]
    fn a_crash_looping_pod_names_its_instance_failure() {
        let message = InstanceFailure::NoUserEntry.message("uid 5 has no entry");
        let pod = |state: serde_json::Value, last: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "orders-0"},
                "status": {"containerStatuses": [{
                    "name": "postgres", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 3, "state": state, "lastState": last
                }]}
            }))
            .unwrap()
        };
        let terminated = |m: &str| serde_json::json!({"terminated": {"exitCode": 1, "message": m}});
        let backoff = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let fact = Some(InstanceFailureFact {
            pod: "orders-0".into(),
            failure: InstanceFailure::NoUserEntry,
            message: "uid 5 has no entry".into(),
        });
        // Just exited, and waiting to restart (then the last state holds the message).
        let crashed = pod(terminated(&message), serde_json::json!({}));
        assert_eq!(instance_failure_fact(&crashed), fact);
        let waiting = pod(backoff.clone(), terminated(&message));
        assert_eq!(instance_failure_fact(&waiting), fact);
        let other = pod(backoff.clone(), terminated("initdb failed"));
        assert_eq!(instance_failure_fact(&other), None);
        let running = pod(serde_json::json!({"running": {}}), serde_json::json!({}));
        assert_eq!(instance_failure_fact(&running), None);
        assert_eq!(instance_failure_fact(&Pod::default()), None);

        // Stopped on a full volume: the figures, while it does not run again.
        let then = VolumeUsage {
            size_bytes: 1 << 30,
            free_bytes: 1 << 20,
        };
        let full = InstanceFailure::VolumeFull.message(&then.full_message());
        let waiting = pod(backoff.clone(), terminated(&full));
        assert_eq!(stopped_full(&waiting), Some(("orders-0".into(), then)));
        let ran_since = pod(serde_json::json!({"running": {}}), terminated(&full));
        assert_eq!(stopped_full(&ran_since), None);
        assert_eq!(stopped_full(&pod(backoff, terminated(&message))), None);
    }

    #[test]
    fn init_config_map_checks() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "init": {"configMapRef": {"name": "schema", "key": "init.sql"}}
        }));
        assert_eq!(
            init_source_fact(&db, None),
            InitSourceFact::ConfigMapNotFound {
                name: "schema".into()
            }
        );
        let mut cm = ConfigMap::default();
        assert!(matches!(
            init_source_fact(&db, Some(&cm)),
            InitSourceFact::KeyNotFound { .. }
        ));
        cm.data = Some([("init.sql".to_string(), "select 1".to_string())].into());
        assert_eq!(init_source_fact(&db, Some(&cm)), InitSourceFact::Available);
        assert_eq!(
            init_source_fact(&testing::minimal(), None),
            InitSourceFact::Available
        );
    }
}
