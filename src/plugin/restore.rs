//! `kubectl dbop restore`: the new Database that restores a DatabaseBackup
//! (`spec.bootstrap.fromBackup.databaseBackup`, docs/restore.md), what the plugin says about it
//! and the answer to its question. Pure.

use crate::api::{
    BackupPhase, BootstrapSpec, Database, DatabaseBackup, DatabaseSpec, FromBackupSpec,
};

/// What the user may change from the source Database.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub version: Option<String>,
    pub storage_size: Option<String>,
    pub storage_class: Option<String>,
}

/// The Database `new_name` that restores `backup` (of `source`): the source's version and
/// storage unless overridden, one instance, nothing else copied (no backup schedule, no
/// credentials Secret: the restore brings the backup's roles, the new Database gets its own
/// Secrets). Refused when the backup failed or belongs to another Database.
pub fn manifest(
    source: &Database,
    backup: &DatabaseBackup,
    new_name: &str,
    overrides: &Overrides,
) -> Result<Database, String> {
    let backup_name = backup.metadata.name.clone().unwrap_or_default();
    if backup.spec.database != source.name() {
        return Err(format!(
            "DatabaseBackup {backup_name} is of Database {}, not {}",
            backup.spec.database,
            source.name()
        ));
    }
    let phase = backup.status.as_ref().and_then(|s| s.phase);
    if phase == Some(BackupPhase::Failed) {
        return Err(format!(
            "DatabaseBackup {backup_name} failed: there is nothing to restore"
        ));
    }
    if new_name == source.name() {
        return Err(format!(
            "the restore goes into a new Database: {new_name} is the source's name"
        ));
    }
    let mut storage = source.spec.storage.clone();
    if let Some(size) = &overrides.storage_size {
        storage.size = size.clone();
    }
    if let Some(class) = &overrides.storage_class {
        storage.storage_class_name = Some(class.clone());
    }
    let spec: DatabaseSpec = serde_json::from_value(serde_json::json!({
        "version": overrides.version.clone().unwrap_or_else(|| source.spec.version.clone()),
        "storage": storage,
    }))
    .map_err(|e| format!("cannot build the new Database's spec: {e}"))?;
    let mut db = Database::new(
        new_name,
        DatabaseSpec {
            engine: source.spec.engine,
            bootstrap: Some(Box::new(BootstrapSpec {
                from_backup: FromBackupSpec {
                    database_backup: Some(backup_name),
                    ..from_backup_default()
                },
            })),
            ..spec
        },
    );
    db.metadata.namespace = source.metadata.namespace.clone();
    Ok(db)
}

fn from_backup_default() -> FromBackupSpec {
    serde_json::from_value(serde_json::json!({})).expect("every field of fromBackup is optional")
}

/// What `restore` says it will create.
pub fn summary(db: &Database, backup: &DatabaseBackup) -> String {
    let status = backup.status.clone().unwrap_or_default();
    let class = db
        .spec
        .storage
        .storage_class_name
        .as_deref()
        .unwrap_or("the default class");
    format!(
        "Database {ns}/{name}: version {version}, {size} of {class}, 1 instance,\n  restored from DatabaseBackup {backup} of Database {source} (backup {id}, {phase}).\n",
        ns = db.namespace_or_default(),
        name = db.name(),
        version = db.spec.version,
        size = db.spec.storage.size,
        backup = backup.metadata.name.as_deref().unwrap_or_default(),
        source = backup.spec.database,
        id = status.backup_id.as_deref().unwrap_or("not known yet"),
        phase = status.phase.map_or("no phase yet", |p| p.label()),
    )
}

/// Whether an answer to "Create it? [y/N]" is a yes.
pub fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Database {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1",
                "annotations": {"dbop.dev/restartedAt": "x"}},
            "spec": {"version": "16.4", "instances": 3,
                "storage": {"size": "20Gi", "storageClassName": "fast"},
                "credentials": {"secretName": "orders-own"},
                "backup": {"schedule": "0 2 * * *", "s3": {"bucket": "b", "credentials": {"secretName": "s3"}}}},
            "status": {"phase": "Ready"}
        }))
        .unwrap()
    }

    fn backup(database: &str, phase: &str) -> DatabaseBackup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "dbop.dev/v1alpha1", "kind": "DatabaseBackup",
            "metadata": {"name": "orders-202611300200", "namespace": "shop"},
            "spec": {"database": database, "reason": "Scheduled"},
            "status": {"phase": phase, "backupId": "20261130T020003Z-orders"}
        }))
        .unwrap()
    }

    #[test]
    fn the_new_database_restores_the_backup_with_the_source_s_version_and_storage() {
        let db = manifest(
            &source(),
            &backup("orders", "Succeeded"),
            "orders-restored",
            &Overrides::default(),
        )
        .unwrap();
        let value = serde_json::to_value(&db).unwrap();
        assert_eq!(value["kind"], "Database");
        assert_eq!(
            value["metadata"],
            serde_json::json!({"name": "orders-restored", "namespace": "shop"})
        );
        let spec = &value["spec"];
        assert_eq!(spec["version"], "16.4");
        assert_eq!(spec["instances"], 1);
        assert_eq!(
            spec["storage"],
            serde_json::json!({"size": "20Gi", "storageClassName": "fast"})
        );
        assert_eq!(
            spec["bootstrap"],
            serde_json::json!({"fromBackup": {"databaseBackup": "orders-202611300200"}})
        );
        assert!(value["spec"].get("backup").is_none(), "{value}");
        assert!(value["spec"].get("credentials").is_none(), "{value}");
        let text = summary(&db, &backup("orders", "Succeeded"));
        assert_eq!(
            text,
            "Database shop/orders-restored: version 16.4, 20Gi of fast, 1 instance,\n  restored from DatabaseBackup orders-202611300200 of Database orders (backup 20261130T020003Z-orders, Succeeded).\n"
        );
    }

    #[test]
    fn overrides_replace_the_version_and_storage() {
        let db = manifest(
            &source(),
            &backup("orders", "Succeeded"),
            "orders-big",
            &Overrides {
                version: Some("16.6".into()),
                storage_size: Some("50Gi".into()),
                storage_class: Some("slow".into()),
            },
        )
        .unwrap();
        assert_eq!(db.spec.version, "16.6");
        assert_eq!(db.spec.storage.size, "50Gi");
        assert_eq!(db.spec.storage.storage_class_name.as_deref(), Some("slow"));
    }

    #[test]
    fn a_failed_backup_another_database_s_backup_or_the_source_s_name_is_refused() {
        let o = Overrides::default();
        let err = manifest(&source(), &backup("orders", "Failed"), "x", &o).unwrap_err();
        assert!(err.contains("failed"), "{err}");
        let err = manifest(&source(), &backup("billing", "Succeeded"), "x", &o).unwrap_err();
        assert!(err.contains("of Database billing, not orders"), "{err}");
        let err = manifest(&source(), &backup("orders", "Succeeded"), "orders", &o).unwrap_err();
        assert!(err.contains("new Database"), "{err}");
    }

    #[test]
    fn only_yes_confirms() {
        assert!(confirmed("y\n"));
        assert!(confirmed(" YES "));
        assert!(!confirmed(""));
        assert!(!confirmed("n"));
        assert!(!confirmed("yep"));
    }
}
