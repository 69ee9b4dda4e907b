//! The init Job: runs the Database's init SQL once, with psql from the database image, against
//! the `-rw` Service, stopping at the first error: in one transaction (`singleTransaction`,
//! the default), or statement by statement, each committing on its own, so that `CREATE
//! DATABASE`, `ALTER SYSTEM` and the like, which cannot run in a transaction block, can run.
//!
//! The SQL reaches the container as a file (`psql --file`): the user's ConfigMap key, or a
//! ConfigMap dbop makes from inline SQL, mounted as a volume. No size limit but the
//! ConfigMap's (1 MiB); an environment variable would stop at 128 KiB.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, Container, KeyToPath, Volume};

use super::credentials::{PASSWORD_KEY, USERNAME_KEY, secret_name};
use super::job::{JobParts, JobPod, job};
use super::placement::JobClass;
use super::pod::{container_security_context, env, mount, scratch, secret_volume};
use super::{Names, POSTGRES_PORT, image, job_pod_labels, owned_meta};
use crate::api::Database;
use crate::settings::Settings;

/// How often a failing init is retried before the Database is marked Failed.
pub const BACKOFF_LIMIT: i32 = 3;
/// A hung init (a lock, a typo'd infinite loop) fails instead of running forever.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 1800;
/// The key of the SQL in the ConfigMap dbop makes from inline SQL.
pub const SQL_KEY: &str = "init.sql";
const SQL_DIR: &str = "/etc/dbop/init";
const SQL_VOLUME: &str = "sql";
/// Where the credentials Secret is mounted (whole: a user's Secret may lack `username`).
const CREDENTIALS_DIR: &str = "/etc/dbop/pg-credentials";
/// The pgpass file the script writes into the `/tmp` emptyDir.
const PGPASS_FILE: &str = "/tmp/pgpass";

/// Sets PGUSER from the credentials' `username` file (default `postgres`) and writes a pgpass
/// file (mode 0600) from the `password` file's first line, its `\` and `:` escaped as libpq
/// reads them, named by PGPASSFILE: the password never enters the environment or a command
/// line. Shell builtins only (`read`, `case`, `printf`): an operand image need not have `sed`
/// or `cat` that run (a minimal image's `sed` may lack its libraries).
fn credentials_script(dir: &str, pgpass: &str) -> String {
    const SCRIPT: &str = r#"PGUSER=''
if [ -s @USER_FILE@ ]; then IFS= read -r PGUSER < @USER_FILE@ || true; fi
[ -n "$PGUSER" ] || PGUSER=postgres
export PGUSER
umask 077
pw=''
IFS= read -r pw < @PASSWORD_FILE@ || true
escaped=''
while [ -n "$pw" ]; do
  rest=${pw#?}; c=${pw%"$rest"}; pw=$rest
  case $c in \\|:) escaped="$escaped\\$c" ;; *) escaped="$escaped$c" ;; esac
done
printf '*:*:*:*:%s\n' "$escaped" > @PGPASS@
unset pw escaped rest c
export PGPASSFILE=@PGPASS@
"#;
    SCRIPT
        .replace("@USER_FILE@", &format!("{dir}/{USERNAME_KEY}"))
        .replace("@PASSWORD_FILE@", &format!("{dir}/{PASSWORD_KEY}"))
        .replace("@PGPASS@", pgpass)
}

/// libpq connects as the superuser (the Secret's user, default `postgres`) to the application
/// database (`PGDATABASE`). `--single-transaction` when `single`; otherwise psql runs the
/// statements one by one in autocommit, and still stops at the first error.
fn script(single: bool) -> String {
    let transaction = if single { " --single-transaction" } else { "" };
    format!(
        "set -eu\n{}\
         exec psql --no-psqlrc --no-password --set=ON_ERROR_STOP=1{transaction} --file={SQL_DIR}/{SQL_KEY}",
        credentials_script(CREDENTIALS_DIR, PGPASS_FILE)
    )
}

/// On the init Job: the digest (`short_digest`) of the SQL it runs.
pub const SQL_DIGEST_ANNOTATION: &str = "dbop.dev/init-sql";
/// On the init Job: the Database's generation it was made from. A pass that read an older
/// Database (a cache behind the API server) does not replace a Job made from a newer one.
pub const GENERATION_ANNOTATION: &str = "dbop.dev/database-generation";
/// On the init Job of inline SQL: the ConfigMap dbop made for it (deleted with the Job when
/// the Job is replaced; the watch caches keep no Job spec to find it in).
pub const CONFIG_MAP_ANNOTATION: &str = "dbop.dev/init-sql-config-map";

