//! A Database's maintenance window (`spec.maintenanceWindow`): whether it is open at a moment,
//! when it next opens or closes, and so whether the restarts that are not urgent may run now
//! ([`Gate`]); and the `MaintenancePending` condition that says what waits for it.
//!
//! A window opens on each of its days at `start`, local time in its zone, and stays open for
//! `duration` of real time (so it may run past midnight into the next day). A start the clock
//! skips (daylight saving begins) opens when the clock resumes; a start the clock shows twice
//! (daylight saving ends) opens at the first.
//!
//! Pure: `now` comes in.

use std::time::Duration;

use chrono::{DateTime, Datelike, LocalResult, NaiveDate, NaiveTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;

use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{Database, MaintenanceWindowSpec};

/// The longest window: a week (with every day, it is then always open).
const LONGEST: TimeDelta = TimeDelta::days(7);
/// The shortest window.
const SHORTEST: TimeDelta = TimeDelta::minutes(1);

/// A parsed maintenance window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The days it opens on (every day when empty).
    days: Vec<chrono::Weekday>,
    start: NaiveTime,
    length: TimeDelta,
    zone: Tz,
}

/// Where a moment falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    Open { closes: DateTime<Utc> },
    Closed { opens: DateTime<Utc> },
}

impl Window {
    /// Reads the spec; the error says what to fix.
    pub fn parse(spec: &MaintenanceWindowSpec) -> Result<Window, String> {
        let start = NaiveTime::parse_from_str(&spec.start, "%H:%M").map_err(|_| {
            format!(
                "spec.maintenanceWindow.start {:?} is not a time of day: use HH:MM, e.g. 02:00",
                spec.start
            )
        })?;
        let length = dbop_contract::units::parse_duration(&spec.duration)
            .ok()
            .and_then(|d| TimeDelta::from_std(d).ok())
            .filter(|d| (SHORTEST..=LONGEST).contains(d))
            .ok_or_else(|| {
                format!(
                    "spec.maintenanceWindow.duration {:?} is not a duration from 1m to 7d, \
                     e.g. 2h or 90m",
                    spec.duration
                )
            })?;
        let zone = match spec.time_zone.as_deref() {
            None => Tz::UTC,
            Some(name) => name.parse::<Tz>().map_err(|_| {
                format!(
                    "spec.maintenanceWindow.timeZone {name:?} is not an IANA time zone: use a \
                     name such as Europe/Berlin or America/New_York"
                )
            })?,
        };
        let days = spec.days.iter().map(|d| d.to_chrono()).collect();
        Ok(Window {
            days,
            start,
            length,
            zone,
        })
    }

    /// Where `now` falls: in an opening (and when the window closes), or between two.
    pub fn at(&self, now: DateTime<Utc>) -> WindowState {
        let today = now.with_timezone(&self.zone).date_naive();
        // A window lasts at most a week: one opened 8 local days ago has closed, and every
        // weekday opens within the 8 days ahead.
        let openings: Vec<DateTime<Utc>> = (-8..=8)
            .filter_map(|offset| today.checked_add_signed(TimeDelta::days(offset)))
            .filter_map(|day| self.opening(day))
            .collect();
        let containing = openings
            .iter()
            .any(|&open| open <= now && now < open + self.length);
        if containing {
            return WindowState::Open {
                closes: self.end_of_opening(&openings, now),
            };
        }
        let opens = openings.into_iter().find(|&open| open > now);
        // Unreachable with a valid window (some day opens within a week); a year ahead keeps
        // it closed rather than open by mistake.
        let opens = opens.unwrap_or(now + TimeDelta::days(365));
        WindowState::Closed { opens }
    }

    /// The opening on local day `day`, if the window opens that day.
    fn opening(&self, day: NaiveDate) -> Option<DateTime<Utc>> {
        if !self.days.is_empty() && !self.days.contains(&day.weekday()) {
            return None;
        }
        let local = day.and_time(self.start);
        // A skipped time opens at the first minute the clock shows after it.
        (0..=24 * 60).find_map(|minutes| {
            match self
                .zone
                .from_local_datetime(&(local + TimeDelta::minutes(minutes)))
            {
                LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
                LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
                LocalResult::None => None,
            }
        })
    }

