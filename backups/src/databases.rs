//! Every database of the instance: which ones a backup covers (those that accept connections,
//! not the templates), what `CREATE DATABASE` needs to recreate each faithfully (owner,
//! encoding, locale, connection limit, database-level settings and grants, read from the
//! catalog), the object file each one's dump goes to, and how a restore maps the backup's
//! databases onto the target server. Everything here but [`list`] is pure.
//!
//! Roles come from `globals.sql`, which runs before any of this; per-role settings inside a
//! database (`ALTER ROLE … IN DATABASE … SET`), comments on and security labels of databases,
//! and tablespaces are not recreated.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layout::DUMP_FILE;
use crate::pg::PgTools;

/// The databases a backup covers, the connected one first, as one JSON array. Columns that
/// differ between major versions are read through `to_jsonb(d)` (absent ones are null).
pub const LIST_SQL: &str = r#"SELECT coalesce(json_agg(json_build_object(
  'name', d.datname,
  'owner', pg_catalog.pg_get_userbyid(d.datdba),
  'encoding', pg_catalog.pg_encoding_to_char(d.encoding),
  'collate', d.datcollate,
  'ctype', d.datctype,
  'localeProvider', to_jsonb(d)->>'datlocprovider',
  'icuLocale', coalesce(to_jsonb(d)->>'daticulocale', to_jsonb(d)->>'datlocale'),
  'connectionLimit', d.datconnlimit,
  'acl', CASE WHEN d.datacl IS NULL THEN NULL ELSE (
    SELECT coalesce(json_agg(json_build_object(
      'grantee', CASE WHEN a.grantee = 0 THEN NULL ELSE pg_catalog.pg_get_userbyid(a.grantee) END,
      'privilege', a.privilege_type, 'grantable', a.is_grantable)
      ORDER BY a.grantee, a.privilege_type), '[]')
    FROM pg_catalog.aclexplode(d.datacl) a) END,
  'settings', (SELECT coalesce(json_agg(u.c ORDER BY u.o), '[]')
    FROM pg_catalog.pg_db_role_setting s, unnest(s.setconfig) WITH ORDINALITY u(c, o)
    WHERE s.setdatabase = d.oid AND s.setrole = 0))
  ORDER BY d.datname = current_database() DESC, d.datname), '[]')::text
FROM pg_catalog.pg_database d WHERE d.datallowconn AND NOT d.datistemplate"#;

/// Settings whose stored value is a list already in SQL syntax (pg_dump writes them verbatim).
const LIST_SETTINGS: [&str; 6] = [
    "search_path",
    "temp_tablespaces",
    "session_preload_libraries",
    "shared_preload_libraries",
    "local_preload_libraries",
    "unix_socket_directories",
];

/// What recreating one database needs, as the source's catalog says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseDefinition {
    pub owner: String,
    pub encoding: String,
    pub collate: String,
    pub ctype: String,
    /// `c` (libc), `i` (ICU) or `b` (builtin); absent before PostgreSQL 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale_provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icu_locale: Option<String>,
    pub connection_limit: i32,
    /// The database's grants; `None` is the default ACL (never changed by GRANT/REVOKE).
    #[serde(default)]
    pub acl: Option<Vec<Grant>>,
    /// `ALTER DATABASE … SET` settings, as stored: `name=value`.
    #[serde(default)]
    pub settings: Vec<String>,
}

/// One privilege on a database; `grantee` `None` is PUBLIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub grantee: Option<String>,
    pub privilege: String,
    pub grantable: bool,
}

/// One database as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    pub name: String,
    #[serde(flatten)]
    pub definition: DatabaseDefinition,
}

/// The databases of the server `tools` reaches, the connected one first.
pub async fn list(tools: &PgTools) -> Result<Vec<Listed>> {
    let json = tools.query(None, LIST_SQL).await?;
    serde_json::from_str(&json).map_err(|e| {
        crate::pg::pg_error(
            "psql",
            &crate::pg::database_label(None),
            format!("unexpected database list: {e}"),
        )
    })
}

