//! The `s3.ca` source of a backup: whether the Secret or ConfigMap key it names exists, read
//! before a backup Job is made (a missing source would leave the Job's pod in
//! ContainerCreating until its deadline).
//!
//! `problem` is pure; `read_problem` is the one read (a get of the named object; only the key's
//! presence is looked at).

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use crate::api::{BackupSpec, CaSource};

/// What was found for the CA source: `None` when the object does not exist, else whether it
/// has a non-empty value under the key.
pub fn problem(ca: &CaSource, found: Option<bool>) -> Option<String> {
    let (kind, r) = match (&ca.secret_key_ref, &ca.config_map_key_ref) {
        (Some(r), _) => ("Secret", r),
        (None, Some(r)) => ("ConfigMap", r),
        (None, None) => {
            return Some(
                "spec.backup.s3.ca names neither a secretKeyRef nor a configMapKeyRef".into(),
            );
        }
    };
    match found {
        None => Some(format!(
            "{kind} {} (spec.backup.s3.ca) does not exist: create it with the CA certificate \
             (PEM) under the key {}",
            r.name, r.key
        )),
        Some(false) => Some(format!(
            "{kind} {} has no non-empty key {} (spec.backup.s3.ca): add the CA certificate (PEM)",
            r.name, r.key
        )),
        Some(true) => None,
    }
}

/// Reads the CA source of `spec` (if any) and says what is wrong with it.
pub async fn read_problem(
    client: &Client,
    namespace: &str,
    spec: &BackupSpec,
) -> kube::Result<Option<String>> {
    let Some(ca) = &spec.s3.ca else {
        return Ok(None);
    };
    let found = match (&ca.secret_key_ref, &ca.config_map_key_ref) {
        (Some(r), _) => Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(&r.name)
            .await?
            .map(|s| {
                s.data
                    .unwrap_or_default()
                    .get(&r.key)
                    .is_some_and(|v| !v.0.is_empty())
                    || s.string_data
                        .unwrap_or_default()
                        .get(&r.key)
                        .is_some_and(|v| !v.is_empty())
            }),
        (None, Some(r)) => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(&r.name)
            .await?
            .map(|c| {
                c.data
                    .unwrap_or_default()
                    .get(&r.key)
                    .is_some_and(|v| !v.is_empty())
                    || c.binary_data.unwrap_or_default().contains_key(&r.key)
            }),
        (None, None) => None,
    };
    Ok(problem(ca, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KeyRef;

    fn key(name: &str) -> Option<KeyRef> {
        Some(KeyRef {
            name: name.into(),
            key: "ca.crt".into(),
        })
    }

    #[test]
    fn problems() {
        let cm = CaSource {
            secret_key_ref: None,
            config_map_key_ref: key("minio-ca"),
        };
        let secret = CaSource {
            secret_key_ref: key("minio-tls"),
            config_map_key_ref: None,
        };
        assert_eq!(problem(&cm, Some(true)), None);
        let missing = problem(&cm, None).unwrap();
        assert!(missing.contains("ConfigMap minio-ca") && missing.contains("does not exist"));
        let no_key = problem(&secret, Some(false)).unwrap();
        assert!(no_key.contains("Secret minio-tls") && no_key.contains("ca.crt"));
        let neither = CaSource {
            secret_key_ref: None,
            config_map_key_ref: None,
        };
        assert!(problem(&neither, Some(true)).is_some());
    }
}