    /// When the opening that contains `now` ends, with the openings that overlap it joined.
    fn end_of_opening(&self, openings: &[DateTime<Utc>], now: DateTime<Utc>) -> DateTime<Utc> {
        let mut closes = now;
        for &open in openings {
            if open <= closes.max(now) && open + self.length > closes {
                closes = open + self.length;
            }
        }
        closes
    }

    /// `at` as the window's own local time, e.g. `Sat 2026-12-05 02:00 CET`.
    pub fn local(&self, at: DateTime<Utc>) -> String {
        at.with_timezone(&self.zone)
            .format("%a %Y-%m-%d %H:%M %Z")
            .to_string()
    }
}

/// What the restarts that are not urgent may do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// No window: they run when their change is made.
    NoWindow,
    /// In the window: they run now.
    Open { closes: String, at: DateTime<Utc> },
    /// Outside the window: they wait until it opens.
    Closed { opens: String, at: DateTime<Utc> },
    /// The window cannot be read: they wait until it is fixed.
    Invalid { message: String },
}

impl Gate {
    /// The gate of `db` at `now`.
    pub fn of(db: &Database, now: DateTime<Utc>) -> Gate {
        let Some(spec) = db.spec.maintenance_window.as_ref() else {
            return Gate::NoWindow;
        };
        let window = match Window::parse(spec) {
            Ok(window) => window,
            Err(message) => return Gate::Invalid { message },
        };
        match window.at(now) {
            WindowState::Open { closes } => Gate::Open {
                closes: window.local(closes),
                at: closes,
            },
            WindowState::Closed { opens } => Gate::Closed {
                opens: window.local(opens),
                at: opens,
            },
        }
    }

    /// Restarts that are not urgent wait.
    pub fn holds(&self) -> bool {
        matches!(self, Gate::Closed { .. } | Gate::Invalid { .. })
    }

    /// The Database's window is open now.
    pub fn is_open(&self) -> bool {
        matches!(self, Gate::Open { .. })
    }

    /// The Database's window cannot be read.
    pub fn is_invalid(&self) -> bool {
        matches!(self, Gate::Invalid { .. })
    }

    /// How long until the window opens or closes (None: it never will by itself).
    pub fn next_change(&self, now: DateTime<Utc>) -> Option<Duration> {
        match self {
            Gate::Open { at, .. } | Gate::Closed { at, .. } => {
                // A second past the moment, so that the pass then sees it changed (and never
                // less than a second, whatever the clock did meanwhile).
                let until = (*at - now + TimeDelta::seconds(1))
                    .to_std()
                    .unwrap_or_default();
                Some(until.max(Duration::from_secs(1)))
            }
            Gate::NoWindow | Gate::Invalid { .. } => None,
        }
    }
}

/// The reason of `MaintenancePending` when something waits for the window.
pub const WAITING: &str = "WaitingForMaintenanceWindow";
/// The reason when the window cannot be read.
pub const INVALID: &str = "InvalidMaintenanceWindow";

