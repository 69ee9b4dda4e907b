//! The replication part of the managed configuration.
//!
//! Pure: text and argument lists from names and paths. Three places hold it:
//! - the server's command line (`server_settings`): what every instance needs to be a primary or
//!   a hot standby and to be rewound later; these need a restart, and the command line wins over
//!   `postgresql.conf` and `ALTER SYSTEM`;
//! - `pg_hba.conf` (`hba_lines`): replication connections for dbop's replication role only;
//! - the managed file `dbop-replication.conf` in the data directory, included from
//!   `postgresql.conf` (`standby_file`, `include_line`): `primary_conninfo` and
//!   `primary_slot_name`, which a reload changes (repointing a standby needs no restart), and the
//!   file `standby.signal` beside it. The password is in neither: `primary_conninfo` names a
//!   passfile (`passfile_line`, mode 0600) that libpq reads when the standby connects.

use std::path::Path;

pub use dbop_contract::topology::REPLICATION_ROLE;
/// The managed file with the standby settings, in the data directory.
pub const MANAGED_FILE: &str = "dbop-replication.conf";
/// The file whose presence makes the server start as a standby.
pub const STANDBY_SIGNAL: &str = "standby.signal";
/// The file that starts a server in targeted recovery (dbop does not write it; a restore may).
pub const RECOVERY_SIGNAL: &str = "recovery.signal";
/// Every slot dbop makes starts with this; dbop never touches another slot.
pub const SLOT_PREFIX: &str = "dbop_";
/// The longest slot name PostgreSQL takes (NAMEDATALEN - 1).
pub const SLOT_MAX: usize = 63;
/// Standbys an instance can serve (and slots it can hold): dbop runs at most a handful of
/// instances, this leaves room for clones in progress and pg_basebackup's own sender.
pub const MAX_WAL_SENDERS: u32 = 10;

/// The replication settings on every instance's command line: a primary streams to standbys
/// and keeps their slots; a standby answers read-only queries; hint bits are WAL-logged so
/// that pg_rewind can rewind a former primary even when data checksums are off.
pub fn server_settings() -> Vec<(&'static str, String)> {
    vec![
        ("wal_level", "replica".into()),
        ("max_wal_senders", MAX_WAL_SENDERS.to_string()),
        ("max_replication_slots", MAX_WAL_SENDERS.to_string()),
        ("hot_standby", "on".into()),
        ("wal_log_hints", "on".into()),
        // A standby tells its primary which rows its queries still need, rather than having
        // them cancelled by vacuum on the primary.
        ("hot_standby_feedback", "on".into()),
    ]
}

/// The `pg_hba.conf` lines for replication: SCRAM, the replication role only. (Its normal
/// connections, which pg_rewind uses, are covered by the `host all all` lines.)
/// `network` is the rule type of network connections: `hostssl` when the server has TLS.
pub fn hba_lines(network: &str) -> String {
    format!(
        "# Streaming replication: dbop's replication role only, SCRAM.\n\
         {network} replication {REPLICATION_ROLE} 0.0.0.0/0 scram-sha-256\n\
         {network} replication {REPLICATION_ROLE} ::/0 scram-sha-256\n"
    )
}

/// The slot on the primary for the instance `instance` (a pod name). Pod names are DNS names
/// (lowercase letters, digits, `-`, `.`): `-` becomes `_`; any other change (a `.`, another
/// character, a name too long) adds a digest of the whole name, so two instances never share
/// a slot.
pub fn slot_name(instance: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut lossy = false;
    let mapped: String = instance
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            '-' => '_',
            'A'..='Z' => {
                lossy = true;
                c.to_ascii_lowercase()
            }
            _ => {
                lossy = true;
                '_'
            }
        })
        .collect();
    let plain = format!("{SLOT_PREFIX}{mapped}");
    if !lossy && !instance.is_empty() && plain.len() <= SLOT_MAX {
        return plain;
    }
    let digest = Sha256::digest(instance.as_bytes());
    let suffix: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let room = SLOT_MAX - SLOT_PREFIX.len() - 1 - suffix.len();
    let head: String = mapped.chars().take(room).collect();
    format!("{SLOT_PREFIX}{head}_{suffix}")
}

/// Whether `name` is a slot name PostgreSQL accepts (lowercase letters, digits, `_`).
pub fn valid_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= SLOT_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Where a standby streams from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    /// The standby's own instance name: its `application_name` on the primary and its slot.
    pub instance: String,
    /// The passfile holding the replication role's password.
    pub passfile: std::path::PathBuf,
    /// The CA that signed the primary's certificate (`None`: no TLS required, `sslmode=prefer`).
    /// With it, `sslmode=verify-full`: the primary's name must be in its certificate.
    pub ssl_root_cert: Option<std::path::PathBuf>,
}

