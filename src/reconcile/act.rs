//! Act: carry out a decision. Builds the desired objects, writes only those that drifted
//! (server-side apply, one field manager), creates what must only ever be created (the
//! generated Secret, the init or restore Job), patches status only when it changed, and publishes the
//! Events of a transition.

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::json;
use tracing::info;

use super::bootstrap;
use super::decide::{Decision, Steps};
use super::events::transition_events;
use super::observe::Snapshot;
use crate::api::conditions::{ConditionStatus, ConditionType, find, merge};
use crate::api::{BackupReason, Database, DatabaseBackup, DatabaseBackupSpec, DatabaseStatus};
use crate::backup::plan::health_events;
use crate::context::Context;
use crate::error::Result;
use crate::kube_io::{self, EventSpec, apply_if_drifted, create_once, patch_status};
use crate::resources::credentials::{generated_secret, secret_name};
use crate::resources::init_job::{init_job, init_sql_config_map};
use crate::resources::preflight_job::preflight_job;
use crate::resources::restore_job::restore_job;
use crate::resources::services::{headless, read_write};
use crate::resources::statefulset::{PodRun, statefulset_running};
use crate::resources::{Names, owned_meta, owner_reference};
use crate::upgrade::events::upgrade_events;

/// Length of generated passwords: 32 alphanumerics, about 190 bits.
const PASSWORD_LENGTH: usize = 32;

/// Carries out the decision's steps against the cluster. Returns the conditions that what
/// happened overrides (e.g. a volume expansion the StorageClass refused).
///
/// `Steps` is destructured without `..`: a new step does not compile until it is carried out.
pub async fn apply_steps(
    ctx: &Context,
    db: &Database,
    snap: &Snapshot,
    decision: &Decision,
) -> Result<Vec<ConditionStatus>> {
    let Steps {
        create_secret,
        adopt_secret,
        apply_services,
        apply_statefulset,
        expand_volumes,
        create_init_job,
        create_restore_job,
        create_preflight_job,
        create_pre_upgrade_backup,
        delete_pods,
    } = &decision.steps;
    let ns = db.namespace_or_default();
    let client = &ctx.client;
    if *create_secret {
        create_generated_secret(ctx, db).await?;
    }
    if *adopt_secret {
        adopt_retained_secret(ctx, db).await?;
    }
    if *apply_services {
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        apply_if_drifted(&services, &headless(db), snap.headless_service.as_ref()).await?;
        apply_if_drifted(&services, &read_write(db), snap.rw_service.as_ref()).await?;
    }
    if *apply_statefulset {
        apply_statefulset_of(ctx, db, snap.statefulset.as_ref(), &decision.pod_run).await?;
    }
    upgrade_steps(
        ctx,
        db,
        create_preflight_job,
        create_pre_upgrade_backup,
        delete_pods,
        decision,
    )
    .await?;
    let mut overrides = Vec::new();
    if let Some(size) = expand_volumes {
        overrides.extend(expand_claims(ctx, db, &snap.data_claims, size).await?);
    }
    if *create_init_job && let Some(job) = init_job(db, &ctx.settings) {
        // The SQL is mounted into the Job's pod as a file: its ConfigMap goes first.
        if let Some(sql) = init_sql_config_map(db) {
            create_once(&Api::<ConfigMap>::namespaced(client.clone(), &ns), &sql).await?;
        }
        create_once(&Api::<Job>::namespaced(client.clone(), &ns), &job).await?;
    }
    // The source was checked by decide; read again from the same snapshot to build the Job.
    if *create_restore_job && let Ok(source) = bootstrap::source(db, &snap.restore) {
        let job = restore_job(db, &source, &ctx.settings);
        create_once(&Api::<Job>::namespaced(client.clone(), &ns), &job).await?;
    }
    Ok(overrides)
}

/// Applies the StatefulSet, keeping the claim templates it has (they are immutable).
async fn apply_statefulset_of(
    ctx: &Context,
    db: &Database,
    observed: Option<&StatefulSet>,
    run: &PodRun,
) -> Result<()> {
    let statefulsets: Api<StatefulSet> =
        Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let existing_claims = observed.and_then(|s| s.spec.volume_claim_templates.clone());
    let desired = statefulset_running(db, &ctx.settings, existing_claims, run);
    apply_if_drifted(&statefulsets, &desired, observed).await
}

