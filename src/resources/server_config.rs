//! The server configuration dbop ships to the database pods: the ConfigMap `<name>-config`
//! with the parameters (`postgresql.conf`) and the extra client rules (`pg_hba.conf`) of
//! `spec.postgresql`, and the topology (`topology`: which instance is the primary), mounted
//! at `CONFIG_DIR`, where the instance manager includes the first from the server's
//! `postgresql.conf`, composes the second into `pg_hba.conf`, reloads the server when the
//! kubelet updates them, and follows the third (primary or standby of whom).
//!
//! Also what a restart applies: the parameters PostgreSQL reads only at start
//! (`RESTART_PARAMETERS`), which the pod template carries in an annotation so that a change of
//! one rolls the pods; and the memory defaults that follow the container's memory limit.
//!
//! Pure: plain functions of the Database.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, PodTemplateSpec, Volume, VolumeMount,
};

use super::owned_meta;
use super::quantity;
use crate::api::Database;
use dbop_contract::topology::{TOPOLOGY_FILE, Topology};

pub use dbop_contract::instance::{CONFIG_DIR, HBA_FILE, PARAMETERS_FILE};

/// The pod-template annotation with the restart-needing parameters the pods start with (JSON,
/// name to value): a change of it rolls the pods, a change of any other parameter does not.
pub const RESTART_ANNOTATION: &str = "dbop.dev/restart-parameters";
/// The volume of the ConfigMap in the database pod.
pub const CONFIG_VOLUME: &str = "server-config";

/// Parameters PostgreSQL reads only at server start (context `postmaster` in `pg_settings`,
/// PostgreSQL 13 to 18, and those of common extensions): a change of one restarts the pods.
/// Every other parameter is applied by a reload. (The ones dbop manages are listed too: the
/// list says what PostgreSQL does, not what a spec may set.)
pub const RESTART_PARAMETERS: [&str; 57] = [
    "archive_mode",
    "autovacuum_freeze_max_age",
    "autovacuum_max_workers",
    "autovacuum_multixact_freeze_max_age",
    "autovacuum_worker_slots",
    "bonjour",
    "bonjour_name",
    "cluster_name",
    "commit_timestamp_buffers",
    "config_file",
    "data_directory",
    "data_sync_retry",
    "debug_io_direct",
    "dynamic_shared_memory_type",
    "event_source",
    "external_pid_file",
    "hba_file",
    "hot_standby",
    "huge_page_size",
    "huge_pages",
    "ident_file",
    "io_max_concurrency",
    "io_method",
    "io_workers",
    "jit_provider",
    "listen_addresses",
    "logging_collector",
    "max_connections",
    "max_files_per_process",
    "max_locks_per_transaction",
    "max_logical_replication_workers",
    "max_notify_queue_pages",
    "max_pred_locks_per_transaction",
    "max_prepared_transactions",
    "max_replication_slots",
    "max_wal_senders",
    "max_worker_processes",
    "min_dynamic_shared_memory",
    "multixact_member_buffers",
    "multixact_offset_buffers",
    "old_snapshot_threshold",
    "port",
    "reserved_connections",
    "shared_buffers",
    "shared_memory_type",
    "shared_preload_libraries",
    "superuser_reserved_connections",
    "track_activity_query_size",
    "track_commit_timestamp",
    "wal_buffers",
    "wal_decode_buffer_size",
    "wal_level",
    "wal_log_hints",
    // Extensions' own.
    "pg_stat_statements.max",
    "cron.database_name",
    "cron.use_background_workers",
    "timescaledb.max_background_workers",
];

/// Whether a change of `name` needs the server restarted.
pub fn needs_restart(name: &str) -> bool {
    RESTART_PARAMETERS.contains(&name)
}

const MIB: u128 = 1024 * 1024;

/// PostgreSQL's default `max_connections`, which `work_mem`'s default divides the memory by.
const DEFAULT_MAX_CONNECTIONS: u128 = 100;

/// The memory settings for a container limited to `limit` bytes, `max_connections` clients:
/// - `shared_buffers`: a quarter of the limit (at least 16MB);
/// - `effective_cache_size`: three quarters (the planner's guess of what caches hold);
/// - `maintenance_work_mem`: a sixteenth, from 16MB to 2GB (vacuum, index builds);
/// - `work_mem`: a quarter of the limit shared by every connection, from PostgreSQL's own 4MB
///   to 256MB (one sort or hash may use it; a query may run several).
pub fn memory_defaults(limit: u128, max_connections: u128) -> BTreeMap<String, String> {
    let mb = |bytes: u128| format!("{}MB", bytes / MIB);
    let connections = max_connections.max(1);
    BTreeMap::from([
        ("shared_buffers".into(), mb((limit / 4).max(16 * MIB))),
        ("effective_cache_size".into(), mb(limit / 4 * 3)),
        (
            "maintenance_work_mem".into(),
            mb((limit / 16).clamp(16 * MIB, 2048 * MIB)),
        ),
        (
            "work_mem".into(),
            mb((limit / 4 / connections).clamp(4 * MIB, 256 * MIB)),
        ),
    ])
}

