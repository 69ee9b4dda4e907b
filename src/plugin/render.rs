//! The text of `kubectl dbop status` and `kubectl dbop backup --wait`: pure, from objects and a
//! clock, so the screen is unit-tested without a cluster.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::health::{PodHealth, health_section};
pub use super::text::{size, table};
use crate::api::{BackupPhase, Database, DatabaseBackup};
use crate::backup::window::{Latest, restorable_window};

/// How many of a Database's DatabaseBackups and Events the status screen shows.
pub const RECENT: usize = 5;

/// One Event about the Database, reduced to what the screen shows.
#[derive(Clone, Debug, PartialEq)]
pub struct EventLine {
    pub at: Option<DateTime<Utc>>,
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
}

/// Everything `status` shows: the Database, its DatabaseBackups and Events (any order), and
/// each database pod's health figures.
#[derive(Clone, Debug)]
pub struct StatusView {
    pub database: Database,
    pub backups: Vec<DatabaseBackup>,
    pub events: Vec<EventLine>,
    pub health: Vec<PodHealth>,
}

/// Converts a meta/v1 `Time` (jiff) to chrono.
pub fn from_meta_time(t: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.0.as_second(), 0)
}

/// An age as kubectl prints it (`45s`, `3m`, `2h`, `4d`); `-` when unknown.
pub fn age(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(at) = at else { return "-".into() };
    let secs = (now - at).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// A time with its distance from now: `2026-11-30T09:00:00Z (5m ago)` or `(in 5m)`.
fn when(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match at {
        None => "-".into(),
        Some(t) if t > now => format!(
            "{} (in {})",
            t.format("%Y-%m-%dT%H:%M:%SZ"),
            age(Some(now), t)
        ),
        Some(t) => format!(
            "{} ({} ago)",
            t.format("%Y-%m-%dT%H:%M:%SZ"),
            age(Some(t), now)
        ),
    }
}

/// The whole `status` screen.
pub fn status_screen(view: &StatusView, now: DateTime<Utc>) -> String {
    let mut out = summary(&view.database);
    out += &conditions(&view.database, now);
    out += &health_section(&view.health);
    out += &upgrade(&view.database);
    out += &backup_status(&view.database, now);
    out += &point_in_time(&view.database, &view.backups, now);
    out += &recent_backups(&view.backups, now);
    out += &events(&view.events, now);
    out
}

fn summary(db: &Database) -> String {
    let status = db.status.clone().unwrap_or_default();
    let phase = status
        .phase
        .map_or("Unknown (no status yet)", |p| p.label());
    format!(
        "Database:  {}/{}\nPhase:     {phase}\nVersion:   spec {}, current {}\nEndpoint:  {}\n{}",
        db.namespace_or_default(),
        db.name(),
        db.spec.version,
        status.current_version.as_deref().unwrap_or("-"),
        status.endpoint.as_deref().unwrap_or("-"),
        instances(&status.instances) + &synchronous(db, &status.instances) + &maintenance(db),
    )
}

/// With `spec.maintenanceWindow`, one line for it: when it is, and what waits for it (the
/// `MaintenancePending` condition's message).
fn maintenance(db: &Database) -> String {
    let Some(window) = db.spec.maintenance_window.as_ref() else {
        return String::new();
    };
    let days = if window.days.is_empty() {
        "every day".to_string()
    } else {
        let names: Vec<String> = window.days.iter().map(|d| format!("{d:?}")).collect();
        names.join(", ")
    };
    let zone = window.time_zone.as_deref().unwrap_or("UTC");
    let pending = db
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "MaintenancePending")
        })
        .map_or_else(|| "not judged yet".to_string(), |c| c.message.clone());
    format!(
        "Maintenance: {days} {} for {} ({zone}); {pending}\n",
        window.start, window.duration
    )
}

