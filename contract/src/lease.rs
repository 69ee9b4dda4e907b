//! The primary lease: how a Database with standbys never has two primaries, and how the operator
//! tells its instances who the primary is without waiting for the kubelet.
//!
//! One `coordination.k8s.io/v1` Lease per Database (`lease_name`), made by the operator. Two
//! writers, each compare-and-swap on its `resourceVersion`:
//! - the **operator** designates the primary: the Lease's `TOPOLOGY_ANNOTATION` holds the
//!   topology (`topology::Topology::render`), `DESIGNATED_AT_ANNOTATION` when the primary it
//!   names was chosen;
//! - the **instance** the topology names takes the Lease (`holderIdentity`) when it is free or
//!   expired, renews it every `RENEW_EVERY`, and releases it only after its server stopped.
//!
//! The rules (`LeaseState`): an instance runs as the primary (accepts writes) only while it
//! holds the Lease, and stops accepting writes `FENCE_MARGIN` before the Lease could expire as
//! the others see it (counted from the start of its last successful renewal, on its own clock).
//! Another instance may take the Lease only once it expired or was released. So at no moment
//! do two instances accept writes, whether or not the operator runs, provided the clocks of the
//! nodes differ by less than the margin minus the time a fence takes (documented in
//! `docs/high-availability.md`). The operator fails over when the primary it named has lost its
//! Lease (`LeaseState::lost`). Pure: times are Unix milliseconds, passed in.

use std::time::Duration;

/// The annotation with the topology the operator designates (`topology::Topology::render`).
pub const TOPOLOGY_ANNOTATION: &str = "dbop.dev/topology";
/// The annotation with when the topology's primary was designated (Unix milliseconds).
pub const DESIGNATED_AT_ANNOTATION: &str = "dbop.dev/designated-at";
/// How long a Lease stays valid after its last renewal, as the others judge it.
pub const DURATION_SECONDS: i32 = 10;
/// How often the holder renews.
pub const RENEW_EVERY: Duration = Duration::from_secs(2);
/// How long before the others could take the Lease its holder stops accepting writes: covers
/// the manager's poll, the fence itself and the clock difference between nodes.
pub const FENCE_MARGIN: Duration = Duration::from_secs(4);

/// The Lease of the Database `database`.
pub fn lease_name(database: &str) -> String {
    format!("{database}-primary")
}

/// The Lease as both sides read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// The instance that holds it (`None`: never taken, or released).
    pub holder: Option<String>,
    /// Its last renewal (or release), Unix milliseconds.
    pub renewed_ms: Option<i64>,
    /// `leaseDurationSeconds` in milliseconds.
    pub duration_ms: i64,
    /// When the operator designated the topology's primary.
    pub designated_ms: Option<i64>,
}

impl LeaseState {
    /// No instance may be accepting writes under it: released, never taken, or its holder
    /// has not renewed for the whole duration.
    pub fn free(&self, now_ms: i64) -> bool {
        self.holder.is_none()
            || self
                .renewed_ms
                .is_none_or(|r| now_ms > r + self.duration_ms)
    }

    /// `me` may take (or keep) the Lease now.
    pub fn may_take(&self, me: &str, now_ms: i64) -> bool {
        self.holder.as_deref() == Some(me) || self.free(now_ms)
    }

    /// The operator's view: `primary`, the instance it designated, is lost. Either it held the
    /// Lease and has not renewed it for the whole duration, or it has not taken it within the
    /// whole duration since it could first take it (it released it when its server stopped, or
    /// never took it).
    pub fn lost(&self, primary: &str, now_ms: i64) -> bool {
        now_ms > self.lost_at(primary)
    }

    /// When `primary` will be lost if nothing changes (Unix milliseconds). A designated primary
    /// that does not hold the Lease has its whole duration from the later of its designation
    /// and the moment the Lease became free: in a switchover the old primary holds it until its
    /// server has stopped (a fast shutdown sends its standbys all of its WAL first, which can
    /// take longer than the duration), and the new one cannot take it before.
    pub fn lost_at(&self, primary: &str) -> i64 {
        let since = match self.holder.as_deref() {
            Some(h) if h == primary => self.renewed_ms.unwrap_or(0),
            _ => self.designated_ms.unwrap_or(0).max(self.free_since()),
        };
        since + self.duration_ms
    }

