//! The init Job: runs the Database's init SQL once, with psql from the database image, against
//! the `-rw` Service, in one transaction that stops at the first error.
//!
//! The SQL reaches the container as an environment variable (inline, or straight from the
//! user's ConfigMap key), so neither the SQL nor the password appears on a command line.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, PodSpec,
    PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::credentials::{PASSWORD_KEY, USERNAME_KEY, secret_name};
use super::statefulset::{container_security_context, pod_security_context, secret_env};
use super::{Names, POSTGRES_PORT, Settings, image, owned_meta, pod_annotations, pod_labels};
use crate::api::{Database, InitSpec};

/// How often a failing init is retried before the Database is marked Failed.
pub const BACKOFF_LIMIT: i32 = 3;
/// A hung init (a lock, a typo'd infinite loop) fails instead of running forever.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 1800;

const SCRIPT: &str = r#"set -eu
export PGUSER="${PGUSER:-postgres}"
printf '%s\n' "$DBOP_INIT_SQL" | psql --no-psqlrc --set=ON_ERROR_STOP=1 --single-transaction --file=-"#;

/// The init Job, or None when the Database has no init SQL.
pub fn init_job(db: &Database, settings: &Settings) -> Option<Job> {
    let init = db.spec.init.as_ref()?;
    let names = Names::of(db);
    let namespace = db.namespace_or_default();
    let secret = secret_name(db);
    let env = vec![
        plain("PGHOST", &names.endpoint(&namespace)),
        plain("PGPORT", &POSTGRES_PORT.to_string()),
        plain("PGDATABASE", "postgres"),
        plain("PGCONNECT_TIMEOUT", "10"),
        // Optional: a user's Secret may carry only a password (the script defaults the user).
        secret_env("PGUSER", &secret, USERNAME_KEY, true),
        secret_env("PGPASSWORD", &secret, PASSWORD_KEY, false),
        sql_env(init),
    ];
    let container = Container {
        name: "init".into(),
        image: Some(image(db, settings)),
        command: Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]),
        env: Some(env),
        security_context: Some(container_security_context()),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    Some(Job {
        metadata: owned_meta(db, names.init_job(), "init"),
        spec: Some(JobSpec {
            backoff_limit: Some(BACKOFF_LIMIT),
            active_deadline_seconds: Some(ACTIVE_DEADLINE_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(db, "init")),
                    annotations: pod_annotations(db),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![container],
                    security_context: Some(pod_security_context()),
                    enable_service_links: Some(false),
                    volumes: Some(vec![Volume {
                        name: "tmp".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    })
}

fn plain(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn sql_env(init: &InitSpec) -> EnvVar {
    match (&init.sql, &init.config_map_ref) {
        (_, Some(r)) => EnvVar {
            name: "DBOP_INIT_SQL".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: r.name.clone(),
                    key: r.key.clone(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        (sql, None) => plain("DBOP_INIT_SQL", sql.as_deref().unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn env_of(job: &Job) -> Vec<EnvVar> {
        job.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .env
            .clone()
            .unwrap()
    }

    #[test]
    fn no_init_no_job() {
        assert!(init_job(&testing::minimal(), &Settings::default()).is_none());
    }

    #[test]
    fn inline_sql_goes_in_the_environment_not_the_command() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "init": {"sql": "CREATE TABLE t (id int);"}
        }));
        let job = init_job(&db, &Settings::default()).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("orders-init"));
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.backoff_limit, Some(BACKOFF_LIMIT));
        let c = &spec.template.spec.as_ref().unwrap().containers[0];
        assert!(
            !c.command
                .as_ref()
                .unwrap()
                .join(" ")
                .contains("CREATE TABLE")
        );
        let env = env_of(&job);
        let sql = env.iter().find(|e| e.name == "DBOP_INIT_SQL").unwrap();
        assert_eq!(sql.value.as_deref(), Some("CREATE TABLE t (id int);"));
        let host = env.iter().find(|e| e.name == "PGHOST").unwrap();
        assert_eq!(host.value.as_deref(), Some("orders-rw.shop.svc"));
        let pw = env.iter().find(|e| e.name == "PGPASSWORD").unwrap();
        assert!(pw.value.is_none() && pw.value_from.is_some());
    }

    #[test]
    fn config_map_sql_is_read_from_the_key() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "credentials": {"secretName": "admin"},
            "init": {"configMapRef": {"name": "schema", "key": "init.sql"}}
        }));
        let job = init_job(&db, &Settings::default()).unwrap();
        let env = env_of(&job);
        let sql = env.iter().find(|e| e.name == "DBOP_INIT_SQL").unwrap();
        let r = sql
            .value_from
            .as_ref()
            .unwrap()
            .config_map_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("schema", "init.sql"));
        let user = env.iter().find(|e| e.name == "PGUSER").unwrap();
        assert_eq!(
            user.value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .optional,
            Some(true)
        );
        let pw = env.iter().find(|e| e.name == "PGPASSWORD").unwrap();
        assert_eq!(
            pw.value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .name,
            "admin"
        );
    }
}
