//! Shared pieces of every pod dbop creates (the database's, the init Job's, the backup Job's):
//! the user and groups they run as (`run_as`, from `spec.podSecurity` and the image), security
//! contexts, scratch volumes, Secrets as files, default resources and the
//! init container that copies one of dbop's static binaries into the pod.
//!
//! Pure: plain functions of their arguments.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, KeyToPath, LocalObjectReference,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount,
};

use crate::api::{Database, IdsAssignedBy, PodSecuritySpec};
use crate::objects::quantities;
use crate::settings::Settings;

/// The uid and gid of the `postgres` user in the official Debian images (and Debian-built ones).
pub const POSTGRES_UID: i64 = 999;
/// The `postgres` user of the official Alpine images (`adduser -u 70`).
pub const ALPINE_POSTGRES_UID: i64 = 70;
/// The `postgres` user of CloudNativePG's images (`usermod -u 26 postgres`).
pub const CNPG_POSTGRES_UID: i64 = 26;
/// The user of Bitnami's images (`USER 1001`, no passwd entry: they ship nss_wrapper).
pub const BITNAMI_UID: i64 = 1001;
/// Where the copying init container puts dbop's binaries (an emptyDir).
pub const DBOP_BIN_DIR: &str = "/dbop";
/// The name of the emptyDir holding dbop's binaries.
pub const DBOP_BIN_VOLUME: &str = "dbop-bin";

/// A Secret as a volume of files readable by the pod's group only (`fsGroup`), never as
/// environment variables: whole, or only `items` (key → file name).
pub fn secret_volume(name: &str, secret: &str, items: Option<Vec<(String, String)>>) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: items.map(|items| {
                items
                    .into_iter()
                    .map(|(key, path)| KeyToPath {
                        key,
                        path,
                        ..KeyToPath::default()
                    })
                    .collect()
            }),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A plain environment variable.
pub fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
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

/// The uid of the `postgres` user in `image`, from its name: CloudNativePG's
/// (`…cloudnative-pg/postgresql`) 26, Bitnami's (`…bitnami/postgresql`) 1001, a tag with
/// `alpine` 70, anything else the official Debian images' 999.
pub fn image_uid(image: &str) -> i64 {
    let name = image.split_once('@').map_or(image, |(name, _digest)| name);
    let (repository, tag) = match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => (repository, tag),
        _ => (name, ""),
    };
    if repository.ends_with("cloudnative-pg/postgresql") {
        CNPG_POSTGRES_UID
    } else if repository.ends_with("bitnami/postgresql") {
        BITNAMI_UID
    } else if tag.contains("alpine") {
        ALPINE_POSTGRES_UID
    } else {
        POSTGRES_UID
    }
}

/// What the API server's rules on `spec.podSecurity` refuse, for the same value given to the
/// operator (`--database-pod-security`), which no schema checks.
pub fn pod_security_problem(spec: &PodSecuritySpec) -> Option<String> {
    let ids = [spec.run_as_user, spec.run_as_group, spec.fs_group];
    if spec.assigned_by == Some(IdsAssignedBy::Platform) && ids.iter().any(Option::is_some) {
        return Some(
            "assignedBy Platform lets the platform choose the ids: remove runAsUser, runAsGroup and fsGroup".into(),
        );
    }
    if spec.run_as_user.is_some_and(|uid| uid < 1) {
        return Some("runAsUser must be at least 1: PostgreSQL refuses to run as root".into());
    }
    if ids
        .iter()
        .flatten()
        .any(|id| *id < 0 || *id > 2_147_483_647)
    {
        return Some("ids are between 0 and 2147483647".into());
    }
    None
}

/// The ids a pod runs as; `None`: left to the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub user: Option<i64>,
    pub group: Option<i64>,
    pub fs_group: Option<i64>,
}

/// Which ids the pods of a Database running `image` get: none with `assignedBy: Platform`;
/// else the spec's, each missing one from the one before it (`runAsGroup` from `runAsUser`,
/// `fsGroup` from `runAsGroup`), the user from the image's name when the spec has none.
pub fn run_as(spec: Option<&PodSecuritySpec>, image: &str) -> RunAs {
    let spec = spec.cloned().unwrap_or_default();
    if spec.assigned_by == Some(IdsAssignedBy::Platform) {
        return RunAs {
            user: None,
            group: None,
            fs_group: None,
        };
    }
    let user = spec.run_as_user.unwrap_or_else(|| image_uid(image));
    let group = spec.run_as_group.unwrap_or(user);
    RunAs {
        user: Some(user),
        group: Some(group),
        fs_group: Some(spec.fs_group.unwrap_or(group)),
    }
}

