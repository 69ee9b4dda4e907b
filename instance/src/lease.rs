//! What this instance does with the primary Lease (`dbop_contract::lease`) at each look at it:
//! take it, renew it, release it, or leave it. The decisions only; `lease_keeper` reads and
//! writes the Lease and tells the supervisor until when it may accept writes.

use std::time::Duration;

use dbop_contract::lease::{LeaseState, RENEW_EVERY};

/// What to write to the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Become its holder (it is free and the topology names this instance).
    Take,
    /// Stamp it again (this instance holds it and may go on).
    Renew,
    /// Give it up (this instance holds it and its server has stopped).
    Release,
}

/// What the instance wants from the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The topology names this instance the primary and its server may run as one.
    Hold,
    /// Neither take nor renew it (a standby, or a primary that is stopping).
    Leave,
    /// Its server stopped: release it if held.
    Release,
}

/// What this process knows of the Lease at a look.
#[derive(Clone, Copy, Debug)]
pub struct Look<'a> {
    pub lease: &'a LeaseState,
    /// Who released it last (`RELEASED_BY_ANNOTATION`), if it is released.
    pub released_by: Option<&'a str>,
    pub now_ms: i64,
    /// How long ago this process last renewed it successfully (`None`: not since it started).
    pub since_renewed: Option<Duration>,
}

/// The step for `me` at `look`. A free Lease is taken, except by the instance that released it
/// while the operator may still fail over (`LeaseState::awaits_decision`).
pub fn step(look: Look<'_>, me: &str, want: Want) -> Step {
    let Look {
        lease,
        released_by,
        now_ms,
        since_renewed,
    } = look;
    let mine = lease.holder.as_deref() == Some(me);
    match want {
        Want::Release if mine => Step::Release,
        Want::Release | Want::Leave => Step::Nothing,
        Want::Hold if mine && since_renewed.is_some_and(|d| d < RENEW_EVERY) => Step::Nothing,
        Want::Hold if mine => Step::Renew,
        Want::Hold if lease.awaits_decision(me, released_by, now_ms) => Step::Nothing,
        Want::Hold if lease.free(now_ms) => Step::Take,
        Want::Hold => Step::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: i64) -> LeaseState {
        LeaseState {
            holder: holder.map(Into::into),
            renewed_ms: Some(renewed),
            duration_ms: 10_000,
            designated_ms: Some(0),
        }
    }

    /// The step at `now` of a Lease nobody released.
    fn step_at(
        lease: &LeaseState,
        me: &str,
        want: Want,
        now_ms: i64,
        since_renewed: Option<Duration>,
    ) -> Step {
        let look = Look {
            lease,
            released_by: None,
            now_ms,
            since_renewed,
        };
        step(look, me, want)
    }

    #[test]
    fn the_named_instance_takes_a_free_lease_and_renews_it_every_two_seconds() {
        let free = lease(None, 0);
        assert_eq!(step_at(&free, "a", Want::Hold, 1_000, None), Step::Take);
        let mine = lease(Some("a"), 1_000);
        let soon = Some(Duration::from_millis(1_500));
        assert_eq!(step_at(&mine, "a", Want::Hold, 2_500, soon), Step::Nothing);
        let later = Some(Duration::from_secs(2));
        assert_eq!(step_at(&mine, "a", Want::Hold, 3_000, later), Step::Renew);
        // A restarted manager renews the Lease it still holds at once.
        assert_eq!(step_at(&mine, "a", Want::Hold, 3_000, None), Step::Renew);
    }

    #[test]
    fn another_holders_lease_is_taken_only_once_it_expired() {
        let theirs = lease(Some("b"), 1_000);
        assert_eq!(
            step_at(&theirs, "a", Want::Hold, 11_000, None),
            Step::Nothing
        );
        assert_eq!(step_at(&theirs, "a", Want::Hold, 11_001, None), Step::Take);
    }

    #[test]
    fn a_stopping_or_stopped_instance_never_takes_and_releases_only_its_own() {
        let free = lease(None, 0);
        assert_eq!(
            step_at(&free, "a", Want::Leave, 50_000, None),
            Step::Nothing
        );
        assert_eq!(
            step_at(&free, "a", Want::Release, 50_000, None),
            Step::Nothing
        );
        let theirs = lease(Some("b"), 1_000);
        assert_eq!(
            step_at(&theirs, "a", Want::Release, 2_000, None),
            Step::Nothing
        );
        let mine = lease(Some("a"), 1_000);
        assert_eq!(step_at(&mine, "a", Want::Leave, 2_000, None), Step::Nothing);
        assert_eq!(
            step_at(&mine, "a", Want::Release, 2_000, None),
            Step::Release
        );
    }

    #[test]
    fn a_primary_back_after_releasing_the_lease_waits_for_the_operator_then_takes_it() {
        // "a" released it at 1 s (its postgres died) and its manager came back, still named.
        let released = lease(None, 1_000);
        let look = |now_ms| Look {
            lease: &released,
            released_by: Some("a"),
            now_ms,
            since_renewed: None,
        };
        assert_eq!(step(look(2_000), "a", Want::Hold), Step::Nothing);
        assert_eq!(step(look(11_001), "a", Want::Hold), Step::Take);
        // Another instance the operator names takes it at once.
        assert_eq!(step(look(2_000), "b", Want::Hold), Step::Take);
    }
}