    /// Since when the Lease may be taken (Unix milliseconds): its release, or once its holder's
    /// last renewal is the whole duration old (0: never taken).
    fn free_since(&self) -> i64 {
        let renewed = self.renewed_ms.unwrap_or(0);
        match self.holder {
            Some(_) => renewed + self.duration_ms,
            None => renewed,
        }
    }

    /// The Lease was released by `primary` (its server stopped on purpose, or died): the
    /// operator need not wait for it to expire.
    pub fn released_by(&self, primary: &str, released_by: Option<&str>) -> bool {
        self.holder.is_none() && released_by == Some(primary)
    }

    /// `me` released the Lease (its server stopped or died) and is back before the operator
    /// decided: it leaves the Lease to that decision — a failover to a standby, or a new
    /// designation — for the Lease's duration after its release, and takes it again on its own
    /// only then (the operator may be down). A primary whose postgres crashed and whose
    /// container restarted at once took the Lease back first, and a ready standby was never
    /// promoted.
    pub fn awaits_decision(&self, me: &str, released_by: Option<&str>, now_ms: i64) -> bool {
        let released_at = self.renewed_ms.unwrap_or(0);
        self.released_by(me, released_by)
            && self.designated_ms.unwrap_or(0) <= released_at
            && now_ms <= released_at + self.duration_ms
    }
}

/// How long after the start of its last successful renewal a holder may accept writes.
pub fn holder_validity(duration_ms: i64) -> Duration {
    Duration::from_millis(duration_ms.max(0) as u64).saturating_sub(FENCE_MARGIN)
}

/// How much longer `me`, the designated primary, may go on writing without holding the Lease:
/// only while nobody holds it (never taken since it was designated) and the designation is
/// younger than a holder's validity, for the operator judges such a primary lost only once the
/// designation is the Lease's duration old. Lets a running single instance scaled up keep
/// running while it takes the Lease. `None` once another holds it, or the grace is over.
pub fn designation_grace(
    lease: &LeaseState,
    released_by: Option<&str>,
    me: &str,
    now_ms: i64,
) -> Option<Duration> {
    if lease.holder.is_some() || released_by == Some(me) {
        return None;
    }
    let end = lease.designated_ms? + holder_validity(lease.duration_ms).as_millis() as i64;
    (end > now_ms).then(|| Duration::from_millis((end - now_ms) as u64))
}

