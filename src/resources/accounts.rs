//! The accounts of a Database: the application's Secret `<name>-app` (what clients connect
//! with: the application role, which is not a superuser, and its database), and the Secret
//! `<name>-accounts` the instances mount (`dbop_contract::accounts`): the document naming the
//! application role, its database and the declared roles (`spec.roles`), with their passwords
//! beside it. The primary's instance manager makes PostgreSQL follow it.
//!
//! Pure: the passwords come in (made or read by the caller).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PodTemplateSpec, Secret};
use sha2::{Digest, Sha256};

use super::pod::mount_optional_secret;
use super::{Names, POSTGRES_PORT, owned_meta};
use crate::api::{ApplicationSpec, Database, ManagedRoleSpec, RoleEnsure};
use dbop_contract::accounts::{
    ACCOUNTS_DIR, APPLICATION_PASSWORD_FILE, Accounts, Application, DOCUMENT_FILE, Ensure, Role,
    role_password_file,
};

/// The annotation on `<name>-accounts` with the digest of what it was built from (the spec's
/// roles, the Secrets' versions): a pass compares it with the metadata cache and rebuilds the
/// Secret only when it differs.
pub const INPUTS_ANNOTATION: &str = "dbop.dev/accounts-inputs";
/// The accounts Secret's volume in the database pod.
pub const VOLUME: &str = "accounts";

impl Names {
    /// The Secret applications connect with.
    pub fn application_secret(&self) -> String {
        format!("{}-app", self.database())
    }
    /// The Secret the instances mount: the accounts document and its passwords.
    pub fn accounts_secret(&self) -> String {
        format!("{}-accounts", self.database())
    }
}

/// The application's database and owner (the spec's, or `app` and `app`).
pub fn application(db: &Database) -> ApplicationSpec {
    db.spec.application.clone().unwrap_or_default()
}

