//! `spec.postgresql`: the server's own settings a Database may set — parameters, the libraries
//! preloaded at start, and extra `pg_hba.conf` rules — and the schema rules the API server
//! enforces on them (names, the settings dbop manages, the shape of a rule).
//!
//! Pure data: no client, no I/O. The lists the rules are generated from (`MANAGED_PARAMETERS`)
//! are the ones `resources::server_config` and the tests read, so the schema and the builder
//! cannot disagree.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Parameters dbop sets itself (on the server's command line, which wins over any file, or in
/// files it writes): setting one would do nothing, or break the pod, its Services or its
/// replication. `ssl*` is refused too (`MANAGED_PREFIXES`).
pub const MANAGED_PARAMETERS: [&str; 32] = [
    // The instance manager's command line (instance/src/config.rs).
    "listen_addresses",
    "port",
    "unix_socket_directories",
    "unix_socket_group",
    "unix_socket_permissions",
    "data_directory",
    "config_file",
    "hba_file",
    "ident_file",
    "external_pid_file",
    "password_encryption",
    // Replication (instance/src/replication/config.rs).
    "wal_level",
    "max_wal_senders",
    "max_replication_slots",
    "hot_standby",
    "wal_log_hints",
    "hot_standby_feedback",
    "primary_conninfo",
    "primary_slot_name",
    "recovery_target_timeline",
    "promote_trigger_file",
    "restore_command",
    "archive_mode",
    "archive_command",
    "archive_library",
    "archive_cleanup_command",
    "recovery_end_command",
    // Its own field: spec.postgresql.sharedPreloadLibraries.
    "shared_preload_libraries",
    // spec.synchronous: the primary's manager sets it from the topology.
    "synchronous_standby_names",
    // Directives, not parameters: they would read a file outside the ConfigMap.
    "include",
    "include_if_exists",
    "include_dir",
];

/// Parameter name prefixes dbop manages: TLS is not configured by dbop yet, and a
/// certificate file the pod does not have stops the server.
pub const MANAGED_PREFIXES: [&str; 1] = ["ssl"];

/// Connection types a `pgHba` rule may have: network rules only (the local socket is dbop's).
pub const HBA_TYPES: [&str; 5] = ["host", "hostssl", "hostnossl", "hostgssenc", "hostnogssenc"];

/// Authentication methods a `pgHba` rule may use (`trust` and cleartext `password` are not:
/// the rules are for network clients).
pub const HBA_METHODS: [&str; 9] = [
    "scram-sha-256",
    "md5",
    "reject",
    "cert",
    "gss",
    "sspi",
    "ldap",
    "radius",
    "pam",
];

/// The server's settings: parameters, preloaded libraries, extra client authentication rules.
/// See docs/configuration.md: which changes are reloaded, which restart the pods, and the
/// memory defaults.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    /// `postgresql.conf` parameters, name to value (e.g. `max_connections: "200"`,
    /// `work_mem: "16MB"`). A change PostgreSQL can reload is reloaded in place; one that needs
    /// a restart (`max_connections`, `shared_buffers`, …) rolls the pods one at a time, and the
    /// `RestartPending` condition names it until done. Names dbop manages (`port`,
    /// `listen_addresses`, replication and archive settings, `ssl*`, …) are refused. These win
    /// over dbop's memory defaults; `ALTER SYSTEM` wins over these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "parameters_schema")]
    pub parameters: BTreeMap<String, String>,

    /// Libraries loaded at server start (`shared_preload_libraries`), e.g. `pg_stat_statements`.
    /// The image must have them. A change restarts the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "libraries_schema")]
    pub shared_preload_libraries: Vec<String>,

    /// Extra `pg_hba.conf` rules, one line each, e.g. `hostssl all all 10.0.0.0/8 scram-sha-256`
    /// or `host all all 192.168.0.0/16 reject`. Network rules only (`host…` types; no `trust`
    /// or `password`). They come after dbop's local-socket and replication rules (which they
    /// cannot override) and before dbop's catch-all SCRAM rules (which they can narrow). A
    /// change is reloaded in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "hba_schema")]
    pub pg_hba: Vec<String>,
}

/// A CEL list literal of `names`.
fn cel_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// The CEL test "name `k` is one dbop manages".
fn managed_test() -> String {
    let prefixes: Vec<String> = MANAGED_PREFIXES
        .iter()
        .map(|p| format!("k.startsWith('{p}')"))
        .collect();
    format!(
        "(k in {} || {})",
        cel_list(&MANAGED_PARAMETERS),
        prefixes.join(" || ")
    )
}

/// A parameter name: lower-case letters, digits and `_`, and one `.` for an extension's own
/// (`pg_stat_statements.max`).
pub const PARAMETER_NAME_PATTERN: &str = "^[a-z_][a-z0-9_]*([.][a-z_][a-z0-9_]*)?$";

