//! The accounts a primary keeps (`dbop_contract::accounts`): the application role (a login
//! role that is not a superuser) owning the application database, and the declared roles —
//! created, altered to their attributes, memberships and password, and dropped only when the
//! spec says `Absent`.
//!
//! Pure: the caller reads the mounted files (`read`) and runs the scripts; passwords become
//! SCRAM verifiers before they reach SQL (`password::scram_verifier`), so the plain text is in
//! no statement, log or command line.

use std::collections::BTreeMap;
use std::path::Path;

use dbop_contract::accounts::{APPLICATION_PASSWORD_FILE, Accounts, DOCUMENT_FILE, Ensure, Role};
use sha2::{Digest, Sha256};

use crate::password::{self, Fingerprint, quote_ident, quote_literal};

/// What the accounts directory holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// No document: the pod predates accounts (or the Secret is not made yet).
    Missing,
    Present(Mounted),
    /// The document or a password is unusable; the message names no password.
    Invalid(String),
}

/// The document and the passwords it names, by file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mounted {
    pub accounts: Accounts,
    pub passwords: BTreeMap<String, String>,
    pub fingerprint: Fingerprint,
}

/// Reads the accounts directory.
pub fn read(dir: &Path) -> Read {
    let document = match std::fs::read_to_string(dir.join(DOCUMENT_FILE)) {
        Ok(text) => text,
        Err(_) => return Read::Missing,
    };
    let accounts = match Accounts::parse(&document) {
        Ok(a) => a,
        Err(why) => return Read::Invalid(why),
    };
    let mut digest = Sha256::new();
    digest.update(document.as_bytes());
    let mut passwords = BTreeMap::new();
    let files = std::iter::once(APPLICATION_PASSWORD_FILE.to_string()).chain(
        accounts
            .roles
            .iter()
            .filter_map(|r| r.password_file.clone()),
    );
    for file in files {
        let Ok(bytes) = std::fs::read(dir.join(&file)) else {
            return Read::Invalid(format!("the password file {file} is missing"));
        };
        match password::from_file(&bytes) {
            Ok(p) if !p.is_empty() && p.is_ascii() => {
                digest.update(file.as_bytes());
                digest.update([0]);
                digest.update(p.as_bytes());
                digest.update([0]);
                passwords.insert(file, p);
            }
            _ => {
                return Read::Invalid(format!(
                    "the password in {file} is empty or not ASCII (dbop sets ASCII passwords only)"
                ));
            }
        }
    }
    Read::Present(Mounted {
        accounts,
        passwords,
        fingerprint: digest.finalize().into(),
    })
}

/// psql input that makes `role` exist (as an empty role first, so every attribute is then set
/// by one `ALTER ROLE`).
fn create_role(role: &str) -> String {
    format!(
        "SELECT format('CREATE ROLE %I', {name}) \
         WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name})\\gexec\n",
        name = quote_literal(role)
    )
}

fn flag(on: bool, name: &str) -> String {
    if on {
        name.to_string()
    } else {
        format!("NO{name}")
    }
}

fn password_clause(verifier: Option<&str>) -> String {
    verifier
        .map(|v| format!(" PASSWORD {}", quote_literal(v)))
        .unwrap_or_default()
}

/// The application's role and database: a login role with no other privilege, owning the
/// database (made when missing).
pub fn application_sql(accounts: &Accounts, verifier: &str) -> String {
    let app = &accounts.application;
    let owner = quote_ident(&app.owner);
    let mut sql = create_role(&app.owner);
    sql.push_str(&format!(
        "ALTER ROLE {owner} WITH LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE \
         NOREPLICATION NOBYPASSRLS{};\n",
        password_clause(Some(verifier))
    ));
    sql.push_str(&password::ensure_database_sql(&app.database, &app.owner));
    sql.push_str(&format!(
        "ALTER DATABASE {} OWNER TO {owner};\n",
        quote_ident(&app.database)
    ));
    sql
}

