//! Apply: write what `build` built, in its order. Applies only what drifted (server-side
//! apply, one field manager), creates what must only ever be created (the generated Secret,
//! the Jobs, the `DatabaseBackup`s), patches and deletes what the decision says, then writes
//! the status only when it changed and publishes the Events of a transition. Every write goes
//! through `kube_io`.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Resource};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::json;
use tracing::{debug, info};

use super::build::{AccountWrites, BackupWrites, Desired, RoleWrites, TlsWrites};
use super::events::{maintenance_events, release_events, transition_events};
use super::facts::Observed;
use super::init::FailedInitJob;
use super::roles::SECRETS_SEEN_ANNOTATION;
use super::status::Applied;
use crate::api::conditions::{ConditionStatus, ConditionType, find};
use crate::api::{Database, DatabaseBackup, DatabaseStatus, InstanceRole};
use crate::backup::plan::health_events;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kube_io::{
    self, apply_if_drifted, create_once, delete_if_exists, merge_patch, merge_patch_if_exists,
    patch_status,
};
use crate::objects::EventSpec;
use crate::resources::cert_manager::Certificate;
use crate::resources::primary_lease::{self, PROMOTE_ANNOTATION};
use crate::resources::replication::ROLE_LABEL;
use crate::resources::{Names, owner_reference, quantity};
use crate::upgrade::events::upgrade_events;

/// Length of generated passwords: 32 alphanumerics, about 190 bits.
const PASSWORD_LENGTH: usize = 32;

/// Writes `desired`, each object only where it differs from what `snap` read (or, for what is
/// created once, where it does not exist yet).
///
/// `Desired` is destructured without `..`: a new object does not compile until it is written.
pub async fn apply(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    desired: Desired,
) -> Result<Applied> {
    let Desired {
        secret,
        adopt_secret,
        accounts,
        roles,
        network_policy,
        services,
        disruption_budgets,
        server_config,
        statefulset,
        upgrade,
        delete_pods,
        claims_size,
        volume_growth,
        init_job,
        replace_init_job,
        restore_job,
        backups,
        verify_job,
        tls,
    } = desired;
    write_credentials(ctx, db, secret, adopt_secret).await?;
    let mut applied = Applied::default();
    let certificate = write_tls(ctx, db, snap, tls).await?;
    applied.overrides.extend(certificate);
    let ns = db.namespace_or_default();
    write_accounts(ctx, db, accounts).await?;
    write_roles(ctx, db, snap, roles).await?;
    for (name, budget) in disruption_budgets.into_iter().flatten() {
        write_disruption_budget(ctx, db, snap, &name, budget).await?;
    }
    if let Some(policy) = network_policy {
        let condition = write_network_policy(ctx, db, snap, policy).await?;
        applied.overrides.extend(condition);
    }
    write_serving(ctx, db, snap, services, server_config, statefulset).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let backup_api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &ns);
    create_each(&jobs, upgrade.preflight_job).await?;
    create_each(&backup_api, upgrade.pre_upgrade_backup).await?;
    delete_database_pods(ctx, &ns, delete_pods).await?;
    if let Some(size) = claims_size {
        let refused = expand_claims(ctx, db, &snap.data_claims, &size).await?;
        if let Some(note) = volume_growth.filter(|_| refused.is_none()) {
            grown(ctx, db, note).await;
        }
        applied.overrides.extend(refused);
    }
    if let Some(failed) = replace_init_job {
        delete_failed_init_job(ctx, db, &jobs, failed).await?;
    }
    write_jobs(ctx, db, &jobs, init_job, restore_job).await?;
    write_backups(ctx, db, &backup_api, backups).await?;
    create_each(&jobs, verify_job).await?;
    Ok(applied)
}

