//! Decides a Database's accounts (`resources::accounts`): whether the application's Secret
//! `<name>-app` must be made (it is missing), and whether the accounts Secret the instances
//! mount must be rebuilt (what it was built from — the spec's roles, the versions of the
//! Secrets the passwords come from — differs from the digest it carries). A role whose
//! password Secret or key is missing is still kept, without a password change, and named in a
//! warning Event.
//!
//! Pure: reads the observed metadata; `observe::application_password` reads the one password
//! a rebuild needs, and only in a pass that rebuilds.

use k8s_openapi::api::core::v1::Secret;

use super::facts::Observed;
use crate::api::Database;
use crate::objects::EventSpec;
use crate::resources::accounts::{INPUTS_ANNOTATION, inputs, password_sources};

/// What a pass does about the accounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountsPlan {
    /// Make `<name>-app` (with a new password).
    pub create_application_secret: bool,
    /// Rebuild `<name>-accounts` with these inputs (its new digest).
    pub rebuild: Option<String>,
    /// The declared roles whose password cannot be read, with why.
    pub missing_passwords: Vec<String>,
}

/// The plan from what the pass observed.
pub fn plan(db: &Database, snap: &Observed) -> AccountsPlan {
    let application = snap.application_secret.as_ref();
    let mut versions = vec![application.and_then(|s| s.metadata.resource_version.clone())];
    let mut missing_passwords = Vec::new();
    let sources = password_sources(db);
    for (i, source) in sources.iter().enumerate() {
        let secret = snap.role_password_secrets.get(i).and_then(Option::as_ref);
        if let Some(key) = source {
            if password(secret, &key.key).is_none() {
                missing_passwords.push(format!(
                    "role {}: Secret {} has no key {}",
                    db.spec.roles[i].name, key.name, key.key
                ));
            }
            versions.push(secret.and_then(|s| s.metadata.resource_version.clone()));
        }
    }
    let wanted = inputs(db, &versions);
    let built = snap
        .accounts_secret
        .as_ref()
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(INPUTS_ANNOTATION));
    AccountsPlan {
        create_application_secret: application.is_none(),
        rebuild: (built != Some(&wanted)).then_some(wanted),
        missing_passwords,
    }
}

/// A password from a Secret's key (`data` or `stringData`), when it is there and not empty.
pub fn password(secret: Option<&Secret>, key: &str) -> Option<Vec<u8>> {
    let secret = secret?;
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone());
    let from_string = || {
        secret
            .string_data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.as_bytes().to_vec())
    };
    from_data.or_else(from_string).filter(|p| !p.is_empty())
}

/// The warning Event of a rebuild that left passwords out (names, never values).
pub fn missing_event(plan: &AccountsPlan) -> Option<EventSpec> {
    (plan.rebuild.is_some() && !plan.missing_passwords.is_empty()).then(|| EventSpec {
        warning: true,
        reason: "RolePasswordMissing".into(),
        note: format!(
            "{}: the role is kept without a password change; create the Secret or key named in \
             spec.roles[].passwordSecret",
            plan.missing_passwords.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use serde_json::json;

    use super::*;
    use crate::resources::accounts::accounts_secret;
    use crate::resources::testing;

    fn db() -> Database {
        let mut db = testing::minimal();
        db.spec.roles = serde_json::from_value(json!([
            {"name": "reporting", "passwordSecret": {"name": "reporting-pw", "key": "password"}}
        ]))
        .unwrap();
        db
    }

    fn secret(version: &str, password: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.resource_version = Some(version.into());
        s.data = password
            .map(|p| BTreeMap::from([("password".to_string(), ByteString(p.as_bytes().to_vec()))]));
        s
    }

    #[test]
    fn a_new_database_gets_both_secrets() {
        let p = plan(&db(), &Observed::default());
        assert!(p.create_application_secret);
        assert!(p.rebuild.is_some());
        assert_eq!(
            p.missing_passwords,
            vec!["role reporting: Secret reporting-pw has no key password"]
        );
        let event = missing_event(&p).unwrap();
        assert!(event.warning && event.note.contains("reporting-pw"));
    }

    #[test]
    fn a_settled_database_rebuilds_nothing_until_an_input_changes() {
        let db = db();
        let mut snap = Observed {
            application_secret: Some(secret("11", None)),
            role_password_secrets: vec![Some(secret("21", Some("pw")))],
            ..Observed::default()
        };
        let first = plan(&db, &snap);
        assert!(!first.create_application_secret && first.missing_passwords.is_empty());
        let built = accounts_secret(
            &db,
            "app",
            &BTreeMap::new(),
            first.rebuild.as_ref().unwrap(),
        );
        snap.accounts_secret = Some(Secret {
            metadata: built.metadata,
            ..Secret::default()
        });
        assert_eq!(plan(&db, &snap), AccountsPlan::default());
        // The user changes the role's password.
        snap.role_password_secrets = vec![Some(secret("22", Some("new")))];
        assert!(plan(&db, &snap).rebuild.is_some());
    }

    #[test]
    fn passwords_from_data_or_string_data_and_never_empty() {
        assert_eq!(
            password(Some(&secret("1", Some("pw"))), "password"),
            Some(b"pw".to_vec())
        );
        assert_eq!(password(Some(&secret("1", Some(""))), "password"), None);
        assert_eq!(password(Some(&secret("1", Some("pw"))), "other"), None);
        let s = Secret {
            string_data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
            ..Secret::default()
        };
        assert_eq!(password(Some(&s), "k"), Some(b"v".to_vec()));
        assert_eq!(password(None, "k"), None);
    }
}
