//! Observe: read the objects a Database owns or refers to (the only reads of a reconcile) into
//! a `Observed` (`facts`), which `Facts::from_observed` reduces to what `decide` needs.
//!
//! The objects dbop owns come from the watch caches (`context::caches`), the user's own objects
//! from the API server. One clock read per pass: `Observed.observed_at`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::Utc;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client};
use tracing::debug;

use super::certificates::Ca;
use super::facts::{ClassFact, Observed, UpgradeObjects};
use super::restore::{self, RestoreObjects};
use super::tls::TlsSteps;
use crate::api::conditions::{self, ConditionType};
use crate::api::{CaSource, Database, DatabaseBackup, TlsSpec};
use crate::context::Context;
use crate::context::caches::{cordoned, get, get_unpacked, list, list_unpacked};
use crate::error::Error;
use crate::kube_io::job_pods;
use crate::objects::{JobState, job_state};
use crate::release::Fleet;
use crate::resources::cert_manager::Certificate;
use crate::resources::credentials::{self};
use crate::resources::primary_lease::has_standbys;
use crate::resources::template_origin;
use crate::resources::tls::{CA_KEY, external_certificate};
use crate::resources::wal_archiving;
use crate::resources::{LABEL_INSTANCE, Names, selector_labels};
use dbop_contract::instance::TLS_CA_FILE;
use dbop_contract::position::{Archiver, Position};
use dbop_contract::volume::VolumeUsage;

/// Reads the upgrade's objects, only while an upgrade is under way (an idle Database reads
/// no pods).
pub async fn upgrade_objects(client: &Client, db: &Database) -> Result<UpgradeObjects, Error> {
    let Some(upgrade) = db
        .status
        .as_ref()
        .and_then(|s| s.upgrade.as_ref())
        .filter(|u| !u.stage.is_finished())
    else {
        return Ok(UpgradeObjects::default());
    };
    let ns = db.namespace_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let database_pods = pods
        .list(&ListParams::default().labels(&pod_selector(db)))
        .await?;
    let (preflight_job, preflight_pods) = match &upgrade.preflight_job {
        Some(name) if upgrade.stage == crate::api::UpgradeStage::Preflight => {
            let job = Api::<Job>::namespaced(client.clone(), &ns)
                .get_opt(name)
                .await?;
            (job, job_pods(client, &ns, name).await?)
        }
        _ => (None, vec![]),
    };
    Ok(UpgradeObjects {
        pods: database_pods.items,
        preflight_job,
        preflight_pods,
    })
}

