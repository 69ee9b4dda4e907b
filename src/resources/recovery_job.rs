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
//! Its pod is `private_server`'s, as is the verify Job's of base backups.
//!
//! Pure: a function of the Database, the resolved source and the operator's settings.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume};

use super::job::job;
use super::pod::mount;
use super::private_server::{Bucket, bucket_args, private_server_pod};
use super::restore_job::{RESTORE_CONTAINER, RestoreSource, restore_job_parts, retry_policy};
use super::statefulset::{DATA_MOUNT, PGDATA, data_claim_template};
use super::{Names, image};
use crate::api::{Database, RecoveryTarget};
use crate::settings::Settings;

/// A pod that failed for a reason that may pass (the bucket or the server it starts out of
/// reach, a full disk freed) is retried with the Job's doubling back-off (10 s up to 6 min):
/// about ten minutes of an S3 outage are ridden out, and every attempt resumes from scratch or
/// reports a recovery that finished. What no retry can fix fails the Job at once
/// ([`retry_policy`]).
const BACKOFF_LIMIT: i32 = 6;
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
    let bucket = Bucket {
        s3: &source.s3,
        prefix: &source.prefix,
        encryption_secret: source.encryption_secret.as_deref(),
    };
    let args = recovery_args(source, &bucket);
    let image = image(db, settings);
    let mut pod = private_server_pod(db, &bucket, (RESTORE_CONTAINER, args), image, settings);
    pod.volumes.push(Volume {
        name: DATA_VOLUME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: Names::of(db).first_data_claim(),
            read_only: Some(false),
        }),
        ..Volume::default()
    });
    pod.container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount(DATA_VOLUME, DATA_MOUNT, false));
    let mut job = job(db, settings, restore_job_parts(db, pod, BACKOFF_LIMIT));
    if let Some(spec) = job.spec.as_mut() {
        spec.pod_failure_policy = Some(retry_policy(RESTORE_CONTAINER));
    }
    job
}

/// `recover <PGDATA>` with where the base backups and WAL are and where to stop. Nothing secret.
fn recovery_args(source: &RestoreSource, bucket: &Bucket<'_>) -> Vec<String> {
    let mut args = vec!["recover".into(), PGDATA.into()];
    args.extend(bucket_args(bucket));
    if source.backup != "latest" {
        args.push(format!("--backup-id={}", source.backup));
    }
    args.extend(source.target.as_ref().and_then(target_arg));
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
            streams: None,
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
        let spec = job.spec.unwrap();
        // Minutes of an unreachable bucket are retried; a final answer is not.
        assert_eq!(spec.backoff_limit, Some(6));
        let rules = spec.pod_failure_policy.unwrap().rules;
        let codes = rules[0].on_exit_codes.clone().unwrap();
        assert_eq!(
            (rules[0].action.as_str(), codes.values, codes.container_name),
            ("FailJob", vec![2, 4], Some(RESTORE_CONTAINER.to_string()))
        );
        assert_eq!(rules[1].action, "Ignore");
        let pod = spec.template.spec.unwrap();
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
                "--path-style",
                "--target-time=2026-12-04T10:00:00.250Z",
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
            let bucket = Bucket {
                s3: &s.s3,
                prefix: &s.prefix,
                encryption_secret: None,
            };
            recovery_args(&s, &bucket)[7..].to_vec()
        };
        assert_eq!(
            args(serde_json::json!({"lsn": "0/3000100"}), "latest"),
            ["--target-lsn=0/3000100"]
        );
        assert_eq!(
            args(
                serde_json::json!({"restorePoint": "before-migration"}),
                "b1"
            ),
            ["--backup-id=b1", "--target-name=before-migration"]
        );
        assert_eq!(
            args(serde_json::json!({"latest": true}), "latest"),
            Vec::<String>::new()
        );
    }
}