/// With `spec.synchronous`, one line for it: the quorum asked for, what happens with too few,
/// and the standbys the primary counts now (`pg_stat_replication.sync_state`, as the status
/// last read it).
fn synchronous(db: &Database, instances: &[crate::api::InstanceStatus]) -> String {
    let Some(sync) = db.spec.synchronous.as_ref() else {
        return String::new();
    };
    let standbys = db.spec.instances.saturating_sub(1);
    let counted: Vec<&str> = instances
        .iter()
        .filter(|i| matches!(i.sync_state.as_deref(), Some("quorum" | "sync")))
        .map(|i| i.name.as_str())
        .collect();
    let now = if counted.is_empty() {
        "none streams to confirm now".to_string()
    } else {
        format!("confirming now: {}", counted.join(", "))
    };
    let too_few = match sync.when_too_few {
        crate::api::WhenTooFew::Wait => "too few: commits wait",
        crate::api::WhenTooFew::Degrade => "too few: commits go on unconfirmed",
    };
    format!(
        "Synchronous: any {} of {standbys} standbys confirm each commit ({too_few}); {now}\n",
        sync.standbys
    )
}

/// One line for the instances: each with its role, readiness and a standby's lag when known
/// (`orders-1 standby ready, lag 256 B`).
fn instances(instances: &[crate::api::InstanceStatus]) -> String {
    if instances.is_empty() {
        return String::new();
    }
    let each: Vec<String> = instances
        .iter()
        .map(|i| {
            let ready = if i.ready { "ready" } else { "not ready" };
            let lag = match (i.lag_bytes, i.lag_milliseconds) {
                (Some(b), Some(ms)) => format!(" (lag {}, {ms} ms)", size(Some(b as i64))),
                (Some(b), None) => format!(" (lag {})", size(Some(b as i64))),
                (None, _) => String::new(),
            };
            format!("{} {} {ready}{lag}", i.name, i.role.label())
        })
        .collect();
    format!("Instances: {}\n", each.join(", "))
}

