//! What an upgrade needs to know about the world, reduced from observed objects: the preflight
//! Job and its pod, the pre-upgrade backup, the StatefulSet's revisions and each database pod.
//! Pure: the reads happen in `database::observe`, the reduction in `database::facts`.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::api::{BackupPhase, DatabaseBackup};
use crate::objects::{JobState, job_state};
use crate::resources::preflight_job::PREFLIGHT_CONTAINER;
use crate::resources::statefulset::template_image;

/// The label the StatefulSet controller puts on each pod: its revision.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// Waiting reasons that mean an image cannot be pulled.
const PULL_ERRORS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Everything the upgrade plan reads besides the Database.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeFacts {
    /// The preflight Job of the upgrade in `status.upgrade`, if it exists.
    pub preflight: Option<PreflightFact>,
    /// The pre-upgrade `DatabaseBackup` of that upgrade, if it exists.
    pub backup: Option<PreUpgradeBackupFact>,
    /// The StatefulSet's template and revisions.
    pub statefulset: Option<RevisionFact>,
    /// The database pods (not Job pods), by ordinal.
    pub pods: Vec<PodFact>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreflightFact {
    pub job: JobState,
    /// A container of its pod cannot pull its image: `reason: message`.
    pub pull_error: Option<String>,
    /// What the check wrote to its termination message.
    pub reported: Option<String>,
    /// The digest of the image the check ran.
    pub image_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreUpgradeBackupFact {
    pub phase: Option<BackupPhase>,
    pub message: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionFact {
    pub image: Option<String>,
    /// The StatefulSet controller has seen the latest spec (its update revision is that spec's).
    pub observed_current: bool,
    pub update_revision: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFact {
    pub name: String,
    pub ordinal: i32,
    pub ready: bool,
    pub terminating: bool,
    pub revision: Option<String>,
    /// The `postgres` container's image and digest as the kubelet reports them.
    pub image: Option<String>,
    pub image_id: Option<String>,
}

pub fn preflight_fact(job: &Job, pods: &[Pod]) -> PreflightFact {
    let statuses: Vec<&ContainerStatus> = pods
        .iter()
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .collect();
    let pull_error = statuses.iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        PULL_ERRORS.contains(&reason).then(|| {
            let detail = waiting.message.clone().unwrap_or_default();
            JobState::failure_text(&format!("{reason} ({})", c.image), &detail)
        })
    });
    let check = statuses.iter().find(|c| c.name == PREFLIGHT_CONTAINER);
    PreflightFact {
        job: job_state(job),
        pull_error,
        reported: check
            .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
            .map(|m| m.trim().to_string()),
        image_id: check.map(|c| c.image_id.clone()).filter(|i| !i.is_empty()),
    }
}

pub fn backup_fact(backup: &DatabaseBackup) -> PreUpgradeBackupFact {
    let status = backup.status.clone().unwrap_or_default();
    PreUpgradeBackupFact {
        phase: status.phase,
        message: status.message,
    }
}

pub fn revision_fact(sts: &StatefulSet) -> RevisionFact {
    let status = sts.status.clone().unwrap_or_default();
    RevisionFact {
        image: template_image(sts),
        observed_current: matches!(
            (status.observed_generation, sts.metadata.generation),
            (Some(o), Some(g)) if o >= g
        ),
        update_revision: status.update_revision,
    }
}

/// The fact of a database pod; None for a pod whose name has no ordinal.
pub fn pod_fact(pod: &Pod) -> Option<PodFact> {
    let name = pod.metadata.name.clone()?;
    let ordinal = name.rsplit_once('-')?.1.parse().ok()?;
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let postgres = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "postgres");
    Some(PodFact {
        name,
        ordinal,
        ready,
        terminating: pod.metadata.deletion_timestamp.is_some(),
        revision: pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(REVISION_LABEL).cloned()),
        image: postgres.map(|c| c.image.clone()),
        image_id: postgres
            .map(|c| c.image_id.clone())
            .filter(|i| !i.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_pull_error_and_the_reported_version_are_read_from_the_preflight_pod() {
        let job = Job::default();
        let pulling = pod(json!({"status": {"containerStatuses": [{
            "name": PREFLIGHT_CONTAINER, "image": "pg:15.99", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
        }]}}));
        let fact = preflight_fact(&job, &[pulling]);
        assert_eq!(
            fact.pull_error.as_deref(),
            Some("ImagePullBackOff (pg:15.99): not found")
        );
        assert_eq!(fact.image_id, None);
        let done = pod(json!({"status": {"containerStatuses": [{
            "name": PREFLIGHT_CONTAINER, "image": "pg:15.20", "imageID": "sha256:abc",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "message": "15.20\n"}}
        }]}}));
        let fact = preflight_fact(&job, &[done]);
        assert_eq!(fact.pull_error, None);
        assert_eq!(fact.reported.as_deref(), Some("15.20"));
        assert_eq!(fact.image_id.as_deref(), Some("sha256:abc"));
    }

    #[test]
    fn pod_facts_carry_ordinal_revision_and_readiness() {
        let p = pod(json!({
            "metadata": {"name": "orders-0", "labels": {REVISION_LABEL: "orders-abc"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let fact = pod_fact(&p).unwrap();
        assert_eq!(
            (fact.ordinal, fact.ready, fact.revision.as_deref()),
            (0, true, Some("orders-abc"))
        );
        assert!(pod_fact(&pod(json!({"metadata": {"name": "nodigits"}}))).is_none());
    }
}
