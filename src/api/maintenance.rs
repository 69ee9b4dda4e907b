//! `spec.maintenanceWindow`: the days and hours in which dbop may restart a Database's pods for
//! changes that are not urgent. The schema judges the shape; the time zone and the duration's
//! bounds are judged by the operator (the top-level `maintenance` module), which says what to
//! fix in a condition.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When changes that restart the pods and are not urgent may run: a new instance manager after
/// an operator upgrade, a server parameter that needs a restart, a new image for the same
/// version, and a version upgrade marked `upgrade.inMaintenanceWindow`. Outside it they wait,
/// and the `MaintenancePending` condition says what waits and when the window opens. A change
/// that starts in the window runs to its end even when the window closes meanwhile.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindowSpec {
    /// The days the window opens on, in its time zone (every day when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7), extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,

    /// When the window opens, as local time `HH:MM` (24-hour clock). On a day that skips this
    /// time (daylight saving starts), it opens when the clock resumes; on a day that has it
    /// twice, at the first.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,

    /// How long the window stays open, as a duration such as `2h` or `90m` (at least 1m, at most
    /// 7d): real time, so a window across a daylight-saving change is as long as it says.
    #[schemars(regex(pattern = r"^([0-9]{1,6}[smhdw])+$"), length(max = 32))]
    pub duration: String,

    /// The IANA time zone `start` and `days` are read in, e.g. `Europe/Berlin`; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
    )]
    pub time_zone: Option<String>,
}

/// A day of the week.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    /// The same day in chrono's terms.
    pub fn to_chrono(self) -> chrono::Weekday {
        match self {
            Weekday::Monday => chrono::Weekday::Mon,
            Weekday::Tuesday => chrono::Weekday::Tue,
            Weekday::Wednesday => chrono::Weekday::Wed,
            Weekday::Thursday => chrono::Weekday::Thu,
            Weekday::Friday => chrono::Weekday::Fri,
            Weekday::Saturday => chrono::Weekday::Sat,
            Weekday::Sunday => chrono::Weekday::Sun,
        }
    }
}
