//! The I/O both controllers share, and the only place that writes to the API server on their
//! behalf: server-side apply of what drifted, create-once, compare-and-swap replaces, merge patches (owner references,
//! finalizers, claim sizes), deletes that take "not found" for done, the status patch and
//! Events. Depends only on `context`, `error` and the pure `objects` and `resources::drift`: no
//! controller logic.

pub mod client;
pub mod initial_list;
pub mod rate_limit;
pub mod watch;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Event;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use crate::FIELD_MANAGER;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::objects::{EventSpec, MAX_MESSAGE, NamedEvent, job_pods_selector, truncate};
use crate::resources::drift::needs_apply;

/// Publishes an Event about each of `references`. A failed publish is logged, never fatal:
/// Events are for people, and the status already says the same.
pub async fn publish(
    ctx: &Context,
    references: &[ObjectReference],
    action: &str,
    event: &EventSpec,
) {
    let event_of = || Event {
        type_: event.event_type(),
        reason: event.reason.clone(),
        note: Some(truncate(&event.note, MAX_MESSAGE)),
        action: action.into(),
        secondary: None,
    };
    for reference in references {
        if let Err(error) = ctx.recorder.publish(&event_of(), reference).await {
            warn!(%error, reason = %event.reason, "could not publish an Event");
        }
    }
}

/// Publishes `named` about `reference` under its own name (events.k8s.io/v1): "already
/// exists" is success, so a restarted operator that publishes it again adds nothing. A failed
/// publish is logged, never fatal.
pub async fn publish_named(
    ctx: &Context,
    reference: &ObjectReference,
    action: &str,
    named: &NamedEvent,
) {
    let namespace = reference.namespace.clone().unwrap_or_default();
    let event = EventsV1Event {
        metadata: kube::api::ObjectMeta {
            name: Some(named.name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some(action.into()),
        reason: Some(named.event.reason.clone()),
        note: Some(truncate(&named.event.note, MAX_MESSAGE)),
        type_: Some(
            if named.event.warning {
                "Warning"
            } else {
                "Normal"
            }
            .into(),
        ),
        regarding: Some(reference.clone()),
        reporting_controller: Some("dbop".into()),
        reporting_instance: Some(std::env::var("POD_NAME").unwrap_or_else(|_| "dbop".into())),
        ..Default::default()
    };
    let api: Api<EventsV1Event> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            info!(name = %named.name, "the Event was published before");
        }
        Err(error) => warn!(%error, name = %named.name, "could not publish an Event"),
    }
}

/// Server-side applies `desired` unless `observed` already has every field it sets.
pub async fn apply_if_drifted<K>(api: &Api<K>, desired: &K, observed: Option<&K>) -> Result<()>
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
pub async fn create_once<K>(api: &Api<K>, object: &K) -> Result<()>
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

/// Writes `status` into the status subresource of `name` by server-side apply (one field
/// manager, `apiVersion` and `kind` in the body). Callers write only a status that changed.
pub async fn patch_status<K, S>(api: &Api<K>, name: &str, status: &S) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// A JSON merge patch of `name`. The request's error is returned as it came, for the caller
/// to tell what it tolerates (a claim's StorageClass that refuses to grow, say).
pub async fn merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
) -> std::result::Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// Replaces `name` with `object`, whose `resourceVersion` makes it a compare-and-swap: a write
/// by someone else since it was read is a conflict (an error: the pass is tried again).
pub async fn replace<K>(api: &Api<K>, name: &str, object: &K) -> Result<()>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    api.replace(name, &params, object).await?;
    Ok(())
}

/// A merge patch of `name` where an object already gone is no error: whether it was patched.
pub async fn merge_patch_if_exists<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match merge_patch(api, name, patch).await {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `name`; an object already gone is no error. Whether this call deleted it.
pub async fn delete_if_exists<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The pods of the Job `job_name` in `ns` (by the label the Job controller puts on them).
pub async fn job_pods(client: &kube::Client, ns: &str, job_name: &str) -> Result<Vec<Pod>> {
    let selector = job_pods_selector(job_name);
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(pods.items)
}
