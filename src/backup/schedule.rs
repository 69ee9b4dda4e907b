//! The backup schedule, decided: the 5-field cron expression and its time zone, when the next
//! run is due, whether a due run starts now, waits or is skipped, the deterministic names of
//! scheduled backups, which old `DatabaseBackup` objects to delete, and whether backups are
//! healthy.
//!
//! Pure: no client, no clock (`now` is passed in), no I/O.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use dbop_contract::retention;

use crate::api::BackupPhase;
use crate::api::conditions::{ConditionStatus, ConditionType};

/// How late a missed run may still start when `startingDeadline` is not set.
pub const DEFAULT_STARTING_DEADLINE: Duration = Duration::from_secs(3600);
/// How long a backup Job may run when `timeout` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
/// Successful backups kept when `retention.keepLast` is not set.
pub const DEFAULT_KEEP_LAST: u32 = 7;
/// Failed `DatabaseBackup` objects kept when `retention.keepFailed` is not set.
pub const DEFAULT_KEEP_FAILED: u32 = 3;
/// Runs looked at to find the longest interval of a schedule (the default RPO is twice that).
const INTERVAL_SAMPLE: usize = 16;
/// A bound on the runs walked in one decision, so no expression or outage can make a loop long.
const MAX_RUNS_WALKED: usize = 100_000;

/// A parsed schedule: the cron expression in its time zone.
#[derive(Clone, Debug)]
pub struct BackupSchedule {
    cron: cron::Schedule,
    zone: Tz,
}

impl BackupSchedule {
    /// Parses a standard 5-field cron expression (or an `@daily`-style shorthand) read in the
    /// IANA time zone `time_zone` (UTC when absent). The error says what to fix.
    pub fn parse(expression: &str, time_zone: Option<&str>) -> Result<Self, String> {
        let six = to_cron_crate_syntax(expression)?;
        let cron: cron::Schedule = six.parse().map_err(|e| {
            format!("spec.backup.schedule {expression:?} is not a valid cron expression: {e}")
        })?;
        let zone = match time_zone {
            None => Tz::UTC,
            Some(name) => name.parse::<Tz>().map_err(|_| {
                format!(
                    "spec.backup.timeZone {name:?} is not an IANA time zone: use a name such as \
                     Europe/Berlin or America/New_York"
                )
            })?,
        };
        // An expression that never fires (e.g. 30 February) is a mistake, not a schedule.
        let schedule = BackupSchedule { cron, zone };
        if schedule.next_after(DateTime::UNIX_EPOCH).is_none() {
            return Err(format!(
                "spec.backup.schedule {expression:?} never fires: check the day and month fields"
            ));
        }
        Ok(schedule)
    }

    /// The first run strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .after(&t.with_timezone(&self.zone))
            .next()
            .map(|t| t.with_timezone(&Utc))
    }

    /// The latest run in `(after, until]`, walking at most `MAX_RUNS_WALKED` runs.
    pub fn latest_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut latest = None;
        let mut previous_local = None;
        for run in self
            .cron
            .after(&after.with_timezone(&self.zone))
            .take(MAX_RUNS_WALKED)
        {
            // A wall-clock time that happens twice (the hour repeated when daylight saving
            // ends) is one run, not two.
            let local = run.naive_local();
            if previous_local == Some(local) {
                continue;
            }
            previous_local = Some(local);
            let run = run.with_timezone(&Utc);
            if run > until {
                break;
            }
            latest = Some(run);
        }
        latest
    }

    /// The longest interval between two consecutive runs among the next few after `from`.
    pub fn longest_interval(&self, from: DateTime<Utc>) -> Option<Duration> {
        let runs: Vec<DateTime<Utc>> = self
            .cron
            .after(&from.with_timezone(&self.zone))
            .take(INTERVAL_SAMPLE + 1)
            .map(|t| t.with_timezone(&Utc))
            .collect();
        runs.windows(2)
            .filter_map(|w| (w[1] - w[0]).to_std().ok())
            .max()
    }
}

