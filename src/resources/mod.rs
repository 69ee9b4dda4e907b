//! Pure builders of every object a Database owns: names, labels, and the desired Secret,
//! Services, StatefulSet and init Job.
//!
//! Pure: a builder is a plain function of the Database, the operator's settings and observed
//! facts. No client, no clock, no randomness (the caller passes a generated password in).

pub mod accounts;
pub mod agent;
pub mod backup_job;
pub mod cert_manager;
pub mod credentials;
pub mod database_backup;
pub mod drift;
pub mod init_job;
pub mod job;
pub mod monitoring;
pub mod network_policy;
pub mod placement;
pub mod pod;
pub mod preflight_job;
pub mod primary_lease;
pub mod private_server;
pub mod quantity;
pub mod recovery_job;
pub mod replication;
pub mod restore_job;
pub mod server_config;
pub mod services;
pub mod statefulset;
pub mod template_origin;
pub mod tls;
pub mod wal_archiving;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::Database;
use crate::settings::Settings;

/// The digits of its SQL's digest in the name of an init SQL ConfigMap.
const INIT_SQL_DIGITS: usize = 10;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first 16 hex digits of the SHA-256 of `bytes`: a name's or an annotation's short id of
/// a content.
pub fn short_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes)[..8])
}

/// The port every PostgreSQL instance listens on.
pub const POSTGRES_PORT: i32 = 5432;
/// The superuser name when the credentials Secret does not say (the instance manager's too).
pub use dbop_contract::instance::DEFAULT_SUPERUSER;
/// The PostgreSQL major versions dbop knows how to run.
pub const SUPPORTED_MAJORS: std::ops::RangeInclusive<u32> = 13..=18;

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_VERSION: &str = "app.kubernetes.io/version";
pub const MANAGED_BY: &str = "dbop";
/// A label selector for everything dbop manages, used by the controller's watches.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=dbop";
/// A label selector for the database pods of every Database (not the Jobs' pods).
pub const DATABASE_POD_SELECTOR: &str =
    "app.kubernetes.io/managed-by=dbop,app.kubernetes.io/component=database";

/// The names of everything derived from one Database. Deterministic, so that a restarted
/// operator finds what it made before instead of making it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    database: String,
}

impl Names {
    pub fn new(database: &str) -> Self {
        Self {
            database: database.to_string(),
        }
    }
    pub fn of(db: &Database) -> Self {
        Self::new(&db.name())
    }
    pub fn database(&self) -> &str {
        &self.database
    }
    pub fn statefulset(&self) -> String {
        self.database.clone()
    }
    /// The headless Service that gives each pod a stable DNS name.
    pub fn headless_service(&self) -> String {
        format!("{}-hl", self.database)
    }
    /// The client Service pointing at the primary.
    pub fn rw_service(&self) -> String {
        format!("{}-rw", self.database)
    }
    pub fn generated_secret(&self) -> String {
        format!("{}-credentials", self.database)
    }
    pub fn init_job(&self) -> String {
        format!("{}-init", self.database)
    }
    /// The Job restoring `spec.bootstrap.fromBackup`.
    pub fn restore_job(&self) -> String {
        format!("{}-restore", self.database)
    }
    /// The ConfigMap holding inline init SQL, named by its digest (`short_digest`; its first
    /// 10 digits keep the name a DNS label): a Job can only ever mount the SQL it was made for.
    pub fn init_sql_config_map(&self, digest: &str) -> String {
        let short = digest.get(..INIT_SQL_DIGITS).unwrap_or(digest);
        format!("{}-init-sql-{short}", self.database)
    }
    /// Whether `name` is one of the ConfigMaps dbop made for this Database's inline init SQL
    /// (today's, named by digest, or the single one of releases before).
    pub fn is_init_sql_config_map(&self, name: &str) -> bool {
        let legacy = format!("{}-init-sql", self.database);
        name == legacy
            || name
                .strip_prefix(&legacy)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|digest| {
                    digest.len() == INIT_SQL_DIGITS && digest.bytes().all(|b| b.is_ascii_hexdigit())
                })
    }
    pub fn pod(&self, ordinal: i32) -> String {
        format!("{}-{ordinal}", self.database)
    }
    /// The ordinal of one of this Database's pods, from its name.
    pub fn ordinal_of(&self, pod: &str) -> Option<i32> {
        let ordinal = pod
            .strip_prefix(self.database.as_str())?
            .strip_prefix('-')?;
        let n: i32 = ordinal.parse().ok()?;
        (n >= 0 && n.to_string() == ordinal).then_some(n)
    }
    /// The claim the StatefulSet controller makes from the `data` volumeClaimTemplate.
    pub fn data_pvc(&self, ordinal: i32) -> String {
        format!("data-{}-{ordinal}", self.database)
    }
    pub fn endpoint(&self, namespace: &str) -> String {
        format!("{}.{namespace}.svc", self.rw_service())
    }
}