/// The roles plan's writes, in `RoleWrites`' order: the failover's Event before the Lease that
/// carries it out, the Lease before the labels and the topology the instances read.
async fn write_roles(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    roles: RoleWrites,
) -> Result<()> {
    let RoleWrites {
        instance_access,
        primary_lease,
        primary_lease_carries_over,
        failover_event,
        role_events,
        promotion_answered,
        label_pods,
        refresh_pods,
    } = roles;
    let ns = db.namespace_or_default();
    let lease = DesignatedLease {
        planned: primary_lease,
        observed: snap.primary_lease.as_ref(),
        carries_over: primary_lease_carries_over,
    };
    // The failover's Event before the Lease that carries it out: an operator killed between
    // the two decides the same failover again, and its Event has the same name.
    if let Some(event) = &failover_event {
        kube_io::publish_named(ctx, &db.object_ref(&()), "Reconcile", event).await;
    }
    write_primary_lease(ctx, &ns, instance_access, lease).await?;
    for event in &role_events {
        publish(ctx, db, event).await;
    }
    if promotion_answered {
        let api: Api<Database> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"metadata": {"annotations": {PROMOTE_ANNOTATION: null}}});
        merge_patch_if_exists(&api, &db.name(), &patch).await?;
    }
    label_instances(ctx, &ns, label_pods).await?;
    refresh_secret_volumes(ctx, &ns, refresh_pods).await?;
    Ok(())
}

/// Creates the object, if any, unless it exists.
async fn create_each<K>(api: &Api<K>, object: Option<K>) -> Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match object {
        Some(object) => create_once(api, &object).await,
        None => Ok(()),
    }
}

/// The replication role's and the application's Secrets (created once), the accounts Secret
/// (where it drifted), and the Event of a role password that could not be read.
async fn write_accounts(ctx: &Context, db: &Database, accounts: AccountWrites) -> Result<()> {
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &db.namespace_or_default());
    if let Some(secret) = accounts.replication_secret {
        create_once(&secrets, &secret).await?;
        info!(secret = ?secret.metadata.name, "made the replication role's Secret");
    }
    if let Some(secret) = accounts.application_secret {
        create_once(&secrets, &secret).await?;
        info!(secret = ?secret.metadata.name, "made the application's Secret");
    }
    if let Some(secret) = accounts.accounts_secret {
        apply_if_drifted(&secrets, &secret, None).await?;
        info!(secret = ?secret.metadata.name, "wrote the accounts the instances keep");
    }
    if let Some(event) = accounts.accounts_event {
        publish(ctx, db, &event).await;
    }
    Ok(())
}

/// Deletes the database pods the decision replaces (held back on an earlier revision, stopped
/// on a volume that grew, rolled back by a release).
async fn delete_database_pods(ctx: &Context, ns: &str, names: Vec<String>) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for name in names {
        if delete_if_exists(&pods, &name, &DeleteParams::default()).await? {
            info!(pod = %name, "deleted a database pod held back on an earlier revision");
        }
    }
    Ok(())
}

/// What serves the database, where it drifted: the Services, the server configuration (before
/// the StatefulSet: a new pod finds its parameters at its first start), the StatefulSet.
async fn write_serving(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    services: Vec<Service>,
    server_config: Option<ConfigMap>,
    statefulset: Option<StatefulSet>,
) -> Result<()> {
    let ns = db.namespace_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    for service in services {
        let observed = snap
            .services
            .iter()
            .find(|s| s.metadata.name == service.metadata.name);
        apply_if_drifted(&api, &service, observed).await?;
    }
    if let Some(desired) = server_config {
        let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
        apply_if_drifted(&api, &desired, snap.server_config.as_ref()).await?;
    }
    if let Some(desired) = statefulset {
        let api = Api::namespaced(ctx.client.clone(), &ns);
        apply_if_drifted(&api, &desired, snap.statefulset.as_ref()).await?;
    }
    Ok(())
}