fn parameters_schema(_: &mut SchemaGenerator) -> Schema {
    let managed = managed_test();
    json_schema!({
        "type": "object",
        "maxProperties": 128,
        "additionalProperties": {
            "type": "string",
            "maxLength": 1024,
            // One line: a newline would end the setting in postgresql.conf.
            "pattern": "^[^\\n\\r]*$"
        },
        "x-kubernetes-validations": [
            {
                "rule": format!("self.all(k, k.size() <= 63 && k.matches('{PARAMETER_NAME_PATTERN}'))"),
                "message": "spec.postgresql.parameters: a parameter name has at most 63 lower-case letters, digits and '_', with one '.' for an extension's (e.g. pg_stat_statements.max)"
            },
            {
                "rule": format!("!self.exists(k, {managed})"),
                "messageExpression": format!("'spec.postgresql.parameters.' + self.filter(k, {managed})[0] + ' is managed by dbop and cannot be set' + (self.exists(k, k == 'shared_preload_libraries') ? ' (use spec.postgresql.sharedPreloadLibraries)' : '')"),
                "message": "spec.postgresql.parameters: a parameter dbop manages cannot be set (docs/configuration.md lists them)"
            }
        ]
    })
}

fn libraries_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 32,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[A-Za-z0-9_$.-]+$"
        },
        "x-kubernetes-validations": [{
            "rule": "self.all(l, self.exists_one(m, m == l))",
            "message": "spec.postgresql.sharedPreloadLibraries: a library is listed twice"
        }]
    })
}

/// A `pg_hba.conf` network rule: TYPE DATABASE USER ADDRESS [MASK] METHOD [OPTIONS].
pub fn hba_rule_pattern() -> String {
    format!(
        "^({})[ \\t]+[^ \\t#]+[ \\t]+[^ \\t#]+[ \\t]+[^ \\t#]+([ \\t]+[0-9.:a-fA-F]+)?[ \\t]+({})([ \\t]+[a-z_]+=[^ \\t]+)*$",
        HBA_TYPES.join("|"),
        HBA_METHODS.join("|")
    )
}

fn hba_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "string",
            "maxLength": 512,
            "pattern": hba_rule_pattern()
        }
    })
}

/// Why a parameter name cannot be set, or None when it can (the schema's rules, for a spec
/// stored before them).
pub fn parameter_problem(name: &str) -> Option<String> {
    let managed =
        MANAGED_PARAMETERS.contains(&name) || MANAGED_PREFIXES.iter().any(|p| name.starts_with(p));
    if managed {
        return Some(format!(
            "spec.postgresql.parameters.{name} is managed by dbop and cannot be set"
        ));
    }
    let mut parts = name.split('.');
    let word = |w: Option<&str>| {
        w.is_some_and(|w| {
            w.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
    };
    let shaped = word(parts.next())
        && parts.next().is_none_or(|w| word(Some(w)))
        && parts.next().is_none()
        && name.len() <= 63;
    (!shaped).then(|| format!("spec.postgresql.parameters.{name} is not a parameter name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_and_malformed_names_are_refused_by_name() {
        for name in [
            "port",
            "listen_addresses",
            "ssl",
            "ssl_cert_file",
            "wal_level",
        ] {
            let problem = parameter_problem(name).unwrap();
            assert!(problem.contains(&format!("parameters.{name} is managed")));
        }
        for name in ["Max_Connections", "a..b", "a.b.c", "1x", "x-y", ""] {
            assert!(parameter_problem(name).is_some(), "{name}");
        }
        for name in ["max_connections", "work_mem", "pg_stat_statements.max"] {
            assert_eq!(parameter_problem(name), None, "{name}");
        }
    }

    #[test]
    fn the_rules_name_every_managed_parameter() {
        let test = managed_test();
        for name in MANAGED_PARAMETERS {
            assert!(test.contains(&format!("'{name}'")), "{name}");
        }
        assert!(test.contains("k.startsWith('ssl')"));
    }

    #[test]
    fn hba_rules_have_a_network_type_and_a_known_method() {
        let re = regex_lite(&hba_rule_pattern());
        for good in [
            "host all all 10.0.0.0/8 scram-sha-256",
            "hostssl app app 192.168.1.0 255.255.255.0 md5",
            "host all all 0.0.0.0/0 reject",
            "hostssl all all ::/0 cert clientcert=verify-full",
        ] {
            assert!(re(good), "{good}");
        }
        for bad in [
            "local all all trust",
            "host all all 0.0.0.0/0 trust",
            "host all all",
            "host all all 0.0.0.0/0 scram-sha-256\nlocal all all trust",
            "include other.conf",
        ] {
            assert!(!re(bad), "{bad}");
        }
    }

    /// The schema's pattern, read with the regex crate the operator already builds.
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool + use<> {
        let re = regex::Regex::new(pattern).unwrap();
        move |s| re.is_match(s)
    }
}
