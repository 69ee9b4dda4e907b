//! `spec.application` and `spec.roles`: the application's own role and database, and the
//! declared roles dbop keeps (docs/security.md, "Roles"). The superuser is dbop's and the
//! break-glass account's; applications get `<name>-app`.
//!
//! Pure data: no client, no clock, no I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::KeyRef;

/// The application's database and the role that owns it. Names (here and in `roles`):
/// lower-case letters, digits and `_`, so they need no quoting in a client's URI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!self.owner.startsWith('pg_') && !self.database.startsWith('pg_') && !(self.database in ['postgres', 'template0', 'template1'])",
    "message": "the application's database and owner cannot be PostgreSQL's own (pg_…, postgres, template0, template1)"
}]))]
pub struct ApplicationSpec {
    /// The application database (default `app`).
    #[serde(default = "default_app")]
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"), length(min = 1, max = 63))]
    pub database: String,
    /// The role that owns it, a login role that is not a superuser and may not create roles
    /// or databases (default `app`). Its credentials are in the Secret `<name>-app`.
    #[serde(default = "default_app")]
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"), length(min = 1, max = 63))]
    pub owner: String,
}

impl Default for ApplicationSpec {
    fn default() -> Self {
        Self {
            database: default_app(),
            owner: default_app(),
        }
    }
}

fn default_app() -> String {
    "app".into()
}

/// Whether a declared role must exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RoleEnsure {
    /// Created when missing and kept to the spec.
    #[default]
    Present,
    /// Dropped (a role that still owns objects is not: the primary logs why, and tries again).
    Absent,
}

/// A role dbop keeps on the primary: created, altered to exactly these attributes and
/// memberships, and dropped only with `ensure: Absent`. Never a superuser, never a
/// replication role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRoleSpec {
    /// The role's name.
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_]{0,62}$"), length(min = 1, max = 63))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!self.startsWith('pg_') && !(self in ['postgres', 'dbop_replication'])",
        "message": "the name is PostgreSQL's or dbop's own (pg_…, postgres, dbop_replication)"
    }]))]
    pub name: String,
    /// `Present` (default) or `Absent`.
    #[serde(default)]
    pub ensure: RoleEnsure,
    /// May log in (default true).
    #[serde(default = "yes")]
    pub login: bool,
    /// May create databases.
    #[serde(default)]
    pub createdb: bool,
    /// May create and alter roles that are not superusers.
    #[serde(default)]
    pub createrole: bool,
    /// Uses the privileges of the roles it is a member of (default true).
    #[serde(default = "yes")]
    pub inherit: bool,
    /// Bypasses row-level security.
    #[serde(default)]
    pub bypassrls: bool,
    /// Concurrent connections allowed (-1, the default: no limit).
    #[serde(default = "no_limit")]
    #[schemars(range(min = -1, max = 100000))]
    pub connection_limit: i32,
    /// The roles it is a member of; memberships not listed here are revoked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub in_roles: Vec<String>,
    /// The key of a Secret in the Database's namespace that holds its password (ASCII). A
    /// changed password is applied within seconds. Without it, dbop does not manage
    /// the role's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<KeyRef>,
}

fn yes() -> bool {
    true
}

fn no_limit() -> i32 {
    -1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let app: ApplicationSpec = serde_json::from_str("{}").unwrap();
        assert_eq!((app.database.as_str(), app.owner.as_str()), ("app", "app"));
        let role: ManagedRoleSpec = serde_json::from_str(r#"{"name": "reporting"}"#).unwrap();
        assert!(role.login && role.inherit && !role.createdb && !role.bypassrls);
        assert_eq!(role.connection_limit, -1);
        assert_eq!(role.ensure, RoleEnsure::Present);
    }
}
