//! `spec.backup` parsed once, for both the plan (schedule, history, health) and the backup Job
//! (timeout, retention flags), so a bad value is reported the same way wherever it is used and
//! never silently dropped. Pure.

use std::time::Duration;

use super::schedule::{
    BackupSchedule, DEFAULT_KEEP_FAILED, DEFAULT_KEEP_LAST, DEFAULT_STARTING_DEADLINE,
    DEFAULT_TIMEOUT, HistoryPolicy, parse_duration,
};
use crate::api::{BackupSpec, RetentionSpec};

/// The backup settings of a Database, parsed.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    pub schedule: BackupSchedule,
    pub starting_deadline: Duration,
    pub rpo: Option<Duration>,
    /// How long one backup Job may run.
    pub timeout: Duration,
    pub history: HistoryPolicy,
}

impl BackupSettings {
    /// Parses `spec`; the error names the field and says what to write instead.
    pub fn parse(spec: &BackupSpec) -> Result<BackupSettings, String> {
        let schedule = BackupSchedule::parse(&spec.schedule, spec.time_zone.as_deref())?;
        let retention = spec.retention.clone().unwrap_or(RetentionSpec {
            keep_last: None,
            max_age: None,
            keep_failed: None,
        });
        Ok(BackupSettings {
            schedule,
            starting_deadline: positive_duration("startingDeadline", &spec.starting_deadline)?
                .unwrap_or(DEFAULT_STARTING_DEADLINE),
            rpo: positive_duration("rpo", &spec.rpo)?,
            timeout: positive_duration("timeout", &spec.timeout)?.unwrap_or(DEFAULT_TIMEOUT),
            history: HistoryPolicy {
                keep_last: retention.keep_last.unwrap_or(DEFAULT_KEEP_LAST).max(1),
                max_age: positive_duration("retention.maxAge", &retention.max_age)?,
                keep_failed: retention.keep_failed.unwrap_or(DEFAULT_KEEP_FAILED),
            },
        })
    }
}

/// An optional duration field that, when set, must be positive.
fn positive_duration(field: &str, value: &Option<String>) -> Result<Option<Duration>, String> {
    let Some(text) = value else {
        return Ok(None);
    };
    parse_duration(text)
        .filter(|d| !d.is_zero())
        .map(Some)
        .ok_or_else(|| {
            format!(
                "spec.backup.{field} {text:?} is not a positive duration: use a form such as 30m, \
                 12h or 7d"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> BackupSpec {
        let mut base = serde_json::json!({
            "schedule": "0 2 * * *",
            "s3": {"bucket": "b", "credentials": {"secretName": "s3"}}
        });
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn defaults_fill_what_is_absent() {
        let s = BackupSettings::parse(&spec(serde_json::json!({}))).unwrap();
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.starting_deadline, DEFAULT_STARTING_DEADLINE);
        assert_eq!(s.history.keep_last, DEFAULT_KEEP_LAST.max(1));
        assert_eq!(s.history.max_age, None);
        assert_eq!(s.rpo, None);
    }

    #[test]
    fn every_bad_duration_names_its_field() {
        for (extra, field) in [
            (
                serde_json::json!({"timeout": "soon"}),
                "spec.backup.timeout",
            ),
            (serde_json::json!({"timeout": "0s"}), "spec.backup.timeout"),
            (serde_json::json!({"rpo": "1 day"}), "spec.backup.rpo"),
            (
                serde_json::json!({"startingDeadline": "-5m"}),
                "spec.backup.startingDeadline",
            ),
            (
                serde_json::json!({"retention": {"maxAge": "forever"}}),
                "spec.backup.retention.maxAge",
            ),
        ] {
            let message = BackupSettings::parse(&spec(extra.clone())).unwrap_err();
            assert!(message.contains(field), "{extra}: {message}");
        }
    }

    #[test]
    fn set_values_are_used() {
        let s = BackupSettings::parse(&spec(serde_json::json!({
            "timeout": "2h", "retention": {"keepLast": 3, "maxAge": "7d"}
        })))
        .unwrap();
        assert_eq!(s.timeout, Duration::from_secs(7200));
        assert_eq!(s.history.keep_last, 3);
        assert_eq!(s.history.max_age, Some(Duration::from_secs(7 * 86400)));
    }
}
