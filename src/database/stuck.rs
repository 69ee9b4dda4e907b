//! Database pods the StatefulSet controller will not replace by itself: a pod that never
//! became ready on an earlier revision (a crash loop, an image that cannot be pulled or run).
//!
//! A rolling update waits for each pod to be Running and Ready before it moves on, so a pod
//! broken by one template waits forever after the template is fixed; Kubernetes documents the
//! remedy ("forced rollback": delete the pod). dbop applies it: once the StatefulSet has seen the
//! fixed template, such a pod is deleted and comes back on the current revision. A pod that is
//! starting, or not ready for another reason (a long crash recovery, a failing probe), is left
//! alone: only a container the kubelet holds back is a pod that cannot recover.
//!
//! Pure: the observed StatefulSet and pods in, pod names out.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::upgrade::facts::pod_fact;

/// Waiting reasons of a container the kubelet will not run as it is.
const HELD_BACK: [&str; 7] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// The pods of `pods` stuck on a revision `sts` has moved on from, by name.
pub fn stuck_pods(sts: Option<&StatefulSet>, pods: &[Pod]) -> Vec<String> {
    let Some(current) = sts.and_then(settled_update_revision) else {
        return vec![];
    };
    pods.iter()
        .filter(|p| stuck_on_another_revision(p, current))
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// The pods of `pods` not ready on a revision `sts` has moved on from, by name, however they
/// wait: after a release was rolled back (`crate::release`), the revision they run is known to
/// be the one that did not become ready, so even a pod still running on it is replaced.
pub fn unready_on_another_revision(sts: Option<&StatefulSet>, pods: &[Pod]) -> Vec<String> {
    let Some(current) = sts.and_then(settled_update_revision) else {
        return vec![];
    };
    pods.iter()
        .filter(|p| {
            pod_fact(p).is_some_and(|f| {
                !f.terminating && !f.ready && f.revision.as_deref().is_some_and(|r| r != current)
            })
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// The revision the StatefulSet's pods should run, once its controller has seen the latest
/// template (before that, `updateRevision` may still name the template being replaced).
fn settled_update_revision(sts: &StatefulSet) -> Option<&str> {
    let status = sts.status.as_ref()?;
    let seen = status.observed_generation? >= sts.metadata.generation?;
    seen.then_some(status.update_revision.as_deref()?)
}

/// Readiness, deletion and revision as the upgrade reads them (`upgrade::facts::pod_fact`);
/// the held-back containers are this module's own question.
fn stuck_on_another_revision(pod: &Pod, current: &str) -> bool {
    let Some(fact) = pod_fact(pod) else {
        return false;
    };
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let mut containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    !fact.terminating
        && fact.revision.as_deref().is_some_and(|r| r != current)
        && !fact.ready
        && containers.any(held_back)
}

fn held_back(container: &ContainerStatus) -> bool {
    container
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .is_some_and(|reason| HELD_BACK.contains(&reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgrade::facts::REVISION_LABEL;
    use serde_json::json;

    fn sts(generation: i64, observed: i64) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "orders", "generation": generation},
            "spec": {"selector": {}, "serviceName": "orders", "template": {}},
            "status": {"replicas": 1, "observedGeneration": observed,
                       "currentRevision": "orders-old", "updateRevision": "orders-new"}
        }))
        .unwrap()
    }

    fn pod(revision: &str, ready: bool, waiting: Option<&str>) -> Pod {
        let state = match waiting {
            Some(reason) => json!({"waiting": {"reason": reason}}),
            None => json!({"running": {}}),
        };
        serde_json::from_value(json!({
            "metadata": {"name": "orders-0", "labels": {REVISION_LABEL: revision}},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": "postgres", "image": "i", "imageID": "",
                                       "ready": ready, "restartCount": 4, "state": state}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_held_back_on_an_earlier_revision_is_stuck() {
        let crash_looping = pod("orders-old", false, Some("CrashLoopBackOff"));
        assert_eq!(
            stuck_pods(Some(&sts(2, 2)), std::slice::from_ref(&crash_looping)),
            ["orders-0"]
        );
        let unpullable = pod("orders-old", false, Some("ImagePullBackOff"));
        assert_eq!(stuck_pods(Some(&sts(2, 2)), &[unpullable]), ["orders-0"]);
        // The controller has not seen the latest template yet: wait for it.
        assert!(stuck_pods(Some(&sts(3, 2)), std::slice::from_ref(&crash_looping)).is_empty());
        // Already deleted.
        let mut going = serde_json::to_value(&crash_looping).unwrap();
        going["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        let going: Pod = serde_json::from_value(going).unwrap();
        assert!(stuck_pods(Some(&sts(2, 2)), &[going]).is_empty());
        assert!(stuck_pods(None, &[crash_looping]).is_empty());
    }

    #[test]
    fn after_a_rollback_any_unready_pod_on_another_revision_goes() {
        let running = pod("orders-old", false, None);
        let s = sts(2, 2);
        assert_eq!(
            unready_on_another_revision(Some(&s), std::slice::from_ref(&running)),
            ["orders-0"]
        );
        assert!(unready_on_another_revision(Some(&s), &[pod("orders-old", true, None)]).is_empty());
        assert!(
            unready_on_another_revision(Some(&s), &[pod("orders-new", false, None)]).is_empty()
        );
        assert!(unready_on_another_revision(Some(&sts(3, 2)), &[running]).is_empty());
    }

    #[test]
    fn a_pod_that_can_still_recover_is_left_alone() {
        let s = sts(2, 2);
        // On the current revision: the template it runs is the spec's; the condition says why.
        assert!(
            stuck_pods(
                Some(&s),
                &[pod("orders-new", false, Some("CrashLoopBackOff"))]
            )
            .is_empty()
        );
        // Starting, or running but not ready yet (crash recovery): the rollout will go on.
        assert!(
            stuck_pods(
                Some(&s),
                &[pod("orders-old", false, Some("ContainerCreating"))]
            )
            .is_empty()
        );
        assert!(stuck_pods(Some(&s), &[pod("orders-old", false, None)]).is_empty());
        // Ready: the rollout replaces it in its turn.
        assert!(stuck_pods(Some(&s), &[pod("orders-old", true, None)]).is_empty());
    }
}
