//! The StatefulSet that runs PostgreSQL: one pod per instance, a data volume each, dbop's
//! instance manager as the entrypoint (copied in by an init container), the credentials Secret
//! mounted as files, probes with the spec's timings, the spec's placement and resources (the
//! operator's default resources without them), a locked-down security context.

use std::collections::BTreeMap;

use dbop_contract::instance::ManagerFlags;
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ExecAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSpec, PodTemplateSpec, Probe, SecretVolumeSource, Volume, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::credentials::secret_name;
use super::placement::{database_placement, database_resources, place};
use super::pod::{
    DBOP_BIN_DIR, DBOP_BIN_VOLUME, container_security_context, copy_binary,
    database_security_context, env, mount, pull_secrets, scratch, shared_memory,
};
use super::{
    LABEL_VERSION, Names, POSTGRES_PORT, Version, image, labels, owned_meta, pod_annotations,
    pod_labels, selector_labels,
};
use crate::api::{Database, DeletionPolicy, ProbeTiming};
use crate::settings::Settings;

/// Where the data volume is mounted in the database pod (and the recovery Job).
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// PGDATA is a subdirectory: the volume's root may hold `lost+found`, which initdb refuses.
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// The server's Unix socket directory (Debian's default, so `psql` in the pod finds it).
pub const SOCKET_DIR: &str = "/var/run/postgresql";
/// Where the credentials Secret is mounted (files `password`, `username`).
pub const CREDENTIALS_DIR: &str = "/etc/dbop/credentials";
const TERMINATION_GRACE_SECONDS: i64 = 60;
const SMART_SHUTDOWN_SECONDS: i64 = 30;
const FAST_SHUTDOWN_SECONDS: i64 = 20;

/// What the pod template runs and how far the rollout may go: the upgrade decides both (the
/// old image until its rollout; a partition to move one ordinal at a time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRun {
    pub image: String,
    /// The version that image is for.
    pub version: String,
    /// Pods with an ordinal at or above it follow the template; None: all of them.
    pub partition: Option<i32>,
}

/// Sets the StatefulSet's rolling-update partition: pods with an ordinal at or above it move to
/// the new template, the others wait.
pub fn set_partition(sts: &mut StatefulSet, partition: i32) {
    if let Some(rolling) = sts
        .spec
        .update_strategy
        .as_mut()
        .and_then(|u| u.rolling_update.as_mut())
    {
        rolling.partition = Some(partition);
    }
}

impl PodRun {
    /// The spec's version and image, every pod.
    pub fn of_spec(db: &Database, settings: &Settings) -> PodRun {
        PodRun {
            image: image(db, settings),
            version: db.spec.version.clone(),
            partition: None,
        }
    }

    /// What the pod template records of it (`template_origin`).
    pub fn origin(&self) -> super::template_origin::Run<'_> {
        super::template_origin::Run {
            image: &self.image,
            version: &self.version,
        }
    }
}

/// The desired StatefulSet running the spec's version (see `statefulset_running`).
pub fn statefulset(
    db: &Database,
    settings: &Settings,
    existing_claims: Option<Vec<PersistentVolumeClaim>>,
) -> StatefulSet {
    statefulset_running(
        db,
        settings,
        existing_claims,
        &PodRun::of_spec(db, settings),
    )
}

/// The desired StatefulSet, its pods running `run`.
///
/// `existing_claims` are the volumeClaimTemplates of the StatefulSet as it exists: they are
/// immutable, so once created they are kept verbatim and storage grows by expanding the PVCs.
pub fn statefulset_running(
    db: &Database,
    settings: &Settings,
    existing_claims: Option<Vec<PersistentVolumeClaim>>,
    run: &PodRun,
) -> StatefulSet {
    let names = Names::of(db);
    let mut meta = owned_meta(db, names.statefulset(), "database");
    if let Some(l) = meta.labels.as_mut() {
        l.insert(LABEL_VERSION.into(), run.version.clone());
    }
    meta.annotations = Some(super::template_origin::record(db, run.origin(), settings));
    let claim_policy = match db.spec.deletion_policy {
        DeletionPolicy::Retain => "Retain",
        DeletionPolicy::Delete => "Delete",
        // The finalizer deletes the claims itself, and only after a succeeded final backup.
        DeletionPolicy::Snapshot => "Retain",
    };
    StatefulSet {
        metadata: meta,
        spec: StatefulSetSpec {
            replicas: Some(db.spec.instances),
            service_name: Some(names.headless_service()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names.database())),
                ..LabelSelector::default()
            },
            pod_management_policy: Some("OrderedReady".into()),
            // The partition is always explicit: a drift check that only compares the fields
            // we set would otherwise never lower a partition back to 0.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(run.partition.unwrap_or(0)),
                    ..RollingUpdateStatefulSetStrategy::default()
                }),
            }),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(claim_policy.into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            template: {
                let mut template = pod_template(db, settings, &run.image);
                super::server_config::add_to_pod_template(&mut template, db);
                super::monitoring::add_to_pod_template(&mut template, db);
                super::tls::add_to_pod_template(&mut template, db);
                super::replication::add_to_pod_template(&mut template, db);
                super::primary_lease::add_to_pod_template(&mut template, db);
                super::accounts::add_to_pod_template(&mut template, db);
                super::wal_archiving::add_to_pod_template(&mut template, db, settings);
                template
            },
            volume_claim_templates: Some(
                existing_claims.unwrap_or_else(|| vec![data_claim_template(db)]),
            ),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    }
}