/// `MaintenancePending`, for a Database with a window: True while changes wait for it (named in
/// `pending`, e.g. "a restart for shared_buffers"), with when they will run. None without a
/// window (the status then drops the condition).
pub fn condition(gate: &Gate, pending: &[String]) -> Option<ConditionStatus> {
    let what = pending.join("; ");
    let (status, reason, message) = match gate {
        Gate::NoWindow => return None,
        Gate::Invalid { message } => (
            !pending.is_empty(),
            INVALID,
            if pending.is_empty() {
                format!("{message}; changes that restart the pods will wait until it is fixed")
            } else {
                format!("{message}; waiting until it is fixed: {what}")
            },
        ),
        Gate::Closed { opens, .. } if !pending.is_empty() => (
            true,
            WAITING,
            format!("waiting for the maintenance window, which opens {opens}: {what}"),
        ),
        Gate::Closed { opens, .. } => (
            false,
            "NothingPending",
            format!("nothing waits for the maintenance window, which opens {opens}"),
        ),
        Gate::Open { closes, .. } => (
            false,
            "WindowOpen",
            format!("the maintenance window is open until {closes}"),
        ),
    };
    Some(ConditionStatus::new(
        ConditionType::MaintenancePending,
        status,
        reason,
        message,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Weekday;

    fn window(days: &[Weekday], start: &str, duration: &str, zone: Option<&str>) -> Window {
        Window::parse(&MaintenanceWindowSpec {
            days: days.to_vec(),
            start: start.into(),
            duration: duration.into(),
            time_zone: zone.map(str::to_string),
        })
        .unwrap()
    }

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn check(w: &Window, now: &str, expected: WindowState) {
        assert_eq!(w.at(utc(now)), expected, "at {now}");
    }

    fn open_until(text: &str) -> WindowState {
        WindowState::Open { closes: utc(text) }
    }

    fn closed_until(text: &str) -> WindowState {
        WindowState::Closed { opens: utc(text) }
    }

    #[test]
    fn a_daily_window_opens_at_its_start_and_closes_after_its_duration() {
        let w = window(&[], "02:00", "2h", None);
        let cases = [
            ("2026-12-04T01:59:59Z", closed_until("2026-12-04T02:00:00Z")),
            ("2026-12-04T02:00:00Z", open_until("2026-12-04T04:00:00Z")),
            ("2026-12-04T03:59:59Z", open_until("2026-12-04T04:00:00Z")),
            ("2026-12-04T04:00:00Z", closed_until("2026-12-05T02:00:00Z")),
        ];
        for (now, expected) in cases {
            check(&w, now, expected);
        }
    }

    #[test]
    fn days_are_read_in_the_window_s_time_zone() {
        // Saturdays and Sundays 02:00 in Berlin (CET, UTC+1 in December).
        let w = window(
            &[Weekday::Saturday, Weekday::Sunday],
            "02:00",
            "2h",
            Some("Europe/Berlin"),
        );
        let cases = [
            // Wednesday: the next opening is Saturday 02:00 CET.
            ("2026-12-02T12:00:00Z", closed_until("2026-12-05T01:00:00Z")),
            ("2026-12-05T01:30:00Z", open_until("2026-12-05T03:00:00Z")),
            // Sunday's closes, and Monday is not a day of it: next Saturday.
            ("2026-12-06T03:00:00Z", closed_until("2026-12-12T01:00:00Z")),
        ];
        for (now, expected) in cases {
            check(&w, now, expected);
        }
        assert_eq!(
            w.local(utc("2026-12-05T01:00:00Z")),
            "Sat 2026-12-05 02:00 CET"
        );
    }

    #[test]
    fn a_window_runs_past_midnight_into_a_day_not_listed() {
        let w = window(&[Weekday::Friday], "23:00", "3h", None);
        // Friday 2026-12-04 23:00 → Saturday 02:00.
        check(
            &w,
            "2026-12-05T01:00:00Z",
            open_until("2026-12-05T02:00:00Z"),
        );
        check(
            &w,
            "2026-12-05T02:00:00Z",
            closed_until("2026-12-11T23:00:00Z"),
        );
    }

    #[test]
    fn a_start_the_clock_skips_opens_when_the_clock_resumes() {
        // Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST; 02:30 does not exist.
        let w = window(&[], "02:30", "1h", Some("Europe/Berlin"));
        check(
            &w,
            "2026-03-29T00:30:00Z",
            closed_until("2026-03-29T01:00:00Z"),
        );
        // One hour of real time from 03:00 CEST (01:00Z).
        check(
            &w,
            "2026-03-29T01:30:00Z",
            open_until("2026-03-29T02:00:00Z"),
        );
        // The next day opens at 02:30 CEST again.
        check(
            &w,
            "2026-03-29T02:00:00Z",
            closed_until("2026-03-30T00:30:00Z"),
        );
    }

    #[test]
    fn a_start_the_clock_shows_twice_opens_at_the_first_and_lasts_its_real_time() {
        // New York, 1 November 2026: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
        let w = window(&[], "01:30", "2h", Some("America/New_York"));
        // The first 01:30 is EDT (05:30Z); two real hours later is 07:30Z (02:30 EST).
        check(
            &w,
            "2026-11-01T05:00:00Z",
            closed_until("2026-11-01T05:30:00Z"),
        );
        check(
            &w,
            "2026-11-01T06:45:00Z",
            open_until("2026-11-01T07:30:00Z"),
        );
        check(
            &w,
            "2026-11-01T07:30:00Z",
            closed_until("2026-11-02T06:30:00Z"),
        );
    }

    #[test]
    fn overlapping_openings_join_and_a_week_long_daily_window_never_closes_soon() {
        let w = window(&[Weekday::Monday, Weekday::Tuesday], "00:00", "36h", None);
        // Monday 00:00 + 36 h overlaps Tuesday's opening; together they run to Wednesday 12:00.
        check(
            &w,
            "2026-11-30T06:00:00Z",
            open_until("2026-12-02T12:00:00Z"),
        );
        let always = window(&[], "00:00", "7d", None);
        match always.at(utc("2026-12-04T12:00:00Z")) {
            WindowState::Open { closes } => assert!(closes > utc("2026-12-10T00:00:00Z")),
            closed => panic!("always open, got {closed:?}"),
        }
    }

    #[test]
    fn a_window_shorter_than_a_restart_still_opens_and_closes() {
        let w = window(&[], "03:00", "1m", None);
        check(
            &w,
            "2026-12-04T03:00:30Z",
            open_until("2026-12-04T03:01:00Z"),
        );
        check(
            &w,
            "2026-12-04T03:01:00Z",
            closed_until("2026-12-05T03:00:00Z"),
        );
    }

    #[test]
    fn a_window_that_cannot_be_read_says_what_to_fix() {
        let spec = |start: &str, duration: &str, zone: Option<&str>| MaintenanceWindowSpec {
            days: vec![],
            start: start.into(),
            duration: duration.into(),
            time_zone: zone.map(str::to_string),
        };
        let cases = [
            (spec("02:00", "2h", Some("Mars/Olympus")), "timeZone"),
            (spec("02:00", "30s", None), "duration"),
            (spec("02:00", "8d", None), "duration"),
            (spec("2am", "2h", None), "start"),
        ];
        for (spec, field) in cases {
            let error = Window::parse(&spec).unwrap_err();
            assert!(error.contains(field), "{error}");
        }
    }

    #[test]
    fn the_gate_and_its_condition() {
        let mut db = crate::resources::testing::minimal();
        let now = utc("2026-12-04T12:00:00Z");
        assert_eq!(Gate::of(&db, now), Gate::NoWindow);
        assert_eq!(condition(&Gate::NoWindow, &["x".into()]), None);

        db.spec.maintenance_window = Some(Box::new(MaintenanceWindowSpec {
            days: vec![],
            start: "02:00".into(),
            duration: "2h".into(),
            time_zone: Some("Europe/Berlin".into()),
        }));
        let gate = Gate::of(&db, now);
        assert!(gate.holds() && !gate.is_open());
        assert_eq!(
            gate.next_change(now),
            Some(Duration::from_secs(13 * 3600 + 1))
        );
        let pending = condition(&gate, &["a restart for shared_buffers".into()]).unwrap();
        assert!(pending.status);
        assert_eq!(pending.reason, WAITING);
        assert_eq!(
            pending.message,
            "waiting for the maintenance window, which opens Sat 2026-12-05 02:00 CET: \
             a restart for shared_buffers"
        );
        assert!(!condition(&gate, &[]).unwrap().status);

        let open = Gate::of(&db, utc("2026-12-05T01:30:00Z"));
        assert!(open.is_open() && !open.holds());
        assert_eq!(
            condition(&open, &[]).unwrap().message,
            "the maintenance window is open until Sat 2026-12-05 04:00 CET"
        );

        db.spec.maintenance_window.as_mut().unwrap().time_zone = Some("Nowhere".into());
        let invalid = Gate::of(&db, now);
        assert!(invalid.holds());
        let c = condition(&invalid, &["the upgrade to 16.5".into()]).unwrap();
        assert!(c.status);
        assert_eq!(c.reason, INVALID);
        assert!(c.message.contains("Nowhere") && c.message.contains("16.5"));
    }
}
