//! The StatefulSet that runs PostgreSQL: one pod per instance, a data volume each, probes,
//! a locked-down security context.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, SeccompProfile, SecretKeySelector, SecurityContext, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::credentials::{PASSWORD_KEY, USERNAME_KEY, secret_name};
use super::{
    LABEL_VERSION, Names, POSTGRES_PORT, Settings, image, labels, owned_meta, pod_annotations,
    pod_labels, selector_labels,
};
use crate::api::{Database, DeletionPolicy};

/// The uid and gid of the `postgres` user in the official images.
pub const POSTGRES_UID: i64 = 999;
const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// PGDATA is a subdirectory: the volume's root may hold `lost+found`, which initdb refuses.
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";

/// The desired StatefulSet.
///
/// `existing_claims` are the volumeClaimTemplates of the StatefulSet as it exists: they are
/// immutable, so once created they are kept verbatim and storage grows by expanding the PVCs.
pub fn statefulset(
    db: &Database,
    settings: &Settings,
    existing_claims: Option<Vec<PersistentVolumeClaim>>,
) -> StatefulSet {
    let names = Names::of(db);
    let mut meta = owned_meta(db, names.statefulset(), "database");
    if let Some(l) = meta.labels.as_mut() {
        l.insert(LABEL_VERSION.into(), db.spec.version.clone());
    }
    let claim_policy = match db.spec.deletion_policy {
        DeletionPolicy::Retain => "Retain",
        DeletionPolicy::Delete => "Delete",
    };
    StatefulSet {
        metadata: meta,
        spec: StatefulSetSpec {
            replicas: Some(db.spec.replicas),
            service_name: Some(names.headless_service()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names.database())),
                ..LabelSelector::default()
            },
            pod_management_policy: Some("OrderedReady".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                ..StatefulSetUpdateStrategy::default()
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(claim_policy.into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            template: pod_template(db, settings),
            volume_claim_templates: Some(
                existing_claims.unwrap_or_else(|| vec![data_claim_template(db)]),
            ),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    }
}

fn data_claim_template(db: &Database) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            labels: Some(labels(&db.name(), "database")),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: db.spec.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(db.spec.storage.size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// An environment variable read from a key of the credentials Secret.
pub fn secret_env(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: optional.then_some(true),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn probe(period: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                "pg_isready".into(),
                "--host=127.0.0.1".into(),
                format!("--port={POSTGRES_PORT}"),
                "--timeout=5".into(),
            ]),
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(6),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

/// The security context every dbop container runs with.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// The pod security context every dbop pod runs with.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: Some(POSTGRES_UID),
        run_as_group: Some(POSTGRES_UID),
        fs_group: Some(POSTGRES_UID),
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

fn scratch(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..VolumeMount::default()
    }
}

fn pod_template(db: &Database, settings: &Settings) -> PodTemplateSpec {
    let secret = secret_name(db);
    let container = Container {
        name: "postgres".into(),
        image: Some(image(db, settings)),
        ports: Some(vec![ContainerPort {
            name: Some("postgresql".into()),
            container_port: POSTGRES_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: Some(vec![
            secret_env("POSTGRES_USER", &secret, USERNAME_KEY, true),
            secret_env("POSTGRES_PASSWORD", &secret, PASSWORD_KEY, false),
            env("PGDATA", PGDATA),
        ]),
        resources: db.spec.resources.clone(),
        // Crash recovery of a large database can take a while: the startup probe allows ten
        // minutes before liveness takes over.
        startup_probe: Some(probe(10, 60)),
        readiness_probe: Some(probe(10, 3)),
        liveness_probe: Some(probe(10, 6)),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![
            mount("data", DATA_MOUNT),
            mount("run", "/var/run/postgresql"),
            mount("tmp", "/tmp"),
        ]),
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels(db, "database")),
            annotations: pod_annotations(db),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            security_context: Some(pod_security_context()),
            // A clean shutdown (checkpoint) beats a fast one.
            termination_grace_period_seconds: Some(60),
            enable_service_links: Some(false),
            volumes: Some(vec![scratch("run"), scratch("tmp")]),
            ..PodSpec::default()
        }),
    }
}

/// The image the StatefulSet's pod template runs (for observed objects).
pub fn template_image(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "postgres")?
        .image
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn build() -> StatefulSet {
        statefulset(&testing::minimal(), &Settings::default(), None)
    }

    #[test]
    fn statefulset_runs_the_versioned_image_non_root() {
        let sts = build();
        let spec = &sts.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.service_name.as_deref(), Some("orders-hl"));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        let c = &pod.containers[0];
        assert_eq!(
            template_image(&sts).as_deref(),
            Some("docker.io/library/postgres:16.4")
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert!(
            c.readiness_probe
                .as_ref()
                .unwrap()
                .exec
                .as_ref()
                .unwrap()
                .command
                .as_ref()
                .unwrap()[0]
                == "pg_isready"
        );
    }

    #[test]
    fn password_comes_from_the_secret_never_inline() {
        let sts = build();
        let c = &sts.spec.template.spec.unwrap().containers[0];
        let pw = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == "POSTGRES_PASSWORD")
            .unwrap();
        assert!(pw.value.is_none());
        let key = pw
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(key.name, "orders-credentials");
        assert_eq!(key.key, "password");
    }

    #[test]
    fn claim_template_asks_for_the_spec_size() {
        let sts = build();
        let claims = sts.spec.volume_claim_templates.unwrap();
        let req = claims[0]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(req["storage"], Quantity("1Gi".into()));
    }

    #[test]
    fn existing_claim_templates_are_kept_verbatim() {
        let mut db = testing::minimal();
        let original = build().spec.volume_claim_templates;
        db.spec.storage.size = "5Gi".into();
        let sts = statefulset(&db, &Settings::default(), original.clone());
        assert_eq!(sts.spec.volume_claim_templates, original);
    }

    #[test]
    fn deletion_policy_sets_the_claim_retention() {
        let mut db = testing::minimal();
        db.spec.deletion_policy = DeletionPolicy::Delete;
        let sts = statefulset(&db, &Settings::default(), None);
        let policy = sts.spec.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(policy.when_deleted.as_deref(), Some("Delete"));
        assert_eq!(policy.when_scaled.as_deref(), Some("Retain"));
    }

    #[test]
    fn resources_pass_through() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}
        }));
        let sts = statefulset(&db, &Settings::default(), None);
        let c = &sts.spec.template.spec.unwrap().containers[0];
        assert_eq!(
            c.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"],
            Quantity("500m".into())
        );
    }
}
