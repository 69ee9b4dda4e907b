//! The pure vocabulary both controllers share about the objects they read and the Events they
//! publish: a Job's state, an Event to publish, a text cut for a message, a Kubernetes time in
//! chrono, a pod's termination message, an owner check.
//!
//! Pure: no client, no clock. Must not import `kube_io` or `context` (the I/O rooms import it).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::events::EventType;

/// The most of a text copied into an Event's note or a status message (bytes).
pub const MAX_MESSAGE: usize = 1024;

/// An Event to publish about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// An Event published once under a name of its own: a second publish of the same name (an
/// operator restarted between the Event and the write it announces) adds nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedEvent {
    pub name: String,
    pub event: EventSpec,
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

/// A Kubernetes time in chrono (whole seconds, as the API server stores it).
pub fn to_chrono(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default()
}

/// When a Job ended: its completion time, or when it was marked Failed.
pub fn finished_at(job: &Job) -> Option<DateTime<Utc>> {
    let status = job.status.as_ref()?;
    status.completion_time.as_ref().map(to_chrono).or_else(|| {
        status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "Failed" && c.status == "True")
            .find_map(|c| c.last_transition_time.as_ref().map(to_chrono))
    })
}

/// The termination message of `container` in the newest of `pods` that has one.
pub fn termination_message(pods: &[Pod], container: &str) -> Option<String> {
    pods.iter()
        .filter_map(|p| {
            let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
            let terminated = statuses
                .iter()
                .find(|c| c.name == container)?
                .state
                .as_ref()?
                .terminated
                .as_ref()?;
            Some((
                terminated.finished_at.as_ref().map(to_chrono),
                terminated.message.clone()?,
            ))
        })
        .max_by_key(|(finished, _)| *finished)
        .map(|(_, message)| message)
}

/// Whether `meta` names an owner with `uid` (of `kind`, when one is given).
pub fn owned_by(meta: &ObjectMeta, kind: Option<&str>, uid: Option<&str>) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| kind.is_none_or(|k| o.kind == k) && Some(o.uid.as_str()) == uid)
}

/// The label selector of a Job's pods.
pub fn job_pods_selector(job_name: &str) -> String {
    format!("batch.kubernetes.io/job-name={job_name}")
}

/// Resource quantities by name (`cpu`, `memory`), as a container's requests or limits.
pub fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect(),
    )
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
