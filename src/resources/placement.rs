//! Where dbop's pods run and what their main containers reserve: the Database's placement put
//! on a pod spec, which placement and resources each Job gets (a backup or verify Job takes
//! `spec.backup`'s when set), and the database container's resources with the operator's default.
//!
//! Pure: plain functions of the Database and the operator's settings.

use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

use crate::api::{Database, PlacementSpec};
use crate::settings::Settings;

/// Which of the Database's settings a Job follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobClass {
    /// Init, restore, preflight: `spec.placement` and `spec.jobResources`.
    Database,
    /// Backup and verify: `spec.backup.placement` and `spec.backup.resources` first.
    Backup,
}

/// Puts the placement's scheduling fields on `pod` (nothing when there is none).
pub fn place(pod: &mut PodSpec, placement: Option<&PlacementSpec>) {
    let Some(p) = placement else {
        return;
    };
    pod.node_selector = (!p.node_selector.is_empty()).then(|| p.node_selector.clone());
    pod.tolerations = (!p.tolerations.is_empty()).then(|| p.tolerations.clone());
    pod.affinity = p.affinity.clone();
    pod.topology_spread_constraints =
        (!p.topology_spread_constraints.is_empty()).then(|| p.topology_spread_constraints.clone());
    pod.priority_class_name = p.priority_class_name.clone();
}

/// The placement of the database pods.
pub fn database_placement(db: &Database) -> Option<&PlacementSpec> {
    db.spec.placement.as_deref()
}

/// The placement of a Job: `spec.backup.placement` replaces `spec.placement` as a whole for
/// backup and verify Jobs; every other Job inherits the database's.
pub fn job_placement(db: &Database, class: JobClass) -> Option<&PlacementSpec> {
    let backup = match class {
        JobClass::Backup => db.spec.backup.as_ref().and_then(|b| b.placement.as_ref()),
        JobClass::Database => None,
    };
    backup.or(db.spec.placement.as_deref())
}

/// The resources of a Job's main container: `spec.backup.resources` (backup and verify), else
/// `spec.jobResources`, else the operator's `--job-resources`.
pub fn job_resources(db: &Database, settings: &Settings, class: JobClass) -> ResourceRequirements {
    let backup = match class {
        JobClass::Backup => db.spec.backup.as_ref().and_then(|b| b.resources.as_ref()),
        JobClass::Database => None,
    };
    backup
        .or(db.spec.job_resources.as_ref())
        .unwrap_or(&settings.job_resources)
        .clone()
}

