//! The physical recovery of `spec.bootstrap.fromBackup.recoveryTarget`: the first instance's
//! data claim, made before the StatefulSet (which adopts it by name), and the Job that runs
//! `dbop-backup recover` on it from the Database's own image — the base backup before the
//! target unpacked, the archived WAL replayed up to the target, the server promoted on a new
//! timeline and stopped cleanly. The database pod then starts on a finished data directory.
//!
//! The agent is resumable (it works in a scratch directory beside PGDATA and renames it into
//! place last) and a finished volume makes it only report its result again, so a retried or
//! recreated Job never recovers twice. The S3 key and encryption keys reach it only as files
//! of read-only Secret volumes; of the database's credentials only the superuser's name is
//! mounted: nothing connects to a server but the one the Job starts on its own socket.
//!
//! Pure: a function of the Database, the resolved source and the operator's settings.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume};

use super::agent::{
    CA_FILE, PG_CREDENTIALS_DIR, PHYSICAL_FOLDER, TERMINATION_LOG, encryption_env, s3_env,
    storage_secrets,
};
use super::credentials::{USERNAME_KEY, secret_name};
use super::job::{AgentRun, agent_pod, job};
use super::pod::{env, mount, secret_volume, shared_memory};
use super::restore_job::{RESTORE_CONTAINER, RestoreSource, restore_job_parts};
use super::statefulset::{DATA_MOUNT, PGDATA, data_claim_template};
use super::{Names, image};
use crate::api::{Database, RecoveryTarget};
use crate::settings::Settings;

/// A Job pod lost with its node is retried; the agent resumes from scratch or reports a
/// recovery that finished.
const BACKOFF_LIMIT: i32 = 2;
const DATA_VOLUME: &str = "data";

impl Names {
    /// The first instance's data claim (the StatefulSet's `data` claim template, ordinal 0).
    pub fn first_data_claim(&self) -> String {
        format!("data-{}", self.pod(0))
    }
}

/// The first instance's data claim as the StatefulSet would make it: not owned by the
/// Database (the StatefulSet's claim retention and the deletion policy decide its end).
pub fn data_claim(db: &Database) -> PersistentVolumeClaim {
    let mut claim = data_claim_template(db);
    claim.metadata.name = Some(Names::of(db).first_data_claim());
    claim.metadata.namespace = Some(db.namespace_or_default());
    claim
}

/// The recovery Job of a Database, owned by it, writing into its first data claim.
pub fn recovery_job(db: &Database, source: &RestoreSource, settings: &Settings) -> Job {
    let keys = source.encryption_secret.as_deref();
    let mut vars = s3_env(&source.s3);
    vars.push(env("DBOP_BACKUP_LOG_FORMAT", "json"));
    vars.extend(encryption_env(keys));
    // The agent connects to the server it starts as the superuser this Database will have
    // (the role initdb made in the source, `postgres` unless its credentials named another):
    // the user name only, from the credentials Secret's `username` item.
    let user_file = format!("{PG_CREDENTIALS_DIR}/{USERNAME_KEY}");
    vars.push(env("DBOP_BACKUP_USER_FILE", &user_file));
    let mut secrets = storage_secrets(&source.s3, keys);
    secrets.push((
        secret_volume(
            "pg-credentials",
            &secret_name(db),
            Some(vec![(USERNAME_KEY.into(), USERNAME_KEY.into())]),
        ),
        mount("pg-credentials", PG_CREDENTIALS_DIR, true),
    ));
    let run = AgentRun {
        container: RESTORE_CONTAINER,
        image: image(db, settings),
        args: agent_args(source),
        env: vars,
        s3: &source.s3,
        database_ca: None,
        secrets,
    };
    let mut pod = agent_pod(settings, run);
    pod.volumes.push(Volume {
        name: DATA_VOLUME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: Names::of(db).first_data_claim(),
            read_only: Some(false),
        }),
        ..Volume::default()
    });
    pod.volumes.push(shared_memory());
    let mounts = pod.container.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(mount(DATA_VOLUME, DATA_MOUNT, false));
    mounts.push(mount("shm", "/dev/shm", false));
    job(db, settings, restore_job_parts(db, pod, BACKOFF_LIMIT))
}