fn conditions(db: &Database, now: DateTime<Utc>) -> String {
    let conditions = db
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if conditions.is_empty() {
        return "\nConditions: none yet\n".into();
    }
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(from_meta_time(&c.last_transition_time), now),
                c.message.clone(),
            ]
        })
        .collect();
    "\nConditions:\n".to_string() + &table(&["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], &rows)
}

/// The upgrade's stage, from the `Upgrading` condition while one is in progress (the status
/// has no separate stage field).
fn upgrade(db: &Database) -> String {
    let Some(status) = &db.status else {
        return String::new();
    };
    let upgrading = status.conditions.iter().find(|c| c.type_ == "Upgrading");
    match upgrading {
        Some(c) if c.status == "True" => format!(
            "\nUpgrade:   to {} — {}: {}\n",
            status.target_version.as_deref().unwrap_or(&db.spec.version),
            c.reason,
            c.message
        ),
        _ => String::new(),
    }
}

fn backup_status(db: &Database, now: DateTime<Utc>) -> String {
    if db.spec.backup.is_none() {
        return "\nBackups:   not configured (spec.backup)\n".into();
    }
    let b = db
        .status
        .as_ref()
        .and_then(|s| s.backup.clone())
        .unwrap_or_default();
    let named = |name: &Option<String>, at| match name {
        Some(n) => format!("{n} at {}", when(at, now)),
        None => "none".into(),
    };
    let suspended = db.spec.backup.as_ref().is_some_and(|b| b.suspend);
    format!(
        "\nBackups:\n  Last successful:  {}\n  Last failure:     {}\n  Next scheduled:   {}\n",
        named(&b.last_successful, b.last_successful_time),
        named(&b.last_failure, b.last_failure_time),
        if suspended {
            "suspended".into()
        } else {
            when(b.next_schedule_time, now)
        },
    )
}

/// The restorable window, for a Database that archives its WAL.
fn point_in_time(db: &Database, backups: &[DatabaseBackup], now: DateTime<Utc>) -> String {
    let Some(window) = restorable_window(db, backups) else {
        return String::new();
    };
    let from = match &window.earliest {
        Some((name, at)) => format!("{} (base backup {name})", when(Some(*at), now)),
        None => "no base backup yet (kubectl dbop backup NAME --physical, or spec.backup.method: Physical)".into(),
    };
    let to = match window.latest {
        Latest::Now { archive_timeout } => {
            let timeout = chrono::TimeDelta::from_std(archive_timeout).unwrap_or_default();
            format!(
                "now (commits of the last {} may not be archived yet)",
                age(Some(now - timeout), now)
            )
        }
        Latest::FailingSince(at) => format!(
            "{}: WAL archiving has failed since then (ContinuousArchiving)",
            when(Some(at), now)
        ),
        Latest::Unknown => "not known yet (the primary has not reported on archiving)".into(),
    };
    format!("\nPoint-in-time recovery:\n  Restorable from:  {from}\n  Restorable to:    {to}\n")
}

fn recent_backups(backups: &[DatabaseBackup], now: DateTime<Utc>) -> String {
    if backups.is_empty() {
        return "\nDatabaseBackups: none\n".into();
    }
    let mut sorted: Vec<&DatabaseBackup> = backups.iter().collect();
    sorted.sort_by_key(|b| (created(b), b.metadata.name.clone()));
    let start = sorted.len().saturating_sub(RECENT);
    let rows: Vec<Vec<String>> = sorted[start..].iter().map(|b| backup_row(b, now)).collect();
    format!("\nDatabaseBackups (last {}):\n", rows.len())
        + &table(
            &["NAME", "REASON", "PHASE", "SIZE", "AGE", "MESSAGE"],
            &rows,
        )
}

fn created(b: &DatabaseBackup) -> Option<DateTime<Utc>> {
    b.metadata
        .creation_timestamp
        .as_ref()
        .and_then(from_meta_time)
}

fn backup_row(b: &DatabaseBackup, now: DateTime<Utc>) -> Vec<String> {
    let status = b.status.clone().unwrap_or_default();
    vec![
        b.metadata.name.clone().unwrap_or_default(),
        format!("{:?}", b.spec.reason),
        status.phase.map_or("Pending", BackupPhase::label).into(),
        size(status.size_bytes),
        age(created(b), now),
        status.message.unwrap_or_default(),
    ]
}

fn events(events: &[EventLine], now: DateTime<Utc>) -> String {
    if events.is_empty() {
        return "\nEvents: none\n".into();
    }
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.at);
    let start = sorted.len().saturating_sub(RECENT);
    let rows: Vec<Vec<String>> = sorted[start..]
        .iter()
        .map(|e| {
            let count = if e.count > 1 {
                format!(" (x{})", e.count)
            } else {
                String::new()
            };
            vec![
                age(e.at, now),
                e.type_.clone(),
                e.reason.clone(),
                format!("{}{count}", e.message),
            ]
        })
        .collect();
    "\nEvents (newest last):\n".to_string() + &table(&["AGE", "TYPE", "REASON", "MESSAGE"], &rows)
}

