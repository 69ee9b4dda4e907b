//! The facts of one `DatabaseBackup` pass: what its `decide` knows (`BackupFacts`), and the
//! pure reductions `observe` fills them with (a Job's facts, the Database's, the queue).
//!
//! Pure: no client, no clock (`BackupFacts.now` is the pass's one `now`). Must not import
//! `observe`, `kube_io` or `context`.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::api::{BackupPhase, BackupReason, Database, DatabaseBackup, Phase};
use crate::backup::s3_secret::S3SecretProblem;
use crate::backup::settings::BackupSettings;
use crate::objects::{JobState, finished_at, termination_message, to_chrono};
use crate::resources::backup_job::BACKUP_CONTAINER;

/// Everything the decision needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BackupFacts {
    pub now: DateTime<Utc>,
    /// The Database, if it exists.
    pub database: Option<DatabaseFacts>,
    /// Unfinished backups of the same Database that go first: (name, running).
    pub ahead: Vec<(String, bool)>,
    pub job: Option<JobFacts>,
    /// A Job of this name exists but belongs to an earlier `DatabaseBackup` of the same name
    /// (deleted and made again, e.g. to retry a final backup): wait until it is collected.
    pub stale_job: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseFacts {
    pub phase: Option<Phase>,
    pub has_backup_spec: bool,
    /// `spec.backup.walArchiving` is set: a physical backup has the WAL it needs.
    pub archives_wal: bool,
    /// What does not parse in `spec.backup` (the message names the field).
    pub spec_problem: Option<String>,
    pub has_run: bool,
    /// What is wrong with the S3 credentials Secret.
    pub s3_problem: Option<S3SecretProblem>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct JobFacts {
    pub state: JobState,
    pub start_time: Option<DateTime<Utc>>,
    pub completion_time: Option<DateTime<Utc>>,
    /// The backup container's termination message (the newest pod's).
    pub termination_message: Option<String>,
}

pub(super) fn job_facts(job: &Job, state: JobState, pods: &[Pod]) -> JobFacts {
    let status = job.status.clone().unwrap_or_default();
    JobFacts {
        state,
        start_time: status.start_time.as_ref().map(to_chrono),
        completion_time: finished_at(job),
        termination_message: termination_message(pods, BACKUP_CONTAINER),
    }
}

pub(super) fn database_facts(db: &Database, s3_problem: Option<S3SecretProblem>) -> DatabaseFacts {
    let status = db.status.clone().unwrap_or_default();
    DatabaseFacts {
        phase: status.phase,
        has_backup_spec: db.spec.backup.is_some(),
        archives_wal: crate::resources::wal_archiving::enabled(db).is_some(),
        spec_problem: db
            .spec
            .backup
            .as_ref()
            .and_then(|spec| BackupSettings::parse(spec).err()),
        has_run: status.current_version.is_some(),
        s3_problem,
    }
}

/// The unfinished backups that go before `backup`: pre-upgrade ones first, then by creation
/// time and name. Running ones always go first.
pub fn queue_ahead(backup: &DatabaseBackup, siblings: &[DatabaseBackup]) -> Vec<(String, bool)> {
    let key = |b: &DatabaseBackup| {
        (
            b.spec.reason != BackupReason::PreUpgrade,
            b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            name_of(b),
        )
    };
    let me = key(backup);
    let mut ahead: Vec<(bool, (bool, Option<_>, String))> = siblings
        .iter()
        .filter(|b| name_of(b) != name_of(backup))
        .filter(|b| b.spec.database == backup.spec.database)
        .filter(|b| {
            !b.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(BackupPhase::is_finished)
        })
        .filter_map(|b| {
            let running = b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running);
            (running || key(b) < me).then(|| (running, key(b)))
        })
        .collect();
    ahead.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    ahead.into_iter().map(|(r, k)| (k.2, r)).collect()
}

pub(super) fn name_of(b: &DatabaseBackup) -> String {
    b.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database_backup::testing::backup;

    #[test]
    fn the_queue_runs_the_oldest_first_and_pre_upgrade_before_all() {
        let me = backup("me", BackupReason::Manual, None, 10);
        let siblings = vec![
            backup(
                "older",
                BackupReason::Scheduled,
                Some(BackupPhase::Pending),
                20,
            ),
            backup("newer", BackupReason::Scheduled, None, 5),
            backup(
                "done",
                BackupReason::Scheduled,
                Some(BackupPhase::Succeeded),
                50,
            ),
            backup("pre", BackupReason::PreUpgrade, None, 1),
            me.clone(),
        ];
        let ahead: Vec<String> = queue_ahead(&me, &siblings)
            .into_iter()
            .map(|a| a.0)
            .collect();
        assert_eq!(ahead, vec!["pre", "older"]);
        let running_newer = vec![backup(
            "newer",
            BackupReason::Manual,
            Some(BackupPhase::Running),
            1,
        )];
        assert_eq!(
            queue_ahead(&me, &running_newer),
            vec![("newer".to_string(), true)]
        );
        let mut other_db = backup("x", BackupReason::Manual, None, 99);
        other_db.spec.database = "other".into();
        assert!(queue_ahead(&me, &[other_db]).is_empty());
    }
}