/// Converts a standard 5-field cron expression to the `cron` crate's syntax: a seconds field
/// first, and days of the week numbered 1 (Sunday) to 7 instead of 0 (Sunday) to 6 (7 is
/// Sunday too). Shorthands such as `@daily` pass through.
pub fn to_cron_crate_syntax(expression: &str) -> Result<String, String> {
    let trimmed = expression.trim();
    if trimmed.starts_with('@') {
        return Ok(trimmed.to_string());
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let [minute, hour, day_of_month, month, day_of_week] = fields[..] else {
        return Err(format!(
            "spec.backup.schedule {expression:?} must have 5 fields (minute hour day-of-month \
             month day-of-week), e.g. \"0 2 * * *\"; it has {}",
            fields.len()
        ));
    };
    let restricted = |f: &str| f != "*" && f != "?";
    if restricted(day_of_month) && restricted(day_of_week) {
        return Err(format!(
            "spec.backup.schedule {expression:?} restricts both day-of-month and day-of-week; \
             classic cron runs when either matches, which is rarely what is meant: set one of \
             them to *"
        ));
    }
    let day_of_week = convert_day_of_week(day_of_week)
        .map_err(|e| format!("spec.backup.schedule {expression:?}: {e}"))?;
    Ok(format!(
        "0 {minute} {hour} {day_of_month} {month} {day_of_week}"
    ))
}

fn convert_day_of_week(field: &str) -> Result<String, String> {
    let day = |text: &str| -> Result<Option<u32>, String> {
        if text.chars().all(|c| c.is_ascii_digit()) {
            let n: u32 = text
                .parse()
                .map_err(|_| format!("day of week {text:?} is not a number"))?;
            if n > 7 {
                return Err(format!(
                    "day of week {n} is out of range: use 0-7 (0 and 7 are Sunday) or SUN-SAT"
                ));
            }
            Ok(Some(n))
        } else {
            Ok(None) // a name (MON) or `*`: the same in both syntaxes
        }
    };
    // Standard day d (0..=7) in the crate's numbering (1..=7, Sunday = 1).
    let crate_day = |d: u32| if d == 0 || d == 7 { 1 } else { d + 1 };
    let mut items = Vec::new();
    for item in field.split(',') {
        let (base, step) = match item.split_once('/') {
            Some((b, s)) => (b, Some(s)),
            None => (item, None),
        };
        let suffix = step.map(|s| format!("/{s}")).unwrap_or_default();
        match base.split_once('-') {
            Some((from, to)) => match (day(from)?, day(to)?) {
                (Some(a), Some(b)) => {
                    if a > b {
                        return Err(format!("day-of-week range {base:?} runs backwards"));
                    }
                    if b == 7 && a > 0 {
                        // a..=Saturday, then Sunday (7) if the step reaches it.
                        items.push(format!("{}-7{suffix}", a + 1));
                        let step: u32 = step.and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
                        if (7 - a) % step == 0 {
                            items.push("1".into());
                        }
                    } else {
                        let b = if b == 7 { 6 } else { b };
                        items.push(format!("{}-{}{suffix}", a + 1, b + 1));
                    }
                }
                (None, None) => items.push(item.to_string()),
                _ => {
                    return Err(format!(
                        "day-of-week range {base:?} mixes numbers and names"
                    ));
                }
            },
            None => match day(base)? {
                Some(d) => items.push(format!("{}{suffix}", crate_day(d))),
                None => items.push(item.to_string()),
            },
        }
    }
    Ok(items.join(","))
}

/// Parses a duration such as `30d`, `12h` or `1h30m` (units s, m, h, d, w), as the backup
/// agent does.
pub fn parse_duration(text: &str) -> Option<Duration> {
    dbop_contract::units::parse_duration(text).ok()
}

/// A duration as people write it: `2d`, `26h`, `90m`, `45s` (the agent parses what the
/// operator formats: both use `dbop_contract::units`).
pub use dbop_contract::units::format_duration;

/// The name of the `DatabaseBackup` of the run scheduled at `at`: `<database>-<yyyymmddhhmm>`
/// in UTC. The same run always has the same name, so a restarted operator never makes it twice.
pub fn scheduled_backup_name(database: &str, at: DateTime<Utc>) -> String {
    format!("{database}-{}", at.format("%Y%m%d%H%M"))
}

/// What the schedule knows about the world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleFacts {
    /// The Database's name (scheduled backups are named after it).
    pub database: String,
    pub now: DateTime<Utc>,
    /// `status.backup.lastScheduleTime`.
    pub last_schedule_time: Option<DateTime<Utc>>,
    /// `status.backup.nextScheduleTime`.
    pub next_schedule_time: Option<DateTime<Utc>>,
    /// `spec.backup.suspend`.
    pub suspended: bool,
    pub starting_deadline: Duration,
    /// Why a due run cannot start now, besides another backup running (an upgrade rollout,
    /// a database not yet serving, unusable S3 credentials).
    pub hold: Option<Hold>,
    /// An unfinished `DatabaseBackup` of this Database (scheduled or on demand).
    pub active_backup: Option<String>,
    /// The names of this Database's `DatabaseBackup` objects.
    pub existing: Vec<String>,
}

/// Why due runs wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// An upgrade is being rolled out; scheduled backups resume when it ends.
    Upgrading,
    /// The database has never served yet.
    DatabaseNotReady,
    /// The S3 settings cannot work (the BackupHealthy condition says why).
    Misconfigured,
}