/// The application's Secret, with what clients expect (CloudNativePG's `-app` layout).
pub fn application_secret(db: &Database, password: &str) -> Secret {
    let names = Names::of(db);
    let app = application(db);
    let host = names.endpoint(&db.namespace_or_default());
    let (user, dbname, port) = (&app.owner, &app.database, POSTGRES_PORT);
    // Names are `[a-z0-9_]` and generated passwords alphanumeric: nothing to escape in a URI.
    let entries = [
        ("username", user.clone()),
        ("password", password.to_string()),
        ("host", host.clone()),
        ("port", port.to_string()),
        ("dbname", dbname.clone()),
        (
            "uri",
            format!("postgresql://{user}:{password}@{host}:{port}/{dbname}?sslmode=require"),
        ),
        (
            "jdbc-uri",
            format!(
                "jdbc:postgresql://{host}:{port}/{dbname}?user={user}&password={password}&sslmode=require"
            ),
        ),
        (
            "pgpass",
            format!("{host}:{port}:{dbname}:{user}:{password}\n"),
        ),
    ];
    Secret {
        metadata: owned_meta(db, names.application_secret(), "credentials"),
        type_: Some("kubernetes.io/basic-auth".into()),
        data: Some(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// The accounts document for `db` (no password in it: each role with one names its file).
pub fn document(db: &Database) -> Accounts {
    let app = application(db);
    Accounts {
        application: Application {
            database: app.database,
            owner: app.owner,
        },
        roles: db
            .spec
            .roles
            .iter()
            .enumerate()
            .map(|(i, r)| role(i, r))
            .collect(),
    }
}

fn role(index: usize, spec: &ManagedRoleSpec) -> Role {
    Role {
        name: spec.name.clone(),
        ensure: match spec.ensure {
            RoleEnsure::Present => Ensure::Present,
            RoleEnsure::Absent => Ensure::Absent,
        },
        login: spec.login,
        createdb: spec.createdb,
        createrole: spec.createrole,
        inherit: spec.inherit,
        bypassrls: spec.bypassrls,
        connection_limit: spec.connection_limit,
        in_roles: spec.in_roles.clone(),
        password_file: spec
            .password_secret
            .as_ref()
            .filter(|_| spec.ensure == RoleEnsure::Present)
            .map(|_| role_password_file(index)),
    }
}

/// What the accounts Secret is built from, as a digest: the document, and the version of each
/// Secret a password comes from (`None`: not read yet, or missing).
pub fn inputs(db: &Database, versions: &[Option<String>]) -> String {
    let mut digest = Sha256::new();
    digest.update(document(db).render().as_bytes());
    for version in versions {
        digest.update(version.as_deref().unwrap_or("-").as_bytes());
        digest.update([0]);
    }
    super::hex(&digest.finalize())
}

/// The Secrets a role password comes from, in `spec.roles` order (`None` for a role without
/// one, or one that is `Absent`).
pub fn password_sources(db: &Database) -> Vec<Option<&crate::api::KeyRef>> {
    db.spec
        .roles
        .iter()
        .map(|r| {
            r.password_secret
                .as_ref()
                .filter(|_| r.ensure == RoleEnsure::Present)
        })
        .collect()
}

/// The accounts Secret: the document, the application password, and each declared role's
/// password (by index; a missing one is left out, and the primary logs which).
pub fn accounts_secret(
    db: &Database,
    application_password: &str,
    role_passwords: &BTreeMap<usize, Vec<u8>>,
    inputs: &str,
) -> Secret {
    let mut data = BTreeMap::from([
        (
            DOCUMENT_FILE.to_string(),
            ByteString(document(db).render().into_bytes()),
        ),
        (
            APPLICATION_PASSWORD_FILE.to_string(),
            ByteString(application_password.as_bytes().to_vec()),
        ),
    ]);
    for (index, password) in role_passwords {
        data.insert(role_password_file(*index), ByteString(password.clone()));
    }
    let mut metadata = owned_meta(db, Names::of(db).accounts_secret(), "accounts");
    metadata.annotations = Some(BTreeMap::from([(
        INPUTS_ANNOTATION.to_string(),
        inputs.to_string(),
    )]));
    Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Mounts the accounts Secret in the database container (optional: a pod may start before the
/// Secret exists, and then has the application role once it appears).
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    if let Some(pod) = template.spec.as_mut() {
        mount_optional_secret(pod, VOLUME, ACCOUNTS_DIR, Names::of(db).accounts_secret());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use serde_json::json;

    fn with_roles() -> Database {
        let mut db = testing::minimal();
        db.spec.application = Some(ApplicationSpec {
            database: "shop".into(),
            owner: "shop_owner".into(),
        });
        db.spec.roles = serde_json::from_value(json!([
            {"name": "reporting", "inRoles": ["pg_read_all_data"],
             "passwordSecret": {"name": "reporting-pw", "key": "password"}},
            {"name": "old", "ensure": "Absent",
             "passwordSecret": {"name": "old-pw", "key": "password"}},
            {"name": "nologin", "login": false}
        ]))
        .unwrap();
        db
    }

    #[test]
    fn the_application_secret_has_what_clients_expect() {
        let s = application_secret(&testing::minimal(), "pw123");
        assert_eq!(s.metadata.name.as_deref(), Some("orders-app"));
        let data = s.data.unwrap();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(text("username"), "app");
        assert_eq!(text("dbname"), "app");
        assert_eq!(text("host"), "orders-rw.shop.svc");
        assert_eq!(
            text("uri"),
            "postgresql://app:pw123@orders-rw.shop.svc:5432/app?sslmode=require"
        );
        assert!(text("jdbc-uri").starts_with("jdbc:postgresql://orders-rw.shop.svc:5432/app?"));
        assert_eq!(text("pgpass"), "orders-rw.shop.svc:5432:app:app:pw123\n");
    }

    #[test]
    fn the_document_names_password_files_not_passwords() {
        let db = with_roles();
        let doc = document(&db);
        assert_eq!(doc.application.owner, "shop_owner");
        assert_eq!(
            doc.roles[0].password_file.as_deref(),
            Some("role-0.password")
        );
        // An Absent role's password is not needed; a role without a Secret keeps its own.
        assert_eq!(doc.roles[1].ensure, Ensure::Absent);
        assert_eq!(doc.roles[1].password_file, None);
        assert_eq!(doc.roles[2].password_file, None);
        assert!(!doc.roles[2].login);
        let sources = password_sources(&db);
        assert_eq!(sources[0].map(|k| k.name.as_str()), Some("reporting-pw"));
        assert!(sources[1].is_none() && sources[2].is_none());
        let secret = accounts_secret(
            &db,
            "app-pw",
            &BTreeMap::from([(0, b"rep-pw".to_vec())]),
            "digest",
        );
        let data = secret.data.unwrap();
        assert_eq!(data["role-0.password"].0, b"rep-pw");
        assert_eq!(data["application.password"].0, b"app-pw");
        assert!(!String::from_utf8_lossy(&data["accounts.json"].0).contains("rep-pw"));
        assert_eq!(
            secret.metadata.annotations.unwrap()[INPUTS_ANNOTATION],
            "digest"
        );
    }

    #[test]
    fn the_inputs_change_with_the_spec_and_the_secrets() {
        let db = with_roles();
        let base = inputs(&db, &[Some("1".into())]);
        assert_eq!(base, inputs(&db, &[Some("1".into())]));
        assert_ne!(base, inputs(&db, &[Some("2".into())]));
        assert_ne!(base, inputs(&db, &[None]));
        let mut changed = db.clone();
        changed.spec.roles[0].connection_limit = 3;
        assert_ne!(base, inputs(&changed, &[Some("1".into())]));
    }

    #[test]
    fn the_pods_mount_the_accounts_optionally() {
        let sts = crate::resources::statefulset::statefulset(
            &testing::minimal(),
            &crate::settings::Settings::default(),
            None,
        );
        let pod = sts.spec.template.spec.unwrap();
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "accounts")
            .unwrap();
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("orders-accounts"));
        assert_eq!(secret.optional, Some(true));
        let postgres = &pod.containers[0];
        assert!(
            postgres
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.mount_path == ACCOUNTS_DIR && m.read_only == Some(true))
        );
    }
}
