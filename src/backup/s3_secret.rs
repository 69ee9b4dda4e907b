//! Whether the S3 credentials Secret named by `spec.backup.s3.credentials` is usable. Pure:
//! only key names are looked at, never values. Read by both controllers (a Database's
//! `BackupHealthy`, a `DatabaseBackup` waiting for usable credentials).

use std::fmt;

use k8s_openapi::api::core::v1::Secret;

use crate::api::S3CredentialsRef;

/// What is wrong with the S3 credentials Secret; `Display` says what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum S3SecretProblem {
    NotFound {
        secret: String,
        access_key_id_key: String,
        secret_access_key_key: String,
    },
    /// The keys (by the names the reference gives them) that are absent or empty; the first
    /// names the field of the reference that would rename it.
    MissingKeys {
        secret: String,
        keys: Vec<String>,
        field: &'static str,
    },
    /// The `spec.backup.s3.ca` source is missing or empty (see `backup::ca`); says what to fix.
    CaSource(String),
    /// The `spec.backup.encryption` Secret is missing or lacks its key (`backup::encryption`).
    EncryptionKey(String),
}

impl S3SecretProblem {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            S3SecretProblem::NotFound { .. } => "S3CredentialsSecretNotFound",
            S3SecretProblem::MissingKeys { .. } => "S3CredentialsSecretInvalid",
            S3SecretProblem::CaSource(_) => "S3CaSourceInvalid",
            S3SecretProblem::EncryptionKey(_) => "EncryptionKeySecretInvalid",
        }
    }
}

impl fmt::Display for S3SecretProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            S3SecretProblem::NotFound {
                secret,
                access_key_id_key,
                secret_access_key_key,
            } => write!(
                f,
                "Secret {secret} (spec.backup.s3.credentials.secretName) does not exist: create it \
                 with the keys {access_key_id_key} and {secret_access_key_key}"
            ),
            S3SecretProblem::MissingKeys {
                secret,
                keys,
                field,
            } => write!(
                f,
                "Secret {secret} has no non-empty key {}: add it (or set spec.backup.s3.credentials.{field})",
                keys.join(" nor ")
            ),
            S3SecretProblem::CaSource(problem) | S3SecretProblem::EncryptionKey(problem) => {
                f.write_str(problem)
            }
        }
    }
}

/// Whether `secret` has a non-empty `key` (in `data` or `stringData`); values are not read.
pub fn has_key(secret: &Secret, key: &str) -> bool {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .is_some_and(|v| !v.0.is_empty())
        || secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_some_and(|v| !v.is_empty())
}

/// What is wrong with the S3 credentials Secret, if anything (nothing when the spec names
/// none: the Jobs take the standard credential chain).
pub fn s3_secret_problem(
    reference: Option<&S3CredentialsRef>,
    secret: Option<&Secret>,
) -> Option<S3SecretProblem> {
    let reference = reference?;
    let Some(secret) = secret else {
        return Some(S3SecretProblem::NotFound {
            secret: reference.secret_name.clone(),
            access_key_id_key: reference.access_key_id_key().into(),
            secret_access_key_key: reference.secret_access_key_key().into(),
        });
    };
    let has = |key: &str| has_key(secret, key);
    let missing: Vec<String> = [
        reference.access_key_id_key(),
        reference.secret_access_key_key(),
    ]
    .into_iter()
    .chain(reference.session_token_key.as_deref())
    .filter(|k| !has(k))
    .map(String::from)
    .collect();
    let field = match missing.first() {
        None => return None,
        Some(first) if first == reference.access_key_id_key() => "accessKeyIdKey",
        Some(first) if first == reference.secret_access_key_key() => "secretAccessKeyKey",
        Some(_) => "sessionTokenKey",
    };
    Some(S3SecretProblem::MissingKeys {
        secret: reference.secret_name.clone(),
        keys: missing,
        field,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn s3_secret_checks_name_keys_never_values() {
        let reference = S3CredentialsRef {
            secret_name: "s3".into(),
            access_key_id_key: None,
            secret_access_key_key: Some("secret".into()),
            session_token_key: None,
        };
        assert_eq!(
            s3_secret_problem(None, None),
            None,
            "no Secret named: the chain"
        );
        let missing = s3_secret_problem(Some(&reference), None).unwrap();
        assert_eq!(missing.reason(), "S3CredentialsSecretNotFound");
        let text = missing.to_string();
        assert!(
            text.contains("does not exist") && text.contains("AWS_ACCESS_KEY_ID"),
            "{text}"
        );
        let secret = |keys: &[(&str, &str)]| Secret {
            data: Some(
                keys.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let lacking = s3_secret_problem(
            Some(&reference),
            Some(&secret(&[("AWS_ACCESS_KEY_ID", "AKIA-VALUE")])),
        )
        .unwrap();
        assert_eq!(lacking.reason(), "S3CredentialsSecretInvalid");
        let text = lacking.to_string();
        assert!(text.contains("no non-empty key secret"), "{text}");
        assert!(text.contains("credentials.secretAccessKeyKey"), "{text}");
        assert!(!text.contains("AKIA-VALUE"));
        let both = s3_secret_problem(Some(&reference), Some(&secret(&[]))).unwrap();
        assert!(
            both.to_string()
                .contains("AWS_ACCESS_KEY_ID nor secret: add it (or set spec.backup.s3.credentials.accessKeyIdKey)"),
            "{both}"
        );
        assert_eq!(
            s3_secret_problem(
                Some(&reference),
                Some(&secret(&[("AWS_ACCESS_KEY_ID", "a"), ("secret", "b")]))
            ),
            None
        );
        let with_token = S3CredentialsRef {
            session_token_key: Some("token".into()),
            ..reference
        };
        let no_token = s3_secret_problem(
            Some(&with_token),
            Some(&secret(&[("AWS_ACCESS_KEY_ID", "a"), ("secret", "b")])),
        )
        .unwrap();
        assert!(
            no_token.to_string().contains("credentials.sessionTokenKey"),
            "{no_token}"
        );
    }
}