/// Reads what a pass decides from: what dbop labels from the watch caches, the user's objects (a Secret
/// of their own, the init ConfigMap, the S3 Secret and CA) from the API server. A missing
/// object is `None`, not an error.
pub async fn observe(ctx: &Context, db: &Database) -> Result<Observed, Error> {
    ctx.caches.wait_until_synced().await;
    let (client, caches) = (&ctx.client, &ctx.caches);
    let ns = db.namespace_or_default();
    let names = Names::of(db);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let init_config_map = init_config_map(client, db, &ns).await?;
    let data_claims: Vec<PersistentVolumeClaim> = (0..db.spec.instances.max(1))
        .filter_map(|ordinal| get_unpacked(&caches.claims, &ns, &names.data_pvc(ordinal)))
        .collect();
    let name = db.name();
    let backups = list(&caches.backups, &ns, |b| b.spec.database == name);
    let (s3_secret, s3_ca_problem, encryption_problem) =
        backup_inputs(client, db, &ns, &secrets).await?;
    let restore = restore_objects(client, db).await?;
    let statefulset = get_unpacked(&caches.statefulsets, &ns, &names.statefulset());
    let instance_pods = instance_pods(ctx, &ns, &names);
    // The Lease before the positions: a primary releases it, or lets it run out, only after its
    // server stopped or fenced itself, so positions read after a Lease that says so are final —
    // a failover then compares every standby's last WAL, not a read from before the last of it.
    let primary_lease = get(&caches.leases, &ns, &names.primary_lease());
    // The Lease is judged as of its read: the positions below may take seconds, and a `now` from
    // after them made a renewing primary look lost.
    let observed_at = Utc::now();
    let (positions, archiver, volumes) = instances_report(db, &instance_pods).await;
    let storage_class = match class_worth_reading(db, &volumes) {
        true => storage_class(client, db, &data_claims).await,
        false => ClassFact::Unknown,
    };
    Ok(Observed {
        restore,
        backups,
        s3_secret,
        s3_ca_problem,
        encryption_problem,
        observed_at,
        credentials_secret: credentials_secret(ctx, db, &ns).await?,
        ca_secret: secret_metadata(ctx, &ns, &names.ca_secret()),
        server_tls_secret: secret_metadata(ctx, &ns, &names.server_tls_secret()),
        superuser_tls_secret: secret_metadata(ctx, &ns, &names.superuser_tls_secret()),
        own_certificate: match external_certificate(db) {
            Some((name, _)) => secrets.get_opt(&name).await?,
            None => None,
        },
        certificate: certificate(client, db, &ns, &names).await?,
        init_config_map,
        server_config: get_unpacked(
            &caches.config_maps,
            &ns,
            &crate::resources::server_config::config_map_name(db),
        ),
        services: services(ctx, &ns, &names),
        cordoned_nodes: cordoned_nodes(ctx, &instance_pods),
        release_fleet: release_fleet(ctx, statefulset.as_ref()),
        instance_pods,
        positions,
        archiver,
        volumes,
        storage_class,
        replication_secret: secret_metadata(ctx, &ns, &names.replication_secret()),
        application_secret: secret_metadata(ctx, &ns, &names.application_secret()),
        accounts_secret: secret_metadata(ctx, &ns, &names.accounts_secret()),
        role_password_secrets: role_password_secrets(&secrets, db).await?,
        primary_lease,
        disruption_budgets: disruption_budgets(ctx, &ns, &names),
        network_policy: get_unpacked(&caches.network_policies, &ns, &names.statefulset()),
        database_pods: database_pods(client, db, statefulset.as_ref()).await?,
        statefulset,
        init_job: get_unpacked(&caches.jobs, &ns, &names.init_job()),
        data_claims,
        upgrade: upgrade_objects(client, db).await?,
    })
}

/// The init ConfigMap `spec.init.configMapRef` names, when it exists.
async fn init_config_map(
    client: &Client,
    db: &Database,
    ns: &str,
) -> Result<Option<ConfigMap>, Error> {
    let Some(r) = (db.spec.init.as_ref()).and_then(|i| i.config_map_ref.as_ref()) else {
        return Ok(None);
    };
    Ok(Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(&r.name)
        .await?)
}

/// What backups need from the user: the S3 credentials Secret, and what is wrong with the S3
/// CA and the encryption key, when something is.
async fn backup_inputs(
    client: &Client,
    db: &Database,
    ns: &str,
    secrets: &Api<Secret>,
) -> Result<(Option<Secret>, Option<String>, Option<String>), Error> {
    let Some(spec) = &db.spec.backup else {
        return Ok((None, None, None));
    };
    let s3_secret = match &spec.s3.credentials {
        Some(credentials) => secrets.get_opt(&credentials.secret_name).await?,
        None => None,
    };
    let ca_problem = crate::backup::ca::read_problem(client, ns, spec).await?;
    let encryption_problem =
        crate::backup::encryption::read_problem(client, ns, spec.encryption.as_ref()).await?;
    Ok((s3_secret, ca_problem, encryption_problem))
}

/// The cert-manager Certificate, when `spec.tls` names an issuer.
async fn certificate(
    client: &Client,
    db: &Database,
    ns: &str,
    names: &Names,
) -> Result<Option<Certificate>, Error> {
    if TlsSpec::issuer(db.spec.tls.as_ref()).is_none() {
        return Ok(None);
    }
    Ok(Api::<Certificate>::namespaced(client.clone(), ns)
        .get_opt(&names.certificate())
        .await?)
}

/// The Database's PodDisruptionBudgets that exist, by name.
fn disruption_budgets(
    ctx: &Context,
    ns: &str,
    names: &Names,
) -> BTreeMap<String, PodDisruptionBudget> {
    [names.standby_budget(), names.primary_budget()]
        .into_iter()
        .filter_map(|n| {
            Some((
                n.clone(),
                get_unpacked(&ctx.caches.disruption_budgets, ns, &n)?,
            ))
        })
        .collect()
}