/// `recover <PGDATA>` with where the base backups and WAL are and where to stop. Nothing secret.
fn agent_args(source: &RestoreSource) -> Vec<String> {
    let s3 = &source.s3;
    let mut args: Vec<String> = vec![
        "recover".into(),
        PGDATA.into(),
        format!("--bucket={}", s3.bucket),
        format!("--prefix={}", source.prefix),
        format!("--database={PHYSICAL_FOLDER}"),
        format!("--result-file={TERMINATION_LOG}"),
    ];
    if source.backup != "latest" {
        args.push(format!("--backup-id={}", source.backup));
    }
    args.extend(source.target.as_ref().and_then(target_arg));
    if s3.force_path_style {
        args.push("--path-style".into());
    }
    if s3.ca.is_some() {
        args.push(format!("--ca-file={CA_FILE}"));
    }
    args
}

/// The agent's flag for the target; none for the latest point.
fn target_arg(target: &RecoveryTarget) -> Option<String> {
    match (&target.time, &target.lsn, &target.restore_point) {
        (Some(time), _, _) => Some(format!(
            "--target-time={}",
            time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        )),
        (None, Some(lsn), _) => Some(format!("--target-lsn={lsn}")),
        (None, None, Some(name)) => Some(format!("--target-name={name}")),
        (None, None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn source(target: serde_json::Value) -> RestoreSource {
        let s3: crate::api::S3Spec = serde_json::from_value(serde_json::json!({
            "endpoint": "http://minio.storage.svc:9000", "bucket": "backups", "prefix": "team/",
            "forcePathStyle": true, "credentials": {"secretName": "s3-creds"}
        }))
        .unwrap();
        RestoreSource {
            prefix: super::super::restore_job::storage_prefix(&s3, "shop", "orders-old"),
            s3,
            backup: "latest".into(),
            source_database: None,
            encryption_secret: None,
            target: Some(serde_json::from_value(target).unwrap()),
        }
    }

    #[test]
    fn the_job_recovers_into_the_first_data_claim_to_the_target() {
        let db = testing::minimal();
        let job = recovery_job(
            &db,
            &source(serde_json::json!({"time": "2026-12-04T10:00:00.25Z"})),
            &Settings::default(),
        );
        assert_eq!(job.metadata.name.as_deref(), Some("orders-restore"));
        let pod = job.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.name, RESTORE_CONTAINER);
        assert_eq!(
            c.args.clone().unwrap(),
            [
                "recover",
                PGDATA,
                "--bucket=backups",
                "--prefix=team/shop/orders-old",
                "--database=physical",
                "--result-file=/dev/termination-log",
                "--target-time=2026-12-04T10:00:00.250Z",
                "--path-style",
            ]
        );
        let claim = pod
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.persistent_volume_claim.clone())
            .unwrap();
        assert_eq!(claim.claim_name, "data-orders-0");
        assert_eq!(
            data_claim(&db).metadata.name.as_deref(),
            Some("data-orders-0")
        );
        assert!(data_claim(&db).metadata.owner_references.is_none());
        let mounts = c.volume_mounts.clone().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == DATA_MOUNT && m.read_only != Some(true))
        );
        // Nothing to connect to but its own server: no PGHOST, no password.
        let env = c.env.clone().unwrap();
        assert!(
            env.iter()
                .all(|e| !e.name.starts_with("PG") && e.value_from.is_none()),
            "{env:?}"
        );
        let credentials = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "pg-credentials")
            .and_then(|v| v.secret.clone())
            .unwrap();
        let items: Vec<String> = credentials
            .items
            .unwrap()
            .into_iter()
            .map(|i| i.key)
            .collect();
        assert_eq!(items, ["username"], "the user name only");
    }

    #[test]
    fn each_kind_of_target_is_one_flag_and_latest_is_none() {
        let args = |target: serde_json::Value, backup: &str| {
            let mut s = source(target);
            s.backup = backup.into();
            agent_args(&s)[6..].to_vec()
        };
        assert_eq!(
            args(serde_json::json!({"lsn": "0/3000100"}), "latest"),
            ["--target-lsn=0/3000100", "--path-style"]
        );
        assert_eq!(
            args(
                serde_json::json!({"restorePoint": "before-migration"}),
                "b1"
            ),
            [
                "--backup-id=b1",
                "--target-name=before-migration",
                "--path-style"
            ]
        );
        assert_eq!(
            args(serde_json::json!({"latest": true}), "latest"),
            ["--path-style"]
        );
    }
}