/// What happens to the run that is due, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Run {
    /// Nothing is due.
    NotDue,
    /// Suspended: no run starts.
    Suspended,
    /// Create the `DatabaseBackup` of this run.
    Start { at: DateTime<Utc>, name: String },
    /// The run's `DatabaseBackup` exists already (made before a restart): only record it.
    AlreadyStarted { at: DateTime<Utc> },
    /// A run is due but must wait (it starts later if its deadline has not passed by then).
    Wait { at: DateTime<Utc>, why: WaitReason },
    /// Runs were missed and the latest is past its starting deadline: skipped.
    Skipped { latest_missed: DateTime<Utc> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitReason {
    Hold(Hold),
    /// Another backup of this Database is pending or running: never two at once.
    BackupInProgress(String),
}

/// The scheduling decision: the run, the status fields, and when to look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulePlan {
    pub run: Run,
    pub last_schedule_time: Option<DateTime<Utc>>,
    pub next_schedule_time: Option<DateTime<Utc>>,
    /// When the schedule next needs a look (None: only a change wakes it).
    pub requeue_after: Option<Duration>,
}

/// While a run waits, how often to look again (the backup and rollout watches usually wake it
/// sooner).
const WAIT_POLL: Duration = Duration::from_secs(30);

/// Decides the schedule's next step.
///
/// The schedule's anchor is the last run dbop started (`lastScheduleTime`), or, before the
/// first, the first due time it computed (`nextScheduleTime`); with neither, this is the first
/// look and nothing is due yet. Of the runs due since the anchor, only the latest counts, and
/// only while it is at most `starting_deadline` late: after any outage, at most one catch-up.
pub fn plan_schedule(schedule: &BackupSchedule, facts: &ScheduleFacts) -> SchedulePlan {
    let now = facts.now;
    let until = |t: DateTime<Utc>| (t - now).to_std().ok().map(|d| d + Duration::from_secs(1));
    if facts.suspended {
        return SchedulePlan {
            run: Run::Suspended,
            last_schedule_time: facts.last_schedule_time,
            next_schedule_time: None,
            requeue_after: None,
        };
    }
    let anchor = facts
        .last_schedule_time
        .or(facts.next_schedule_time.map(|t| t - TimeDelta::seconds(1)));
    let Some(anchor) = anchor.filter(|a| *a <= now) else {
        // First look (or a clock that went backwards): the next run after now.
        let next = schedule.next_after(now);
        return SchedulePlan {
            run: Run::NotDue,
            last_schedule_time: facts.last_schedule_time,
            next_schedule_time: next,
            requeue_after: next.and_then(until),
        };
    };
    let deadline = TimeDelta::from_std(facts.starting_deadline).unwrap_or(TimeDelta::MAX);
    let window_start = now.checked_sub_signed(deadline).unwrap_or(anchor);
    let latest_in_window = if window_start > anchor {
        schedule.latest_between(window_start - TimeDelta::seconds(1), now)
    } else {
        schedule.latest_between(anchor, now)
    };
    let Some(at) = latest_in_window else {
        let first_due = schedule.next_after(anchor);
        return match first_due {
            Some(missed) if missed <= now => {
                let latest_missed = schedule.latest_between(anchor, now).unwrap_or(missed);
                let next = schedule.next_after(now);
                SchedulePlan {
                    run: Run::Skipped { latest_missed },
                    last_schedule_time: facts.last_schedule_time,
                    next_schedule_time: next,
                    requeue_after: next.and_then(until),
                }
            }
            next => SchedulePlan {
                run: Run::NotDue,
                last_schedule_time: facts.last_schedule_time,
                next_schedule_time: next,
                requeue_after: next.and_then(until),
            },
        };
    };
    plan_due_run(schedule, facts, at, deadline)
}

/// The schedule's step when the run due at `at` is within its starting deadline: start it,
/// record it (it exists already) or make it wait.
fn plan_due_run(
    schedule: &BackupSchedule,
    facts: &ScheduleFacts,
    at: DateTime<Utc>,
    deadline: TimeDelta,
) -> SchedulePlan {
    let now = facts.now;
    let until = |t: DateTime<Utc>| (t - now).to_std().ok().map(|d| d + Duration::from_secs(1));
    let name = scheduled_backup_name(&facts.database, at);
    let started = |run: Run| {
        let next = schedule.next_after(at.max(now));
        SchedulePlan {
            run,
            last_schedule_time: Some(at),
            next_schedule_time: next,
            requeue_after: next.and_then(until),
        }
    };
    if facts.existing.contains(&name) {
        return started(Run::AlreadyStarted { at });
    }
    let why = match (&facts.hold, &facts.active_backup) {
        (Some(hold), _) => Some(WaitReason::Hold(hold.clone())),
        (None, Some(active)) => Some(WaitReason::BackupInProgress(active.clone())),
        (None, None) => None,
    };
    match why {
        Some(why) => {
            // Look again when the run's deadline passes, or sooner (a deadline past the end of
            // the calendar never passes).
            let expires = match at.checked_add_signed(deadline) {
                Some(end) => (end - now).to_std().unwrap_or_default(),
                None => WAIT_POLL,
            };
            SchedulePlan {
                run: Run::Wait { at, why },
                last_schedule_time: facts.last_schedule_time,
                next_schedule_time: Some(at),
                requeue_after: Some(WAIT_POLL.min(expires.saturating_add(Duration::from_secs(1)))),
            }
        }
        None => started(Run::Start { at, name }),
    }
}