/// The annotation an instance sets when it releases the Lease (its name).
pub const RELEASED_BY_ANNOTATION: &str = "dbop.dev/released-by";

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, renewed: i64) -> LeaseState {
        LeaseState {
            holder: Some(by.into()),
            renewed_ms: Some(renewed),
            duration_ms: 10_000,
            designated_ms: Some(0),
        }
    }

    #[test]
    fn a_held_lease_is_taken_only_by_its_holder_until_it_expires() {
        let lease = held("orders-0", 100_000);
        assert!(lease.may_take("orders-0", 105_000));
        assert!(!lease.may_take("orders-1", 110_000));
        assert!(lease.may_take("orders-1", 110_001));
        let released = LeaseState {
            holder: None,
            ..lease
        };
        assert!(released.may_take("orders-1", 100_001));
    }

    #[test]
    fn the_holder_stops_writing_a_margin_before_others_may_take_it() {
        let validity = holder_validity(10_000);
        assert_eq!(validity, Duration::from_secs(6));
        // The holder's renewal started at 100 s and was stamped no earlier: others may take it
        // after 110 s, the holder stopped at 106 s.
        assert!(100_000 + validity.as_millis() as i64 + FENCE_MARGIN.as_millis() as i64 <= 110_000);
        assert_eq!(holder_validity(2_000), Duration::ZERO);
    }

    #[test]
    fn the_designated_primary_is_lost_when_it_stops_renewing_or_never_takes_the_lease() {
        let lease = held("orders-0", 100_000);
        assert!(!lease.lost("orders-0", 110_000));
        assert!(lease.lost("orders-0", 110_001));
        assert_eq!(lease.lost_at("orders-0"), 110_000);
        // orders-1 was designated at 112 s, once the old holder's Lease had run out (a failover).
        let designated = LeaseState {
            designated_ms: Some(112_000),
            ..lease.clone()
        };
        assert!(!designated.lost("orders-1", 122_000));
        assert!(designated.lost("orders-1", 122_001));
        let released = LeaseState {
            holder: None,
            ..lease
        };
        assert!(released.released_by("orders-0", Some("orders-0")));
        assert!(!released.released_by("orders-0", Some("orders-1")));
    }

    #[test]
    fn a_switchovers_new_primary_is_given_the_whole_duration_from_the_old_ones_release() {
        // orders-0 renewed at 100 s; orders-1 was designated at 101 s (a switchover). The old
        // primary's fast shutdown lasts: it stopped renewing, and still holds the Lease.
        let switching = LeaseState {
            designated_ms: Some(101_000),
            ..held("orders-0", 100_000)
        };
        // orders-1 may take it from 110 s, when the old holder's last renewal is 10 s old.
        assert!(!switching.lost("orders-1", 111_001));
        assert_eq!(switching.lost_at("orders-1"), 120_000);
        // The old primary's server stopped at 115 s and it released the Lease then.
        let released = LeaseState {
            holder: None,
            renewed_ms: Some(115_000),
            ..switching
        };
        assert!(!released.lost("orders-1", 124_000));
        assert!(released.lost("orders-1", 125_001));
        // A release long before the designation: counted from the designation.
        let long_free = LeaseState {
            designated_ms: Some(200_000),
            ..released
        };
        assert_eq!(long_free.lost_at("orders-1"), 210_000);
    }

    #[test]
    fn a_primary_back_after_its_release_leaves_the_lease_to_the_operator_for_its_duration() {
        // orders-0, designated at 0, released the Lease at 100 s (its postgres died).
        let released = LeaseState {
            holder: None,
            ..held("orders-0", 100_000)
        };
        let mine = Some("orders-0");
        assert!(released.awaits_decision("orders-0", mine, 100_500));
        assert!(released.awaits_decision("orders-0", mine, 110_000));
        // No decision within the Lease's duration (no operator, no ready standby): its own again.
        assert!(!released.awaits_decision("orders-0", mine, 110_001));
        // Designated anew after the release: at once.
        let designated_again = LeaseState {
            designated_ms: Some(101_000),
            ..released.clone()
        };
        assert!(!designated_again.awaits_decision("orders-0", mine, 101_500));
        // Others are not held back by its release, nor is it by another's.
        assert!(!released.awaits_decision("orders-1", mine, 100_500));
        assert!(!released.awaits_decision("orders-0", Some("orders-1"), 100_500));
    }

    #[test]
    fn a_designated_primary_may_write_unheld_only_briefly_and_only_while_nobody_holds_it() {
        let designated = LeaseState {
            holder: None,
            renewed_ms: None,
            duration_ms: 10_000,
            designated_ms: Some(100_000),
        };
        assert_eq!(
            designation_grace(&designated, None, "a", 101_000),
            Some(Duration::from_secs(5))
        );
        assert_eq!(designation_grace(&designated, None, "a", 106_000), None);
        // The operator may fail over only after 110 s: the grace ends a margin before.
        assert!(!designated.lost("a", 106_000) && designated.lost("a", 110_001));
        assert_eq!(
            designation_grace(&designated, Some("a"), "a", 101_000),
            None
        );
        let held = LeaseState {
            holder: Some("b".into()),
            ..designated
        };
        assert_eq!(designation_grace(&held, None, "a", 101_000), None);
    }
}