/// The data volume's claim template (`data`: the claims are `data-<name>-<ordinal>`).
pub(super) fn data_claim_template(db: &Database) -> PersistentVolumeClaim {
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

/// The instance manager's arguments shared by `run` and `probe` (`dbop_contract::instance`).
pub fn manager_args(db: &Database) -> Vec<String> {
    let major = Version::parse(&db.spec.version).map_or(0, |v| v.major);
    ManagerFlags {
        pgdata: PGDATA.into(),
        major,
        port: POSTGRES_PORT as u16,
        socket_dir: SOCKET_DIR.into(),
        credentials_dir: CREDENTIALS_DIR.into(),
        smart_shutdown_seconds: SMART_SHUTDOWN_SECONDS as u64,
        fast_shutdown_seconds: FAST_SHUTDOWN_SECONDS as u64,
    }
    .to_args()
}

/// The database container's three probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

/// The timing of a probe: the spec's fields over the defaults. The startup probe allows an
/// hour (crash recovery of a large database replays WAL before the server accepts
/// connections; a kubelet restart in the middle would start it over), then liveness takes over.
pub fn probe_timing(db: &Database, kind: ProbeKind) -> ProbeTiming {
    let probes = db.spec.probes.as_ref();
    let (spec, failure_threshold) = match kind {
        ProbeKind::Startup => (probes.and_then(|p| p.startup), 360),
        ProbeKind::Readiness => (probes.and_then(|p| p.readiness), 3),
        ProbeKind::Liveness => (probes.and_then(|p| p.liveness), 6),
    };
    let spec = spec.unwrap_or_default();
    ProbeTiming {
        period_seconds: Some(spec.period_seconds.unwrap_or(10)),
        timeout_seconds: Some(spec.timeout_seconds.unwrap_or(6)),
        failure_threshold: Some(spec.failure_threshold.unwrap_or(failure_threshold)),
    }
}

/// The probe: the instance manager's own check (it connects as the Database's superuser to
/// the application database over the local socket, so a custom superuser logs no failures).
fn probe(manager: &str, db: &Database, kind: ProbeKind) -> Probe {
    let mut command = vec![manager.to_string(), "probe".into()];
    command.extend(manager_args(db));
    let timing = probe_timing(db, kind);
    Probe {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        period_seconds: timing.period_seconds,
        timeout_seconds: timing.timeout_seconds,
        failure_threshold: timing.failure_threshold,
        ..Probe::default()
    }
}

fn credentials_volume(db: &Database) -> Volume {
    Volume {
        name: "credentials".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(db)),
            // Readable by the pod's group (fsGroup) only.
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn pod_template(db: &Database, settings: &Settings, image: &str) -> PodTemplateSpec {
    let (copy, manager) = copy_binary(settings, "dbop-instance");
    let mut command = vec![manager.clone(), "run".into()];
    command.extend(manager_args(db));
    let container = Container {
        name: "postgres".into(),
        image: Some(image.to_string()),
        command: Some(command),
        ports: Some(vec![ContainerPort {
            name: Some("postgresql".into()),
            container_port: POSTGRES_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        // Not a secret: lets `kubectl exec … -- psql` find the data and the socket.
        env: Some(vec![env("PGDATA", PGDATA)]),
        resources: Some(database_resources(db, settings)),
        startup_probe: Some(probe(&manager, db, ProbeKind::Startup)),
        readiness_probe: Some(probe(&manager, db, ProbeKind::Readiness)),
        liveness_probe: Some(probe(&manager, db, ProbeKind::Liveness)),
        security_context: Some(container_security_context()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            mount("data", DATA_MOUNT, false),
            mount("run", SOCKET_DIR, false),
            mount("tmp", "/tmp", false),
            mount("shm", "/dev/shm", false),
            mount(DBOP_BIN_VOLUME, DBOP_BIN_DIR, true),
            mount("credentials", CREDENTIALS_DIR, true),
        ]),
        ..Container::default()
    };
    let mut spec = PodSpec {
        init_containers: Some(vec![copy]),
        containers: vec![container],
        security_context: Some(database_security_context(db, image, settings)),
        // The manager asks a smart shutdown, then a fast one, then an immediate one, all
        // before the kubelet's SIGKILL.
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        enable_service_links: Some(false),
        // `primary_lease::add_to_pod_template` gives the pods the instances' account and its token.
        automount_service_account_token: Some(false),
        image_pull_secrets: pull_secrets(settings),
        volumes: Some(vec![
            scratch("run"),
            scratch("tmp"),
            shared_memory(),
            scratch(DBOP_BIN_VOLUME),
            credentials_volume(db),
        ]),
        ..PodSpec::default()
    };
    place(&mut spec, database_placement(db));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels(db, "database")),
            annotations: pod_annotations(db),
            ..ObjectMeta::default()
        }),
        spec: Some(spec),
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

    /// The instance manager parses what the operator writes: its entrypoint and its probes,
    /// read back with the manager's own parser (`dbop_contract::instance::Cli`).
    #[test]
    fn the_instance_manager_parses_the_arguments_the_operator_writes() {
        use clap::Parser;
        use dbop_contract::instance::{Cli, Cmd};
        let sts = build();
        let pod = sts.spec.template.spec.unwrap();
        let postgres = pod
            .containers
            .iter()
            .find(|c| c.name == "postgres")
            .unwrap();
        let probes = [
            &postgres.startup_probe,
            &postgres.readiness_probe,
            &postgres.liveness_probe,
        ];
        let mut commands = vec![postgres.command.clone().unwrap()];
        commands.extend(probes.iter().map(|p| {
            let exec = p.as_ref().unwrap().exec.as_ref().unwrap();
            exec.command.clone().unwrap()
        }));
        for command in commands {
            assert_eq!(command[0], "/dbop/dbop-instance");
            let argv = std::iter::once("dbop-instance".to_string()).chain(command[1..].to_vec());
            let parsed = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{command:?}: {e}"));
            let (Cmd::Run(common) | Cmd::Probe(common)) = parsed.command else {
                panic!("{command:?} is neither run nor probe");
            };
            assert_eq!(common.pgdata.to_str(), Some(PGDATA));
            assert_eq!(common.major, 16);
            assert_eq!(i32::from(common.port), POSTGRES_PORT);
            assert_eq!(common.socket_dir.to_str(), Some(SOCKET_DIR));
            assert_eq!(common.credentials_dir.to_str(), Some(CREDENTIALS_DIR));
            assert_eq!(common.smart_shutdown_seconds, SMART_SHUTDOWN_SECONDS as u64);
            assert_eq!(common.fast_shutdown_seconds, FAST_SHUTDOWN_SECONDS as u64);
        }
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
    }

    #[test]
    fn the_instance_manager_is_the_entrypoint_and_reads_the_password_from_a_file() {
        let sts = build();
        let pod = sts.spec.template.spec.unwrap();
        let copy = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            copy.image.as_deref(),
            Some(crate::settings::DEFAULT_AGENT_IMAGE)
        );
        let c = &pod.containers[0];
        let command = c.command.as_ref().unwrap();
        assert_eq!(command[..2], ["/dbop/dbop-instance", "run"]);
        assert!(command.contains(&"--major=16".to_string()));
        assert!(command.contains(&format!("--credentials-dir={CREDENTIALS_DIR}")));
        // No secret in the environment: only PGDATA.
        let env = c.env.as_ref().unwrap();
        assert!(env.iter().all(|e| e.value_from.is_none()), "{env:?}");
        assert!(!format!("{c:?}").contains("POSTGRES_PASSWORD"));
        let volumes = pod.volumes.as_ref().unwrap();
        let creds = volumes.iter().find(|v| v.name == "credentials").unwrap();
        assert_eq!(
            creds.secret.as_ref().unwrap().secret_name.as_deref(),
            Some("orders-credentials")
        );
        let shm = volumes.iter().find(|v| v.name == "shm").unwrap();
        assert_eq!(
            shm.empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("Memory")
        );
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().any(|m| m.mount_path == "/dev/shm"));
        // The instances' own account, whose token may read and update the primary Lease only.
        assert_eq!(pod.automount_service_account_token, Some(true));
        assert_eq!(pod.service_account_name.as_deref(), Some("orders-instance"));
        assert_eq!(
            pod.security_context
                .unwrap()
                .fs_group_change_policy
                .as_deref(),
            Some("OnRootMismatch")
        );
    }

    #[test]
    fn probes_are_the_instance_managers_not_pg_isready_as_postgres() {
        let sts = build();
        let c = &sts.spec.template.spec.unwrap().containers[0];
        for probe in [&c.startup_probe, &c.readiness_probe, &c.liveness_probe] {
            let command = probe
                .as_ref()
                .unwrap()
                .exec
                .as_ref()
                .unwrap()
                .command
                .clone();
            let command = command.unwrap();
            assert_eq!(command[..2], ["/dbop/dbop-instance", "probe"]);
            assert!(
                !command
                    .iter()
                    .any(|a| a.contains("postgres") && a.starts_with("--user"))
            );
        }
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
    fn an_upgrade_sets_the_image_and_the_partition() {
        let db = testing::minimal();
        let run = PodRun {
            image: "pg:16.5".into(),
            version: "16.5".into(),
            partition: Some(2),
        };
        let sts = statefulset_running(&db, &Settings::default(), None, &run);
        assert_eq!(template_image(&sts).as_deref(), Some("pg:16.5"));
        assert_eq!(sts.metadata.labels.as_ref().unwrap()[LABEL_VERSION], "16.5");
        let partition = |s: &StatefulSet| {
            s.spec
                .update_strategy
                .clone()
                .unwrap()
                .rolling_update
                .unwrap()
                .partition
        };
        assert_eq!(partition(&sts), Some(2));
        // Without an upgrade the partition is explicitly 0, so a finished rollout lowers it.
        assert_eq!(partition(&build()), Some(0));
    }

    #[test]
    fn probe_timings_follow_the_spec_over_the_defaults() {
        let timing = |p: &Option<Probe>| {
            let p = p.as_ref().unwrap();
            (p.period_seconds, p.timeout_seconds, p.failure_threshold)
        };
        let c = &build().spec.template.spec.unwrap().containers[0];
        // An hour of crash recovery before liveness takes over.
        assert_eq!(timing(&c.startup_probe), (Some(10), Some(6), Some(360)));
        assert_eq!(timing(&c.readiness_probe), (Some(10), Some(6), Some(3)));
        assert_eq!(timing(&c.liveness_probe), (Some(10), Some(6), Some(6)));
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "probes": {"startup": {"failureThreshold": 1440, "periodSeconds": 5},
                       "liveness": {"timeoutSeconds": 20}}
        }));
        let sts = statefulset(&db, &Settings::default(), None);
        let c = &sts.spec.template.spec.unwrap().containers[0];
        assert_eq!(timing(&c.startup_probe), (Some(5), Some(6), Some(1440)));
        assert_eq!(timing(&c.readiness_probe), (Some(10), Some(6), Some(3)));
        assert_eq!(timing(&c.liveness_probe), (Some(10), Some(20), Some(6)));
    }

    #[test]
    fn the_pods_follow_the_placement_and_get_default_resources() {
        let pod = build().spec.template.spec.unwrap();
        assert_eq!(pod.node_selector, None);
        assert_eq!(pod.tolerations, None);
        assert_eq!(
            pod.containers[0].resources,
            Some(crate::settings::default_database_resources())
        );
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "placement": {"nodeSelector": {"pool": "db"},
                          "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                          "priorityClassName": "databases"}
        }));
        let pod = statefulset(&db, &Settings::default(), None)
            .spec
            .template
            .spec
            .unwrap();
        assert_eq!(pod.node_selector.unwrap()["pool"], "db");
        assert_eq!(pod.tolerations.unwrap().len(), 1);
        assert_eq!(pod.priority_class_name.as_deref(), Some("databases"));
        // Every container carries requests and limits (a ResourceQuota admits the pod).
        for c in pod.init_containers.unwrap().iter().chain(&pod.containers) {
            let r = c.resources.as_ref().unwrap();
            assert!(r.requests.is_some() && r.limits.is_some(), "{}", c.name);
        }
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