/// One libpq `key=value` pair, the value quoted when it needs to be.
fn conninfo_pair(key: &str, value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:".contains(c));
    if plain {
        format!("{key}={value}")
    } else {
        format!(
            "{key}='{}'",
            value.replace('\\', "\\\\").replace('\'', "\\'")
        )
    }
}

/// A libpq connection string from pairs.
pub fn conninfo(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| conninfo_pair(k, v))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The connection a standby (and pg_basebackup) uses: replication role, passfile, its name,
/// and TLS verified against the CA when it has one.
pub fn replication_conninfo(u: &Upstream) -> String {
    let port = u.port.to_string();
    let passfile = u.passfile.display().to_string();
    let ssl = match &u.ssl_root_cert {
        Some(ca) => vec![
            ("sslmode", "verify-full".to_string()),
            ("sslrootcert", ca.display().to_string()),
        ],
        None => vec![("sslmode", "prefer".to_string())],
    };
    let ssl: Vec<(&str, &str)> = ssl.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let base = conninfo(&[
        ("host", &u.host),
        ("port", &port),
        ("user", REPLICATION_ROLE),
        ("passfile", &passfile),
        ("application_name", &u.instance),
        ("connect_timeout", "5"),
        // A primary that stops answering is noticed in seconds, not after the kernel's hours.
        ("keepalives_idle", "5"),
        ("keepalives_interval", "2"),
        ("keepalives_count", "3"),
    ]);
    format!("{base} {}", conninfo(&ssl))
}

/// The normal (non-replication) connection pg_rewind reads the source server through.
pub fn rewind_conninfo(u: &Upstream) -> String {
    format!(
        "{} {}",
        replication_conninfo(u),
        conninfo(&[("dbname", "postgres")])
    )
}

/// A value quoted for `postgresql.conf` (the server unescapes `\\` and `''`).
pub fn conf_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The managed file of a standby of `u`, or of a primary (`None`: both settings empty).
pub fn standby_file(upstream: Option<&Upstream>) -> String {
    let header = "# Written by dbop-instance (replication): edits here are lost.\n";
    match upstream {
        Some(u) => format!(
            "{header}primary_conninfo = {}\nprimary_slot_name = {}\n\
             recovery_target_timeline = 'latest'\n",
            conf_value(&replication_conninfo(u)),
            conf_value(&slot_name(&u.instance)),
        ),
        None => format!("{header}primary_conninfo = ''\nprimary_slot_name = ''\n"),
    }
}

/// The line that includes the managed file from `postgresql.conf`.
pub fn include_line() -> String {
    format!("include_if_exists = {}", conf_value(MANAGED_FILE))
}

/// `postgresql.conf` with the include line appended, or `None` when it is already there.
pub fn with_include(postgresql_conf: &str) -> Option<String> {
    let line = include_line();
    if postgresql_conf.lines().any(|l| l.trim() == line) {
        return None;
    }
    let mut text = postgresql_conf.to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# Added by dbop-instance: the replication settings it manages.\n");
    text.push_str(&line);
    text.push('\n');
    Some(text)
}

/// The passfile line for the replication role (any host, port and database: the file holds
/// this one password only). `:` and `\` are escaped as libpq reads them.
pub fn passfile_line(password: &str) -> String {
    let escaped = password.replace('\\', "\\\\").replace(':', "\\:");
    format!("*:*:*:{REPLICATION_ROLE}:{escaped}\n")
}

/// Whether the data directory is set to start as a standby.
pub fn is_standby(pgdata: &Path) -> bool {
    pgdata.join(STANDBY_SIGNAL).exists()
}

