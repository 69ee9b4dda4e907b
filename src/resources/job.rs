//! The one Job skeleton every dbop Job is built on (init, restore, preflight, backup, verify):
//! no restarts, no ServiceAccount token, no service links, the pod security context, the pull
//! secrets, the user's pod annotations, a backoff limit and a deadline, the Database's placement
//! and the Job resources of its class (`placement::JobClass`) on the main container. A builder
//! says only what sets its Job apart (`JobParts`); `agent_pod` is the part the agent's Jobs share.
//!
//! Pure: plain functions of their arguments.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PodSpec, PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::agent::{TERMINATION_LOG, agent_mounts, ca_volume};
use super::placement::{JobClass, job_placement, job_resources, place};
use super::pod::{
    DBOP_BIN_VOLUME, container_security_context, copy_binary, database_security_context,
    pull_secrets, scratch,
};
use super::pod_annotations;
use crate::api::{Database, S3Spec};
use crate::settings::Settings;

/// What sets one Job apart from the others.
pub struct JobParts {
    pub metadata: ObjectMeta,
    /// The labels of its pod (`job_pod_labels`, and any of its own).
    pub pod_labels: BTreeMap<String, String>,
    pub backoff_limit: i32,
    pub active_deadline_seconds: i64,
    pub ttl_seconds_after_finished: Option<i32>,
    /// Whose placement and resources it takes (a backup or verify Job: `spec.backup`'s first).
    pub class: JobClass,
    pub pod: JobPod,
}

/// The pod of a Job: what runs, and what it mounts.
pub struct JobPod {
    pub init_containers: Option<Vec<Container>>,
    pub container: Container,
    pub volumes: Vec<Volume>,
    /// The pod's ServiceAccount (None: the namespace's `default`); no token is mounted.
    pub service_account_name: Option<String>,
}

/// A Job of `db` (whose pod annotations it carries) from its parts.
pub fn job(db: &Database, settings: &Settings, parts: JobParts) -> Job {
    let JobParts {
        metadata,
        pod_labels,
        backoff_limit,
        active_deadline_seconds,
        ttl_seconds_after_finished,
        class,
        pod,
    } = parts;
    // The database's ids: the Job reads its credentials (and a restore writes its data).
    let security_context = database_security_context(
        db,
        pod.container.image.as_deref().unwrap_or_default(),
        settings,
    );
    let mut container = pod.container;
    container.resources = Some(job_resources(db, settings, class));
    let mut pod_spec = PodSpec {
        restart_policy: Some("Never".into()),
        init_containers: pod.init_containers,
        containers: vec![container],
        security_context: Some(security_context),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        service_account_name: pod.service_account_name,
        image_pull_secrets: pull_secrets(settings),
        volumes: Some(pod.volumes),
        ..PodSpec::default()
    };
    place(&mut pod_spec, job_placement(db, class));
    Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(backoff_limit),
            active_deadline_seconds: Some(active_deadline_seconds),
            ttl_seconds_after_finished,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: pod_annotations(db),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// What the agent runs: its container's name, the database image (so `pg_dump` and
/// `pg_restore` match the server), its arguments and environment, and the bucket.
pub struct AgentRun<'a> {
    pub container: &'static str,
    pub image: String,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub s3: &'a S3Spec,
    /// The Database's CA certificate, when the agent verifies the server (`tls::client_ca`).
    pub database_ca: Option<(Volume, VolumeMount)>,
    /// The Secrets the agent reads as files (`agent::agent_secrets`).
    pub secrets: Vec<(Volume, VolumeMount)>,
}

/// The pod of an agent Job: the agent copied in by an init container, run from the database
/// image, its JSON result in the termination message, the S3 CA mounted when there is one,
/// the bucket's ServiceAccount (`s3.serviceAccountName`, for IRSA and its kin).
pub fn agent_pod(settings: &Settings, run: AgentRun<'_>) -> JobPod {
    let (copy_agent, agent) = copy_binary(settings, "dbop-backup");
    let container = Container {
        name: run.container.into(),
        image: Some(run.image),
        command: Some(vec![agent]),
        args: Some(run.args),
        env: Some(run.env),
        security_context: Some(container_security_context()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(agent_mounts(run.s3.ca.is_some())),
        ..Container::default()
    };
    let mut volumes = vec![scratch(DBOP_BIN_VOLUME), scratch("tmp")];
    volumes.extend(run.s3.ca.as_ref().map(ca_volume));
    let mut container = container;
    for (volume, mount) in run.database_ca.into_iter().chain(run.secrets) {
        volumes.push(volume);
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount);
    }
    JobPod {
        init_containers: Some(vec![copy_agent]),
        container,
        volumes,
        service_account_name: run.s3.service_account_name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn an_agent_pod_runs_as_the_buckets_service_account_without_a_token() {
        let s3: S3Spec = serde_json::from_value(
            serde_json::json!({"bucket": "backups", "serviceAccountName": "backup-irsa"}),
        )
        .unwrap();
        let settings = Settings::default();
        let run = AgentRun {
            container: "backup",
            image: "postgres:16".into(),
            args: vec![],
            env: vec![],
            s3: &s3,
            database_ca: None,
            secrets: vec![],
        };
        let pod = agent_pod(&settings, run);
        assert_eq!(pod.service_account_name.as_deref(), Some("backup-irsa"));
        let parts = JobParts {
            pod,
            ..parts(JobClass::Backup)
        };
        let job = job(&testing::minimal(), &settings, parts);
        let spec = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("backup-irsa"));
        assert_eq!(spec.automount_service_account_token, Some(false));
    }

    fn parts(class: JobClass) -> JobParts {
        JobParts {
            metadata: ObjectMeta::default(),
            pod_labels: BTreeMap::new(),
            backoff_limit: 0,
            active_deadline_seconds: 60,
            ttl_seconds_after_finished: None,
            class,
            pod: JobPod {
                init_containers: None,
                container: Container::default(),
                volumes: Vec::new(),
                service_account_name: None,
            },
        }
    }

    #[test]
    fn every_job_carries_the_placement_and_the_resources_of_its_class() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "placement": {"nodeSelector": {"pool": "db"}},
            "jobResources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m"}},
            "backup": {"schedule": "@daily", "s3": {"bucket": "b", "credentials": {"secretName": "s3"}},
                       "placement": {"nodeSelector": {"pool": "batch"}},
                       "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}
        }));
        let settings = Settings::default();
        let pod = |class| {
            job(&db, &settings, parts(class))
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
        };
        for (class, pool, cpu) in [
            (JobClass::Database, "db", "200m"),
            (JobClass::Backup, "batch", "2"),
        ] {
            let pod = pod(class);
            assert_eq!(pod.node_selector.unwrap()["pool"], pool, "{class:?}");
            let r = pod.containers[0].resources.clone().unwrap();
            assert_eq!(r.requests.unwrap()["cpu"].0, cpu, "{class:?}");
        }
        let bare = job(&testing::minimal(), &settings, parts(JobClass::Backup));
        let pod = bare.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector, None);
        assert_eq!(pod.containers[0].resources, Some(settings.job_resources));
    }
}