/// The security context of `db`'s pods that run `image` (the database's, its Jobs').
/// The Database's `spec.podSecurity` wins over the operator's `--database-pod-security`.
pub fn database_security_context(
    db: &Database,
    image: &str,
    settings: &Settings,
) -> PodSecurityContext {
    let spec = db
        .spec
        .pod_security
        .as_ref()
        .or(settings.database_pod_security.as_ref());
    pod_security_context(run_as(spec, image))
}

/// The pod security context every dbop pod runs with. `OnRootMismatch`: the kubelet changes
/// a volume's ownership only when its root is wrong, not recursively at every start.
pub fn pod_security_context(ids: RunAs) -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: ids.user,
        run_as_group: ids.group,
        fs_group: ids.fs_group,
        fs_group_change_policy: Some("OnRootMismatch".into()),
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// An emptyDir volume.
pub fn scratch(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// `/dev/shm` backed by memory (the container runtime's default is 64 MiB; PostgreSQL's
/// parallel queries use dynamic shared memory there).
pub fn shared_memory() -> Volume {
    Volume {
        name: "shm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A volume mount.
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// Mounts Secret `secret` read-only at `dir` in the database container (`postgres`) of `pod`,
/// as volume `volume`: optional (a pod may start before the Secret exists, and sees it once
/// it does) and readable by the pod's group (fsGroup) only.
pub fn mount_optional_secret(pod: &mut PodSpec, volume: &str, dir: &str, secret: String) {
    if let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") {
        postgres
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(volume, dir, true));
    }
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            optional: Some(true),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    });
}

/// The init container that copies `binary` (`dbop-backup`, `dbop-instance`) from dbop's image
/// into the `dbop-bin` emptyDir; returns it with the path the binary ends up at.
pub fn copy_binary(settings: &Settings, binary: &str) -> (Container, String) {
    let target = format!("{DBOP_BIN_DIR}/{binary}");
    let container = Container {
        name: format!("copy-{binary}"),
        image: Some(settings.agent_image.clone()),
        command: Some(vec![
            "cp".into(),
            format!("/usr/local/bin/{binary}"),
            target.clone(),
        ]),
        resources: Some(copy_resources()),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![mount(DBOP_BIN_VOLUME, DBOP_BIN_DIR, false)]),
        ..Container::default()
    };
    (container, target)
}

/// Resources of the copying init containers: a `cp` of one file.
pub fn copy_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: quantities(&[("cpu", "10m"), ("memory", "16Mi")]),
        limits: quantities(&[("cpu", "100m"), ("memory", "64Mi")]),
        ..ResourceRequirements::default()
    }
}

