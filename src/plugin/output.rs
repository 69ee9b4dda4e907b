//! Machine-readable output (`-o json|yaml`) and the `list` table: pure, from objects and a clock.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::render::{age, from_meta_time};
use super::text::table;
use crate::api::{Database, DatabaseBackup};

/// The `-o` formats besides the default text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

/// An object as `kubectl get -o` prints it: without `metadata.managedFields`.
pub fn object(item: &impl Serialize) -> Value {
    let mut value = serde_json::to_value(item).unwrap_or(Value::Null);
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    value
}

/// A `v1` `List` of the objects, as kubectl prints several.
pub fn list(items: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// `status -o`: a List of the Database followed by its DatabaseBackups (oldest first).
pub fn status_document(db: &Database, backups: &[DatabaseBackup]) -> Value {
    let mut backups: Vec<&DatabaseBackup> = backups.iter().collect();
    backups.sort_by_key(|b| {
        (
            b.metadata.creation_timestamp.clone(),
            b.metadata.name.clone(),
        )
    });
    let items = std::iter::once(object(db))
        .chain(backups.into_iter().map(object))
        .collect();
    list(items)
}

/// The document in the format (JSON pretty-printed; both end with a newline).
pub fn print(document: &Value, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(document).unwrap_or_default() + "\n",
        Format::Yaml => serde_norway::to_string(document).unwrap_or_default(),
    }
}

/// `list`: one row a Database (NAMESPACE first with `all_namespaces`), sorted by namespace and
/// name. READY is `ready/instances` from the status's instances.
pub fn list_table(dbs: &[Database], all_namespaces: bool, now: DateTime<Utc>) -> String {
    let mut dbs: Vec<&Database> = dbs.iter().collect();
    dbs.sort_by_key(|d| (d.metadata.namespace.clone(), d.metadata.name.clone()));
    let rows: Vec<Vec<String>> = dbs
        .iter()
        .map(|db| {
            let status = db.status.clone().unwrap_or_default();
            let ready = status.instances.iter().filter(|i| i.ready).count();
            let mut row = vec![
                db.metadata.name.clone().unwrap_or_default(),
                status.phase.map_or("-", |p| p.label()).to_string(),
                db.spec.version.clone(),
                status.current_version.unwrap_or_else(|| "-".into()),
                format!("{ready}/{}", db.spec.instances),
                status.primary.unwrap_or_else(|| "-".into()),
                age(
                    db.metadata
                        .creation_timestamp
                        .as_ref()
                        .and_then(from_meta_time),
                    now,
                ),
            ];
            if all_namespaces {
                row.insert(0, db.metadata.namespace.clone().unwrap_or_default());
            }
            row
        })
        .collect();
    let mut headers = vec![
        "NAME", "PHASE", "VERSION", "CURRENT", "READY", "PRIMARY", "AGE",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    // kubectl's tables are not indented.
    table(&headers, &rows)
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l).to_string() + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(ns: &str, name: &str, status: Value) -> Database {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": name, "namespace": ns,
                "creationTimestamp": "2026-11-30T09:00:00Z",
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"version": "16.4", "instances": 3, "storage": {"size": "1Gi"}},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn list_rows_show_phase_versions_ready_of_instances_primary_and_age() {
        let ready = db(
            "shop",
            "orders",
            serde_json::json!({"phase": "Ready", "currentVersion": "16.4", "primary": "orders-1",
                "instances": [
                    {"name": "orders-0", "role": "standby", "ready": true},
                    {"name": "orders-1", "role": "primary", "ready": true},
                    {"name": "orders-2", "role": "standby", "ready": false}]}),
        );
        let new = db("billing", "ledger", serde_json::json!({}));
        let now = "2026-11-30T12:00:00Z".parse().unwrap();
        let text = list_table(&[ready.clone(), new.clone()], true, now);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec![
                    "NAMESPACE",
                    "NAME",
                    "PHASE",
                    "VERSION",
                    "CURRENT",
                    "READY",
                    "PRIMARY",
                    "AGE"
                ],
                vec!["billing", "ledger", "-", "16.4", "-", "0/3", "-", "3h"],
                vec![
                    "shop", "orders", "Ready", "16.4", "16.4", "2/3", "orders-1", "3h"
                ],
            ],
            "{text}"
        );
        let one_namespace = list_table(&[ready], false, now);
        assert!(one_namespace.starts_with("NAME "), "{one_namespace}");
        assert!(!one_namespace.contains("shop"), "{one_namespace}");
    }

    #[test]
    fn status_document_is_a_list_of_the_database_then_its_backups_without_managed_fields() {
        let database = db("shop", "orders", serde_json::json!({"phase": "Ready"}));
        let backup = |name: &str, at: &str| -> DatabaseBackup {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
                "metadata": {"name": name, "namespace": "shop", "creationTimestamp": at},
                "spec": {"database": "orders", "reason": "Manual"}
            }))
            .unwrap()
        };
        let doc = status_document(
            &database,
            &[
                backup("orders-b", "2026-11-30T10:00:00Z"),
                backup("orders-a", "2026-11-30T09:00:00Z"),
            ],
        );
        assert_eq!(doc["kind"], "List");
        let items = doc["items"].as_array().unwrap();
        let kinds: Vec<(&str, &str)> = items
            .iter()
            .map(|i| {
                (
                    i["kind"].as_str().unwrap(),
                    i["metadata"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("Database", "orders"),
                ("DatabaseBackup", "orders-a"),
                ("DatabaseBackup", "orders-b")
            ]
        );
        assert_eq!(items[0]["apiVersion"], "dbop.dev/v1alpha1");
        assert!(items[0]["metadata"].get("managedFields").is_none());
        assert_eq!(items[0]["status"]["phase"], "Ready");
        let yaml: Value = serde_norway::from_str(&print(&doc, Format::Yaml)).unwrap();
        assert_eq!(yaml, doc);
        let json: Value = serde_json::from_str(&print(&doc, Format::Json)).unwrap();
        assert_eq!(json, doc);
    }
}