/// What the instance managers report: each instance's WAL position (with standbys), the
/// primary's archiver (a Database that archives its WAL without standbys reads its one
/// position for it), and the data volumes' usage (for autoGrow, and for naming WAL that cannot
/// be archived as what fills one).
async fn instances_report(
    db: &Database,
    instance_pods: &[Pod],
) -> (
    BTreeMap<String, Position>,
    Option<Archiver>,
    BTreeMap<String, VolumeUsage>,
) {
    let archiving = wal_archiving::enabled(db).is_some();
    let mut positions = match has_standbys(db) || archiving {
        true => super::positions::read(instance_pods).await,
        false => Default::default(),
    };
    let archiver = positions
        .values()
        .find(|p| !p.standby)
        .and_then(|p| p.archiver.clone());
    if !has_standbys(db) {
        positions.clear();
    }
    let volumes = match db.spec.storage.auto_grow.is_some() || archiving {
        true => super::positions::volumes(instance_pods).await,
        false => Default::default(),
    };
    (positions, archiver, volumes)
}

/// Whether a pass of a Database with autoGrow reads its StorageClass: until `StorageAutoGrow`
/// has a verdict, while it says the class cannot expand (to see it fixed), and when a growth
/// may be due (a volume past the threshold, or none answering: a server stopped on a full one
/// does not). Not in every pass: a fleet's reads would cost the API server one GET per
/// Database every 30 s for a class that rarely changes.
fn class_worth_reading(db: &Database, volumes: &BTreeMap<String, VolumeUsage>) -> bool {
    let Some(spec) = &db.spec.storage.auto_grow else {
        return false;
    };
    let verdict = db
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, ConditionType::StorageAutoGrow));
    verdict.is_none_or(|c| c.reason == "CannotExpand")
        || volumes.is_empty()
        || volumes
            .values()
            .any(|u| u.used_percent() >= spec.threshold())
}

/// Whether the data claims' StorageClass (the spec's, or the one the first claim got) allows
/// expansion. What cannot be read (no class named yet, no permission in watchNamespaces mode, an
/// API error) is `Unknown`: the first growth then tells.
async fn storage_class(
    client: &Client,
    db: &Database,
    claims: &[PersistentVolumeClaim],
) -> ClassFact {
    let named = db.spec.storage.storage_class_name.clone().or_else(|| {
        claims
            .first()
            .and_then(|c| c.spec.as_ref()?.storage_class_name.clone())
    });
    let Some(name) = named.filter(|n| !n.is_empty()) else {
        return ClassFact::Unknown;
    };
    match Api::<StorageClass>::all(client.clone())
        .get_opt(&name)
        .await
    {
        Ok(Some(class)) if class.allow_volume_expansion == Some(true) => ClassFact::Expands,
        Ok(found) => ClassFact::CannotExpand {
            missing: found.is_none(),
            name,
        },
        Err(error) => {
            debug!(class = %name, %error, "cannot read the StorageClass");
            ClassFact::Unknown
        }
    }
}

/// The Database's Services that exist (headless, `-rw`, `-ro`, `-r`), from the cache.
fn services(ctx: &Context, ns: &str, names: &Names) -> Vec<Service> {
    [
        names.headless_service(),
        names.rw_service(),
        names.ro_service(),
        names.r_service(),
    ]
    .iter()
    .filter_map(|name| get_unpacked(&ctx.caches.services, ns, name))
    .collect()
}

/// The database pods of the Database `names` names, from the cache (slimmed: role label, node,
/// readiness): its StatefulSet's pods (by name) that carry its instance label.
fn instance_pods(ctx: &Context, ns: &str, names: &Names) -> Vec<Pod> {
    let of_statefulset = |pod: &str| names.ordinal_of(pod).is_some();
    list_unpacked(&ctx.caches.pods, ns, of_statefulset, |p| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_INSTANCE))
            .is_some_and(|i| i == names.database())
    })
}

/// The nodes of `pods` that are cordoned, from the cache.
fn cordoned_nodes(ctx: &Context, pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .filter(|node| cordoned(&ctx.caches.nodes, node))
        .collect()
}

/// The database pods, only while the StatefulSet has fewer ready pods than it wants (a
/// serving Database reads no pods).
async fn database_pods(
    client: &Client,
    db: &Database,
    statefulset: Option<&StatefulSet>,
) -> Result<Vec<Pod>, Error> {
    let short = statefulset.is_some_and(|sts| {
        let ready = sts.status.as_ref().and_then(|s| s.ready_replicas);
        ready.unwrap_or(0) < sts.spec.replicas.unwrap_or(1)
    });
    if !short {
        return Ok(vec![]);
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &db.namespace_or_default());
    let list = pods
        .list(&ListParams::default().labels(&pod_selector(db)))
        .await?;
    Ok(list.items)
}

