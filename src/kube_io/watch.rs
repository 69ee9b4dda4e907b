//! How the controllers' watches come back after the API server went away: the backoff between
//! attempts to re-establish them. kube-runtime's default (client-go's: 0.8 s doubling to 30 s,
//! jittered, reset after 2 minutes) grows to 30 s on repeated refusals and "410 too old resource
//! version" answers, and after an API server restart the operator took more than 90 s to see
//! anything again (e2e/tests/control_plane.rs). Each watch of `runtime::watches` uses this
//! one instead: 200 ms
//! doubling to at most [`LONGEST_WATCH_RETRY`], back to 200 ms after [`QUIET`] without errors.

use std::time::Duration;

use kube::runtime::utils::{Backoff, ResetTimerBackoff};

/// The first retry of a failed watch or list.
pub const FIRST_WATCH_RETRY: Duration = Duration::from_millis(200);
/// The longest wait between two attempts.
pub const LONGEST_WATCH_RETRY: Duration = Duration::from_secs(5);
/// After this long without an error the backoff starts again from the first retry.
pub const QUIET: Duration = Duration::from_secs(30);

/// The backoff of one watch (`WatchStreamExt::backoff` in `runtime::watches`).
pub fn backoff() -> impl Backoff {
    ResetTimerBackoff::new(Doubling::default(), QUIET)
}

/// 200 ms, 400 ms, … capped at [`LONGEST_WATCH_RETRY`]; never gives up.
#[derive(Debug)]
struct Doubling {
    next: Duration,
}

impl Default for Doubling {
    fn default() -> Self {
        Self {
            next: FIRST_WATCH_RETRY,
        }
    }
}

impl Iterator for Doubling {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(LONGEST_WATCH_RETRY);
        Some(now)
    }
}

impl Backoff for Doubling {
    fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Doubling::default();
        let ms: Vec<u128> = (&mut b).take(7).map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(FIRST_WATCH_RETRY));
    }
}