/// One `DatabaseBackup` of a Database, as the decisions need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupRecord {
    pub name: String,
    pub phase: Option<BackupPhase>,
    pub created: DateTime<Utc>,
    /// When it finished (or, failing that, when it was created).
    pub completed: Option<DateTime<Utc>>,
    pub message: Option<String>,
}

impl BackupRecord {
    fn finished_at(&self) -> DateTime<Utc> {
        self.completed.unwrap_or(self.created)
    }
    pub fn is_finished(&self) -> bool {
        self.phase.is_some_and(BackupPhase::is_finished)
    }
}

/// The retention policy of `DatabaseBackup` objects. Its successful backups are kept by the
/// contract's rule (`dbop_contract::retention`), the one the agent applies to object storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryPolicy {
    pub keep_last: u32,
    pub max_age: Option<Duration>,
    pub keep_failed: u32,
}

/// The finished `DatabaseBackup` objects to delete: successful ones beyond the newest
/// `keep_last` or older than `max_age` (never the newest successful one), failed ones beyond
/// the newest `keep_failed`. Unfinished ones are never touched.
pub fn backups_to_prune(
    backups: &[BackupRecord],
    policy: &HistoryPolicy,
    now: DateTime<Utc>,
) -> Vec<String> {
    let newest_first = |phase: BackupPhase| {
        let mut v: Vec<&BackupRecord> = backups.iter().filter(|b| b.phase == Some(phase)).collect();
        v.sort_by(|a, b| {
            b.finished_at()
                .cmp(&a.finished_at())
                .then_with(|| b.name.cmp(&a.name))
        });
        v
    };
    let succeeded: Vec<retention::Candidate> = backups
        .iter()
        .filter(|b| b.phase == Some(BackupPhase::Succeeded))
        .map(|b| retention::Candidate {
            backup_id: b.name.clone(),
            complete: true,
            completed_at: b.finished_at(),
        })
        .collect();
    let rule = retention::Policy {
        keep_last: Some(policy.keep_last.max(1)),
        max_age: policy.max_age,
    };
    // Every candidate is complete: the grace period of incomplete backups does not apply.
    let mut prune: Vec<String> = retention::verdicts(&succeeded, rule, Duration::ZERO, now)
        .into_iter()
        .filter(|d| matches!(d.verdict, retention::Verdict::Delete(_)))
        .map(|d| d.backup_id)
        .collect();
    for b in newest_first(BackupPhase::Failed)
        .iter()
        .skip(policy.keep_failed as usize)
    {
        prune.push(b.name.clone());
    }
    prune.sort();
    prune
}

/// What `BackupHealthy` is decided from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthFacts {
    pub now: DateTime<Utc>,
    /// The newest successful backup: name and completion time.
    pub last_success: Option<(String, DateTime<Utc>)>,
    /// The newest finished backup, successful or not.
    pub latest_finished: Option<BackupRecord>,
    /// A scheduled run has come due (so a backup should exist by now).
    pub a_run_was_due: bool,
    /// The first scheduled run, when none has come due yet.
    pub first_due: Option<DateTime<Utc>>,
    pub rpo: Duration,
}