/// The dump object's file name of the `index`th database: the application database (index 0)
/// keeps `dump.pgc.zst`, which older agents read; the others get their hex-encoded name, so no
/// name (slashes, quotes, spaces, unicode) can collide or escape the backup folder.
pub fn dump_file_name(index: usize, name: &str) -> String {
    if index == 0 {
        DUMP_FILE.to_string()
    } else {
        format!("db-{index:03}-{}.pgc.zst", hex::encode(name.as_bytes()))
    }
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'` as a standard-conforming literal (an `E''` one when it holds a backslash).
pub fn quote_literal(text: &str) -> String {
    let body = text.replace('\'', "''");
    if body.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    }
}

/// `CREATE DATABASE` for `name` with the definition's encoding and locale (and owner unless
/// `no_owner`), from `template0` as pg_dump does.
pub fn create_statement(name: &str, def: &DatabaseDefinition, no_owner: bool) -> String {
    let mut sql = format!("CREATE DATABASE {} TEMPLATE template0", quote_ident(name));
    if !no_owner {
        sql.push_str(&format!(" OWNER {}", quote_ident(&def.owner)));
    }
    sql.push_str(&format!(
        " ENCODING {} LC_COLLATE {} LC_CTYPE {}",
        quote_literal(&def.encoding),
        quote_literal(&def.collate),
        quote_literal(&def.ctype)
    ));
    let locale = def.icu_locale.as_deref().map(quote_literal);
    match (def.locale_provider.as_deref(), locale) {
        (Some("i"), Some(l)) => sql.push_str(&format!(" LOCALE_PROVIDER icu ICU_LOCALE {l}")),
        (Some("b"), Some(l)) => {
            sql.push_str(&format!(" LOCALE_PROVIDER builtin BUILTIN_LOCALE {l}"))
        }
        _ => {}
    }
    if def.connection_limit != -1 {
        sql.push_str(&format!(" CONNECTION LIMIT {}", def.connection_limit));
    }
    sql
}

/// The statements that give an existing database `name` the definition's owner, settings and
/// grants: idempotent, one transaction. Refuses a privilege or setting it cannot write safely.
pub fn setup_script(
    name: &str,
    def: &DatabaseDefinition,
    no_owner: bool,
    no_acl: bool,
) -> std::result::Result<String, String> {
    let db = quote_ident(name);
    let mut lines = Vec::new();
    if !no_owner {
        lines.push(format!(
            "ALTER DATABASE {db} OWNER TO {};",
            quote_ident(&def.owner)
        ));
    }
    lines.push(format!("ALTER DATABASE {db} RESET ALL;"));
    for setting in &def.settings {
        lines.push(format!(
            "ALTER DATABASE {db} SET {};",
            setting_clause(setting)?
        ));
    }
    if let (Some(acl), false) = (&def.acl, no_acl) {
        lines.push(format!("REVOKE ALL ON DATABASE {db} FROM PUBLIC;"));
        lines.push(format!(
            "REVOKE ALL ON DATABASE {db} FROM {};",
            quote_ident(&def.owner)
        ));
        for g in acl {
            lines.push(grant_statement(&db, g)?);
        }
    }
    Ok(lines.join("\n") + "\n")
}

fn grant_statement(db: &str, g: &Grant) -> std::result::Result<String, String> {
    let privilege = match g.privilege.as_str() {
        p @ ("CREATE" | "CONNECT" | "TEMPORARY") => p,
        other => return Err(format!("unknown database privilege {other:?}")),
    };
    let grantee = g.grantee.as_deref().map_or("PUBLIC".into(), quote_ident);
    let option = if g.grantable {
        " WITH GRANT OPTION"
    } else {
        ""
    };
    Ok(format!(
        "GRANT {privilege} ON DATABASE {db} TO {grantee}{option};"
    ))
}