/// A declared role: made to exist with exactly its attributes and memberships, or dropped.
pub fn role_sql(role: &Role, verifier: Option<&str>) -> String {
    let name = quote_ident(&role.name);
    if role.ensure == Ensure::Absent {
        return format!("DROP ROLE IF EXISTS {name};\n");
    }
    let mut sql = create_role(&role.name);
    sql.push_str(&format!(
        "ALTER ROLE {name} WITH {} {} {} {} {} NOSUPERUSER NOREPLICATION CONNECTION LIMIT {}{};\n",
        flag(role.login, "LOGIN"),
        flag(role.createdb, "CREATEDB"),
        flag(role.createrole, "CREATEROLE"),
        flag(role.inherit, "INHERIT"),
        flag(role.bypassrls, "BYPASSRLS"),
        role.connection_limit,
        password_clause(verifier),
    ));
    for parent in &role.in_roles {
        sql.push_str(&format!(
            "SELECT format('GRANT %I TO %I', {parent}, {me}) WHERE NOT EXISTS (SELECT FROM \
             pg_auth_members m WHERE m.roleid = {parent_reg}::regrole \
             AND m.member = {me_reg}::regrole)\\gexec\n",
            parent = quote_literal(parent),
            me = quote_literal(&role.name),
            parent_reg = quote_literal(&quote_ident(parent)),
            me_reg = quote_literal(&quote_ident(&role.name)),
        ));
    }
    let listed = role
        .in_roles
        .iter()
        .map(|r| quote_literal(r))
        .collect::<Vec<_>>()
        .join(", ");
    let keep = if listed.is_empty() {
        String::new()
    } else {
        format!(" AND r.rolname NOT IN ({listed})")
    };
    sql.push_str(&format!(
        "SELECT format('REVOKE %I FROM %I', r.rolname, {me}) FROM pg_auth_members m \
         JOIN pg_roles r ON r.oid = m.roleid WHERE m.member = {reg}::regrole{keep}\\gexec\n",
        me = quote_literal(&role.name),
        reg = quote_literal(&quote_ident(&role.name)),
    ));
    sql
}

#[cfg(test)]
mod tests {
    use super::*;
    use dbop_contract::accounts::{Application, role_password_file};

    fn accounts() -> Accounts {
        Accounts {
            application: Application {
                database: "app".into(),
                owner: "app".into(),
            },
            roles: vec![Role {
                name: "reporting".into(),
                login: true,
                inherit: true,
                connection_limit: 5,
                in_roles: vec!["pg_read_all_data".into()],
                password_file: Some(role_password_file(0)),
                ..Role::default()
            }],
        }
    }

    #[test]
    fn the_application_owns_its_database_and_nothing_more() {
        let sql = application_sql(&accounts(), "SCRAM-SHA-256$4096:s$k:v");
        assert!(sql.contains("NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"));
        assert!(sql.contains("PASSWORD 'SCRAM-SHA-256$4096:s$k:v'"));
        assert!(sql.contains("CREATE DATABASE %I OWNER %I"));
        assert!(sql.ends_with("ALTER DATABASE \"app\" OWNER TO \"app\";\n"));
    }

    #[test]
    fn a_declared_role_gets_exactly_its_attributes_and_memberships() {
        let role = &accounts().roles[0];
        let sql = role_sql(role, Some("v"));
        assert!(sql.contains(
            "ALTER ROLE \"reporting\" WITH LOGIN NOCREATEDB NOCREATEROLE INHERIT NOBYPASSRLS \
             NOSUPERUSER NOREPLICATION CONNECTION LIMIT 5 PASSWORD 'v';"
        ));
        assert!(sql.contains("format('GRANT %I TO %I', 'pg_read_all_data', 'reporting')"));
        assert!(sql.contains("m.roleid = '\"pg_read_all_data\"'::regrole"));
        assert!(sql.contains("AND r.rolname NOT IN ('pg_read_all_data')"));
        let unmanaged = role_sql(role, None);
        assert!(!unmanaged.contains("PASSWORD"));
        let gone = Role {
            ensure: Ensure::Absent,
            ..role.clone()
        };
        assert_eq!(
            role_sql(&gone, None),
            "DROP ROLE IF EXISTS \"reporting\";\n"
        );
    }

    #[test]
    fn hostile_names_stay_quoted() {
        let role = Role {
            name: "o'b\"x".into(),
            in_roles: vec!["a'b".into()],
            ..Role::default()
        };
        let sql = role_sql(&role, None);
        assert!(sql.contains("ALTER ROLE \"o'b\"\"x\""));
        assert!(sql.contains("'o''b\"x'"));
        assert!(sql.contains("NOT IN ('a''b')"));
    }

    #[test]
    fn reading_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Read::Missing);
        std::fs::write(dir.path().join(DOCUMENT_FILE), accounts().render()).unwrap();
        std::fs::write(dir.path().join(APPLICATION_PASSWORD_FILE), "pw-app\n").unwrap();
        match read(dir.path()) {
            Read::Invalid(why) => assert!(why.contains("role-0.password"), "{why}"),
            other => panic!("{other:?}"),
        }
        std::fs::write(dir.path().join(role_password_file(0)), "pw-rep").unwrap();
        let Read::Present(first) = read(dir.path()) else {
            panic!("not present")
        };
        assert_eq!(first.passwords["role-0.password"], "pw-rep");
        std::fs::write(dir.path().join(role_password_file(0)), "pw-new").unwrap();
        let Read::Present(second) = read(dir.path()) else {
            panic!("not present")
        };
        assert_ne!(first.fingerprint, second.fingerprint);
        std::fs::write(dir.path().join(role_password_file(0)), "pässword").unwrap();
        match read(dir.path()) {
            Read::Invalid(why) => assert!(!why.contains("pässword")),
            other => panic!("{other:?}"),
        }
    }
}