/// The digest of the init SQL as the spec has it now: the inline SQL's, or the key's of the
/// user's ConfigMap (`user_config_map`, as read). None without init SQL, or while the user's
/// ConfigMap or its key is missing.
pub fn sql_digest(db: &Database, user_config_map: Option<&ConfigMap>) -> Option<String> {
    let init = db.spec.init.as_ref()?;
    let sql = match &init.config_map_ref {
        Some(r) => user_config_map?.data.as_ref()?.get(&r.key)?,
        None => init.sql.as_ref()?,
    };
    Some(super::short_digest(sql.as_bytes()))
}

/// The ConfigMap holding inline init SQL (None when there is none, or it comes from the
/// user's ConfigMap): named by the SQL's digest and immutable, so that a Job mounts the SQL
/// it was made for and no other, whatever the kubelet cached. Owned by the Database.
pub fn init_sql_config_map(db: &Database) -> Option<ConfigMap> {
    let init = db.spec.init.as_ref()?;
    if init.config_map_ref.is_some() {
        return None;
    }
    let sql = init.sql.clone()?;
    let name = Names::of(db).init_sql_config_map(&super::short_digest(sql.as_bytes()));
    Some(ConfigMap {
        metadata: owned_meta(db, name, "init"),
        data: Some(BTreeMap::from([(SQL_KEY.to_string(), sql)])),
        immutable: Some(true),
        ..ConfigMap::default()
    })
}

/// The volume that puts the SQL at `/etc/dbop/init/init.sql`.
fn sql_volume(db: &Database, digest: &str) -> Option<Volume> {
    let init = db.spec.init.as_ref()?;
    let (name, key) = match &init.config_map_ref {
        Some(r) => (r.name.clone(), r.key.clone()),
        None => (
            Names::of(db).init_sql_config_map(digest),
            SQL_KEY.to_string(),
        ),
    };
    Some(Volume {
        name: SQL_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name,
            items: Some(vec![KeyToPath {
                key,
                path: SQL_KEY.into(),
                ..KeyToPath::default()
            }]),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    })
}

