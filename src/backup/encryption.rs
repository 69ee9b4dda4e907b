//! Whether the Secret of `spec.backup.encryption` can serve the backup Jobs: it exists and has
//! a non-empty `keyName`. Only key names are looked at here; whether the value is a key (base64
//! of 32 bytes) is the agent's to say, in the backup's message. Checked before any Job starts,
//! so a missing Secret is a condition, not a pod waiting for its volume until the Job's deadline.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::api::BackupEncryption;

/// What is wrong with the encryption keys' Secret, saying what to fix. Pure.
pub fn problem(encryption: &BackupEncryption, secret: Option<&Secret>) -> Option<String> {
    let BackupEncryption {
        secret_name,
        key_name,
    } = encryption;
    let Some(secret) = secret else {
        return Some(format!(
            "Secret {secret_name} (spec.backup.encryption.secretName) does not exist: create it \
             with the key {key_name}, e.g. `kubectl create secret generic {secret_name} \
             --from-literal={key_name}=$(openssl rand -base64 32)`"
        ));
    };
    (!super::s3_secret::has_key(secret, key_name)).then(|| {
        format!(
            "Secret {secret_name} has no non-empty key {key_name} \
             (spec.backup.encryption.keyName): add it (the base64 of 32 random bytes, \
             `openssl rand -base64 32`), keeping the keys older backups were made with"
        )
    })
}

/// Reads the Secret of `spec.backup.encryption` (when there is one) and says what is wrong.
pub async fn read_problem(
    client: &Client,
    namespace: &str,
    encryption: Option<&BackupEncryption>,
) -> kube::Result<Option<String>> {
    let Some(encryption) = encryption else {
        return Ok(None);
    };
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&encryption.secret_name)
        .await?;
    Ok(problem(encryption, secret.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn the_secret_must_exist_and_hold_the_named_key() {
        let enc = BackupEncryption {
            secret_name: "keys".into(),
            key_name: "k2".into(),
        };
        let with = |pairs: &[(&str, &str)]| Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let missing = problem(&enc, None).unwrap();
        assert!(
            missing.contains("Secret keys") && missing.contains("does not exist"),
            "{missing}"
        );
        let no_key = problem(&enc, Some(&with(&[("k1", "x")]))).unwrap();
        assert!(no_key.contains("no non-empty key k2"), "{no_key}");
        assert!(problem(&enc, Some(&with(&[("k2", "")]))).is_some());
        assert_eq!(
            problem(&enc, Some(&with(&[("k1", "x"), ("k2", "secret-value")]))),
            None
        );
        // Never a value in a message.
        assert!(!no_key.contains('x') || !no_key.contains("\"x\""));
    }
}