/// The PodDisruptionBudget `name` where it drifted, or deleted once the Database has one
/// instance.
async fn write_disruption_budget(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    name: &str,
    budget: Option<PodDisruptionBudget>,
) -> Result<()> {
    let api: Api<PodDisruptionBudget> =
        Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let observed = snap.disruption_budgets.get(name);
    match budget {
        Some(budget) => apply_if_drifted(&api, &budget, observed).await,
        None if observed.is_some() => {
            if delete_if_exists(&api, name, &DeleteParams::default()).await? {
                info!(budget = %name, "deleted a disruption budget of a single instance");
            }
            Ok(())
        }
        None => Ok(()),
    }
}

/// The NetworkPolicy where it drifted, or deleted once the spec no longer asks for it. When
/// the API server refuses it (a peer the schema could not judge), `NetworkPolicyReady` False
/// (over decide's True) and a Warning Event: the policy in place, if any, stays, and the pass
/// goes on.
async fn write_network_policy(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    policy: Option<NetworkPolicy>,
) -> Result<Option<ConditionStatus>> {
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let Some(policy) = policy else {
        if snap.network_policy.is_some() {
            let name = db.name();
            if delete_if_exists(&api, &name, &DeleteParams::default()).await? {
                info!(policy = %name, "deleted the NetworkPolicy the spec no longer asks for");
            }
        }
        return Ok(None);
    };
    let name = policy.metadata.name.clone().unwrap_or_default();
    match apply_if_drifted(&api, &policy, snap.network_policy.as_ref()).await {
        Ok(()) => Ok(None),
        Err(crate::error::Error::Kube(kube::Error::Api(status))) if status.code == 422 => {
            let message = format!(
                "the API server refused NetworkPolicy {name}: {}; fix spec.networkPolicy (the policy in place, if any, is kept)",
                status.message
            );
            let refused = (ConditionType::NetworkPolicyReady, "NetworkPolicyRefused");
            Ok(Some(refusal(ctx, db, refused, message).await))
        }
        Err(e) => Err(e),
    }
}

/// The primary Lease a pass writes: the one it plans, the one it read, and whether the plan
/// survives a renewal by the same holder (`primary_lease::carried_over`).
struct DesignatedLease<'a> {
    planned: Option<Lease>,
    observed: Option<&'a Lease>,
    carries_over: bool,
}

/// The instances' access (once), then the primary Lease: created, or replaced with its
/// `resourceVersion`. A renewal in between makes it a conflict: a designation that survives
/// renewals is carried onto the Lease as it is now and written once more; any other conflict,
/// or a failover's, tries the pass again.
async fn write_primary_lease(
    ctx: &Context,
    ns: &str,
    access: Option<(ServiceAccount, Role, RoleBinding)>,
    lease: DesignatedLease<'_>,
) -> Result<()> {
    if let Some((account, role, binding)) = access {
        create_once(&Api::namespaced(ctx.client.clone(), ns), &account).await?;
        create_once(&Api::namespaced(ctx.client.clone(), ns), &role).await?;
        create_once(&Api::namespaced(ctx.client.clone(), ns), &binding).await?;
    }
    let Some(planned) = lease.planned else {
        return Ok(());
    };
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    let name = planned.metadata.name.clone().unwrap_or_default();
    if planned.metadata.resource_version.is_none() {
        create_once(&api, &planned).await?;
        info!(lease = %name, "made the primary Lease");
    } else {
        match kube_io::replace(&api, &name, &planned).await {
            Err(Error::Kube(kube::Error::Api(status)))
                if status.code == 409 && lease.carries_over =>
            {
                let fresh = api.get(&name).await?;
                let carried = lease
                    .observed
                    .and_then(|observed| primary_lease::carried_over(observed, &planned, &fresh));
                let Some(carried) = carried else {
                    return Err(Error::Kube(kube::Error::Api(status)));
                };
                kube_io::replace(&api, &name, &carried).await?;
            }
            written => written?,
        }
        info!(lease = %name, "designated the primary in the primary Lease");
    }
    Ok(())
}