/// The resources of the database container: `spec.resources`, else the operator's
/// `--database-resources` (so a namespace with a ResourceQuota and no LimitRange admits it).
pub fn database_resources(db: &Database, settings: &Settings) -> ResourceRequirements {
    db.spec
        .resources
        .clone()
        .unwrap_or_else(|| settings.database_resources.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    const BACKUP: &str =
        r#"{"schedule": "@daily", "s3": {"bucket": "b", "credentials": {"secretName": "s3"}}}"#;

    fn db(extra: serde_json::Value, backup_extra: serde_json::Value) -> Database {
        let mut spec = json!({"version": "16.4", "storage": {"size": "1Gi"}});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let mut backup: serde_json::Value = serde_json::from_str(BACKUP).unwrap();
        for (k, v) in backup_extra.as_object().unwrap() {
            backup[k] = v.clone();
        }
        spec["backup"] = backup;
        testing::database(spec)
    }

    fn pool(name: &str) -> serde_json::Value {
        json!({"nodeSelector": {"pool": name},
               "tolerations": [{"key": "dedicated", "value": name, "effect": "NoSchedule"}],
               "priorityClassName": "databases"})
    }

    #[test]
    fn jobs_inherit_the_database_placement_unless_the_backup_spec_replaces_it() {
        let inherits = db(json!({"placement": pool("db")}), json!({}));
        for class in [JobClass::Database, JobClass::Backup] {
            assert_eq!(
                job_placement(&inherits, class),
                inherits.spec.placement.as_deref()
            );
        }
        let replaced = db(
            json!({"placement": pool("db")}),
            json!({"placement": {"nodeSelector": {"pool": "batch"}}}),
        );
        let backup = job_placement(&replaced, JobClass::Backup).unwrap();
        assert_eq!(backup.node_selector["pool"], "batch");
        // As a whole: the database's tolerations and priority class do not leak in.
        assert!(backup.tolerations.is_empty() && backup.priority_class_name.is_none());
        assert_eq!(
            job_placement(&replaced, JobClass::Database)
                .unwrap()
                .node_selector["pool"],
            "db"
        );
        assert_eq!(job_placement(&testing::minimal(), JobClass::Backup), None);
    }

    #[test]
    fn place_sets_every_scheduling_field_and_nothing_without_a_placement() {
        let d = db(
            json!({"placement": {
                "nodeSelector": {"pool": "db"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                               "whenUnsatisfiable": "ScheduleAnyway"}],
                "priorityClassName": "databases"}}),
            json!({}),
        );
        let mut pod = PodSpec::default();
        place(&mut pod, database_placement(&d));
        assert_eq!(pod.node_selector.unwrap()["pool"], "db");
        assert_eq!(
            pod.tolerations.unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        assert!(pod.affinity.unwrap().pod_anti_affinity.is_some());
        assert_eq!(pod.topology_spread_constraints.unwrap()[0].max_skew, 1);
        assert_eq!(pod.priority_class_name.as_deref(), Some("databases"));
        let mut bare = PodSpec::default();
        place(&mut bare, None);
        assert_eq!(bare, PodSpec::default());
        // An empty placement sets no empty lists or maps (the drift check would see them).
        place(&mut bare, Some(&PlacementSpec::default()));
        assert_eq!(bare, PodSpec::default());
    }

    #[test]
    fn job_resources_follow_backup_then_database_then_operator() {
        let settings = Settings::default();
        let mem = |r: ResourceRequirements| r.requests.unwrap()["memory"].clone();
        let none = db(json!({}), json!({}));
        for class in [JobClass::Database, JobClass::Backup] {
            assert_eq!(
                job_resources(&none, &settings, class),
                settings.job_resources
            );
        }
        let jobs = json!({"jobResources": {"requests": {"memory": "300Mi"}}});
        let per_db = db(jobs.clone(), json!({}));
        assert_eq!(
            mem(job_resources(&per_db, &settings, JobClass::Backup)),
            Quantity("300Mi".into())
        );
        let both = db(jobs, json!({"resources": {"requests": {"memory": "2Gi"}}}));
        assert_eq!(
            mem(job_resources(&both, &settings, JobClass::Backup)),
            Quantity("2Gi".into())
        );
        assert_eq!(
            mem(job_resources(&both, &settings, JobClass::Database)),
            Quantity("300Mi".into())
        );
    }

    #[test]
    fn the_database_container_has_the_default_resources_unless_the_spec_sets_them() {
        let settings = Settings::default();
        let r = database_resources(&testing::minimal(), &settings);
        let (requests, limits) = (r.requests.unwrap(), r.limits.unwrap());
        // A ResourceQuota on cpu and memory (requests and limits) admits it.
        for key in ["cpu", "memory"] {
            assert!(
                requests.contains_key(key) && limits.contains_key(key),
                "{key}"
            );
        }
        assert_eq!(
            requests["memory"], limits["memory"],
            "memory limit = request"
        );
        let own = db(json!({"resources": {"requests": {"cpu": "2"}}}), json!({}));
        let r = database_resources(&own, &settings);
        assert_eq!(r.requests.unwrap()["cpu"], Quantity("2".into()));
        assert!(
            r.limits.is_none(),
            "the spec's resources are taken as they are"
        );
    }
}