/// The upgrade's writes: its preflight Job and its pre-upgrade backup (each created once, under
/// a name derived from the upgrade's start), and the deletion of pods stuck on a rolled-back image.
async fn upgrade_steps(
    ctx: &Context,
    db: &Database,
    preflight: &Option<String>,
    backup: &Option<String>,
    delete_pods: &[String],
    decision: &Decision,
) -> Result<()> {
    let ns = db.namespace_or_default();
    let upgrade = decision.upgrade.as_ref();
    if let (Some(name), Some(u)) = (preflight, upgrade) {
        let job = preflight_job(db, &ctx.settings, name, &u.to_image, &u.to);
        create_once(&Api::<Job>::namespaced(ctx.client.clone(), &ns), &job).await?;
    }
    if let Some(name) = backup {
        let backup = DatabaseBackup {
            metadata: owned_meta(db, name.clone(), "backup"),
            spec: DatabaseBackupSpec {
                database: db.name(),
                reason: BackupReason::PreUpgrade,
            },
            status: None,
        };
        create_once(
            &Api::<DatabaseBackup>::namespaced(ctx.client.clone(), &ns),
            &backup,
        )
        .await?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for name in delete_pods {
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => info!(pod = %name, "deleted a pod stuck on the image being rolled back"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Creates the generated credentials Secret; says so when a server that ran lost it.
async fn create_generated_secret(ctx: &Context, db: &Database) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    create_once(&secrets, &generated_secret(db, &new_password())).await?;
    if db
        .status
        .as_ref()
        .is_some_and(|s| s.current_version.is_some())
    {
        // The instance manager sets the server's password from the mounted Secret when the
        // kubelet updates the volume; clients holding the old password fail until they reread it.
        let note = format!(
            "the credentials Secret {} was deleted and has been generated again with a new password; \
             the server takes the new password within about a minute: clients must read it again (see docs/runbooks.md)",
            secret_name(db)
        );
        let event = EventSpec {
            warning: true,
            reason: "CredentialsRegenerated".into(),
            note,
        };
        publish(ctx, db, &event).await;
    }
    Ok(())
}

/// Puts our owner reference on a generated Secret kept by an earlier Database (Retain).
async fn adopt_retained_secret(ctx: &Context, db: &Database) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    let owner = owner_reference(db);
    let patch = json!({"metadata": {"ownerReferences": owner.map(|o| vec![o])}});
    secrets
        .patch(
            &secret_name(db),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    info!(secret = %secret_name(db), "adopted the retained credentials Secret");
    Ok(())
}

/// Asks every data claim to grow to `size`. A StorageClass that refuses is a condition to
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
    for claim in data_claims {
        let name = claim.metadata.name.clone().unwrap_or_default();
        match claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => info!(claim = %name, %size, "requested volume expansion"),
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 422) => {
                let message = format!(
                    "PersistentVolumeClaim {name} cannot grow to {size}: {}; use a StorageClass with allowVolumeExpansion: true. The volume keeps its current size",
                    status.message
                );
                let event = EventSpec {
                    warning: true,
                    reason: "ExpansionRefused".into(),
                    note: message.clone(),
                };
                publish(ctx, db, &event).await;
                refused = Some(ConditionStatus::new(
                    ConditionType::StorageReady,
                    false,
                    "ExpansionRefused",
                    message,
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(refused)
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
        target_version: Some(db.spec.version.clone()),
        endpoint: Some(Names::of(db).endpoint(&db.namespace_or_default())),
        credentials_secret: Some(secret_name(db)),
        backup: match &decision.backup {
            Some(plan) => plan.status.clone(),
            None => previous.backup,
        },
        bootstrap: decision.bootstrap.clone().or(previous.bootstrap),
        // Written by the verification step (`backup::verify`), kept otherwise.
        verification: previous.verification,
        upgrade: decision.upgrade.clone(),
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

/// Creates the due scheduled `DatabaseBackup` and deletes the ones the history policy drops.
pub async fn apply_backups(ctx: &Context, db: &Database, decision: &Decision) -> Result<()> {
    let Some(plan) = &decision.backup else {
        return Ok(());
    };
    let api: Api<DatabaseBackup> = Api::namespaced(ctx.client.clone(), &db.namespace_or_default());
    if let Some(new) = &plan.create {
        let mut meta = owned_meta(db, new.name.clone(), "backup");
        meta.annotations = Some(
            [(
                SCHEDULED_AT_ANNOTATION.to_string(),
                new.scheduled_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )]
            .into(),
        );
        let backup = DatabaseBackup {
            metadata: meta,
            spec: DatabaseBackupSpec {
                database: db.name(),
                reason: BackupReason::Scheduled,
            },
            status: None,
        };
        create_once(&api, &backup).await?;
    }
    for name in &plan.prune {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => info!(backup = %name, "deleted by the backup history policy"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for event in &plan.events {
        publish(ctx, db, event).await;
    }
    Ok(())
}

/// The annotation holding a scheduled backup's due time.
pub const SCHEDULED_AT_ANNOTATION: &str = "dbop.dev/scheduled-at";

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

fn new_password() -> String {
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
    fn a_database_without_backups_loses_an_old_backup_not_configured_condition() {
        use crate::reconcile::observe::{CredentialsFact, Facts, InitSourceFact};
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
        let facts = Facts {
            credentials: CredentialsFact::Usable,
            init_source: InitSourceFact::Available,
            statefulset: None,
            volume: None,
            init_job: None,
            backups: Default::default(),
            bootstrap: None,
            upgrade: Default::default(),
        };
        let decision =
            crate::reconcile::decide::decide(&db, &facts, &crate::resources::Settings::default());
        let status = next_status(&db, &decision, t);
        assert_eq!(find(&status.conditions, ConditionType::BackupHealthy), None);
        assert!(find(&status.conditions, ConditionType::Ready).is_some());
    }

    #[test]
    fn passwords_are_long_and_distinct() {
        let a = new_password();
        assert_eq!(a.len(), PASSWORD_LENGTH);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, new_password());
    }
}
