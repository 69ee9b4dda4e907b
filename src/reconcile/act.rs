//! Act: carry out a decision. Builds the desired objects, writes only those that drifted
//! (server-side apply, one field manager), creates what must only ever be created (the
//! generated Secret, the init Job), patches status only when it changed, and publishes the
//! Events of a transition.

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Event;
use kube::{Api, Resource};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::info;

use super::decide::Decision;
use super::drift::needs_apply;
use super::events::{EventSpec, transition_events};
use super::observe::Snapshot;
use crate::FIELD_MANAGER;
use crate::api::conditions::{ConditionStatus, ConditionType, find, merge};
use crate::api::{BackupReason, Database, DatabaseBackup, DatabaseBackupSpec, DatabaseStatus};
use crate::backup::plan::health_events;
use crate::controller::Context;
use crate::error::{Error, Result};
use crate::resources::credentials::{generated_secret, secret_name};
use crate::resources::init_job::{init_job, init_sql_config_map};
use crate::resources::services::{headless, read_write};
use crate::resources::statefulset::statefulset;
use crate::resources::{Names, owned_meta, owner_reference};

/// Length of generated passwords: 32 alphanumerics, about 190 bits.
const PASSWORD_LENGTH: usize = 32;

/// Carries out the decision's steps against the cluster. Returns the conditions that what
/// happened overrides (e.g. a volume expansion the StorageClass refused).
pub async fn apply_steps(
    ctx: &Context,
    db: &Database,
    snap: &Snapshot,
    decision: &Decision,
) -> Result<Vec<ConditionStatus>> {
    let ns = db.namespace_or_default();
    let client = &ctx.client;
    let steps = &decision.steps;
    let mut overrides = Vec::new();

    if steps.create_secret {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
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
            publish(
                ctx,
                db,
                &EventSpec {
                    warning: true,
                    reason: "CredentialsRegenerated".into(),
                    note,
                },
            )
            .await;
        }
    }
    if steps.adopt_secret {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
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
    }
    if steps.apply_services {
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        apply_if_drifted(&services, &headless(db), snap.headless_service.as_ref()).await?;
        apply_if_drifted(&services, &read_write(db), snap.rw_service.as_ref()).await?;
    }
    if steps.apply_statefulset {
        let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        let existing_claims = snap
            .statefulset
            .as_ref()
            .and_then(|s| s.spec.volume_claim_templates.clone());
        let desired = statefulset(db, &ctx.settings, existing_claims);
        apply_if_drifted(&statefulsets, &desired, snap.statefulset.as_ref()).await?;
    }
    if let Some(size) = &steps.expand_volumes {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        for claim in &snap.data_claims {
            let name = claim.metadata.name.clone().unwrap_or_default();
            match claims
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => info!(claim = %name, %size, "requested volume expansion"),
                // The StorageClass does not allow expansion: a condition to read, not an error loop.
                Err(kube::Error::Api(status)) if matches!(status.code, 403 | 422) => {
                    let message = format!(
                        "PersistentVolumeClaim {name} cannot grow to {size}: {}; use a StorageClass with allowVolumeExpansion: true. The volume keeps its current size",
                        status.message
                    );
                    publish(
                        ctx,
                        db,
                        &EventSpec {
                            warning: true,
                            reason: "ExpansionRefused".into(),
                            note: message.clone(),
                        },
                    )
                    .await;
                    overrides.push(ConditionStatus::new(
                        ConditionType::StorageReady,
                        false,
                        "ExpansionRefused",
                        message,
                    ));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    if steps.create_init_job
        && let Some(job) = init_job(db, &ctx.settings)
    {
        if let Some(sql) = init_sql_config_map(db) {
            let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            create_once(&config_maps, &sql).await?;
        }
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        create_once(&jobs, &job).await?;
    }
    Ok(overrides)
}

/// The status a decision leads to, from the previous one.
pub fn next_status(db: &Database, decision: &Decision, now: DateTime<Utc>) -> DatabaseStatus {
    let previous = db.status.clone().unwrap_or_default();
    let generation = db.metadata.generation;
    DatabaseStatus {
        phase: Some(decision.phase),
        conditions: merge(&previous.conditions, &decision.conditions, generation, now),
        observed_generation: generation,
        current_version: decision.current_version.clone(),
        target_version: Some(db.spec.version.clone()),
        endpoint: Some(Names::of(db).endpoint(&db.namespace_or_default())),
        credentials_secret: Some(secret_name(db)),
        backup: match &decision.backup {
            Some(plan) => plan.status.clone(),
            None => previous.backup,
        },
    }
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
    let body = json!({
        "apiVersion": Database::api_version(&()),
        "kind": Database::kind(&()),
        "status": status,
    });
    api.patch_status(
        &db.name(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    for event in transition_events(&previous, &status) {
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

/// Publishes an Event about the Database. A failed publish is logged, never fatal: Events are
/// for people, and the status already says the same.
pub async fn publish(ctx: &Context, db: &Database, event: &EventSpec) {
    let reference = db.object_ref(&());
    let result = ctx
        .recorder
        .publish(
            &Event {
                type_: event.event_type(),
                reason: event.reason.clone(),
                note: Some(truncate(&event.note, 1024)),
                action: "Reconcile".into(),
                secondary: None,
            },
            &reference,
        )
        .await;
    if let Err(error) = result {
        tracing::warn!(%error, reason = %event.reason, "could not publish an Event");
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Server-side applies `desired` unless `observed` already has every field it sets.
async fn apply_if_drifted<K>(api: &Api<K>, desired: &K, observed: Option<&K>) -> Result<()>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let to_value =
        |k: &K, what| serde_json::to_value(k).map_err(|source| Error::Serialize { what, source });
    let desired_value = to_value(desired, "desired object")?;
    let observed_value = observed
        .map(|o| to_value(o, "observed object"))
        .transpose()?;
    if !needs_apply(&desired_value, observed_value.as_ref()) {
        return Ok(());
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired_value),
    )
    .await?;
    info!(kind = %K::kind(&K::DynamicType::default()), %name, created = observed.is_none(), "applied");
    Ok(())
}

/// Creates an object that must never be replaced once it exists; "already exists" is success
/// (a restarted operator, or a cache that had not seen it yet).
async fn create_once<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = object.meta().name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {
            info!(kind = %K::kind(&K::DynamicType::default()), %name, "created");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
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
    fn passwords_are_long_and_distinct() {
        let a = new_password();
        assert_eq!(a.len(), PASSWORD_LENGTH);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, new_password());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
