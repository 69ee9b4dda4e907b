//! The I/O both controllers share, and the only place that writes to the API server on their
//! behalf: server-side apply of what drifted, create-once, the status patch, Events, and the
//! one reading of a Job's state. Depends only on `context` and `error`: no controller logic.

pub mod client;
pub mod drift;
pub mod initial_list;
pub mod rate_limit;
pub mod watch;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use crate::FIELD_MANAGER;
use crate::context::Context;
use crate::error::{Error, Result};
use drift::needs_apply;

/// The most of a text copied into an Event's note or a status message (bytes).
pub const MAX_MESSAGE: usize = 1024;

/// An Event to publish about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

impl EventSpec {
    pub fn event_type(&self) -> EventType {
        if self.warning {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }
}

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

/// `text` cut to at most `max` bytes on a character boundary; a cut text ends in `…`.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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

/// A Job's state, read from its conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    /// Failed for good: the condition's reason (`Failed` when it has none) and message.
    Failed {
        reason: String,
        detail: String,
    },
}

impl JobState {
    /// `reason: detail`, or the reason alone when there is no detail.
    pub fn failure_text(reason: &str, detail: &str) -> String {
        format!("{reason}: {detail}")
            .trim_end_matches([':', ' '])
            .to_string()
    }
}

/// The state of a Job: Complete (or SuccessCriteriaMet) wins, then Failed (or FailureTarget).
pub fn job_state(job: &Job) -> JobState {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let holds = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if holds("Complete").is_some() || holds("SuccessCriteriaMet").is_some() {
        JobState::Succeeded
    } else if let Some(c) = holds("Failed").or_else(|| holds("FailureTarget")) {
        JobState::Failed {
            reason: c.reason.clone().unwrap_or_else(|| "Failed".into()),
            detail: c.message.clone().unwrap_or_default(),
        }
    } else {
        JobState::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    #[test]
    fn truncate_respects_char_boundaries_and_the_limit() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("héllo wörld", 7), "hél…");
        assert_eq!(truncate("héllo wörld", 6), "hé…");
        let long = "é".repeat(600);
        let cut = truncate(&long, MAX_MESSAGE);
        assert!(
            cut.len() <= MAX_MESSAGE && cut.ends_with('…'),
            "{}",
            cut.len()
        );
    }

    fn job_with(type_: &str, reason: Option<&str>, message: Option<&str>) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    reason: reason.map(Into::into),
                    message: message.map(Into::into),
                    ..JobCondition::default()
                }]),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    #[test]
    fn job_states() {
        let failed = |reason: &str, detail: &str| JobState::Failed {
            reason: reason.into(),
            detail: detail.into(),
        };
        let table = [
            ("no status", Job::default(), JobState::Running),
            (
                "complete",
                job_with("Complete", None, None),
                JobState::Succeeded,
            ),
            (
                "success criteria",
                job_with("SuccessCriteriaMet", None, None),
                JobState::Succeeded,
            ),
            (
                "failed",
                job_with("Failed", Some("BackoffLimitExceeded"), Some("limit")),
                failed("BackoffLimitExceeded", "limit"),
            ),
            (
                "failure target, no reason",
                job_with("FailureTarget", None, None),
                failed("Failed", ""),
            ),
            (
                "suspended",
                job_with("Suspended", None, None),
                JobState::Running,
            ),
        ];
        for (name, job, want) in table {
            assert_eq!(job_state(&job), want, "{name}");
        }
        assert_eq!(JobState::failure_text("Failed", ""), "Failed");
        assert_eq!(JobState::failure_text("A", "b"), "A: b");
    }
}