/// Tells each pod the versions of the Secrets it mounts: the pod's update makes the kubelet
/// re-sync its Secret volumes at once.
async fn refresh_secret_volumes(
    ctx: &Context,
    ns: &str,
    pods: Vec<(String, String)>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for (name, versions) in pods {
        let patch = json!({"metadata": {"annotations": {SECRETS_SEEN_ANNOTATION: versions}}});
        if merge_patch_if_exists(&api, &name, &patch).await? {
            debug!(pod = %name, "told the pod its Secrets' versions (its volumes re-sync)");
        }
    }
    Ok(())
}

async fn label_instances(ctx: &Context, ns: &str, pods: Vec<(String, InstanceRole)>) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for (name, role) in pods {
        let patch = json!({"metadata": {"labels": {ROLE_LABEL: role.label()}}});
        if merge_patch_if_exists(&api, &name, &patch).await? {
            info!(pod = %name, role = role.label(), "labelled the instance's role");
        }
    }
    Ok(())
}

/// The failed init Job whose SQL changed since (only that Job: its uid is the precondition),
/// then the ConfigMap of its SQL. The next pass finds no init Job and makes one.
async fn delete_failed_init_job(
    ctx: &Context,
    db: &Database,
    jobs: &Api<Job>,
    failed: FailedInitJob,
) -> Result<()> {
    let name = Names::of(db).init_job();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(failed.uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match delete_if_exists(jobs, &name, &params).await {
        Ok(deleted) => {
            info!(job = %name, deleted, "the init SQL changed since its Job failed: replacing the Job");
            if deleted {
                let note = format!(
                    "the init SQL changed since init Job {name} failed: deleted it, a new one runs the SQL as the spec has it now"
                );
                let event = EventSpec {
                    warning: false,
                    reason: "InitRetrying".into(),
                    note,
                };
                publish(ctx, db, &event).await;
            }
        }
        // Another Job has its name already: the one made in its place.
        Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(config_map) = failed.config_map {
        let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &db.namespace_or_default());
        delete_if_exists(&api, &config_map, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The init Job (after the ConfigMap of its SQL) and the restore Job (after the data claim a
/// physical recovery writes into), created once.
async fn write_jobs(
    ctx: &Context,
    db: &Database,
    jobs: &Api<Job>,
    init_job: Option<(Option<ConfigMap>, Job)>,
    restore_job: Option<(Option<PersistentVolumeClaim>, Job)>,
) -> Result<()> {
    if let Some((sql, job)) = init_job {
        // The SQL is mounted into the Job's pod as a file: its ConfigMap goes first. It is
        // named by the SQL's digest and immutable: made once, for the Jobs of that SQL.
        if let Some(sql) = sql {
            let config_maps =
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &db.namespace_or_default());
            create_once(&config_maps, &sql).await?;
        }
        create_once(jobs, &job).await?;
    }
    if let Some((claim, job)) = restore_job {
        if let Some(claim) = claim {
            let claims = Api::<PersistentVolumeClaim>::namespaced(
                ctx.client.clone(),
                &db.namespace_or_default(),
            );
            create_once(&claims, &claim).await?;
        }
        create_once(jobs, &job).await?;
    }
    Ok(())
}

/// The generated credentials Secret, created (with the Event that says a Database that ran
/// lost it), or a retained one adopted.
async fn write_credentials(
    ctx: &Context,
    db: &Database,
    secret: Option<(Secret, Option<EventSpec>)>,
    adopt: Option<String>,
) -> Result<()> {
    if let Some((secret, regenerated)) = secret {
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
        create_once(&api, &secret).await?;
        if let Some(event) = regenerated {
            publish(ctx, db, &event).await;
        }
    }
    if let Some(name) = adopt {
        adopt_retained_secret(ctx, db, &name).await?;
    }
    Ok(())
}

/// The CA Secret (created once: a CA is never replaced behind a user's back), the server
/// certificate (applied: a renewal replaces it), the CA into the generated credentials Secret,
/// and the cert-manager Certificate of `spec.tls.issuerRef` (its condition when cert-manager is
/// not installed).
async fn write_tls(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    tls: TlsWrites,
) -> Result<Option<ConditionStatus>> {
    let TlsWrites {
        ca,
        server,
        superuser,
        credentials_ca,
        certificate,
        drop_certificate,
    } = tls;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let refused = write_certificate(ctx, db, snap, certificate, drop_certificate).await?;
    if let Some(ca) = ca {
        create_once(&api, &ca).await?;
        info!(secret = ?ca.metadata.name, "made the Database's CA");
    }
    if let Some(server) = server {
        apply_if_drifted(&api, &server, snap.server_tls_secret.as_ref()).await?;
        info!(secret = ?server.metadata.name, "issued the server certificate");
    }
    if let Some(superuser) = superuser {
        apply_if_drifted(&api, &superuser, None).await?;
        info!(secret = ?superuser.metadata.name, "issued the superuser's client certificate");
    }
    if let Some((name, patch)) = credentials_ca {
        merge_patch(&api, &name, &patch).await?;
        info!(secret = %name, "put the CA's certificate in the credentials Secret");
    }
    Ok(refused)
}

/// The cert-manager Certificate where it drifted, or deleted once the spec no longer names an
/// issuer (its Secret is cert-manager's: deleted with the Certificate where cert-manager runs
/// with `--enable-certificate-owner-ref`; dbop may not delete Secrets). A 404 to its apply is cert-manager's resource missing (an apply
/// creates a missing object): `TLSReady` False with `CertManagerNotInstalled` and a Warning
/// Event, the rest of the pass goes on, and a later pass tries again.
async fn write_certificate(
    ctx: &Context,
    db: &Database,
    snap: &Observed,
    certificate: Option<Certificate>,
    drop: bool,
) -> Result<Option<ConditionStatus>> {
    let ns = db.namespace_or_default();
    let api: Api<Certificate> = Api::namespaced(ctx.client.clone(), &ns);
    let names = Names::of(db);
    if drop {
        // A 404 (the Certificate, or cert-manager itself, gone) is success.
        let gone = delete_if_exists(&api, &names.certificate(), &DeleteParams::default()).await?;
        info!(certificate = %names.certificate(), deleted = gone, "deleted the Certificate spec.tls.issuerRef no longer asks for");
    }
    let Some(certificate) = certificate else {
        return Ok(None);
    };
    match apply_if_drifted(&api, &certificate, snap.certificate.as_ref()).await {
        Ok(()) => Ok(None),
        Err(crate::error::Error::Kube(kube::Error::Api(status))) if status.code == 404 => {
            let message = format!(
                "cert-manager is not installed (the API server has no certificates.cert-manager.io): install cert-manager, or remove spec.tls.issuerRef; dbop applies Certificate {} once it is there",
                names.certificate()
            );
            let missing = (ConditionType::TlsReady, "CertManagerNotInstalled");
            Ok(Some(refusal(ctx, db, missing, message).await))
        }
        Err(e) => Err(e),
    }
}

/// The scheduled `DatabaseBackup` that is due, the ones the history policy drops, and the
/// backup plan's Events.
async fn write_backups(
    ctx: &Context,
    db: &Database,
    backups: &Api<DatabaseBackup>,
    writes: BackupWrites,
) -> Result<()> {
    let BackupWrites {
        scheduled,
        prune,
        events,
    } = writes;
    if let Some(backup) = scheduled {
        create_once(backups, &backup).await?;
    }
    for name in prune {
        if delete_if_exists(backups, &name, &DeleteParams::background()).await? {
            info!(backup = %name, "deleted by the backup history policy");
        }
    }
    for event in &events {
        publish(ctx, db, event).await;
    }
    Ok(())
}

/// Puts our owner reference on a generated Secret kept by an earlier Database (Retain).
async fn adopt_retained_secret(ctx: &Context, db: &Database, name: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let owner = owner_reference(db);
    let patch = json!({"metadata": {"ownerReferences": owner.map(|o| vec![o])}});
    merge_patch(&secrets, name, &patch).await?;
    info!(secret = %name, "adopted the retained credentials Secret");
    Ok(())
}

/// `spec.storage.autoGrow` asked the claims for more: an Event that says why, and the counter.
async fn grown(ctx: &Context, db: &Database, note: String) {
    info!(%note, "data volumes growing");
    ctx.metrics
        .volume_grown((db.namespace_or_default(), db.name()));
    let event = EventSpec {
        warning: false,
        reason: "VolumeGrowing".into(),
        note,
    };
    publish(ctx, db, &event).await;
}

/// Asks every data claim that asks for less to grow to `size`. A StorageClass that refuses is a condition to
/// read (returned) and an Event, not an error loop.
async fn expand_claims(
    ctx: &Context,
    db: &Database,
    data_claims: &[PersistentVolumeClaim],
    size: &str,
) -> Result<Option<ConditionStatus>> {
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
    let mut refused = None;
    let wanted = quantity::bytes(size);
    let requested = |claim: &PersistentVolumeClaim| {
        let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
        quantity::bytes(&requests.get("storage")?.0)
    };
    for claim in data_claims {
        if requested(claim).zip(wanted).is_some_and(|(r, w)| r >= w) {
            continue;
        }
        let name = claim.metadata.name.clone().unwrap_or_default();
        match merge_patch(&claims, &name, &patch).await {
            Ok(_) => info!(claim = %name, %size, "requested volume expansion"),
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 422) => {
                let message = format!(
                    "PersistentVolumeClaim {name} cannot grow to {size}: {}; use a StorageClass with allowVolumeExpansion: true. The volume keeps its current size",
                    status.message
                );
                let condition = (ConditionType::StorageReady, "ExpansionRefused");
                refused = Some(refusal(ctx, db, condition, message).await);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(refused)
}

/// A write the API server refused, which only a change of the spec (or of the cluster) can
/// fix: a Warning Event of `reason`, and the condition False with that reason, to read.
async fn refusal(
    ctx: &Context,
    db: &Database,
    (type_, reason): (ConditionType, &str),
    message: String,
) -> ConditionStatus {
    let event = EventSpec {
        warning: true,
        reason: reason.into(),
        note: message.clone(),
    };
    publish(ctx, db, &event).await;
    ConditionStatus::new(type_, false, reason, message)
}

/// Writes the status if it changed and publishes the transition's Events.
pub async fn update_status(ctx: &Context, db: &Database, status: DatabaseStatus) -> Result<()> {
    let previous = db.status.clone().unwrap_or_default();
    if previous == status {
        return Ok(());
    }
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    patch_status(&api, &db.name(), &status).await?;
    for event in transition_events(&previous, &status)
        .into_iter()
        .chain(upgrade_events(&previous, &status))
        .chain(maintenance_events(&previous, &status))
        .chain(release_events(&previous, &status))
    {
        publish(ctx, db, &event).await;
    }
    let backup_healthy = |s: &DatabaseStatus| {
        find(&s.conditions, ConditionType::BackupHealthy).map(|c| ConditionStatus {
            type_: ConditionType::BackupHealthy,
            status: c.status == "True",
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
    };
    if let Some(new) = backup_healthy(&status) {
        for event in health_events(backup_healthy(&previous).as_ref(), &new) {
            publish(ctx, db, &event).await;
        }
    }
    Ok(())
}

/// Publishes an Event about the Database.
pub async fn publish(ctx: &Context, db: &Database, event: &EventSpec) {
    kube_io::publish(ctx, &[db.object_ref(&())], "Reconcile", event).await;
}

/// A new generated password: 32 alphanumerics.
pub fn new_password() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(PASSWORD_LENGTH)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_long_and_distinct() {
        let a = new_password();
        assert_eq!(a.len(), PASSWORD_LENGTH);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, new_password());
    }
}
