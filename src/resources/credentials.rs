//! The generated superuser credentials Secret, and which Secret a Database uses.
//!
//! The password is made by the caller (once, when the Secret does not exist) and is never
//! rotated by dbop while the Secret exists: the server's password is fixed when its data
//! directory is initialised.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use super::{DEFAULT_SUPERUSER, Names, POSTGRES_PORT, owned_meta};
use crate::api::Database;

pub const USERNAME_KEY: &str = "username";
pub const PASSWORD_KEY: &str = "password";

/// The Secret a Database's credentials live in: the user's, or the generated one.
pub fn secret_name(db: &Database) -> String {
    match &db.spec.credentials {
        Some(c) => c.secret_name.clone(),
        None => Names::of(db).generated_secret(),
    }
}

/// True when dbop generates (and owns) the credentials Secret.
pub fn is_generated(db: &Database) -> bool {
    db.spec.credentials.is_none()
}

/// The generated credentials Secret, with the given password.
pub fn generated_secret(db: &Database, password: &str) -> Secret {
    let names = Names::of(db);
    let namespace = db.namespace_or_default();
    let data = BTreeMap::from([
        (USERNAME_KEY.to_string(), bytes(DEFAULT_SUPERUSER)),
        (PASSWORD_KEY.to_string(), bytes(password)),
        ("host".to_string(), bytes(&names.endpoint(&namespace))),
        ("port".to_string(), bytes(&POSTGRES_PORT.to_string())),
    ]);
    Secret {
        metadata: owned_meta(db, names.generated_secret(), "credentials"),
        type_: Some("kubernetes.io/basic-auth".into()),
        data: Some(data),
        ..Secret::default()
    }
}

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

/// The superuser's name: the user's Secret's `username` (when it has one), else `postgres`.
pub fn superuser_name(db: &Database, secret: Option<&Secret>) -> String {
    if is_generated(db) {
        return DEFAULT_SUPERUSER.to_string();
    }
    secret
        .and_then(|s| s.data.as_ref()?.get(USERNAME_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| DEFAULT_SUPERUSER.to_string())
}

/// What is wrong with a user-provided credentials Secret, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretProblem {
    NotFound,
    MissingPassword,
}

/// Checks that a Secret can serve as credentials (it has a non-empty `password`).
pub fn check_secret(secret: Option<&Secret>) -> Result<(), SecretProblem> {
    let secret = secret.ok_or(SecretProblem::NotFound)?;
    let has_password = secret
        .data
        .as_ref()
        .and_then(|d| d.get(PASSWORD_KEY))
        .is_some_and(|p| !p.0.is_empty())
        || secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(PASSWORD_KEY))
            .is_some_and(|p| !p.is_empty());
    if has_password {
        Ok(())
    } else {
        Err(SecretProblem::MissingPassword)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn generated_secret_holds_credentials_and_connection_facts() {
        let db = testing::minimal();
        let s = generated_secret(&db, "s3cret-pw");
        assert_eq!(s.metadata.name.as_deref(), Some("orders-credentials"));
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/basic-auth"));
        let data = s.data.unwrap();
        assert_eq!(data[PASSWORD_KEY].0, b"s3cret-pw");
        assert_eq!(data[USERNAME_KEY].0, b"postgres");
        assert_eq!(data["host"].0, b"orders-rw.shop.svc");
        assert!(s.metadata.owner_references.is_some());
    }

    #[test]
    fn user_secret_name_wins() {
        let mut db = testing::minimal();
        assert!(is_generated(&db));
        db.spec.credentials = Some(crate::api::CredentialsSpec {
            secret_name: "pg-admin".into(),
        });
        assert_eq!(secret_name(&db), "pg-admin");
        assert!(!is_generated(&db));
    }

    #[test]
    fn secret_checks() {
        assert_eq!(check_secret(None), Err(SecretProblem::NotFound));
        let empty = Secret::default();
        assert_eq!(
            check_secret(Some(&empty)),
            Err(SecretProblem::MissingPassword)
        );
        let ok = Secret {
            data: Some(BTreeMap::from([(PASSWORD_KEY.to_string(), bytes("x"))])),
            ..Secret::default()
        };
        assert_eq!(check_secret(Some(&ok)), Ok(()));
        let string_data = Secret {
            string_data: Some(BTreeMap::from([(
                PASSWORD_KEY.to_string(),
                "x".to_string(),
            )])),
            ..Secret::default()
        };
        assert_eq!(check_secret(Some(&string_data)), Ok(()));
    }
}
