//! Shared pieces of every pod dbop creates (the database's, the init Job's, the backup Job's):
//! security contexts, scratch volumes, environment from Secrets, default resources and the
//! init container that copies one of dbop's static binaries into the pod.
//!
//! Pure: plain functions of their arguments.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, LocalObjectReference,
    PodSecurityContext, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext,
    Volume, VolumeMount,
};

use crate::objects::quantities;
use crate::settings::Settings;

/// The uid and gid of the `postgres` user in the official and Debian-built images.
pub const POSTGRES_UID: i64 = 999;
/// Where the copying init container puts dbop's binaries (an emptyDir).
pub const DBOP_BIN_DIR: &str = "/dbop";
/// The name of the emptyDir holding dbop's binaries.
pub const DBOP_BIN_VOLUME: &str = "dbop-bin";

/// An environment variable read from a key of a Secret.
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

/// The pod security context every dbop pod runs with. `OnRootMismatch`: the kubelet changes
/// a volume's ownership only when its root is wrong, not recursively at every start.
pub fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: Some(POSTGRES_UID),
        run_as_group: Some(POSTGRES_UID),
        fs_group: Some(POSTGRES_UID),
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
    fn every_pod_changes_ownership_only_on_mismatch() {
        let sc = pod_security_context();
        assert_eq!(sc.fs_group_change_policy.as_deref(), Some("OnRootMismatch"));
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