/// The labels that select a Database's pods. Never changes for a Database's lifetime
/// (a StatefulSet's selector is immutable).
pub fn selector_labels(database: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "postgresql".to_string()),
        (LABEL_INSTANCE.to_string(), database.to_string()),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
    ])
}

/// The labels of an owned object of the given component (`database`, `init`, `credentials`, …).
pub fn labels(database: &str, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(database);
    labels.insert(LABEL_COMPONENT.to_string(), component.to_string());
    labels
}

/// Metadata of an owned object: name, namespace, labels and the controller owner reference.
pub fn owned_meta(db: &Database, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: db.metadata.namespace.clone(),
        labels: Some(labels(&db.name(), component)),
        owner_references: owner_reference(db).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The controller owner reference to the Database (None only for an object never stored,
/// which has no uid).
pub fn owner_reference(db: &Database) -> Option<OwnerReference> {
    db.controller_owner_ref(&())
}

/// Pod labels: the user's `podMetadata.labels`, then dbop's (dbop's win on conflict).
pub fn pod_labels(db: &Database, component: &str) -> BTreeMap<String, String> {
    let mut out = db
        .spec
        .pod_metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    out.extend(labels(&db.name(), component));
    out
}

/// Labels of a Job's pods: like [`pod_labels`] but with another `app.kubernetes.io/name`, so
/// that neither the StatefulSet's nor the Services' selectors ever match a Job pod.
pub fn job_pod_labels(db: &Database, component: &str) -> BTreeMap<String, String> {
    let mut out = pod_labels(db, component);
    out.insert(LABEL_NAME.to_string(), format!("dbop-{component}"));
    out
}

/// Pod annotations from `podMetadata.annotations` (None when there are none).
pub fn pod_annotations(db: &Database) -> Option<BTreeMap<String, String>> {
    let mut annotations = db
        .spec
        .pod_metadata
        .as_ref()
        .map(|m| m.annotations.clone())
        .unwrap_or_default();
    // A new value rolls the pods: that is how a restart is asked for.
    if let Some(at) = template_origin::restarted_at(db) {
        annotations.insert(template_origin::RESTARTED_AT_ANNOTATION.into(), at);
    }
    Some(annotations).filter(|a| !a.is_empty())
}

/// The parsed `MAJOR.MINOR` version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub fn parse(text: &str) -> Option<Version> {
        let (major, minor) = text.split_once('.')?;
        Some(Version {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

/// Why a version cannot be run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionProblem {
    Malformed,
    UnsupportedMajor(u32),
}

/// Checks the version against what dbop can run (the schema already checked the form).
pub fn check_version(text: &str) -> Result<Version, VersionProblem> {
    let version = Version::parse(text).ok_or(VersionProblem::Malformed)?;
    if SUPPORTED_MAJORS.contains(&version.major) {
        Ok(version)
    } else {
        Err(VersionProblem::UnsupportedMajor(version.major))
    }
}

/// The image of the database container: `spec.image`, or the repository tagged with the version.
pub fn image(db: &Database, settings: &Settings) -> String {
    match &db.spec.image {
        Some(image) => image.clone(),
        None => settings.postgres_image(&db.spec.version),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A Database as the API server would return it, for builder and decision tests.
    use super::*;
    use crate::api::DatabaseSpec;

    pub fn database(spec: serde_json::Value) -> Database {
        let spec: DatabaseSpec = serde_json::from_value(spec).expect("valid spec");
        let mut db = Database::new("orders", spec);
        db.metadata.namespace = Some("shop".into());
        db.metadata.uid = Some("0b5e6f0a-1111-2222-3333-444455556666".into());
        db.metadata.generation = Some(1);
        db
    }

    pub fn minimal() -> Database {
        database(serde_json::json!({"version": "16.4", "storage": {"size": "1Gi"}}))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pod_s_ordinal_is_read_back_from_its_name_only() {
        let names = Names::new("orders");
        assert_eq!(names.ordinal_of(&names.pod(3)), Some(3));
        for other in [
            "orders",
            "orders-",
            "orders-x",
            "orders-01",
            "orders-1-1",
            "shop-1",
            "orders2-1",
        ] {
            assert_eq!(names.ordinal_of(other), None, "{other}");
        }
    }

    use super::*;

    #[test]
    fn the_init_sql_config_maps_dbop_made_are_told_from_others() {
        let n = Names::new("orders");
        let made = n.init_sql_config_map(&short_digest(b"SELECT 1"));
        assert_eq!(made.len(), "orders-init-sql-".len() + 10);
        for ours in [made.as_str(), "orders-init-sql"] {
            assert!(n.is_init_sql_config_map(ours), "{ours}");
        }
        for other in [
            "schema",
            "orders-init-sql-schema",
            "orders-init-sql-0123456789abcdef",
            "orders-2-init-sql-0123456789",
            "order-init-sql-0123456789",
        ] {
            assert!(!n.is_init_sql_config_map(other), "{other}");
        }
    }

    #[test]
    fn names_are_deterministic_and_distinct() {
        let n = Names::new("orders");
        let all = [
            n.statefulset(),
            n.headless_service(),
            n.rw_service(),
            n.generated_secret(),
            n.init_job(),
            n.init_sql_config_map("0123456789abcdef"),
            n.data_pvc(0),
        ];
        let mut sorted = all.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        assert_eq!(n.endpoint("shop"), "orders-rw.shop.svc");
        assert_eq!(n.data_pvc(0), "data-orders-0");
    }

    #[test]
    fn versions() {
        assert_eq!(
            check_version("16.4"),
            Ok(Version {
                major: 16,
                minor: 4
            })
        );
        assert_eq!(
            check_version("9.6"),
            Err(VersionProblem::UnsupportedMajor(9))
        );
        assert_eq!(
            check_version("99.1"),
            Err(VersionProblem::UnsupportedMajor(99))
        );
        assert_eq!(check_version("16"), Err(VersionProblem::Malformed));
        assert_eq!(check_version("a.b"), Err(VersionProblem::Malformed));
        assert!(Version::parse("16.10") > Version::parse("16.9"));
    }

    #[test]
    fn image_follows_version_unless_overridden() {
        let mut db = testing::minimal();
        assert_eq!(
            image(&db, &Settings::default()),
            "docker.io/library/postgres:16.4"
        );
        db.spec.image = Some("registry.local/pg:16.4-postgis".into());
        assert_eq!(
            image(&db, &Settings::default()),
            "registry.local/pg:16.4-postgis"
        );
    }

    #[test]
    fn image_template() {
        let mut s = Settings {
            postgres_image_template: "dbop.local/postgres:{version}".into(),
            ..Settings::default()
        };
        assert_eq!(s.postgres_image("15.20"), "dbop.local/postgres:15.20");
        s.postgres_image_template = "mirror.local/pg".into();
        assert_eq!(s.postgres_image("15.20"), "mirror.local/pg:15.20");
        s.postgres_image_template = "mirror.local/pg:{version}-postgis".into();
        assert_eq!(s.postgres_image("16.4"), "mirror.local/pg:16.4-postgis");
    }

    #[test]
    fn job_pods_are_not_selected_by_the_statefulset_or_the_services() {
        let db = testing::minimal();
        let selector = selector_labels("orders");
        for component in ["init", "backup"] {
            let labels = job_pod_labels(&db, component);
            let matched = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
            assert!(!matched, "{component} pods match the selector: {labels:?}");
            assert_eq!(labels[LABEL_INSTANCE], "orders");
        }
        let db_pod = pod_labels(&db, "database");
        assert!(selector.iter().all(|(k, v)| db_pod.get(k) == Some(v)));
    }

    #[test]
    fn owned_objects_point_at_their_database() {
        let db = testing::minimal();
        let meta = owned_meta(&db, "x".into(), "database");
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "Database");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(meta.labels.unwrap()[LABEL_MANAGED_BY], "dbop");
    }

    #[test]
    fn dbop_labels_win_over_user_pod_labels() {
        let mut db = testing::minimal();
        db.spec.pod_metadata = Some(crate::api::PodMetadata {
            labels: BTreeMap::from([
                (LABEL_INSTANCE.to_string(), "spoof".to_string()),
                ("team".to_string(), "payments".to_string()),
            ]),
            annotations: BTreeMap::new(),
        });
        let labels = pod_labels(&db, "database");
        assert_eq!(labels[LABEL_INSTANCE], "orders");
        assert_eq!(labels["team"], "payments");
        assert_eq!(pod_annotations(&db), None);
    }
}