/// The database container's memory limit in bytes, when one is set.
fn memory_limit(db: &Database) -> Option<u128> {
    let limits = db.spec.resources.as_ref()?.limits.as_ref()?;
    quantity::bytes(&limits.get("memory")?.0).filter(|b| *b > 0)
}

/// Every parameter the server runs with from the spec: the memory defaults (when a memory
/// limit is set), then `spec.postgresql.parameters` (which win), then the preloaded libraries,
/// then WAL archiving's (`spec.backup.walArchiving`).
pub fn parameters(db: &Database) -> BTreeMap<String, String> {
    let spec = db.spec.postgresql.clone().unwrap_or_default();
    let max_connections = spec
        .parameters
        .get("max_connections")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_CONNECTIONS);
    let mut all = memory_limit(db)
        .map(|limit| memory_defaults(limit, max_connections))
        .unwrap_or_default();
    all.extend(spec.parameters);
    if !spec.shared_preload_libraries.is_empty() {
        all.insert(
            "shared_preload_libraries".into(),
            spec.shared_preload_libraries.join(","),
        );
    }
    all.extend(super::wal_archiving::parameters(db));
    all
}

/// The parameters of `all` that need a restart.
pub fn restart_parameters(all: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    all.iter()
        .filter(|(name, _)| needs_restart(name))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect()
}

/// A value quoted for `postgresql.conf` (the server unescapes `\\` and `''`).
fn conf_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// The parameters file, one `name = 'value'` per line, sorted by name.
pub fn render_parameters(all: &BTreeMap<String, String>) -> String {
    let mut text = String::from(
        "# Written by dbop from spec.postgresql and the memory limit: edit the Database, not this.\n",
    );
    for (name, value) in all {
        // The schema refuses line breaks; a stored object from before it must not inject lines.
        let value = value.replace(['\n', '\r'], " ");
        text.push_str(&format!("{name} = {}\n", conf_value(&value)));
    }
    text
}

/// The extra `pg_hba.conf` rules, one per line.
pub fn render_hba(rules: &[String]) -> String {
    let mut text = String::from("# spec.postgresql.pgHba\n");
    for rule in rules {
        text.push_str(&rule.replace(['\n', '\r'], " "));
        text.push('\n');
    }
    text
}

/// The name of the ConfigMap.
pub fn config_map_name(db: &Database) -> String {
    format!("{}-config", db.name())
}

/// The ConfigMap the database pods mount (always built: an empty spec has empty files), with
/// the topology (the one the primary Lease carries too); `superuser` is the name the rules of
/// `spec.tls.superuserAuthentication` are for.
pub fn server_config_map(db: &Database, topology: &Topology, superuser: &str) -> ConfigMap {
    let hba = db
        .spec
        .postgresql
        .as_ref()
        .map(|p| p.pg_hba.clone())
        .unwrap_or_default();
    ConfigMap {
        metadata: owned_meta(db, config_map_name(db), "database"),
        data: Some(BTreeMap::from([
            (PARAMETERS_FILE.into(), render_parameters(&parameters(db))),
            (
                HBA_FILE.into(),
                super::tls::superuser_rules(db, superuser).unwrap_or_default()
                    + &render_hba(&hba)
                    + &super::tls::plaintext_rules(db).unwrap_or_default(),
            ),
            (TOPOLOGY_FILE.to_string(), topology.render()),
        ])),
        ..ConfigMap::default()
    }
}

/// The annotation value: the restart-needing parameters as JSON (None when there are none,
/// so a Database without any keeps the pod template it had).
pub fn restart_annotation(db: &Database) -> Option<String> {
    let restart = restart_parameters(&parameters(db));
    (!restart.is_empty()).then(|| serde_json::to_string(&restart).unwrap_or_default())
}