/// What `backup --wait` prints when the backup finished; `Ok` when it succeeded.
pub fn backup_outcome(b: &DatabaseBackup) -> Result<String, String> {
    let name = b.metadata.name.clone().unwrap_or_default();
    let status = b.status.clone().unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Succeeded) => Ok(format!(
            "DatabaseBackup {name} succeeded: {} at s3://{}/{}",
            size(status.size_bytes),
            status.bucket.as_deref().unwrap_or("-"),
            status.key.as_deref().unwrap_or("-"),
        )),
        _ => Err(format!(
            "DatabaseBackup {name} failed: {}",
            status.message.as_deref().unwrap_or("no message")
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-11-30T10:00:00Z".parse().unwrap()
    }

    fn database(status: serde_json::Value) -> Database {
        serde_json::from_value(json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"version": "16.4", "storage": {"size": "1Gi"}, "backup": {
                "schedule": "0 2 * * *",
                "s3": {"bucket": "backups", "credentials": {"secretName": "s3"}}}},
            "status": status,
        }))
        .unwrap()
    }

    fn condition(
        type_: &str,
        status: &str,
        reason: &str,
        at: &str,
        message: &str,
    ) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "lastTransitionTime": at, "message": message})
    }

    fn backup(name: &str, created: &str, status: serde_json::Value) -> DatabaseBackup {
        serde_json::from_value(json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
            "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created},
            "spec": {"database": "orders", "reason": "Scheduled"},
            "status": status,
        }))
        .unwrap()
    }

    fn backup_named(name: &str, created: &str) -> DatabaseBackup {
        backup(name, created, json!({}))
    }

    fn ready_view() -> StatusView {
        let database = database(json!({
            "phase": "Ready", "currentVersion": "16.4", "endpoint": "orders.shop.svc:5432",
            "conditions": [
                condition("Ready", "True", "Ready", "2026-11-30T09:00:00Z", "accepting connections"),
                condition("BackupHealthy", "False", "BackupFailed", "2026-11-30T09:58:00Z", "upload refused"),
            ],
            "backup": {
                "lastSuccessful": "orders-202611290200", "lastSuccessfulTime": "2026-11-29T02:03:00Z",
                "lastFailure": "orders-202611300200", "lastFailureTime": "2026-11-30T09:58:00Z",
                "nextScheduleTime": "2026-12-01T02:00:00Z"
            }
        }));
        let mut backups: Vec<DatabaseBackup> = (0..6)
            .map(|i| {
                backup(
                    &format!("orders-old-{i}"),
                    &format!("2026-11-2{i}T02:00:00Z"),
                    json!({"phase": "Succeeded", "sizeBytes": 4300}),
                )
            })
            .collect();
        backups.push(backup(
            "orders-202611300200",
            "2026-11-30T09:57:00Z",
            json!({"phase": "Failed", "message": "upload refused"}),
        ));
        let event = |at: &str, reason: &str| EventLine {
            at: Some(at.parse().unwrap()),
            type_: "Normal".into(),
            reason: reason.into(),
            message: format!("{reason} happened"),
            count: 1,
        };
        StatusView {
            database,
            backups,
            events: vec![
                event("2026-11-30T09:59:00Z", "Newest"),
                event("2026-11-30T09:00:00Z", "Oldest"),
            ],
            health: vec![],
        }
    }

    fn line_with<'a>(screen: &'a str, needle: &str) -> &'a str {
        screen
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{screen}"))
    }

    /// The table row whose first column is `first`.
    fn row_of<'a>(screen: &'a str, first: &str) -> &'a str {
        screen
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first:?} in:\n{screen}"))
    }

    fn words(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn the_status_screen_shows_phase_version_endpoint_and_conditions() {
        let screen = status_screen(&ready_view(), now());
        assert_eq!(words(line_with(&screen, "Phase:")), ["Phase:", "Ready"]);
        assert_eq!(
            line_with(&screen, "Version:"),
            "Version:   spec 16.4, current 16.4"
        );
        assert!(line_with(&screen, "Endpoint:").ends_with("orders.shop.svc:5432"));
        assert_eq!(
            words(line_with(&screen, "TYPE")),
            ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
        );
        assert_eq!(
            words(line_with(&screen, "  Ready ")),
            ["Ready", "True", "Ready", "60m", "accepting", "connections"]
        );
        assert_eq!(
            words(line_with(&screen, "BackupHealthy")),
            [
                "BackupHealthy",
                "False",
                "BackupFailed",
                "2m",
                "upload",
                "refused"
            ]
        );
    }

    #[test]
    fn the_status_screen_lists_the_instances_with_their_roles() {
        let view = StatusView {
            database: database(json!({
                "phase": "Degraded",
                "instances": [
                    {"name": "orders-0", "role": "primary", "ready": true},
                    {"name": "orders-1", "role": "standby", "ready": false},
                    {"name": "orders-2", "role": "standby", "ready": true, "lagBytes": 3072, "lagMilliseconds": 40},
                ],
            })),
            ..ready_view()
        };
        let screen = status_screen(&view, now());
        assert_eq!(
            line_with(&screen, "Instances:"),
            "Instances: orders-0 primary ready, orders-1 standby not ready, orders-2 standby ready (lag 3.0 KiB, 40 ms)"
        );
        // No instances in the status (an older dbop): no line.
        assert!(!status_screen(&ready_view(), now()).contains("Instances:"));
        // Asynchronous: no synchronous line.
        assert!(!screen.contains("Synchronous:"));
    }

    #[test]
    fn the_status_screen_says_which_standbys_confirm_commits_now() {
        let mut db = database(json!({
            "phase": "Ready",
            "instances": [
                {"name": "orders-0", "role": "primary", "ready": true},
                {"name": "orders-1", "role": "standby", "ready": true, "syncState": "quorum"},
                {"name": "orders-2", "role": "standby", "ready": false},
            ],
        }));
        db.spec.instances = 3;
        db.spec.synchronous = Some(crate::api::SynchronousSpec {
            standbys: 1,
            when_too_few: crate::api::WhenTooFew::Wait,
        });
        let view = StatusView {
            database: db.clone(),
            ..ready_view()
        };
        assert_eq!(
            line_with(&status_screen(&view, now()), "Synchronous:"),
            "Synchronous: any 1 of 2 standbys confirm each commit (too few: commits wait); confirming now: orders-1"
        );
        let status = db.status.as_mut().unwrap();
        status.instances[1].sync_state = None;
        let view = StatusView {
            database: db,
            ..ready_view()
        };
        assert!(
            line_with(&status_screen(&view, now()), "Synchronous:")
                .ends_with("none streams to confirm now")
        );
    }

    #[test]
    fn the_status_screen_says_when_the_maintenance_window_is_and_what_waits() {
        let mut db = database(json!({
            "phase": "Ready",
            "conditions": [condition("MaintenancePending", "True", "WaitingForMaintenanceWindow",
                "2026-11-30T09:00:00Z",
                "waiting for the maintenance window, which opens Sat 2026-12-05 02:00 CET: a restart for shared_buffers")],
        }));
        let view = StatusView {
            database: db.clone(),
            ..ready_view()
        };
        assert!(!status_screen(&view, now()).contains("Maintenance:"));
        db.spec.maintenance_window = serde_json::from_value(json!({
            "days": ["Saturday", "Sunday"], "start": "02:00", "duration": "2h",
            "timeZone": "Europe/Berlin"}))
        .unwrap();
        let view = StatusView {
            database: db,
            ..ready_view()
        };
        assert_eq!(
            line_with(&status_screen(&view, now()), "Maintenance:"),
            "Maintenance: Saturday, Sunday 02:00 for 2h (Europe/Berlin); waiting for the maintenance window, which opens Sat 2026-12-05 02:00 CET: a restart for shared_buffers"
        );
    }

    #[test]
    fn the_status_screen_shows_backup_outcomes_and_the_last_backups() {
        let screen = status_screen(&ready_view(), now());
        assert_eq!(
            line_with(&screen, "Last successful:").trim(),
            "Last successful:  orders-202611290200 at 2026-11-29T02:03:00Z (31h ago)"
        );
        assert!(line_with(&screen, "Last failure:").contains("orders-202611300200 at"));
        assert!(line_with(&screen, "Next scheduled:").ends_with("2026-12-01T02:00:00Z (in 16h)"));
        assert!(screen.contains("DatabaseBackups (last 5):"), "{screen}");
        assert!(
            !screen.contains("orders-old-0"),
            "only the last five:\n{screen}"
        );
        assert_eq!(
            words(line_with(&screen, "orders-old-5")),
            ["orders-old-5", "Scheduled", "Succeeded", "4.2", "KiB", "5d"]
        );
        assert_eq!(
            words(row_of(&screen, "orders-202611300200")),
            [
                "orders-202611300200",
                "Scheduled",
                "Failed",
                "-",
                "3m",
                "upload",
                "refused"
            ]
        );
    }

    #[test]
    fn the_status_screen_shows_the_restorable_window_of_a_database_that_archives() {
        let mut view = ready_view();
        assert!(!status_screen(&view, now()).contains("Point-in-time recovery:"));
        let backup = view.database.spec.backup.as_mut().unwrap();
        backup.wal_archiving =
            Some(serde_json::from_value(json!({"archiveTimeout": "5m"})).unwrap());
        let screen = status_screen(&view, now());
        assert!(
            line_with(&screen, "Restorable from:").contains("no base backup yet"),
            "{screen}"
        );
        assert!(
            line_with(&screen, "Restorable to:").contains("not known yet"),
            "{screen}"
        );

        let mut base = backup_named("orders-base", "2026-11-29T03:00:00Z");
        base.spec.method = crate::api::BackupMethod::Physical;
        base.status = serde_json::from_value(
            json!({"phase": "Succeeded", "completedAt": "2026-11-29T03:10:00Z"}),
        )
        .unwrap();
        view.backups.push(base);
        let status = view.database.status.as_mut().unwrap();
        status.conditions.push(
            serde_json::from_value(condition(
                "ContinuousArchiving",
                "True",
                "Archiving",
                "2026-11-29T00:00:00Z",
                "archived",
            ))
            .unwrap(),
        );
        let screen = status_screen(&view, now());
        assert_eq!(
            line_with(&screen, "Restorable from:").trim(),
            "Restorable from:  2026-11-29T03:10:00Z (30h ago) (base backup orders-base)"
        );
        assert_eq!(
            line_with(&screen, "Restorable to:").trim(),
            "Restorable to:    now (commits of the last 5m may not be archived yet)"
        );
    }

    #[test]
    fn events_come_newest_last() {
        let screen = status_screen(&ready_view(), now());
        let oldest = screen.find("Oldest happened").expect("oldest event");
        let newest = screen.find("Newest happened").expect("newest event");
        assert!(oldest < newest, "{screen}");
        assert!(screen.contains("Events (newest last):"));
    }

    #[test]
    fn an_upgrade_in_progress_shows_its_stage() {
        let mut view = ready_view();
        view.database = database(json!({
            "phase": "Upgrading", "currentVersion": "16.3", "targetVersion": "16.4",
            "conditions": [condition("Upgrading", "True", "RollingOut", "2026-11-30T09:59:00Z", "1 of 1 pods updated")],
        }));
        let screen = status_screen(&view, now());
        assert_eq!(
            line_with(&screen, "Upgrade:"),
            "Upgrade:   to 16.4 — RollingOut: 1 of 1 pods updated"
        );
        assert_eq!(
            line_with(&screen, "Version:"),
            "Version:   spec 16.4, current 16.3"
        );
    }

    #[test]
    fn a_new_database_without_status_or_backups_reads_clearly() {
        let mut view = ready_view();
        view.database = database(serde_json::Value::Null);
        view.database.spec.backup = None;
        view.backups.clear();
        view.events.clear();
        let screen = status_screen(&view, now());
        assert!(
            screen.contains("Phase:     Unknown (no status yet)"),
            "{screen}"
        );
        assert!(screen.contains("Conditions: none yet"));
        assert!(screen.contains("Backups:   not configured (spec.backup)"));
        assert!(screen.contains("DatabaseBackups: none"));
        assert!(screen.contains("Events: none"));
        assert!(!screen.contains("Upgrade:"));
    }

    #[test]
    fn backup_outcomes_name_size_and_key_or_the_failure() {
        let ok = backup(
            "b1",
            "2026-11-30T09:00:00Z",
            json!({"phase": "Succeeded", "sizeBytes": 4242,
            "bucket": "backups", "key": "shop/orders/x/dump.pgc.zst"}),
        );
        assert_eq!(
            backup_outcome(&ok),
            Ok(
                "DatabaseBackup b1 succeeded: 4.1 KiB at s3://backups/shop/orders/x/dump.pgc.zst"
                    .into()
            )
        );
        let failed = backup(
            "b2",
            "2026-11-30T09:00:00Z",
            json!({"phase": "Failed", "message": "bucket missing"}),
        );
        assert_eq!(
            backup_outcome(&failed),
            Err("DatabaseBackup b2 failed: bucket missing".into())
        );
    }

    #[test]
    fn ages_and_sizes_read_like_kubectl() {
        let t = |s: i64| Some(now() - chrono::TimeDelta::seconds(s));
        assert_eq!(age(t(5), now()), "5s");
        assert_eq!(age(t(600), now()), "10m");
        assert_eq!(age(t(3 * 3600), now()), "3h");
        assert_eq!(age(t(3 * 86400), now()), "3d");
        assert_eq!(age(None, now()), "-");
        assert_eq!(size(Some(512)), "512 B");
        assert_eq!(size(Some(3 * 1024 * 1024)), "3.0 MiB");
    }
}