/// The label selector of `db`'s database pods.
fn pod_selector(db: &Database) -> String {
    selector_labels(&db.name())
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Database's CA with its key, read from its Secret when the pass's TLS steps sign or
/// copy its certificate (None: there is none yet, or the steps need none).
pub async fn signing_ca(
    ctx: &Context,
    db: &Database,
    steps: &TlsSteps,
) -> Result<Option<Ca>, Error> {
    // The user's own certificate: no CA of dbop's to read.
    let own = external_certificate(db).is_some();
    if own || steps.create_ca || (steps.issue.is_none() && !steps.credentials_ca) {
        return Ok(None);
    }
    let name = Names::of(db).ca_secret();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &db.namespace_or_default())
        .get_opt(&name)
        .await?;
    let data = secret.and_then(|s| s.data).unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|t| !t.is_empty())
    };
    match (text(TLS_CA_FILE), text(CA_KEY)) {
        (Some(cert_pem), Some(key_pem)) => Ok(Some(Ca { cert_pem, key_pem })),
        _ => Err(Error::Certificate(format!(
            "Secret {name} has no ca.crt and ca.key: delete it and dbop makes a new CA (clients must then trust the new ca.crt)"
        ))),
    }
}

/// One of dbop's own Secrets from the cache: metadata only (its annotations say what a pass
/// needs; the data is never held).
fn secret_metadata(ctx: &Context, ns: &str, name: &str) -> Option<Secret> {
    get_unpacked(&ctx.caches.secrets, ns, name).map(|meta| Secret {
        metadata: meta.metadata,
        ..Secret::default()
    })
}

/// The Secrets the declared roles' passwords come from (the user's: dbop does not watch them).
async fn role_password_secrets(
    secrets: &Api<Secret>,
    db: &Database,
) -> Result<Vec<Option<Secret>>, Error> {
    let mut found = Vec::new();
    for source in crate::resources::accounts::password_sources(db) {
        found.push(match source {
            Some(key) => secrets.get_opt(&key.name).await?,
            None => None,
        });
    }
    Ok(found)
}

/// The application's password, for a pass that rebuilds the accounts Secret: the one just
/// made, or the one in `<name>-app` (read in full only then: the cache holds metadata).
pub async fn application_password(
    ctx: &Context,
    db: &Database,
    made: Option<&str>,
) -> Result<Option<String>, Error> {
    if let Some(password) = made {
        return Ok(Some(password.to_string()));
    }
    let name = Names::of(db).application_secret();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &db.namespace_or_default())
        .get_opt(&name)
        .await?;
    Ok(super::accounts::password(secret.as_ref(), "password")
        .and_then(|p| String::from_utf8(p).ok()))
}

/// The credentials Secret: a generated one from the cache, metadata only (its owner is all
/// `decide` looks at: its data is never read); the user's own from the API server (its
/// password key is checked, and dbop does not watch the user's Secrets).
async fn credentials_secret(
    ctx: &Context,
    db: &Database,
    ns: &str,
) -> Result<Option<Secret>, Error> {
    let name = credentials::secret_name(db);
    if credentials::is_generated(db) {
        return Ok(secret_metadata(ctx, ns, &name));
    }
    Ok(Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(&name)
        .await?)
}

