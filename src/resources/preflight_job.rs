//! The preflight Job of an upgrade: one short pod in the target image that proves the image
//! pulls and that its `postgres` binary reports the target version, before anything that serves
//! is touched. It runs `dbop-instance server-version` (copied in from the operator's image, like
//! the database pod's entrypoint), which writes the version it found to the termination message
//! and fails when it is not the expected one. It touches no data and no Secret.

use dbop_contract::instance::server_version_args;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Container;

use super::job::{JobParts, JobPod, job};
use super::placement::JobClass;
use super::pod::{
    DBOP_BIN_DIR, DBOP_BIN_VOLUME, container_security_context, copy_binary, mount, scratch,
};
use super::{Version, job_pod_labels, owned_meta};
use crate::api::Database;
use crate::settings::Settings;

/// The container that checks the version (its termination message is the version found).
pub const PREFLIGHT_CONTAINER: &str = "preflight";
/// A check that hangs (a slow registry) fails instead of holding the upgrade forever; an image
/// that cannot be pulled is seen earlier, from the pod's waiting reason.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 600;

/// The preflight Job checking that `image` runs PostgreSQL `version`.
pub fn preflight_job(
    db: &Database,
    settings: &Settings,
    name: &str,
    image: &str,
    version: &str,
) -> Job {
    let major = Version::parse(version).map_or(0, |v| v.major);
    let (copy, manager) = copy_binary(settings, "dbop-instance");
    let check = Container {
        name: PREFLIGHT_CONTAINER.into(),
        image: Some(image.to_string()),
        command: Some([vec![manager], server_version_args(major, version)].concat()),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            mount("tmp", "/tmp", false),
            mount(DBOP_BIN_VOLUME, DBOP_BIN_DIR, true),
        ]),
        ..Container::default()
    };
    let parts = JobParts {
        metadata: owned_meta(db, name.to_string(), "preflight"),
        pod_labels: job_pod_labels(db, "preflight"),
        backoff_limit: 0,
        active_deadline_seconds: ACTIVE_DEADLINE_SECONDS,
        ttl_seconds_after_finished: None,
        class: JobClass::Database,
        pod: JobPod {
            init_containers: Some(vec![copy]),
            container: check,
            volumes: vec![scratch("tmp"), scratch(DBOP_BIN_VOLUME)],
            service_account_name: None,
        },
    };
    job(db, settings, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn the_check_runs_in_the_target_image_and_touches_nothing_that_serves() {
        let db = testing::minimal();
        let job = preflight_job(
            &db,
            &Settings::default(),
            "orders-preflight-1",
            "pg:16.5",
            "16.5",
        );
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("pg:16.5"));
        assert_eq!(
            c.command.as_ref().unwrap()[1..],
            ["server-version", "--major=16", "--expect=16.5"]
        );
        // No data volume, no Secret, no service account token, not selected by the Services.
        let volumes = pod.volumes.as_ref().unwrap();
        assert!(volumes.iter().all(|v| v.empty_dir.is_some()), "{volumes:?}");
        assert_eq!(pod.automount_service_account_token, Some(false));
        let labels = job.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/name"], "dbop-preflight");
        assert_eq!(job.metadata.name.as_deref(), Some("orders-preflight-1"));
    }
}
