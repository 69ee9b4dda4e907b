//! Retention decisions: which backups of one database `prune` deletes. Pure: the catalog and
//! the current time are passed in.
//!
//! Rules, in order: only complete backups count; the newest complete backup is always kept;
//! a complete backup is deleted when it is outside the newest `keep_last` or older than
//! `max_age` (both are limits); an incomplete backup (objects without a manifest) is removed,
//! and an unfinished multipart upload aborted, only once it is older than the grace period,
//! so a backup still being written is never touched.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// What the rule needs to know about one backup folder (the agent's catalog entry, reduced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub backup_id: String,
    /// A manifest exists: the only kind of backup that counts.
    pub complete: bool,
    /// When the manifest was stored; for an incomplete backup, its newest object.
    pub completed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub keep_last: Option<u32>,
    pub max_age: Option<Duration>,
}

impl Policy {
    pub fn is_empty(&self) -> bool {
        self.keep_last.is_none() && self.max_age.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep(&'static str),
    Delete(String),
}

/// One decision about one backup folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub backup_id: String,
    pub verdict: Verdict,
}

/// The verdict on every backup of one database. `entries` may be in any order.
pub fn verdicts(
    entries: &[Candidate],
    policy: Policy,
    grace: Duration,
    now: DateTime<Utc>,
) -> Vec<Decision> {
    let mut complete: Vec<&Candidate> = entries.iter().filter(|e| e.complete).collect();
    complete.sort_by(|a, b| {
        b.completed_at
            .cmp(&a.completed_at)
            .then(b.backup_id.cmp(&a.backup_id))
    });
    let age = |t: DateTime<Utc>| (now - t).to_std().unwrap_or(Duration::ZERO);
    let mut out = Vec::with_capacity(entries.len());
    for (index, e) in complete.iter().enumerate() {
        let verdict = if index == 0 {
            Verdict::Keep("newest complete backup")
        } else if let Some(k) = policy.keep_last.filter(|k| index >= *k as usize) {
            Verdict::Delete(format!("beyond keep-last {k}"))
        } else if let Some(max) = policy.max_age.filter(|max| age(e.completed_at) > *max) {
            Verdict::Delete(format!("older than max-age {}s", max.as_secs()))
        } else {
            Verdict::Keep("within policy")
        };
        out.push(Decision {
            backup_id: e.backup_id.clone(),
            verdict,
        });
    }
    for e in entries.iter().filter(|e| !e.complete) {
        let verdict = if age(e.completed_at) > grace {
            Verdict::Delete(format!("incomplete for longer than {}s", grace.as_secs()))
        } else {
            Verdict::Keep("incomplete but within grace period")
        };
        out.push(Decision {
            backup_id: e.backup_id.clone(),
            verdict,
        });
    }
    out
}

/// Whether an unfinished multipart upload started at `initiated` is abandoned.
pub fn upload_abandoned(initiated: DateTime<Utc>, grace: Duration, now: DateTime<Utc>) -> bool {
    (now - initiated).to_std().is_ok_and(|age| age > grace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const DAY: u64 = 86_400;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 2, 1, 0, 0, 0).unwrap()
    }

    /// A backup completed `days_ago` days before `now()`.
    fn entry(id: &str, days_ago: i64, complete: bool) -> Candidate {
        Candidate {
            backup_id: id.into(),
            complete,
            completed_at: now() - chrono::Duration::days(days_ago),
        }
    }

    fn deleted(entries: &[Candidate], policy: Policy) -> Vec<String> {
        let mut d: Vec<String> = verdicts(entries, policy, Duration::from_secs(DAY), now())
            .into_iter()
            .filter(|d| matches!(d.verdict, Verdict::Delete(_)))
            .map(|d| d.backup_id)
            .collect();
        d.sort();
        d
    }

    #[test]
    fn table() {
        let five = [
            entry("a", 50, true),
            entry("b", 40, true),
            entry("c", 20, true),
            entry("d", 10, true),
            entry("e", 1, true),
        ];
        let keep = |k| Policy {
            keep_last: Some(k),
            max_age: None,
        };
        let age = |d: u64| Policy {
            keep_last: None,
            max_age: Some(Duration::from_secs(d * DAY)),
        };
        let both = |k, d: u64| Policy {
            keep_last: Some(k),
            max_age: Some(Duration::from_secs(d * DAY)),
        };
        let cases: Vec<(&str, Vec<Candidate>, Policy, Vec<&str>)> = vec![
            (
                "no policy deletes nothing complete",
                five.to_vec(),
                Policy::default(),
                vec![],
            ),
            ("keep-last 2", five.to_vec(), keep(2), vec!["a", "b", "c"]),
            (
                "keep-last larger than count",
                five.to_vec(),
                keep(10),
                vec![],
            ),
            (
                "keep-last 0 still keeps the newest",
                five.to_vec(),
                keep(0),
                vec!["a", "b", "c", "d"],
            ),
            ("max-age 30d", five.to_vec(), age(30), vec!["a", "b"]),
            (
                "both are limits",
                five.to_vec(),
                both(4, 30),
                vec!["a", "b"],
            ),
            (
                "both are limits, keep-last binds",
                five.to_vec(),
                both(2, 45),
                vec!["a", "b", "c"],
            ),
            (
                "max-age never deletes the newest",
                vec![entry("old", 100, true), entry("older", 200, true)],
                age(1),
                vec!["older"],
            ),
            (
                "incomplete newer than complete is not the newest",
                vec![entry("x", 100, true), entry("y", 0, false)],
                age(1),
                vec![],
            ),
            (
                "incomplete past grace is removed, within grace kept",
                vec![
                    entry("ok", 3, true),
                    entry("stale", 2, false),
                    entry("fresh", 0, false),
                ],
                Policy::default(),
                vec!["stale"],
            ),
            ("empty catalog", vec![], keep(1), vec![]),
        ];
        for (name, entries, policy, want) in cases {
            assert_eq!(deleted(&entries, policy), want, "{name}");
        }
    }

    #[test]
    fn ties_break_by_id() {
        let entries = [entry("b", 5, true), entry("a", 5, true)];
        let d = verdicts(
            &entries,
            Policy {
                keep_last: Some(1),
                max_age: None,
            },
            Duration::ZERO,
            now(),
        );
        assert_eq!(d[0].backup_id, "b");
        assert_eq!(d[0].verdict, Verdict::Keep("newest complete backup"));
        assert!(matches!(d[1].verdict, Verdict::Delete(_)));
    }

    #[test]
    fn abandoned_uploads() {
        let grace = Duration::from_secs(3600);
        assert!(upload_abandoned(
            now() - chrono::Duration::hours(2),
            grace,
            now()
        ));
        assert!(!upload_abandoned(
            now() - chrono::Duration::minutes(30),
            grace,
            now()
        ));
        assert!(!upload_abandoned(
            now() + chrono::Duration::hours(1),
            grace,
            now()
        ));
    }
}