/// The `BackupHealthy` condition, and when it may change by the clock alone (the last
/// success crossing the RPO).
pub fn backup_health(facts: &HealthFacts) -> (ConditionStatus, Option<Duration>) {
    use ConditionType::BackupHealthy;
    if let Some(latest) = &facts.latest_finished
        && latest.phase == Some(BackupPhase::Failed)
    {
        let why = latest.message.as_deref().unwrap_or("no message");
        return (
            ConditionStatus::new(
                BackupHealthy,
                false,
                "LastBackupFailed",
                format!("the latest backup, {}, failed: {why}", latest.name),
            ),
            None,
        );
    }
    match &facts.last_success {
        Some((name, at)) => {
            let age = (facts.now - *at).to_std().unwrap_or_default();
            let completed = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            if age > facts.rpo {
                (
                    ConditionStatus::new(
                        BackupHealthy,
                        false,
                        "BackupTooOld",
                        format!(
                            "the last successful backup, {name}, completed at {completed}, longer \
                             ago than the RPO of {}",
                            format_duration(facts.rpo)
                        ),
                    ),
                    None,
                )
            } else {
                (
                    ConditionStatus::new(
                        BackupHealthy,
                        true,
                        "BackupSucceeded",
                        format!("the last backup, {name}, succeeded at {completed}"),
                    ),
                    Some(facts.rpo - age + Duration::from_secs(1)),
                )
            }
        }
        None if facts.a_run_was_due => (
            ConditionStatus::new(
                BackupHealthy,
                false,
                "NoSuccessfulBackup",
                "no backup has succeeded since the first scheduled run was due",
            ),
            None,
        ),
        None => (
            ConditionStatus::new(
                BackupHealthy,
                true,
                "FirstBackupNotDue",
                match facts.first_due {
                    Some(t) => format!(
                        "the first scheduled backup is due at {}",
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    None => "no scheduled backup is due yet".to_string(),
                },
            ),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    fn schedule(expr: &str, tz: Option<&str>) -> BackupSchedule {
        BackupSchedule::parse(expr, tz).unwrap()
    }

    fn facts(now: DateTime<Utc>, last: Option<DateTime<Utc>>) -> ScheduleFacts {
        ScheduleFacts {
            database: "orders".into(),
            now,
            last_schedule_time: last,
            next_schedule_time: None,
            suspended: false,
            starting_deadline: DEFAULT_STARTING_DEADLINE,
            hold: None,
            active_backup: None,
            existing: vec![],
        }
    }

    /// Found by tests/spec_properties.rs: a held run with a starting deadline of centuries.
    #[test]
    fn a_held_run_with_an_endless_deadline_polls_instead_of_overflowing() {
        let mut f = facts(utc(2025, 5, 1, 2, 0, 5), Some(utc(2025, 4, 30, 2, 0, 0)));
        f.hold = Some(Hold::Upgrading);
        f.starting_deadline = Duration::from_secs(60 * 137_051_513_739);
        let plan = plan_schedule(&schedule("0 2 * * *", None), &f);
        assert_eq!(plan.requeue_after, Some(WAIT_POLL));
        assert!(matches!(plan.run, Run::Wait { .. }), "{:?}", plan.run);
    }

    #[test]
    fn five_fields_become_the_cron_crates_six() {
        let table = [
            ("0 2 * * *", "0 0 2 * * *"),
            ("*/15 * * * *", "0 */15 * * * *"),
            (" 30 1 1 * * ", "0 30 1 1 * *"),
            ("0 3 * * 0", "0 0 3 * * 1"),
            ("0 3 * * 7", "0 0 3 * * 1"),
            ("0 3 * * 1-5", "0 0 3 * * 2-6"),
            ("0 3 * * 0-6", "0 0 3 * * 1-7"),
            ("0 3 * * 5-7", "0 0 3 * * 6-7,1"),
            ("0 3 * * 1,3,5", "0 0 3 * * 2,4,6"),
            ("0 3 * * MON-FRI", "0 0 3 * * MON-FRI"),
            ("0 3 * * */2", "0 0 3 * * */2"),
            ("@daily", "@daily"),
        ];
        for (five, six) in table {
            assert_eq!(to_cron_crate_syntax(five).as_deref(), Ok(six), "{five}");
            assert!(BackupSchedule::parse(five, None).is_ok(), "{five}");
        }
    }

    #[test]
    fn bad_schedules_say_what_to_fix() {
        let table = [
            ("0 2 * *", "must have 5 fields"),
            ("0 0 2 * * *", "must have 5 fields"),
            ("0 2 1 * 1", "set one of them to *"),
            ("0 2 * * 8", "out of range"),
            ("61 2 * * *", "not a valid cron expression"),
            ("0 2 30 2 *", "never fires"),
        ];
        for (expr, want) in table {
            let err = BackupSchedule::parse(expr, None).unwrap_err();
            assert!(err.contains(want), "{expr}: {err}");
            assert!(err.contains("spec.backup.schedule"), "{expr}: {err}");
        }
        let err = BackupSchedule::parse("0 2 * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(err.contains("spec.backup.timeZone"), "{err}");
    }

    #[test]
    fn standard_day_of_week_numbers_mean_the_standard_days() {
        // 2025-03-07 is a Friday; "1-5" is Monday to Friday in standard cron.
        let s = schedule("0 3 * * 1-5", None);
        assert_eq!(
            s.next_after(utc(2025, 3, 7, 4, 0, 0)),
            Some(utc(2025, 3, 10, 3, 0, 0))
        );
        let sunday = schedule("0 3 * * 0", None);
        assert_eq!(
            sunday.next_after(utc(2025, 3, 7, 4, 0, 0)),
            Some(utc(2025, 3, 9, 3, 0, 0))
        );
    }

    #[test]
    fn time_zones_across_daylight_saving_changes() {
        // Europe/Berlin: clocks jump 02:00 → 03:00 on 2025-03-30, 03:00 → 02:00 on 2025-10-26.
        let table = [
            // A run in the skipped hour does not happen that day.
            (
                "30 2 * * *",
                utc(2025, 3, 29, 2, 0, 0),
                utc(2025, 3, 31, 0, 30, 0),
            ),
            // 09:00 local is 08:00 UTC in winter and 07:00 UTC in summer.
            (
                "0 9 * * *",
                utc(2025, 3, 29, 9, 0, 0),
                utc(2025, 3, 30, 7, 0, 0),
            ),
            (
                "0 9 * * *",
                utc(2025, 10, 25, 8, 0, 0),
                utc(2025, 10, 26, 8, 0, 0),
            ),
            // The repeated hour: the first 02:30 (CEST, 00:30 UTC).
            (
                "30 2 * * *",
                utc(2025, 10, 25, 12, 0, 0),
                utc(2025, 10, 26, 0, 30, 0),
            ),
        ];
        for (expr, after, want) in table {
            let s = schedule(expr, Some("Europe/Berlin"));
            assert_eq!(s.next_after(after), Some(want), "{expr} after {after}");
        }
        // America/New_York, the same rules on other dates.
        let s = schedule("0 2 * * *", Some("America/New_York"));
        assert_eq!(
            s.next_after(utc(2025, 3, 8, 12, 0, 0)),
            Some(utc(2025, 3, 10, 6, 0, 0)),
            "02:00 does not exist on 2025-03-09 in New York"
        );
    }

    #[test]
    fn the_repeated_hour_runs_once() {
        let s = schedule("30 2 * * *", Some("Europe/Berlin"));
        let first = utc(2025, 10, 26, 0, 30, 0);
        // Steady state: after the first 02:30 started, the second is not a new run.
        let plan = plan_schedule(&s, &facts(utc(2025, 10, 26, 1, 31, 0), Some(first)));
        assert_eq!(plan.run, Run::NotDue);
        assert_eq!(plan.next_schedule_time, Some(utc(2025, 10, 27, 1, 30, 0)));
        // After downtime across both: one run, the first.
        let mut f = facts(
            utc(2025, 10, 26, 1, 31, 0),
            Some(utc(2025, 10, 25, 0, 30, 0)),
        );
        f.starting_deadline = Duration::from_secs(7200);
        let plan = plan_schedule(&s, &f);
        assert_eq!(
            plan.run,
            Run::Start {
                at: first,
                name: "orders-202510260030".into()
            }
        );
    }

    #[test]
    fn scheduling_table() {
        let minutely = schedule("* * * * *", None);
        let hourly = schedule("0 * * * *", None);
        let nightly = schedule("0 2 * * *", None);
        let t = |h, m, s| utc(2025, 5, 1, h, m, s);
        struct Case {
            name: &'static str,
            schedule: BackupSchedule,
            facts: ScheduleFacts,
            run: Run,
            last: Option<DateTime<Utc>>,
            next: Option<DateTime<Utc>>,
        }
        let case = |name, schedule: &BackupSchedule, facts, run, last, next| Case {
            name,
            schedule: schedule.clone(),
            facts,
            run,
            last,
            next,
        };
        let with = |mut f: ScheduleFacts, edit: &dyn Fn(&mut ScheduleFacts)| {
            edit(&mut f);
            f
        };
        let table = [
            case(
                "first look: nothing due, the next run is computed",
                &nightly,
                facts(t(1, 10, 0), None),
                Run::NotDue,
                None,
                Some(t(2, 0, 0)),
            ),
            case(
                "first due time reached",
                &nightly,
                with(facts(t(2, 0, 1), None), &|f| {
                    f.next_schedule_time = Some(t(2, 0, 0))
                }),
                Run::Start {
                    at: t(2, 0, 0),
                    name: "orders-202505010200".into(),
                },
                Some(t(2, 0, 0)),
                Some(utc(2025, 5, 2, 2, 0, 0)),
            ),
            case(
                "not due yet",
                &minutely,
                facts(t(10, 0, 30), Some(t(10, 0, 0))),
                Run::NotDue,
                Some(t(10, 0, 0)),
                Some(t(10, 1, 0)),
            ),
            case(
                "three runs missed during downtime: one catch-up, the latest",
                &minutely,
                facts(t(10, 3, 30), Some(t(10, 0, 0))),
                Run::Start {
                    at: t(10, 3, 0),
                    name: "orders-202505011003".into(),
                },
                Some(t(10, 3, 0)),
                Some(t(10, 4, 0)),
            ),
            case(
                "missed runs past the starting deadline are skipped, not replayed",
                &hourly,
                with(facts(t(5, 30, 0), Some(t(0, 0, 0))), &|f| {
                    f.starting_deadline = Duration::from_secs(600)
                }),
                Run::Skipped {
                    latest_missed: t(5, 0, 0),
                },
                Some(t(0, 0, 0)),
                Some(t(6, 0, 0)),
            ),
            case(
                "a nightly run missed by 30 minutes still starts within the default hour",
                &nightly,
                facts(t(2, 30, 0), Some(utc(2025, 4, 30, 2, 0, 0))),
                Run::Start {
                    at: t(2, 0, 0),
                    name: "orders-202505010200".into(),
                },
                Some(t(2, 0, 0)),
                Some(utc(2025, 5, 2, 2, 0, 0)),
            ),
            case(
                "never two at once: a due run waits for the running backup",
                &minutely,
                with(facts(t(10, 1, 5), Some(t(10, 0, 0))), &|f| {
                    f.active_backup = Some("orders-202505011000".into())
                }),
                Run::Wait {
                    at: t(10, 1, 0),
                    why: WaitReason::BackupInProgress("orders-202505011000".into()),
                },
                Some(t(10, 0, 0)),
                Some(t(10, 1, 0)),
            ),
            case(
                "an on-demand backup in progress holds the schedule too",
                &nightly,
                with(facts(t(2, 0, 5), Some(utc(2025, 4, 30, 2, 0, 0))), &|f| {
                    f.active_backup = Some("before-migration".into())
                }),
                Run::Wait {
                    at: t(2, 0, 0),
                    why: WaitReason::BackupInProgress("before-migration".into()),
                },
                Some(utc(2025, 4, 30, 2, 0, 0)),
                Some(t(2, 0, 0)),
            ),
            case(
                "no scheduled runs during an upgrade rollout",
                &nightly,
                with(facts(t(2, 0, 5), Some(utc(2025, 4, 30, 2, 0, 0))), &|f| {
                    f.hold = Some(Hold::Upgrading)
                }),
                Run::Wait {
                    at: t(2, 0, 0),
                    why: WaitReason::Hold(Hold::Upgrading),
                },
                Some(utc(2025, 4, 30, 2, 0, 0)),
                Some(t(2, 0, 0)),
            ),
            case(
                "suspend stops new runs and clears the next time",
                &minutely,
                with(facts(t(10, 3, 30), Some(t(10, 0, 0))), &|f| {
                    f.suspended = true
                }),
                Run::Suspended,
                Some(t(10, 0, 0)),
                None,
            ),
            case(
                "a run made before a restart is recorded, not made again",
                &minutely,
                with(facts(t(10, 1, 5), Some(t(10, 0, 0))), &|f| {
                    f.existing = vec!["orders-202505011001".into()]
                }),
                Run::AlreadyStarted { at: t(10, 1, 0) },
                Some(t(10, 1, 0)),
                Some(t(10, 2, 0)),
            ),
        ];
        for c in table {
            let plan = plan_schedule(&c.schedule, &c.facts);
            assert_eq!(plan.run, c.run, "{}", c.name);
            assert_eq!(plan.last_schedule_time, c.last, "{}: last", c.name);
            assert_eq!(plan.next_schedule_time, c.next, "{}: next", c.name);
            if let Some(next) = c.next
                && !matches!(plan.run, Run::Wait { .. })
            {
                let wait = plan.requeue_after.expect("a requeue");
                assert_eq!(
                    wait.as_secs(),
                    (next - c.facts.now).num_seconds() as u64 + 1,
                    "{}: requeue at the due time",
                    c.name
                );
            }
            // Deterministic: the same facts give the same plan (no writes on a repeat pass).
            assert_eq!(plan, plan_schedule(&c.schedule, &c.facts), "{}", c.name);
        }
    }

    #[test]
    fn a_waiting_run_gives_up_at_its_deadline() {
        let minutely = schedule("* * * * *", None);
        let mut f = facts(utc(2025, 5, 1, 10, 1, 5), Some(utc(2025, 5, 1, 10, 0, 0)));
        f.active_backup = Some("long".into());
        f.starting_deadline = Duration::from_secs(20);
        let plan = plan_schedule(&minutely, &f);
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(16)));
        // Past the deadline while still blocked: skipped, the next one is awaited.
        f.now = utc(2025, 5, 1, 10, 1, 40);
        let plan = plan_schedule(&minutely, &f);
        assert_eq!(
            plan.run,
            Run::Skipped {
                latest_missed: utc(2025, 5, 1, 10, 1, 0)
            }
        );
        assert_eq!(plan.next_schedule_time, Some(utc(2025, 5, 1, 10, 2, 0)));
    }

    #[test]
    fn a_long_outage_with_a_per_minute_schedule_stays_cheap() {
        let minutely = schedule("* * * * *", None);
        let mut f = facts(utc(2025, 5, 1, 0, 0, 30), Some(utc(2020, 1, 1, 0, 0, 0)));
        f.starting_deadline = Duration::from_secs(10 * 365 * 86_400);
        let plan = plan_schedule(&minutely, &f);
        assert!(
            matches!(plan.run, Run::Start { .. } | Run::Skipped { .. }),
            "{:?}",
            plan.run
        );
    }

    #[test]
    fn names_are_deterministic_utc_minutes() {
        assert_eq!(
            scheduled_backup_name("orders", utc(2025, 1, 31, 2, 0, 0)),
            "orders-202501310200"
        );
    }

    #[test]
    fn durations() {
        for (text, secs) in [
            ("30d", 2_592_000),
            ("12h", 43_200),
            ("1h30m", 5400),
            ("45s", 45),
            ("2w", 1_209_600),
        ] {
            assert_eq!(
                parse_duration(text),
                Some(Duration::from_secs(secs)),
                "{text}"
            );
        }
        for bad in ["", "30", "d", "1x", "99999999999999999999d"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(format_duration(Duration::from_secs(172_800)), "2d");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    }

    fn record(name: &str, phase: BackupPhase, completed_hours_ago: i64) -> BackupRecord {
        let now = utc(2025, 5, 10, 0, 0, 0);
        BackupRecord {
            name: name.into(),
            phase: Some(phase),
            created: now - TimeDelta::hours(completed_hours_ago + 1),
            completed: Some(now - TimeDelta::hours(completed_hours_ago)),
            message: Some(format!("{name} message")),
        }
    }

    #[test]
    fn history_pruning_table() {
        use BackupPhase::{Failed, Pending, Running, Succeeded};
        let now = utc(2025, 5, 10, 0, 0, 0);
        let policy = |keep_last, max_age_hours: Option<u64>, keep_failed| HistoryPolicy {
            keep_last,
            max_age: max_age_hours.map(|h| Duration::from_secs(h * 3600)),
            keep_failed,
        };
        let many = vec![
            record("s1", Succeeded, 1),
            record("s2", Succeeded, 2),
            record("s3", Succeeded, 3),
            record("f1", Failed, 4),
            record("f2", Failed, 5),
            record("r", Running, 0),
            BackupRecord {
                phase: Some(Pending),
                ..record("p", Pending, 0)
            },
        ];
        let table: Vec<(&str, Vec<BackupRecord>, HistoryPolicy, Vec<&str>)> = vec![
            ("within limits", many.clone(), policy(3, None, 2), vec![]),
            (
                "keep last 2 and 1 failed",
                many.clone(),
                policy(2, None, 1),
                vec!["f2", "s3"],
            ),
            (
                "max age 150m",
                many.clone(),
                policy(10, Some(2), 5),
                vec!["s3"],
            ),
            (
                "no failed kept",
                many.clone(),
                policy(10, None, 0),
                vec!["f1", "f2"],
            ),
            (
                "the newest success survives any age",
                vec![
                    record("old", Succeeded, 1000),
                    record("older", Succeeded, 2000),
                ],
                policy(10, Some(24), 3),
                vec!["older"],
            ),
            ("nothing", vec![], policy(1, Some(1), 0), vec![]),
        ];
        for (name, records, policy, want) in table {
            assert_eq!(backups_to_prune(&records, &policy, now), want, "{name}");
        }
    }

    #[test]
    fn backup_health_table() {
        let now = utc(2025, 5, 10, 0, 0, 0);
        let day = Duration::from_secs(86_400);
        let base = HealthFacts {
            now,
            last_success: None,
            latest_finished: None,
            a_run_was_due: false,
            first_due: Some(utc(2025, 5, 10, 2, 0, 0)),
            rpo: 2 * day,
        };
        let ok = record("b-ok", BackupPhase::Succeeded, 5);
        let failed = record("b-bad", BackupPhase::Failed, 1);
        let table = [
            ("nothing due yet", base.clone(), true, "FirstBackupNotDue"),
            (
                "due but none succeeded",
                HealthFacts {
                    a_run_was_due: true,
                    ..base.clone()
                },
                false,
                "NoSuccessfulBackup",
            ),
            (
                "recent success",
                HealthFacts {
                    last_success: Some(("b-ok".into(), ok.completed.unwrap())),
                    latest_finished: Some(ok.clone()),
                    a_run_was_due: true,
                    ..base.clone()
                },
                true,
                "BackupSucceeded",
            ),
            (
                "latest failed",
                HealthFacts {
                    last_success: Some(("b-ok".into(), ok.completed.unwrap())),
                    latest_finished: Some(failed.clone()),
                    a_run_was_due: true,
                    ..base.clone()
                },
                false,
                "LastBackupFailed",
            ),
            (
                "older than the RPO",
                HealthFacts {
                    last_success: Some(("b-ok".into(), now - TimeDelta::days(3))),
                    latest_finished: Some(ok.clone()),
                    a_run_was_due: true,
                    ..base.clone()
                },
                false,
                "BackupTooOld",
            ),
        ];
        for (name, facts, status, reason) in table {
            let (c, _) = backup_health(&facts);
            assert_eq!(
                (c.status, c.reason.as_str()),
                (status, reason),
                "{name}: {}",
                c.message
            );
        }
        // A healthy condition asks to be looked at again when the RPO would be crossed.
        let (_, requeue) = backup_health(&HealthFacts {
            last_success: Some(("b-ok".into(), now - TimeDelta::hours(47))),
            ..base.clone()
        });
        assert_eq!(requeue, Some(Duration::from_secs(3601)));
        let (c, _) = backup_health(&HealthFacts {
            latest_finished: Some(failed),
            ..base
        });
        assert!(c.message.contains("b-bad message"), "{}", c.message);
    }
}
