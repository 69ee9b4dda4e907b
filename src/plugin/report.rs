//! `kubectl dbop report`: a support bundle of one Database, as files in a directory or a
//! `.tar.gz`. Which objects belong to it, how each is written (YAML, without managed fields),
//! and Secrets reduced to their names, types and keys: **a Secret's values are never written**.
//!
//! Pure, except [`Bundle::write`] (local files only; the API reads are in `read`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use serde::Serialize;
use serde_json::Value;

use super::output::{Format, list, object, print};
use crate::resources::{LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY};

/// The label selector of the objects dbop made for the Database (StatefulSet, pods, claims,
/// Services, Jobs, ConfigMaps, Secrets).
pub fn owned_selector(database: &str) -> String {
    format!("{LABEL_INSTANCE}={database},{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// Whether an Event about `involved` (an object's name) concerns the Database: the Database
/// itself, or an object named after it (`orders-0`, `orders-restore`, `data-orders-1`), unless
/// that name is another Database's of the namespace or named after one (`orders-copy-0` is
/// Database orders-copy's).
pub fn event_concerns(database: &str, others: &[String], involved: &str) -> bool {
    let after = |db: &str| {
        involved == db
            || involved.starts_with(&format!("{db}-"))
            || involved.starts_with(&format!("data-{db}-"))
    };
    after(database)
        && !others
            .iter()
            .filter(|o| o.as_str() != database && o.starts_with(&format!("{database}-")))
            .any(|o| after(o))
}

/// A Secret as the bundle lists it: name, type and the names of its keys. Nothing of a value.
pub fn secret_listing(secret: &Secret) -> Value {
    let keys: Vec<&String> = secret
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(secret.string_data.iter().flat_map(|d| d.keys()))
        .collect();
    serde_json::json!({
        "name": secret.metadata.name,
        "type": secret.type_,
        "keys": keys,
    })
}

/// The bundle's files by relative path, and what could not be collected.
#[derive(Clone, Debug, Default)]
pub struct Bundle {
    pub files: BTreeMap<String, Vec<u8>>,
    pub problems: Vec<String>,
}

impl Bundle {
    /// `path` holds the objects as a YAML List (one object: itself).
    pub fn objects<T: Serialize>(&mut self, path: &str, items: &[T]) {
        let items: Vec<Value> = items.iter().map(object).collect();
        let document = match <[Value; 1]>::try_from(items) {
            Ok([one]) => one,
            Err(items) => list(items),
        };
        self.files
            .insert(path.into(), print(&document, Format::Yaml).into_bytes());
    }

    /// `secrets.yaml`: the Secrets' names, types and keys only.
    pub fn secrets(&mut self, secrets: &[Secret]) {
        let listing: Vec<Value> = secrets.iter().map(secret_listing).collect();
        let document = serde_json::json!({
            "note": "Secrets are listed by name, type and keys; their values are not collected.",
            "secrets": listing,
        });
        self.files.insert(
            "secrets.yaml".into(),
            print(&document, Format::Yaml).into_bytes(),
        );
    }

    /// A pod container's log, `logs/<pod>/<container>.log`.
    pub fn log(&mut self, pod: &str, container: &str, text: String) {
        self.files
            .insert(format!("logs/{pod}/{container}.log"), text.into_bytes());
    }

    /// Something that could not be collected, listed in `README.txt`.
    pub fn problem(&mut self, what: impl Into<String>) {
        self.problems.push(what.into());
    }

    /// `README.txt`: what this is, when, and what is missing.
    pub fn readme(&mut self, ns: &str, name: &str, at: &str) {
        let mut text = format!(
            "dbop support bundle of Database {ns}/{name}, collected {at} by kubectl-dbop {}.\n\
             Objects are YAML without managedFields; Secrets are listed by name, type and keys, never their values.\n\
             Files: {}\n",
            env!("CARGO_PKG_VERSION"),
            self.files.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        if self.problems.is_empty() {
            text += "Everything was collected.\n";
        } else {
            text += "Not collected:\n";
            for p in &self.problems {
                text += &format!("  - {p}\n");
            }
        }
        self.files.insert("README.txt".into(), text.into_bytes());
    }

    /// Writes the files under `top/` in `out`: a `.tar.gz` (or `.tgz`) archive, else a
    /// directory. Refuses to write over an existing path.
    pub fn write(&self, out: &Path, top: &str) -> Result<PathBuf, String> {
        if out.exists() {
            return Err(format!(
                "{} exists: the report is written to a new path",
                out.display()
            ));
        }
        let name = out.to_string_lossy();
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            self.write_tar_gz(out, top)
                .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        } else {
            for (path, bytes) in &self.files {
                let file = out.join(path);
                if let Some(dir) = file.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                }
                std::fs::write(&file, bytes)
                    .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
            }
        }
        Ok(out.to_path_buf())
    }

    fn write_tar_gz(&self, out: &Path, top: &str) -> std::io::Result<()> {
        let file = std::fs::File::create_new(out)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut archive = tar::Builder::new(gz);
        for (path, bytes) in &self.files {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_cksum();
            archive.append_data(&mut header, format!("{top}/{path}"), bytes.as_slice())?;
        }
        archive.into_inner()?.finish()?.flush()
    }
}

/// The default output: `dbop-report-<namespace>-<name>-<yyyymmddhhmmss>.tar.gz`.
pub fn default_output(ns: &str, name: &str, at: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "dbop-report-{ns}-{name}-{}.tar.gz",
        at.format("%Y%m%d%H%M%S")
    )
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret() -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("orders-credentials".into()),
                annotations: Some(BTreeMap::from([(
                    "kubectl.kubernetes.io/last-applied-configuration".into(),
                    "{\"stringData\":{\"password\":\"hunter2-value\"}}".into(),
                )])),
                ..Default::default()
            },
            type_: Some("kubernetes.io/basic-auth".into()),
            data: Some(BTreeMap::from([
                ("username".into(), ByteString(b"user-value-x".to_vec())),
                ("password".into(), ByteString(b"hunter2-value".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("extra".into(), "plain-value".into())])),
            ..Default::default()
        }
    }

    /// Neither a value, nor its base64, nor an annotation that repeats it.
    fn assert_no_secret_value(text: &str) {
        for value in [
            "hunter2-value",
            "aHVudGVyMi12YWx1ZQ",
            "plain-value",
            "user-value-x",
        ] {
            assert!(!text.contains(value), "{value} in:\n{text}");
        }
    }

    #[test]
    fn secrets_are_listed_by_name_type_and_keys_without_values() {
        let listing = secret_listing(&secret());
        assert_eq!(
            listing,
            serde_json::json!({"name": "orders-credentials", "type": "kubernetes.io/basic-auth",
                "keys": ["password", "username", "extra"]})
        );
        let mut bundle = Bundle::default();
        bundle.secrets(&[secret()]);
        let text = String::from_utf8(bundle.files["secrets.yaml"].clone()).unwrap();
        assert!(text.contains("orders-credentials"), "{text}");
        assert_no_secret_value(&text);
    }

    #[test]
    fn events_of_the_database_and_of_objects_named_after_it() {
        let others = ["orders".to_string(), "orders-copy".into(), "billing".into()];
        for name in ["orders", "orders-0", "orders-restore", "data-orders-1"] {
            assert!(event_concerns("orders", &others, name), "{name}");
        }
        for name in [
            "orders2",
            "billing-0",
            "data-orders2-0",
            "ordersx-0",
            "orders-copy",
            "orders-copy-0",
            "data-orders-copy-0",
        ] {
            assert!(!event_concerns("orders", &others, name), "{name}");
        }
        assert!(event_concerns("orders-copy", &others, "orders-copy-0"));
        assert_eq!(
            owned_selector("orders"),
            "app.kubernetes.io/instance=orders,app.kubernetes.io/managed-by=dbop"
        );
    }

    #[test]
    fn the_bundle_is_written_as_a_directory_or_a_tar_gz_never_over_a_path() {
        let mut bundle = Bundle::default();
        let db = crate::resources::testing::minimal();
        bundle.objects("database.yaml", std::slice::from_ref(&db));
        bundle.objects("pods.yaml", &[db.clone(), db]);
        bundle.secrets(&[secret()]);
        bundle.log("orders-0", "postgres", "LOG:  ready\n".into());
        bundle.problem("logs of orders-1/postgres: pod not found");
        bundle.readme("shop", "orders", "2026-11-30T09:00:00Z");
        let readme = String::from_utf8(bundle.files["README.txt"].clone()).unwrap();
        assert!(readme.contains("  - logs of orders-1/postgres"), "{readme}");

        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bundle");
        bundle.write(&dir, "top").unwrap();
        let database = std::fs::read_to_string(dir.join("database.yaml")).unwrap();
        assert!(
            database.starts_with("apiVersion: dbop.dev/v1alpha1"),
            "{database}"
        );
        let pods = std::fs::read_to_string(dir.join("pods.yaml")).unwrap();
        assert!(pods.contains("kind: List"), "{pods}");
        assert_eq!(
            std::fs::read_to_string(dir.join("logs/orders-0/postgres.log")).unwrap(),
            "LOG:  ready\n"
        );
        assert!(bundle.write(&dir, "top").unwrap_err().contains("exists"));

        let archive = tmp.path().join("bundle.tar.gz");
        bundle.write(&archive, "dbop-report-orders").unwrap();
        let mut entries = BTreeMap::new();
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(&archive).unwrap());
        for entry in tar::Archive::new(gz).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            entries.insert(path, text);
        }
        assert_eq!(
            entries.keys().cloned().collect::<Vec<_>>(),
            [
                "dbop-report-orders/README.txt",
                "dbop-report-orders/database.yaml",
                "dbop-report-orders/logs/orders-0/postgres.log",
                "dbop-report-orders/pods.yaml",
                "dbop-report-orders/secrets.yaml",
            ]
        );
        assert_eq!(entries["dbop-report-orders/database.yaml"], database);
        assert_no_secret_value(&entries.values().cloned().collect::<String>());
        assert!(bundle.write(&archive, "x").unwrap_err().contains("exists"));
    }
}