/// `name = value` of a stored `name=value` setting: the name quoted part by part, the value a
/// literal, or for list settings each element of the list a literal.
fn setting_clause(setting: &str) -> std::result::Result<String, String> {
    let (name, value) = setting
        .split_once('=')
        .filter(|(n, _)| !n.is_empty())
        .ok_or_else(|| format!("setting {setting:?} is not name=value"))?;
    let quoted_name: Vec<String> = name.split('.').map(quote_ident).collect();
    let value = if LIST_SETTINGS.contains(&name) {
        split_list(value)
            .ok_or_else(|| format!("setting {name} has an unreadable list value"))?
            .iter()
            .map(|v| quote_literal(v))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        quote_literal(value)
    };
    Ok(format!("{} = {value}", quoted_name.join(".")))
}

/// The elements of a stored list setting (`"$user", public`): comma-separated, optionally
/// double-quoted with `""` for a quote. `None` when it does not parse. An empty list is `[""]`.
pub fn split_list(value: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = value.trim().chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut item = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        item.push('"');
                    }
                    '"' => break,
                    c => item.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek().filter(|c| **c != ',') {
                item.push(c);
                chars.next();
            }
            item = item.trim_end().to_string();
        }
        out.push(item);
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(out),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// Where one of the backup's databases goes in a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Its position in the manifest's list.
    pub index: usize,
    pub target: String,
    /// Created by the restore (else it exists, holds nothing, and is restored into).
    pub create: bool,
}

/// What the target server has: its databases, and whether each holds objects of its own.
pub type Existing = BTreeMap<String, bool>;

/// Maps the backup's databases (`names[0]` the application database, restored into
/// `target`) onto the target server: databases it lacks are created; one it has is restored
/// into only when it holds nothing (a new server's `postgres`). Created ones come first, the
/// application database last. Refuses, before anything is created, any other case.
pub fn plan(
    names: &[String],
    target: &str,
    existing: &Existing,
) -> std::result::Result<Vec<Step>, String> {
    let mut taken = BTreeSet::new();
    let mut steps = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let to = if index == 0 { target } else { name.as_str() };
        if !taken.insert(to.to_string()) {
            return Err(format!(
                "the backup's database {name:?} would be restored into {to:?}, which another of its databases goes into"
            ));
        }
        let create = match existing.get(to) {
            None => true,
            Some(false) => false,
            Some(true) if index == 0 => false,
            Some(true) => {
                return Err(format!(
                    "the target server already has a database {to:?} with objects in it; restore the backup into a new server"
                ));
            }
        };
        steps.push(Step {
            index,
            target: to.to_string(),
            create,
        });
    }
    steps.sort_by_key(|s| (!s.create, s.index == 0));
    Ok(steps)
}

/// Whether a database holds objects of its own (any relation, function or type outside the
/// system schemas, or a schema other than `public`).
pub const HAS_OBJECTS_SQL: &str = "SELECT (EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%')
 OR EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'public') AND nspname NOT LIKE 'pg\\_%'))::text";

