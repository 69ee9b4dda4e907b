//! The accounts document: the PostgreSQL roles and the application database the operator wants
//! and the primary's instance manager makes. The operator writes it, with the passwords beside
//! it, into the Secret `<name>-accounts` (mounted at `ACCOUNTS_DIR` in every instance); the
//! instance manager of the primary applies it whenever the files change.
//!
//! The document names no password: each role with one names the Secret key (a file beside the
//! document) that holds it. Pure: serde only.

use serde::{Deserialize, Serialize};

/// Where the accounts Secret is mounted in the database container.
pub const ACCOUNTS_DIR: &str = "/etc/dbop/accounts";
/// The document's file (and key in the Secret).
pub const DOCUMENT_FILE: &str = "accounts.json";
/// The application role's password file (and key in the Secret).
pub const APPLICATION_PASSWORD_FILE: &str = "application.password";

/// The roles and database a primary keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accounts {
    /// The application's role and the database it owns.
    pub application: Application,
    /// The declared roles, in the spec's order.
    #[serde(default)]
    pub roles: Vec<Role>,
}

/// The application database and its owner, a login role that is not a superuser.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Application {
    pub database: String,
    pub owner: String,
}

/// Whether a declared role must exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ensure {
    #[default]
    Present,
    Absent,
}

/// A declared role: its attributes, the roles it is a member of, and where its password is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    pub name: String,
    #[serde(default)]
    pub ensure: Ensure,
    pub login: bool,
    pub createdb: bool,
    pub createrole: bool,
    pub inherit: bool,
    pub bypassrls: bool,
    /// -1: no limit.
    pub connection_limit: i32,
    #[serde(default)]
    pub in_roles: Vec<String>,
    /// The file beside the document with its password; `None`: the password is not managed
    /// (a new role gets none, an existing one keeps its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
}

impl Accounts {
    pub fn render(&self) -> String {
        serde_json::to_string_pretty(self).expect("the accounts document serialises")
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("the accounts document is invalid: {e}"))
    }
}

/// The password file of the declared role at `index` (keys stay valid whatever the role's
/// name: a Secret key allows only `[-._a-zA-Z0-9]`).
pub fn role_password_file(index: usize) -> String {
    format!("role-{index}.password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let doc = Accounts {
            application: Application {
                database: "app".into(),
                owner: "app".into(),
            },
            roles: vec![Role {
                name: "reporting".into(),
                login: true,
                inherit: true,
                connection_limit: -1,
                in_roles: vec!["pg_read_all_data".into()],
                password_file: Some(role_password_file(0)),
                ..Role::default()
            }],
        };
        assert_eq!(Accounts::parse(&doc.render()).unwrap(), doc);
        assert!(Accounts::parse("{").unwrap_err().contains("invalid"));
        assert_eq!(role_password_file(3), "role-3.password");
    }
}