/// SQL that creates the replication role when it is missing and sets its password to a SCRAM
/// verifier, and lets it run what pg_rewind reads on a source server.
pub fn ensure_role_sql(verifier: &str) -> String {
    use crate::password::{quote_ident, quote_literal};
    let role = quote_ident(REPLICATION_ROLE);
    let mut sql = format!(
        "SELECT format('CREATE ROLE %I', {name}) \
         WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name})\\gexec\n\
         ALTER ROLE {role} WITH LOGIN REPLICATION NOSUPERUSER PASSWORD {verifier};\n",
        name = quote_literal(REPLICATION_ROLE),
        verifier = quote_literal(verifier),
    );
    // pg_rewind's source must have checkpointed since its promotion (PostgreSQL 15+).
    sql.push_str(&format!(
        "SELECT format('GRANT pg_checkpoint TO %I', {name}) \
         WHERE EXISTS (SELECT FROM pg_roles WHERE rolname = 'pg_checkpoint')\\gexec\n",
        name = quote_literal(REPLICATION_ROLE),
    ));
    for function in [
        "pg_ls_dir(text, boolean, boolean)",
        "pg_stat_file(text, boolean)",
        "pg_read_binary_file(text)",
        "pg_read_binary_file(text, bigint, bigint, boolean)",
    ] {
        sql.push_str(&format!(
            "GRANT EXECUTE ON FUNCTION pg_catalog.{function} TO {role};\n"
        ));
    }
    sql
}

/// SQL that creates the physical slot `slot` when it is missing, reserving WAL from now (so
/// a clone that starts next finds its WAL kept).
pub fn ensure_slot_sql(slot: &str) -> String {
    let name = crate::password::quote_literal(slot);
    format!(
        "SELECT pg_create_physical_replication_slot({name}, true) \
         WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = {name});\n"
    )
}

/// The replication command that creates the physical slot `slot` on the primary, reserving
/// WAL from now: what a standby sends (over a replication connection, as the replication role)
/// when the primary has not made its slot yet. `slot` is one of `slot_name`'s.
pub fn create_slot_command(slot: &str) -> String {
    format!("CREATE_REPLICATION_SLOT {slot} PHYSICAL RESERVE_WAL")
}

/// Whether `create_slot_command` failed because the slot exists (which is what was wanted).
pub fn slot_already_exists(error: &str) -> bool {
    error.contains("already exists")
}