/// The restart-needing parameters a pod template says (empty when it has no annotation or an
/// unreadable one).
pub fn parse_restart_annotation(
    annotations: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    annotations
        .and_then(|a| a.get(RESTART_ANNOTATION))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The ConfigMap as a volume: optional, so a pod starts (with PostgreSQL's defaults) even in
/// the moment it is missing; the kubelet fills it in when it appears.
pub fn config_volume(db: &Database) -> Volume {
    Volume {
        name: CONFIG_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(db),
            optional: Some(true),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Where the postgres container reads it. No `subPath`: the kubelet updates a whole mount.
pub fn config_mount() -> VolumeMount {
    super::pod::mount(CONFIG_VOLUME, CONFIG_DIR, true)
}

/// Puts the server configuration into the database pod template: the ConfigMap's volume, its
/// mount in the `postgres` container, and the restart annotation.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    if let Some(value) = restart_annotation(db) {
        let meta = template.metadata.get_or_insert_with(Default::default);
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(RESTART_ANNOTATION.into(), value);
    }
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    pod.volumes
        .get_or_insert_with(Vec::new)
        .push(config_volume(db));
    if let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") {
        postgres
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(config_mount());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn db(spec: serde_json::Value) -> Database {
        let mut base = serde_json::json!({"version": "16.4", "storage": {"size": "1Gi"}});
        base.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        testing::database(base)
    }

    #[test]
    fn memory_defaults_follow_the_limit() {
        let gib = 1024 * MIB;
        let one = memory_defaults(gib, 100);
        assert_eq!(one["shared_buffers"], "256MB");
        assert_eq!(one["effective_cache_size"], "768MB");
        assert_eq!(one["maintenance_work_mem"], "64MB");
        assert_eq!(one["work_mem"], "4MB");
        let big = memory_defaults(64 * gib, 100);
        assert_eq!(big["shared_buffers"], "16384MB");
        assert_eq!(big["maintenance_work_mem"], "2048MB");
        assert_eq!(big["work_mem"], "163MB");
        let small = memory_defaults(32 * MIB, 100);
        assert_eq!(small["shared_buffers"], "16MB");
        assert_eq!(small["maintenance_work_mem"], "16MB");
        assert_eq!(small["work_mem"], "4MB");
        // No division by zero: max_connections 0 counts as one.
        assert_eq!(memory_defaults(32 * MIB, 0)["work_mem"], "8MB");
    }

    #[test]
    fn explicit_parameters_win_over_memory_defaults() {
        let none = db(serde_json::json!({}));
        assert!(parameters(&none).is_empty());
        let limited = db(serde_json::json!({
            "resources": {"limits": {"memory": "2Gi"}},
            "postgresql": {
                "parameters": {"shared_buffers": "1GB", "max_connections": "50"},
                "sharedPreloadLibraries": ["pg_stat_statements", "auto_explain"]
            }
        }));
        let all = parameters(&limited);
        assert_eq!(all["shared_buffers"], "1GB");
        assert_eq!(all["effective_cache_size"], "1536MB");
        // 2GiB / 4 / 50 connections.
        assert_eq!(all["work_mem"], "10MB");
        assert_eq!(
            all["shared_preload_libraries"],
            "pg_stat_statements,auto_explain"
        );
        let restart = restart_parameters(&all);
        assert_eq!(
            restart.keys().collect::<Vec<_>>(),
            [
                "max_connections",
                "shared_buffers",
                "shared_preload_libraries"
            ]
        );
    }

    #[test]
    fn reloadable_and_restart_parameters() {
        for name in [
            "max_connections",
            "shared_buffers",
            "shared_preload_libraries",
        ] {
            assert!(needs_restart(name), "{name}");
        }
        for name in [
            "work_mem",
            "log_min_duration_statement",
            "statement_timeout",
        ] {
            assert!(!needs_restart(name), "{name}");
        }
        let mut sorted = RESTART_PARAMETERS.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), RESTART_PARAMETERS.len(), "listed twice");
    }

    #[test]
    fn the_config_map_holds_both_files_quoted() {
        let d = db(serde_json::json!({"postgresql": {
            "parameters": {"search_path": "\"$user\", public", "application_name": "it's"},
            "pgHba": ["host all all 10.0.0.0/8 reject"]
        }}));
        let topology = super::super::replication::topology(&d, "orders-0");
        let cm = server_config_map(&d, &topology, "postgres");
        assert_eq!(cm.metadata.name.as_deref(), Some("orders-config"));
        assert!(cm.metadata.owner_references.is_some());
        let data = cm.data.unwrap();
        let conf = &data[PARAMETERS_FILE];
        assert!(conf.contains("application_name = 'it''s'\n"), "{conf}");
        assert!(
            conf.contains("search_path = '\"$user\", public'\n"),
            "{conf}"
        );
        assert!(data[HBA_FILE].ends_with("host all all 10.0.0.0/8 reject\n"));
        assert!(data["topology"].contains("primary=orders-0\n"));
        let broken = render_parameters(&BTreeMap::from([("a".into(), "x\ny = 1".into())]));
        assert_eq!(broken.lines().count(), 2, "{broken}");
    }

    #[test]
    fn the_annotation_carries_only_restart_parameters() {
        let reload_only =
            db(serde_json::json!({"postgresql": {"parameters": {"work_mem": "8MB"}}}));
        assert_eq!(restart_annotation(&reload_only), None);
        let d = db(serde_json::json!({"postgresql": {"parameters": {
            "work_mem": "8MB", "max_connections": "200"
        }}}));
        let value = restart_annotation(&d).unwrap();
        let annotations = BTreeMap::from([(RESTART_ANNOTATION.to_string(), value)]);
        let parsed = parse_restart_annotation(Some(&annotations));
        assert_eq!(
            parsed,
            BTreeMap::from([("max_connections".into(), "200".into())])
        );
        assert!(parse_restart_annotation(None).is_empty());
    }
}
