//! The finalizer's work: apply the deletion policy when a Database is deleted.
//!
//! Idempotent, and safe when provisioning never finished or the spec is odd: it only lists by
//! label and deletes or releases what it finds.
//! - `Retain`: the data claims stay (StatefulSet claims are not owned by the Database), and the
//!   generated credentials Secret is released from garbage collection so the retained data
//!   stays usable; a new Database of the same name adopts both.
//! - `Delete`: the data claims are deleted (the generated Secret goes with the Database).

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::info;

use chrono::{DateTime, Utc};

use super::act::{publish, update_status};
use crate::api::conditions::{ConditionStatus, ConditionType, merge};
use crate::api::{Database, DatabaseStatus, DeletionPolicy, Phase};
use crate::context::Context;
use crate::error::Result;
use crate::kube_io::EventSpec;
use crate::resources::Names;
use crate::resources::credentials::is_generated;
use crate::resources::{LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY};

/// The label selector of a Database's data claims.
pub fn claims_selector(database: &str) -> String {
    format!("{LABEL_INSTANCE}={database},{LABEL_MANAGED_BY}={MANAGED_BY}")
}

pub async fn cleanup(ctx: &Context, db: &Database) -> Result<Action> {
    // Pods changing version: the upgrade reaches a safe point first (bounded).
    super::upgrade_gate::wait_for_safe_point(ctx, db).await?;
    let ns = db.namespace_or_default();
    let policy = db.spec.deletion_policy;
    update_status(ctx, db, deleting_status(db, Utc::now())).await?;
    match policy {
        DeletionPolicy::Retain if is_generated(db) => {
            release_generated_secret(ctx, &ns, &db.name(), db.metadata.uid.as_deref()).await?
        }
        DeletionPolicy::Retain => {}
        DeletionPolicy::Delete => delete_claims(ctx, db, &ns).await?,
    }
    let note = match policy {
        DeletionPolicy::Retain => {
            "deletionPolicy Retain: the data volumes and the credentials Secret are kept"
        }
        DeletionPolicy::Delete => "deletionPolicy Delete: the data volumes are being deleted",
    };
    publish(
        ctx,
        db,
        &EventSpec {
            warning: false,
            reason: "CleanedUp".into(),
            note: note.into(),
        },
    )
    .await;
    Ok(Action::await_change())
}

/// The status of a Database being deleted: phase Deleting, not Ready.
pub fn deleting_status(db: &Database, now: DateTime<Utc>) -> DatabaseStatus {
    let previous = db.status.clone().unwrap_or_default();
    let ready = ConditionStatus::new(
        ConditionType::Ready,
        false,
        "Deleting",
        format!("deleting with deletionPolicy {:?}", db.spec.deletion_policy),
    );
    DatabaseStatus {
        phase: Some(Phase::Deleting),
        conditions: merge(&previous.conditions, &[ready], db.metadata.generation, now),
        ..previous
    }
}

/// Removes the Database's owner reference from its generated credentials Secret (if the Secret
/// exists and is owned by the Database with this uid), so garbage collection keeps it.
pub async fn release_generated_secret(
    ctx: &Context,
    ns: &str,
    database: &str,
    uid: Option<&str>,
) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = Names::new(database).generated_secret();
    let Some(secret) = secrets.get_opt(&name).await? else {
        return Ok(());
    };
    let owned_by_us = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| Some(r.uid.as_str()) == uid);
    if owned_by_us {
        let patch = json!({"metadata": {"ownerReferences": null}});
        secrets
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        info!(secret = %name, "released the credentials Secret so it outlives the Database (Retain)");
    }
    Ok(())
}

async fn delete_claims(ctx: &Context, db: &Database, ns: &str) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let list = claims
        .list_metadata(&ListParams::default().labels(&claims_selector(&db.name())))
        .await?;
    for claim in list {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = claim.metadata.name.clone().unwrap_or_default();
        match claims.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(claim = %name, "deleted data claim (Delete)"),
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn deleting_status_keeps_the_rest() {
        let mut db = testing::minimal();
        db.status = Some(DatabaseStatus {
            current_version: Some("16.4".into()),
            ..DatabaseStatus::default()
        });
        let s = deleting_status(&db, Utc::now());
        assert_eq!(s.phase, Some(Phase::Deleting));
        assert_eq!(s.current_version.as_deref(), Some("16.4"));
        assert_eq!(s.conditions[0].reason, "Deleting");
        assert_eq!(
            claims_selector("orders"),
            "app.kubernetes.io/instance=orders,app.kubernetes.io/managed-by=dbop"
        );
    }
}