/// SQL that drops the slot `slot` when it exists and is not in use.
pub fn drop_slot_sql(slot: &str) -> String {
    let name = crate::password::quote_literal(slot);
    format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = {name} AND NOT active;\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> Upstream {
        Upstream {
            host: "db-rw.ns.svc".into(),
            port: 5432,
            instance: "db-1".into(),
            passfile: "/var/lib/postgresql/data/dbop-replication.pgpass".into(),
            ssl_root_cert: None,
        }
    }

    #[test]
    fn server_settings_make_a_primary_a_hot_standby_and_rewindable() {
        let settings = server_settings();
        for (key, want) in [
            ("wal_level", "replica"),
            ("hot_standby", "on"),
            ("wal_log_hints", "on"),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
        ] {
            let got = settings.iter().find(|(k, _)| *k == key).map(|(_, v)| v);
            assert_eq!(got.map(String::as_str), Some(want), "{key}");
        }
    }

    #[test]
    fn hba_allows_replication_for_the_replication_role_only_with_scram() {
        let rules: Vec<String> = hba_lines("host")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        assert_eq!(
            rules,
            [
                "host replication dbop_replication 0.0.0.0/0 scram-sha-256",
                "host replication dbop_replication ::/0 scram-sha-256",
            ]
        );
    }

    #[test]
    fn slot_names() {
        let long = "d".repeat(70);
        let table = [
            ("db-0", "dbop_db_0".to_string()),
            ("my-database-12", "dbop_my_database_12".to_string()),
            ("a", "dbop_a".to_string()),
        ];
        for (instance, want) in table {
            assert_eq!(slot_name(instance), want, "{instance}");
        }
        // Lossy mappings carry a digest: distinct instances, distinct slots.
        let lossy = ["a.b", "a-b", "A-b", "", &long, &format!("{long}x")];
        let names: Vec<String> = lossy.iter().map(|i| slot_name(i)).collect();
        for (i, a) in names.iter().enumerate() {
            assert!(valid_slot_name(a), "{a}");
            assert!(a.starts_with(SLOT_PREFIX), "{a}");
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(slot_name(&long).len(), SLOT_MAX);
        assert_eq!(slot_name("a-b"), "dbop_a_b");
        assert_ne!(slot_name("a.b"), "dbop_a_b");
        assert!(!valid_slot_name("Dbop") && !valid_slot_name("a-b") && !valid_slot_name(""));
    }

    #[test]
    fn conninfo_quotes_what_needs_quoting() {
        assert_eq!(
            conninfo(&[("host", "10.0.0.1"), ("user", "a b"), ("x", "it's\\")]),
            "host=10.0.0.1 user='a b' x='it\\'s\\\\'"
        );
        assert_eq!(conninfo(&[("k", "")]), "k=''");
    }

    #[test]
    fn standby_file_points_at_the_upstream_with_a_passfile_and_a_slot_and_no_password() {
        let text = standby_file(Some(&upstream()));
        let want_conninfo = "primary_conninfo = 'host=db-rw.ns.svc port=5432 \
            user=dbop_replication passfile=/var/lib/postgresql/data/dbop-replication.pgpass \
            application_name=db-1 connect_timeout=5 keepalives_idle=5 keepalives_interval=2 \
            keepalives_count=3 sslmode=prefer'";
        assert!(text.contains(want_conninfo), "{text}");
        assert!(text.contains("primary_slot_name = 'dbop_db_1'"), "{text}");
        assert!(text.contains("recovery_target_timeline = 'latest'"));
        assert!(!text.contains("password="), "{text}");
        let primary = standby_file(None);
        assert!(primary.contains("primary_conninfo = ''") && primary.contains("slot_name = ''"));
        assert!(rewind_conninfo(&upstream()).ends_with(" dbname=postgres"));
    }

    #[test]
    fn a_standby_creates_its_own_slot_over_a_replication_connection() {
        assert_eq!(
            create_slot_command(&slot_name("db-1")),
            "CREATE_REPLICATION_SLOT dbop_db_1 PHYSICAL RESERVE_WAL"
        );
        assert!(slot_already_exists(
            "ERROR:  replication slot \"dbop_db_1\" already exists"
        ));
        assert!(!slot_already_exists("could not connect to server"));
    }

    #[test]
    fn with_a_ca_the_replication_connection_verifies_the_primarys_name() {
        let plain = replication_conninfo(&upstream());
        assert!(plain.ends_with(" sslmode=prefer"), "{plain}");
        assert!(!plain.contains("sslrootcert"), "{plain}");
        let tls = Upstream {
            ssl_root_cert: Some("/run/pg/tls/ca.crt".into()),
            ..upstream()
        };
        let text = replication_conninfo(&tls);
        assert!(
            text.ends_with(" sslmode=verify-full sslrootcert=/run/pg/tls/ca.crt"),
            "{text}"
        );
        assert!(!text.contains("prefer"), "{text}");
        let odd = Upstream {
            ssl_root_cert: Some("/run/a b/ca.crt".into()),
            ..upstream()
        };
        assert!(replication_conninfo(&odd).ends_with(" sslrootcert='/run/a b/ca.crt'"));
        assert!(rewind_conninfo(&tls).contains("sslmode=verify-full"));
    }

    #[test]
    fn conf_values_are_escaped() {
        assert_eq!(conf_value("a'b\\c"), "'a''b\\\\c'");
        // A conninfo with a quoted value survives both layers.
        let u = Upstream {
            passfile: "/p/it's".into(),
            ..upstream()
        };
        assert!(standby_file(Some(&u)).contains("passfile=''/p/it\\\\''s''"));
    }

    #[test]
    fn the_include_line_is_added_once() {
        let conf = "max_connections = 100\n#include_if_exists = 'dbop-replication.conf'";
        let added = with_include(conf).unwrap();
        assert!(added.starts_with("max_connections = 100\n#include"));
        assert!(added.ends_with("include_if_exists = 'dbop-replication.conf'\n"));
        assert_eq!(with_include(&added), None);
        assert!(
            with_include("")
                .unwrap()
                .ends_with(&format!("{}\n", include_line()))
        );
    }

    #[test]
    fn passfile_escapes_colons_and_backslashes() {
        assert_eq!(passfile_line("pw"), "*:*:*:dbop_replication:pw\n");
        assert_eq!(
            passfile_line("a:b\\c"),
            "*:*:*:dbop_replication:a\\:b\\\\c\n"
        );
    }

    #[test]
    fn sql_is_idempotent_and_quoted() {
        let role = ensure_role_sql("SCRAM-SHA-256$4096:s$k:v");
        assert!(role.contains(
            "WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'dbop_replication')\\gexec"
        ));
        assert!(role.contains("ALTER ROLE \"dbop_replication\" WITH LOGIN REPLICATION NOSUPERUSER PASSWORD 'SCRAM-SHA-256$4096:s$k:v';"));
        assert!(role.contains(
            "pg_read_binary_file(text, bigint, bigint, boolean) TO \"dbop_replication\""
        ));
        assert!(role.contains("GRANT pg_checkpoint TO %I"));
        let slot = ensure_slot_sql("dbop_db_1");
        assert!(slot.contains("pg_create_physical_replication_slot('dbop_db_1', true)"));
        assert!(slot.contains("WHERE NOT EXISTS"));
        assert!(drop_slot_sql("dbop_db_1").contains("AND NOT active"));
    }
}