/// The pull secrets of pods that run dbop's own image (Jobs, the copying init containers).
pub fn pull_secrets(settings: &Settings) -> Option<Vec<LocalObjectReference>> {
    (!settings.image_pull_secrets.is_empty()).then(|| {
        settings
            .image_pull_secrets
            .iter()
            .map(|name| LocalObjectReference { name: name.clone() })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_s_default_applies_unless_the_database_has_its_own() {
        let mut db = crate::resources::testing::minimal();
        let settings = Settings {
            database_pod_security: Some(PodSecuritySpec {
                assigned_by: Some(IdsAssignedBy::Platform),
                ..PodSecuritySpec::default()
            }),
            ..Settings::default()
        };
        let sc = database_security_context(&db, "postgres:16", &settings);
        assert_eq!((sc.run_as_user, sc.fs_group), (None, None));
        db.spec.pod_security = Some(PodSecuritySpec {
            run_as_user: Some(26),
            ..PodSecuritySpec::default()
        });
        let sc = database_security_context(&db, "postgres:16", &settings);
        assert_eq!((sc.run_as_user, sc.fs_group), (Some(26), Some(26)));
    }

    #[test]
    fn an_operator_default_the_schema_would_refuse_is_refused() {
        let platform_with_ids = PodSecuritySpec {
            assigned_by: Some(IdsAssignedBy::Platform),
            run_as_user: Some(1000),
            ..PodSecuritySpec::default()
        };
        assert!(
            pod_security_problem(&platform_with_ids)
                .unwrap()
                .contains("remove runAsUser")
        );
        let root = PodSecuritySpec {
            run_as_user: Some(0),
            ..PodSecuritySpec::default()
        };
        assert!(pod_security_problem(&root).unwrap().contains("root"));
        assert_eq!(pod_security_problem(&PodSecuritySpec::default()), None);
    }

    #[test]
    fn every_pod_changes_ownership_only_on_mismatch() {
        let sc = pod_security_context(run_as(None, "postgres:16"));
        assert_eq!(sc.fs_group_change_policy.as_deref(), Some("OnRootMismatch"));
        assert_eq!(sc.run_as_non_root, Some(true));
    }

    #[test]
    fn the_uid_follows_the_image_name() {
        for (image, uid) in [
            ("docker.io/library/postgres:16.4", 999),
            ("postgres:16", 999),
            ("postgres", 999),
            ("registry.local:5000/postgres", 999),
            ("postgres:16-alpine", 70),
            ("docker.io/library/postgres:16.4-alpine3.20", 70),
            (
                "registry.local:5000/pg/postgres:15.18-alpine@sha256:abc",
                70,
            ),
            ("ghcr.io/cloudnative-pg/postgresql:16.4", 26),
            (
                "mirror.example/ghcr.io/cloudnative-pg/postgresql:16.4-bookworm",
                26,
            ),
            ("ghcr.io/cloudnative-pg/postgresql@sha256:abc", 26),
            ("docker.io/bitnami/postgresql:16", 1001),
            ("postgis/postgis:16-3.4", 999),
            ("alpine.example/postgres:16", 999),
        ] {
            assert_eq!(image_uid(image), uid, "{image}");
        }
    }

    #[test]
    fn the_spec_wins_and_fills_the_groups_from_the_user() {
        let spec =
            |json: serde_json::Value| -> PodSecuritySpec { serde_json::from_value(json).unwrap() };
        let ids = |user, group, fs_group| RunAs {
            user,
            group,
            fs_group,
        };
        let alpine = "postgres:16-alpine";
        assert_eq!(run_as(None, alpine), ids(Some(70), Some(70), Some(70)));
        let cases = [
            (serde_json::json!({}), ids(Some(70), Some(70), Some(70))),
            (
                serde_json::json!({"runAsUser": 1000650000}),
                ids(Some(1000650000), Some(1000650000), Some(1000650000)),
            ),
            (
                serde_json::json!({"runAsUser": 26, "runAsGroup": 0}),
                ids(Some(26), Some(0), Some(0)),
            ),
            (
                serde_json::json!({"runAsGroup": 5, "fsGroup": 6}),
                ids(Some(70), Some(5), Some(6)),
            ),
            (
                serde_json::json!({"assignedBy": "Dbop", "runAsUser": 26}),
                ids(Some(26), Some(26), Some(26)),
            ),
            (
                serde_json::json!({"assignedBy": "Platform"}),
                ids(None, None, None),
            ),
        ];
        for (json, expected) in cases {
            assert_eq!(
                run_as(Some(&spec(json.clone())), alpine),
                expected,
                "{json}"
            );
        }
        let sc = pod_security_context(ids(None, None, None));
        assert_eq!((sc.run_as_user, sc.fs_group), (None, None));
        assert_eq!(sc.run_as_non_root, Some(true));
    }

    #[test]
    fn copy_container_has_resources_and_copies_into_the_shared_dir() {
        let (c, path) = copy_binary(&Settings::default(), "dbop-instance");
        assert_eq!(path, "/dbop/dbop-instance");
        assert_eq!(
            c.command.unwrap(),
            ["cp", "/usr/local/bin/dbop-instance", "/dbop/dbop-instance"]
        );
        let r = c.resources.unwrap();
        assert!(r.requests.unwrap().contains_key("memory"));
        assert!(r.limits.unwrap().contains_key("cpu"));
    }

    #[test]
    fn pull_secrets_only_when_configured() {
        let mut s = Settings::default();
        assert_eq!(pull_secrets(&s), None);
        s.image_pull_secrets = vec!["regcred".into()];
        assert_eq!(pull_secrets(&s).unwrap()[0].name, "regcred");
    }
}
