//! meta/v1 Conditions as dbop writes them: one entry per type, and a `lastTransitionTime` that
//! moves only when the status really changes (so an unchanged status is never rewritten).
//!
//! Pure: the caller passes `now`.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition types dbop maintains on a `Database`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConditionType {
    /// The database accepts connections and has been initialised.
    Ready,
    /// The data volume is bound (and as large as requested).
    StorageReady,
    /// The init SQL ran once, or there was none to run.
    Initialized,
    /// Backups run on time and the last one succeeded.
    BackupHealthy,
    /// A version change is being rolled out.
    Upgrading,
    /// The latest backup verification restored the backup and its row counts matched.
    BackupVerified,
    /// A change of `spec.postgresql` (or of the memory it follows) needs the server restarted,
    /// and the pods have not all restarted on it yet.
    RestartPending,
    /// Every database pod serves TLS with a valid certificate from the Database's CA.
    TlsReady,
    /// The pods mount the accounts (the application role and database, `spec.roles`) and
    /// every declared password can be read.
    AccountsReady,
    /// The NetworkPolicy of `spec.networkPolicy` is in place as the spec says (absent without
    /// one).
    NetworkPolicyReady,
    /// Changes that restart the pods wait for `spec.maintenanceWindow` (absent without one).
    MaintenancePending,
    /// The operator's own release waits to restart the pods, or restarts them, or failed on
    /// them (absent when their instance manager is the running operator's).
    ReleasePending,
    /// The primary archives its WAL (`spec.backup.walArchiving`; absent without it).
    ContinuousArchiving,
    /// The data volumes can grow before they fill (`spec.storage.autoGrow`; absent without
    /// it).
    StorageAutoGrow,
}

impl ConditionType {
    pub const ALL: [ConditionType; 14] = [
        ConditionType::Ready,
        ConditionType::StorageReady,
        ConditionType::Initialized,
        ConditionType::BackupHealthy,
        ConditionType::Upgrading,
        ConditionType::BackupVerified,
        ConditionType::RestartPending,
        ConditionType::TlsReady,
        ConditionType::AccountsReady,
        ConditionType::NetworkPolicyReady,
        ConditionType::MaintenancePending,
        ConditionType::ReleasePending,
        ConditionType::ContinuousArchiving,
        ConditionType::StorageAutoGrow,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::StorageReady => "StorageReady",
            ConditionType::Initialized => "Initialized",
            ConditionType::BackupHealthy => "BackupHealthy",
            ConditionType::Upgrading => "Upgrading",
            ConditionType::BackupVerified => "BackupVerified",
            ConditionType::RestartPending => "RestartPending",
            ConditionType::TlsReady => "TLSReady",
            ConditionType::AccountsReady => "AccountsReady",
            ConditionType::NetworkPolicyReady => "NetworkPolicyReady",
            ConditionType::MaintenancePending => "MaintenancePending",
            ConditionType::ReleasePending => "ReleasePending",
            ConditionType::ContinuousArchiving => "ContinuousArchiving",
            ConditionType::StorageAutoGrow => "StorageAutoGrow",
        }
    }
}

/// What a decision says about one condition, before timestamps are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionStatus {
    pub type_: ConditionType,
    pub status: bool,
    /// CamelCase machine reason.
    pub reason: String,
    /// A sentence for humans: what is happening, or what to fix.
    pub message: String,
}

impl ConditionStatus {
    pub fn new(
        type_: ConditionType,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Converts chrono time to the meta/v1 `Time` (k8s-openapi wraps jiff).
pub fn to_meta_time(t: DateTime<Utc>) -> Time {
    let ts = Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH);
    Time(ts)
}

/// Builds the new condition list from the decided statuses.
///
/// A condition keeps its previous `lastTransitionTime` unless its status flips; conditions of
/// types the decision did not mention are kept as they were (another controller path owns them).
/// The result is sorted by type so that equal inputs give byte-equal statuses.
pub fn merge(
    previous: &[Condition],
    decided: &[ConditionStatus],
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = previous
        .iter()
        .filter(|c| !decided.iter().any(|d| d.type_.label() == c.type_))
        .cloned()
        .collect();
    for d in decided {
        let status = status_word(d.status);
        let old = previous.iter().find(|c| c.type_ == d.type_.label());
        let last_transition_time = match old {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => to_meta_time(now),
        };
        out.push(Condition {
            type_: d.type_.label().to_string(),
            status: status.to_string(),
            reason: d.reason.clone(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// The condition of the given type, if present.
pub fn find(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.label())
}

/// True when the condition of this type is present with status "True".
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(s, 0).unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let first = merge(
            &[],
            &[ConditionStatus::new(
                ConditionType::Ready,
                false,
                "Provisioning",
                "a",
            )],
            Some(1),
            t(100),
        );
        assert_eq!(first[0].last_transition_time, to_meta_time(t(100)));

        // Same status, new reason and message: the transition time stays.
        let second = merge(
            &first,
            &[ConditionStatus::new(
                ConditionType::Ready,
                false,
                "Initializing",
                "b",
            )],
            Some(1),
            t(200),
        );
        assert_eq!(second[0].last_transition_time, to_meta_time(t(100)));
        assert_eq!(second[0].reason, "Initializing");

        // Status flips: it moves.
        let third = merge(
            &second,
            &[ConditionStatus::new(
                ConditionType::Ready,
                true,
                "DatabaseReady",
                "c",
            )],
            Some(1),
            t(300),
        );
        assert_eq!(third[0].last_transition_time, to_meta_time(t(300)));
        assert_eq!(third[0].status, "True");
    }

    #[test]
    fn unchanged_input_gives_an_equal_list() {
        let decided = [
            ConditionStatus::new(ConditionType::StorageReady, true, "Bound", "ok"),
            ConditionStatus::new(ConditionType::Ready, true, "DatabaseReady", "ok"),
        ];
        let a = merge(&[], &decided, Some(2), t(10));
        let b = merge(&a, &decided, Some(2), t(99));
        assert_eq!(a, b);
        // Sorted by type, whatever the decision order.
        assert_eq!(a[0].type_, "Ready");
    }

    #[test]
    fn conditions_not_decided_are_kept() {
        let backup = merge(
            &[],
            &[ConditionStatus::new(
                ConditionType::BackupHealthy,
                true,
                "Succeeded",
                "ok",
            )],
            Some(1),
            t(1),
        );
        let merged = merge(
            &backup,
            &[ConditionStatus::new(
                ConditionType::Ready,
                true,
                "DatabaseReady",
                "ok",
            )],
            Some(1),
            t(2),
        );
        assert!(is_true(&merged, ConditionType::BackupHealthy));
        assert!(is_true(&merged, ConditionType::Ready));
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<_> = ConditionType::ALL.iter().map(|c| c.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), ConditionType::ALL.len());
    }
}