/// Reads what a restore from a backup needs: the restore Job (and its pods once it ended), the
/// named `DatabaseBackup` and its Database, the S3 credentials Secret and CA source. Nothing
/// once the Database is initialised: then the restore is history.
async fn restore_objects(client: &Client, db: &Database) -> Result<RestoreObjects, Error> {
    let Some(bootstrap) = &db.spec.bootstrap else {
        return Ok(RestoreObjects::default());
    };
    let initialized = db
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, ConditionType::Initialized));
    if initialized {
        return Ok(RestoreObjects::default());
    }
    let ns = db.namespace_or_default();
    let from = &bootstrap.from_backup;
    let mut snap = RestoreObjects::default();
    if let Some(name) = &from.database_backup {
        snap.backup = Api::<DatabaseBackup>::namespaced(client.clone(), &ns)
            .get_opt(name)
            .await?;
        if let Some(b) = &snap.backup {
            snap.source_database = Api::<Database>::namespaced(client.clone(), &ns)
                .get_opt(&b.spec.database)
                .await?;
        }
    }
    if let Some(s3) = restore::source_s3(from, &snap).cloned() {
        if let Some(credentials) = &s3.credentials {
            snap.s3_secret = Api::<Secret>::namespaced(client.clone(), &ns)
                .get_opt(&credentials.secret_name)
                .await?;
        }
        snap.ca_problem = match &s3.ca {
            Some(ca) => crate::backup::ca::problem(ca, ca_found(client, &ns, ca).await?),
            None => None,
        };
    }
    snap.job = Api::<Job>::namespaced(client.clone(), &ns)
        .get_opt(&Names::of(db).restore_job())
        .await?;
    if snap
        .job
        .as_ref()
        .is_some_and(|j| job_state(j) != JobState::Running)
    {
        snap.pods = job_pods(client, &ns, &Names::of(db).restore_job()).await?;
    }
    Ok(snap)
}

/// Whether the CA source's object exists (`None` if not) and has a non-empty value at its key.
async fn ca_found(client: &Client, ns: &str, ca: &CaSource) -> Result<Option<bool>, Error> {
    if let Some(r) = &ca.secret_key_ref {
        let secret = Api::<Secret>::namespaced(client.clone(), ns)
            .get_opt(&r.name)
            .await?;
        return Ok(secret.map(|s| {
            s.data
                .unwrap_or_default()
                .get(&r.key)
                .is_some_and(|v| !v.0.is_empty())
        }));
    }
    if let Some(r) = &ca.config_map_key_ref {
        let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(&r.name)
            .await?;
        return Ok(cm.map(|c| {
            c.data
                .unwrap_or_default()
                .get(&r.key)
                .is_some_and(|v| !v.is_empty())
                || c.binary_data.unwrap_or_default().contains_key(&r.key)
        }));
    }
    Ok(None)
}

/// Where every Database stands in this operator's release: the StatefulSets' markers in the
/// cache, and the turns this process granted that the cache does not show yet. Read only for a
/// Database whose pods another operator built: the release decides nothing about the others,
/// and a pass of every Database need not look at every other one.
fn release_fleet(ctx: &Context, statefulset: Option<&StatefulSet>) -> Fleet {
    let release = template_origin::builder(&ctx.settings);
    let record = statefulset.map(template_origin::TemplateRecord::of);
    if record.is_none_or(|r| r.built_by.as_deref() == Some(release.as_str())) {
        return Fleet::default();
    }
    let statefulsets = ctx.caches.statefulsets.state();
    let metadata: Vec<_> = statefulsets.iter().filter_map(|s| s.partial()).collect();
    let mut fleet = Fleet::of(&metadata, &release);
    let pending = ctx.release_turns.pending(&fleet);
    fleet.rolling.extend(pending);
    fleet
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{ConditionStatus, merge};
    use crate::resources::testing;

    /// The class is read until there is a verdict, while the verdict is CannotExpand, and when a
    /// growth may be due; not in the steady passes between.
    #[test]
    fn the_class_is_read_only_when_its_answer_can_matter() {
        let mut db = testing::minimal();
        let usage = |used: u64| {
            BTreeMap::from([(
                "orders-0".to_string(),
                VolumeUsage {
                    size_bytes: 100,
                    free_bytes: 100 - used,
                },
            )])
        };
        assert!(!class_worth_reading(&db, &usage(99)));
        db.spec.storage.auto_grow =
            serde_json::from_value(serde_json::json!({"maximum": "9Gi"})).unwrap();
        assert!(class_worth_reading(&db, &usage(10)));
        let verdict = |reason: &str| {
            let c = ConditionStatus::new(ConditionType::StorageAutoGrow, true, reason, "m");
            Some(crate::api::DatabaseStatus {
                conditions: merge(&[], &[c], Some(1), chrono::DateTime::UNIX_EPOCH),
                ..Default::default()
            })
        };
        db.status = verdict("Watching");
        assert!(!class_worth_reading(&db, &usage(10)));
        assert!(class_worth_reading(&db, &usage(80)));
        assert!(class_worth_reading(&db, &BTreeMap::new()));
        db.status = verdict("CannotExpand");
        assert!(class_worth_reading(&db, &usage(10)));
    }
}