/// The target server's databases (that accept connections) and whether each holds objects.
pub async fn existing(tools: &PgTools, target: &str) -> Result<Existing> {
    let names = tools
        .query(
            Some(target),
            "SELECT coalesce(json_agg(datname), '[]')::text FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate",
        )
        .await?;
    let names: Vec<String> = serde_json::from_str(&names)
        .map_err(|e| crate::pg::pg_error("psql", target, format!("unexpected list: {e}")))?;
    let mut out = Existing::new();
    for name in names {
        let has = tools.query(Some(&name), HAS_OBJECTS_SQL).await? == "true";
        out.insert(name, has);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> DatabaseDefinition {
        DatabaseDefinition {
            owner: "o\"wner".into(),
            encoding: "UTF8".into(),
            collate: "C.UTF-8".into(),
            ctype: "C.UTF-8".into(),
            locale_provider: Some("c".into()),
            icu_locale: None,
            connection_limit: -1,
            acl: None,
            settings: vec![],
        }
    }

    #[test]
    fn file_names_never_collide_or_escape() {
        assert_eq!(dump_file_name(0, "app"), "dump.pgc.zst");
        let names = ["a/b", "a b", "a\"b", "ü", "..", "a", "A"];
        let files: BTreeSet<String> = names
            .iter()
            .enumerate()
            .map(|(i, n)| dump_file_name(i + 1, n))
            .collect();
        assert_eq!(files.len(), names.len());
        for f in &files {
            assert!(
                f.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
            );
        }
        assert_eq!(dump_file_name(2, "a/b"), "db-002-612f62.pgc.zst");
    }

    #[test]
    fn create_statements() {
        let mut d = def();
        assert_eq!(
            create_statement("we\"ird", &d, false),
            "CREATE DATABASE \"we\"\"ird\" TEMPLATE template0 OWNER \"o\"\"wner\" ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8'"
        );
        d.locale_provider = Some("i".into());
        d.icu_locale = Some("en-US".into());
        d.connection_limit = 5;
        let s = create_statement("x", &d, true);
        assert!(!s.contains("OWNER"));
        assert!(
            s.ends_with("LOCALE_PROVIDER icu ICU_LOCALE 'en-US' CONNECTION LIMIT 5"),
            "{s}"
        );
    }

    #[test]
    fn setup_scripts() {
        let mut d = def();
        d.settings = vec![
            "work_mem=64MB".into(),
            "search_path=\"$user\", public, \"a,b\"".into(),
            "app.note=it's".into(),
        ];
        d.acl = Some(vec![
            Grant {
                grantee: None,
                privilege: "CONNECT".into(),
                grantable: false,
            },
            Grant {
                grantee: Some("reader".into()),
                privilege: "TEMPORARY".into(),
                grantable: true,
            },
        ]);
        let s = setup_script("db", &d, false, false).unwrap();
        for want in [
            "ALTER DATABASE \"db\" OWNER TO \"o\"\"wner\";",
            "ALTER DATABASE \"db\" SET \"work_mem\" = '64MB';",
            "ALTER DATABASE \"db\" SET \"search_path\" = '$user', 'public', 'a,b';",
            "ALTER DATABASE \"db\" SET \"app\".\"note\" = 'it''s';",
            "REVOKE ALL ON DATABASE \"db\" FROM PUBLIC;",
            "GRANT CONNECT ON DATABASE \"db\" TO PUBLIC;",
            "GRANT TEMPORARY ON DATABASE \"db\" TO \"reader\" WITH GRANT OPTION;",
        ] {
            assert!(s.contains(want), "{want} in {s}");
        }
        let s = setup_script("db", &d, true, true).unwrap();
        assert!(!s.contains("OWNER") && !s.contains("GRANT"), "{s}");
        let mut bad = def();
        bad.acl = Some(vec![Grant {
            grantee: None,
            privilege: "ALL; DROP".into(),
            grantable: false,
        }]);
        assert!(setup_script("db", &bad, false, false).is_err());
        let mut bad = def();
        bad.settings = vec!["novalue".into()];
        assert!(setup_script("db", &bad, false, false).is_err());
    }

    #[test]
    fn lists_and_literals() {
        assert_eq!(split_list("a, \"b\"\"c\" ,d").unwrap(), ["a", "b\"c", "d"]);
        assert_eq!(split_list("\"\"").unwrap(), [""]);
        assert_eq!(split_list("\"open"), None);
        assert_eq!(split_list("\"a\"x"), None);
        assert_eq!(quote_literal("a\\b'c"), "E'a\\\\b''c'");
    }

    #[test]
    fn plans() {
        let names: Vec<String> = ["app", "postgres", "b", "c"].map(String::from).to_vec();
        let existing: Existing = [("copy", true), ("postgres", false), ("other", true)]
            .map(|(n, h)| (n.to_string(), h))
            .into_iter()
            .collect();
        let got: Vec<(usize, String, bool)> = plan(&names, "copy", &existing)
            .unwrap()
            .into_iter()
            .map(|s| (s.index, s.target, s.create))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, "b".into(), true),
                (3, "c".into(), true),
                (1, "postgres".into(), false),
                (0, "copy".into(), false),
            ]
        );
        let mut busy = existing.clone();
        busy.insert("b".into(), true);
        assert!(plan(&names, "copy", &busy).unwrap_err().contains("\"b\""));
        assert!(plan(&names, "b", &existing).is_err(), "two into one");
        assert!(plan(&[], "x", &existing).unwrap().is_empty());
    }
}
