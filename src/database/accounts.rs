//! Decides a Database's accounts (`resources::accounts`): whether the application's Secret
//! `<name>-app` must be made (it is missing), and whether the accounts Secret the instances
//! mount must be rebuilt (what it was built from — the spec's roles, the versions of the
//! Secrets the passwords come from — differs from the digest it carries). A role whose
//! password Secret or key is missing is still kept, without a password change, and named in a
//! warning Event.
//!
//! `AccountsReady` says whether the pods mount the accounts (pods an earlier dbop started do
//! not, until their next restart) and whether every declared password can be read.
//!
//! Pure: reads the observed metadata; `observe::application_password` reads the one password
//! a rebuild needs, and only in a pass that rebuilds.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;

use crate::api::Database;
use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::objects::EventSpec;
use crate::resources::Names;
use crate::resources::accounts::{INPUTS_ANNOTATION, VOLUME, inputs, password_sources};

/// What a pass observed of the accounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountsFact {
    /// `<name>-app` exists.
    pub application_secret: bool,
    /// The digest of what the accounts Secret should be built from now.
    pub wanted_inputs: String,
    /// The digest the accounts Secret carries (None: no Secret).
    pub built_inputs: Option<String>,
    /// The declared roles whose password cannot be read, with why.
    pub missing_passwords: Vec<String>,
    /// The StatefulSet's pod template mounts the accounts (None: no StatefulSet yet).
    pub template_mounts: Option<bool>,
}

impl AccountsFact {
    /// From the (metadata of the) application's and accounts Secrets, the role passwords'
    /// Secrets (`password_sources` order) and the StatefulSet.
    pub fn of(
        db: &Database,
        application: Option<&Secret>,
        accounts: Option<&Secret>,
        role_password_secrets: &[Option<Secret>],
        sts: Option<&StatefulSet>,
    ) -> Self {
        let mut versions = vec![application.and_then(|s| s.metadata.resource_version.clone())];
        let mut missing_passwords = Vec::new();
        for (i, source) in password_sources(db).iter().enumerate() {
            let Some(key) = source else { continue };
            let secret = role_password_secrets.get(i).and_then(Option::as_ref);
            if password(secret, &key.key).is_none() {
                missing_passwords.push(format!(
                    "role {}: Secret {} has no key {}",
                    db.spec.roles[i].name, key.name, key.key
                ));
            }
            versions.push(secret.and_then(|s| s.metadata.resource_version.clone()));
        }
        AccountsFact {
            application_secret: application.is_some(),
            wanted_inputs: inputs(db, &versions),
            built_inputs: accounts
                .and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|a| a.get(INPUTS_ANNOTATION).cloned()),
            missing_passwords,
            template_mounts: sts.map(mounts_accounts),
        }
    }
}

fn mounts_accounts(sts: &StatefulSet) -> bool {
    sts.spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == VOLUME))
}

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
pub fn plan(fact: &AccountsFact) -> AccountsPlan {
    AccountsPlan {
        create_application_secret: !fact.application_secret,
        rebuild: (fact.built_inputs.as_ref() != Some(&fact.wanted_inputs))
            .then(|| fact.wanted_inputs.clone()),
        missing_passwords: fact.missing_passwords.clone(),
    }
}

/// `AccountsReady`: the pods mount the accounts and every declared password can be read.
pub fn condition(db: &Database, fact: &AccountsFact) -> ConditionStatus {
    let not_ready = |reason: &str, message: String| {
        ConditionStatus::new(ConditionType::AccountsReady, false, reason, message)
    };
    let app = Names::of(db).application_secret();
    match fact.template_mounts {
        None => not_ready("Starting", "the database pods are not created yet".into()),
        Some(false) => not_ready(
            "RestartPending",
            format!(
                "the pods were started by an earlier dbop without the accounts: the application \
                 role of Secret {app} and spec.roles are made at their next restart (set the \
                 annotation dbop.dev/restartedAt on the Database to restart them one by one now); \
                 the superuser's Secret works meanwhile"
            ),
        ),
        Some(true) if !fact.missing_passwords.is_empty() => not_ready(
            "PasswordSecretMissing",
            format!(
                "{}: the role is kept without a password change; create the Secret or key named \
                 in spec.roles[].passwordSecret",
                fact.missing_passwords.join("; ")
            ),
        ),
        Some(true) => ConditionStatus::new(
            ConditionType::AccountsReady,
            true,
            "Ready",
            format!(
                "applications connect with Secret {app} (a role that is not a superuser, owning \
                 its database); the primary keeps the roles of spec.roles"
            ),
        ),
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

    /// What a pass observed, as the tests set it.
    #[derive(Default)]
    struct Observed {
        application_secret: Option<Secret>,
        accounts_secret: Option<Secret>,
        role_password_secrets: Vec<Option<Secret>>,
        statefulset: Option<StatefulSet>,
    }

    impl AccountsFact {
        fn from(db: &Database, snap: &Observed) -> Self {
            AccountsFact::of(
                db,
                snap.application_secret.as_ref(),
                snap.accounts_secret.as_ref(),
                &snap.role_password_secrets,
                snap.statefulset.as_ref(),
            )
        }
    }

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
        let fact = AccountsFact::from(&db(), &Observed::default());
        let p = plan(&fact);
        assert!(p.create_application_secret);
        assert!(p.rebuild.is_some());
        assert_eq!(
            p.missing_passwords,
            vec!["role reporting: Secret reporting-pw has no key password"]
        );
        let event = missing_event(&p).unwrap();
        assert!(event.warning && event.note.contains("reporting-pw"));
        assert_eq!(condition(&db(), &fact).reason, "Starting");
    }

    #[test]
    fn a_settled_database_rebuilds_nothing_until_an_input_changes() {
        let db = db();
        let mut snap = Observed {
            application_secret: Some(secret("11", None)),
            role_password_secrets: vec![Some(secret("21", Some("pw")))],
            ..Observed::default()
        };
        let first = plan(&AccountsFact::from(&db, &snap));
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
        assert_eq!(
            plan(&AccountsFact::from(&db, &snap)),
            AccountsPlan::default()
        );
        // The user changes the role's password.
        snap.role_password_secrets = vec![Some(secret("22", Some("new")))];
        assert!(plan(&AccountsFact::from(&db, &snap)).rebuild.is_some());
    }

    #[test]
    fn the_condition_says_what_holds_the_accounts_back() {
        let db = db();
        let settings = crate::settings::Settings::default();
        let mut snap = Observed {
            statefulset: Some(crate::resources::statefulset::statefulset(
                &db, &settings, None,
            )),
            role_password_secrets: vec![Some(secret("21", Some("pw")))],
            ..Observed::default()
        };
        let ready = condition(&db, &AccountsFact::from(&db, &snap));
        assert!(ready.status, "{ready:?}");
        assert!(ready.message.contains("orders-app"));
        snap.role_password_secrets = vec![None];
        let missing = condition(&db, &AccountsFact::from(&db, &snap));
        assert_eq!(
            (missing.status, missing.reason.as_str()),
            (false, "PasswordSecretMissing")
        );
        // A template an earlier dbop built, without the accounts volume.
        let sts = snap.statefulset.as_mut().unwrap();
        let pod = sts.spec.template.spec.as_mut().unwrap();
        pod.volumes.as_mut().unwrap().retain(|v| v.name != VOLUME);
        let old = condition(&db, &AccountsFact::from(&db, &snap));
        assert_eq!(old.reason, "RestartPending");
        assert!(old.message.contains("dbop.dev/restartedAt"));
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