/// The init Job, or None when the Database has no init SQL (or the user's ConfigMap of it,
/// `user_config_map` as read, lacks it). It carries the digest of its SQL and the generation
/// of the Database it was made from (`SQL_DIGEST_ANNOTATION`, `GENERATION_ANNOTATION`).
pub fn init_job(
    db: &Database,
    settings: &Settings,
    user_config_map: Option<&ConfigMap>,
) -> Option<Job> {
    let digest = sql_digest(db, user_config_map)?;
    let sql = sql_volume(db, &digest)?;
    let single = db.spec.init.as_ref().is_none_or(|i| i.single_transaction);
    let names = Names::of(db);
    let namespace = db.namespace_or_default();
    let secret = secret_name(db);
    let mut env = vec![
        env("PGHOST", &names.endpoint(&namespace)),
        env("PGPORT", &POSTGRES_PORT.to_string()),
        env("PGCONNECT_TIMEOUT", "10"),
        // The application database: the primary makes it before it says it is ready.
        env("PGDATABASE", &super::accounts::application(db).database),
    ];
    env.extend(super::tls::client_env(db));
    // The credentials as files (the script reads them), never as environment variables.
    let mut mounts = vec![
        mount("tmp", "/tmp", false),
        mount(SQL_VOLUME, SQL_DIR, true),
        mount("pg-credentials", CREDENTIALS_DIR, true),
    ];
    let mut volumes = vec![
        scratch("tmp"),
        sql,
        secret_volume("pg-credentials", &secret, None),
    ];
    if let Some((volume, ca)) = super::tls::client_ca(db) {
        volumes.push(volume);
        mounts.push(ca);
    }
    let container = Container {
        name: "init".into(),
        image: Some(image(db, settings)),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script(single)]),
        env: Some(env),
        security_context: Some(container_security_context()),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let mut metadata = owned_meta(db, names.init_job(), "init");
    let mut annotations = BTreeMap::from([
        (SQL_DIGEST_ANNOTATION.to_string(), digest.clone()),
        (
            GENERATION_ANNOTATION.to_string(),
            db.metadata.generation.unwrap_or_default().to_string(),
        ),
    ]);
    let inline = db
        .spec
        .init
        .as_ref()
        .is_some_and(|i| i.config_map_ref.is_none());
    if inline {
        let made = names.init_sql_config_map(&digest);
        annotations.insert(CONFIG_MAP_ANNOTATION.to_string(), made);
    }
    metadata.annotations = Some(annotations);
    let parts = JobParts {
        metadata,
        pod_labels: job_pod_labels(db, "init"),
        backoff_limit: BACKOFF_LIMIT,
        active_deadline_seconds: ACTIVE_DEADLINE_SECONDS,
        ttl_seconds_after_finished: None,
        class: JobClass::Database,
        pod: JobPod {
            init_containers: None,
            container,
            volumes,
            service_account_name: None,
        },
    };
    Some(job(db, settings, parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(job: &Job) -> PodSpec {
        job.spec.clone().unwrap().template.spec.unwrap()
    }

    fn sql_source(job: &Job) -> (String, String) {
        let pod = pod(job);
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "sql")
            .unwrap();
        let cm = volume.config_map.unwrap();
        let item = &cm.items.unwrap()[0];
        assert_eq!(item.path, SQL_KEY);
        (cm.name, item.key.clone())
    }

    #[test]
    fn no_init_no_job() {
        assert!(init_job(&testing::minimal(), &Settings::default(), None).is_none());
        assert!(init_sql_config_map(&testing::minimal()).is_none());
    }

    #[test]
    fn inline_sql_goes_in_a_config_map_mounted_as_a_file() {
        let big = format!("CREATE TABLE t (id int);\n-- {}\n", "x".repeat(200 * 1024));
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "init": {"sql": big}
        }));
        let cm = init_sql_config_map(&db).unwrap();
        let digest = crate::resources::short_digest(big.as_bytes());
        let name = format!("orders-init-sql-{}", &digest[..10]);
        assert_eq!(cm.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(cm.data.unwrap()[SQL_KEY], big);
        assert_eq!(cm.immutable, Some(true));
        assert!(cm.metadata.owner_references.is_some());
        let job = init_job(&db, &Settings::default(), None).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some("orders-init"));
        assert_eq!(sql_source(&job), (name.clone(), SQL_KEY.to_string()));
        let annotations = job.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[SQL_DIGEST_ANNOTATION], digest);
        assert_eq!(annotations[GENERATION_ANNOTATION], "1");
        assert_eq!(annotations[CONFIG_MAP_ANNOTATION], name);
        let c = &pod(&job).containers[0];
        let text = format!("{:?}{:?}", c.command, c.env);
        assert!(!text.contains("CREATE TABLE"), "the SQL is inline: {text}");
        assert!(text.contains("--file=/etc/dbop/init/init.sql"));
        let env = c.env.as_ref().unwrap();
        let host = env.iter().find(|e| e.name == "PGHOST").unwrap();
        assert_eq!(host.value.as_deref(), Some("orders-rw.shop.svc"));
        // The SQL runs in the application database (spec.application, default `app`).
        let database = env.iter().find(|e| e.name == "PGDATABASE").unwrap();
        assert_eq!(database.value.as_deref(), Some("app"));
        // The credentials are files of a Secret volume (0440), never environment variables.
        for e in env {
            assert!(e.value_from.is_none(), "{} from a reference", e.name);
            assert!(
                !e.name.starts_with("PGPASS") && e.name != "PGUSER",
                "{}",
                e.name
            );
        }
        let pod = pod(&job);
        let creds = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "pg-credentials")
            .unwrap()
            .secret
            .unwrap();
        assert_eq!(creds.secret_name.as_deref(), Some("orders-credentials"));
        assert_eq!(creds.default_mode, Some(0o440));
        let mounts = c.volume_mounts.as_ref().unwrap();
        let m = mounts.iter().find(|m| m.name == "pg-credentials").unwrap();
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (CREDENTIALS_DIR, Some(true))
        );
    }

    /// The script's pgpass, run by a real shell with no `PATH` (builtins only): escaped as
    /// libpq reads it, mode 0600, the user from the file or `postgres`.
    #[test]
    fn the_script_writes_an_escaped_private_pgpass_file() {
        use std::os::unix::fs::PermissionsExt;
        for (user, password, want) in [
            (Some("app"), "plain", "*:*:*:*:plain\n"),
            (None, "a:b\\c", "*:*:*:*:a\\:b\\\\c\n"),
            (Some("x"), "\\:\\:*", "*:*:*:*:\\\\\\:\\\\\\:*\n"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let creds = dir.path().join("creds");
            std::fs::create_dir(&creds).unwrap();
            std::fs::write(creds.join(PASSWORD_KEY), password).unwrap();
            if let Some(u) = user {
                std::fs::write(creds.join(USERNAME_KEY), u).unwrap();
            }
            let pgpass = dir.path().join("pgpass");
            let script = format!(
                "set -eu\n{}echo \"$PGUSER $PGPASSFILE\"",
                credentials_script(&creds.display().to_string(), &pgpass.display().to_string())
            );
            let out = std::process::Command::new("/bin/sh")
                .args(["-c", &script])
                .env_clear()
                .env("PATH", "/nonexistent")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                format!("{} {}", user.unwrap_or("postgres"), pgpass.display())
            );
            assert_eq!(
                std::fs::read_to_string(&pgpass).unwrap(),
                want,
                "{password}"
            );
            let mode = std::fs::metadata(&pgpass).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            assert!(!script.contains(password) || password == "plain");
        }
    }

    #[test]
    fn the_sql_runs_in_one_transaction_unless_the_spec_says_otherwise() {
        let command = |init: serde_json::Value| {
            let db = testing::database(serde_json::json!({
                "version": "16.4", "storage": {"size": "1Gi"}, "init": init
            }));
            pod(&init_job(&db, &Settings::default(), None).unwrap()).containers[0]
                .command
                .clone()
                .unwrap()[2]
                .clone()
        };
        let single = command(serde_json::json!({"sql": "SELECT 1"}));
        assert!(
            single.contains(
                "--set=ON_ERROR_STOP=1 --single-transaction --file=/etc/dbop/init/init.sql"
            ),
            "{single}"
        );
        assert!(single.contains("export PGPASSFILE=/tmp/pgpass"), "{single}");
        assert!(
            single.contains("psql --no-psqlrc --no-password"),
            "{single}"
        );
        let each =
            command(serde_json::json!({"sql": "CREATE DATABASE a", "singleTransaction": false}));
        assert!(!each.contains("--single-transaction"), "{each}");
        assert!(
            each.contains("--set=ON_ERROR_STOP=1 --file=/etc/dbop/init/init.sql"),
            "{each}"
        );
    }

    #[test]
    fn config_map_sql_is_mounted_from_the_users_key() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"},
            "credentials": {"secretName": "admin"},
            "init": {"configMapRef": {"name": "schema", "key": "init.sql"}}
        }));
        assert!(init_sql_config_map(&db).is_none());
        assert!(
            init_job(&db, &Settings::default(), None).is_none(),
            "no Job while the user's ConfigMap is unread"
        );
        let user = |sql: &str| ConfigMap {
            data: Some(BTreeMap::from([("init.sql".to_string(), sql.to_string())])),
            ..ConfigMap::default()
        };
        let job = init_job(&db, &Settings::default(), Some(&user("SELECT 1"))).unwrap();
        assert_eq!(
            sql_source(&job),
            ("schema".to_string(), "init.sql".to_string())
        );
        // The Job carries the digest of the user's SQL, so that a fix to it is seen.
        let digest =
            |job: &Job| job.metadata.annotations.clone().unwrap()[SQL_DIGEST_ANNOTATION].clone();
        let fixed = init_job(&db, &Settings::default(), Some(&user("SELECT 2"))).unwrap();
        assert_ne!(digest(&job), digest(&fixed));
        assert_eq!(
            sql_digest(&db, Some(&user("SELECT 2"))),
            Some(digest(&fixed))
        );
        let creds = pod(&job)
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "pg-credentials")
            .unwrap();
        assert_eq!(creds.secret.unwrap().secret_name.as_deref(), Some("admin"));
    }

    #[test]
    fn the_pod_is_quota_ready_tokenless_and_outside_the_selectors() {
        let db = testing::database(serde_json::json!({
            "version": "16.4", "storage": {"size": "1Gi"}, "init": {"sql": "SELECT 1"}
        }));
        let settings = Settings {
            image_pull_secrets: vec!["regcred".into()],
            ..Settings::default()
        };
        let job = init_job(&db, &settings, None).unwrap();
        let pod = pod(&job);
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
        let r = pod.containers[0].resources.clone().unwrap();
        assert!(r.requests.unwrap().contains_key("memory"));
        assert!(r.limits.unwrap().contains_key("memory"));
        let labels = job.spec.unwrap().template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[crate::resources::LABEL_NAME], "dbop-init");
    }
}
