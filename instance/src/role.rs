//! Which role this instance plays, as the operator's topology says (`dbop_contract::topology`):
//! the decisions only. The operator decides who is the primary; these functions turn what the
//! manager observes (the topology file, its data directory, what it follows) into what it does:
//! at start (`start_plan`: as before, clone, follow, rejoin, wait), while it runs (`decide`:
//! follow a new primary, promote, fence), which of dbop's slots a primary drops
//! (`slot_actions`, with a grace period against a stale topology), when a standby is ready
//! (`standby_ready`) and how long a failed clone waits before the next try (`backoff`).
//!
//! Pure: no I/O. `role_start` and `role_watch` do what these decide.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dbop_contract::topology::{Member, Role, Topology};

use crate::replication::config::SLOT_PREFIX;
use crate::replication::status::Slot;

/// How long one of dbop's slots must have been inactive and absent from the topology before a
/// primary drops it: the topology this process reads may be older than a standby's (the kubelet
/// updates the mounted file up to a minute late), and that standby may have just made its slot.
pub const SLOT_GRACE: Duration = Duration::from_secs(300);

/// How long a standby named primary waits for the old primary to stop while it still streams
/// from it: a switchover's old primary sees the new topology up to a minute later (the
/// kubelet), and stops after sending its standbys all of its WAL. Promoting before would fork
/// the timeline before its last WAL (lost commits, and a rewind for the old primary).
pub const PROMOTE_GRACE: Duration = Duration::from_secs(75);

/// The first and the longest wait between two tries of a clone.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(15);

/// What the topology file says, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// No file: an older operator, or a single instance. Everything as before topologies.
    Missing,
    /// A file that does not parse (why): treated as if it had not changed.
    Invalid(String),
    Parsed(Topology),
}

/// What the data directory is, before the server starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Data {
    /// Missing or empty.
    Empty,
    /// Populated, with `standby.signal`.
    Standby,
    /// Populated, without it: a primary (or a former one), or files that are not a data
    /// directory at all (the start as before refuses those).
    Primary,
}

/// What to do before the server starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartPlan {
    /// Exactly as without a topology (initdb when empty, start on the data as it is). A
    /// standby's data named primary starts as a standby and is promoted once it answers.
    AsBefore,
    /// Clone the primary into the empty data directory.
    Clone(Member),
    /// Point the standby at the primary, then start.
    Follow(Member),
    /// Make the former primary a standby of the primary (rewind), then start.
    Rejoin(Member),
    /// Look at the topology again later (why, for one log line).
    Wait(String),
}

/// The start: what the data directory becomes, from the topology and what it holds.
pub fn start_plan(me: &str, read: &Read, data: Data) -> StartPlan {
    let topology = match read {
        Read::Missing => return StartPlan::AsBefore,
        Read::Invalid(_) if data == Data::Primary => return StartPlan::AsBefore,
        Read::Invalid(why) => {
            return StartPlan::Wait(format!("the topology does not parse: {why}"));
        }
        Read::Parsed(topology) => topology,
    };
    let (Some(role), Some(primary)) = (topology.role_of(me), topology.primary_member()) else {
        return StartPlan::Wait(format!(
            "this instance ({me}) is not one of the topology's instances yet"
        ));
    };
    match (role, data) {
        (Role::Primary, _) => StartPlan::AsBefore,
        (Role::Standby, Data::Empty) => StartPlan::Clone(primary.clone()),
        (Role::Standby, Data::Standby) => StartPlan::Follow(primary.clone()),
        (Role::Standby, Data::Primary) => StartPlan::Rejoin(primary.clone()),
    }
}

/// The start of an instance that follows the primary Lease: `plan` (`start_plan`) waits for a
/// topology that parses (never a start as before on a Lease not read yet), and a primary's data
/// starts only once this instance `holds` the Lease, unless it is the only instance. A
/// standby's data named primary starts as a standby (it is promoted once it holds the Lease).
pub fn leased_start(plan: StartPlan, me: &str, read: &Read, data: Data, holds: bool) -> StartPlan {
    let topology = match read {
        Read::Parsed(topology) => topology,
        Read::Missing => return StartPlan::Wait("the primary Lease is not read yet".into()),
        Read::Invalid(why) => {
            return StartPlan::Wait(format!("the primary Lease's topology: {why}"));
        }
    };
    let primary = topology.role_of(me) == Some(Role::Primary);
    let alone = topology.members.len() == 1;
    if plan == StartPlan::AsBefore && primary && !alone && data != Data::Standby && !holds {
        return StartPlan::Wait(
            "this instance is named the primary: waiting to hold the primary Lease (the old \
             primary releases it when its server stops, or it expires)"
                .into(),
        );
    }
    plan
}

/// A running primary that follows the Lease must stop accepting writes: the topology has
/// standbys (one of them could be promoted) and it `may_write` no more. A topology not read
/// keeps the last one's verdict through `may_write` alone.
pub fn fenced(read: &Read, may_write: bool) -> bool {
    let alone = matches!(read, Read::Parsed(t) if t.members.len() == 1);
    !alone && !may_write
}

/// What to do while the server runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Repoint the standby at this primary (a reload).
    Follow(Member),
    /// The standby is named primary: promote it.
    Promote,
    /// The primary is no longer named primary: stop it (the new primary's name), so that it
    /// comes back as a standby.
    Fence(String),
}

/// While the server runs: `standby` says whether it runs as a standby (`standby.signal`),
/// `following` the primary it streams from. A topology that is missing, does not parse or does
/// not name this instance changes nothing.
pub fn decide(me: &str, read: &Read, standby: bool, following: Option<&Member>) -> Action {
    let Read::Parsed(topology) = read else {
        return Action::Nothing;
    };
    let (Some(role), Some(primary)) = (topology.role_of(me), topology.primary_member()) else {
        return Action::Nothing;
    };
    match (role, standby) {
        (Role::Primary, true) => Action::Promote,
        (Role::Primary, false) => Action::Nothing,
        (Role::Standby, false) => Action::Fence(primary.name.clone()),
        (Role::Standby, true) if following != Some(primary) => Action::Follow(primary.clone()),
        (Role::Standby, true) => Action::Nothing,
    }
}

/// How long a standby repointed at a new primary by a reload may take to stream from it before
/// it restarts to check its timeline against it: time for the new primary to finish promoting
/// and for the WAL receiver's retry (`wal_retrieve_retry_interval`, 5 s) twice.
pub const FOLLOW_GRACE: Duration = Duration::from_secs(15);

/// Where a standby repointed by a reload stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repointed {
    /// It streams from the new primary: done.
    Streaming,
    /// It is no standby any more (named primary and promoted meanwhile): nothing to follow.
    Promoted,
    /// Not yet, within `FOLLOW_GRACE`: look again.
    Waiting,
    /// Not within the grace: PostgreSQL refuses to follow a timeline that forked before the
    /// WAL this standby already replayed (and retries for ever), and only a start can rewind.
    Restart,
}

/// Whether a repointed standby (`standby`: it still is one) streams from `primary_host`, given
/// the WAL receiver's `status|sender_host` (`pg_stat_wal_receiver`; empty: none runs), waited
/// for `since`.
pub fn repointed(
    standby: bool,
    receiver: &str,
    primary_host: &str,
    since: Duration,
    grace: Duration,
) -> Repointed {
    let (status, sender) = receiver
        .trim()
        .split_once('|')
        .unwrap_or((receiver.trim(), ""));
    if !standby {
        Repointed::Promoted
    } else if streaming(Some(status)) && sender == primary_host {
        Repointed::Streaming
    } else if since < grace {
        Repointed::Waiting
    } else {
        Repointed::Restart
    }
}

/// Whether a standby named primary promotes now: once it no longer streams from the old
/// primary (which stopped, or is gone), or when the old one has had `grace` since this
/// instance first saw itself named (`named_for`) and still streams.
pub fn promote_now(streaming: bool, named_for: Duration, grace: Duration) -> bool {
    !streaming || named_for >= grace
}

/// What a primary does about slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotActions {
    pub create: Vec<String>,
    pub drop: Vec<String>,
    /// dbop's unwanted, inactive slots and since when this process has seen them so: the
    /// `unwanted_since` of the next call.
    pub unwanted_since: BTreeMap<String, Instant>,
}

/// The slots to create (every `wanted` one missing, at once) and to drop: one of dbop's that
/// has been inactive and not wanted, as this process observed it, for `grace`. A slot that is
/// active or wanted again starts its wait anew. Slots without dbop's prefix are never touched.
pub fn slot_actions(
    existing: &[Slot],
    wanted: &[String],
    unwanted_since: &BTreeMap<String, Instant>,
    now: Instant,
    grace: Duration,
) -> SlotActions {
    let mut out = SlotActions::default();
    for w in wanted {
        if !existing.iter().any(|s| &s.name == w) && !out.create.contains(w) {
            out.create.push(w.clone());
        }
    }
    for s in existing {
        if !s.name.starts_with(SLOT_PREFIX) || wanted.contains(&s.name) || s.active {
            continue;
        }
        let since = unwanted_since.get(&s.name).copied().unwrap_or(now);
        if now.saturating_duration_since(since) >= grace {
            out.drop.push(s.name.clone());
        } else {
            out.unwanted_since.insert(s.name.clone(), since);
        }
    }
    out
}

/// How long a standby that streamed stays ready after its stream stopped: long enough for the
/// operator to see the primary lost and name it (the primary Lease's duration, and a look), so
/// the standbys of a failed primary remain candidates; a standby that never streamed never is.
pub const STREAM_GRACE: Duration = Duration::from_secs(30);

/// Whether the WAL receiver streams (`pg_stat_wal_receiver.status`, `None`: none runs).
pub fn streaming(receiver: Option<&str>) -> bool {
    receiver.map(str::trim) == Some("streaming")
}

/// A standby is ready when it accepts connections and its WAL receiver streams, or streamed
/// less than `STREAM_GRACE` ago (`since_streamed`: `None` when it never did in this process).
pub fn standby_ready(
    accepting: bool,
    receiver: Option<&str>,
    since_streamed: Option<Duration>,
) -> bool {
    accepting && (streaming(receiver) || since_streamed.is_some_and(|d| d < STREAM_GRACE))
}

/// The wait after `previous` (`None`: after the first failure).
pub fn backoff(previous: Option<Duration>) -> Duration {
    match previous {
        None => BACKOFF_FIRST,
        Some(d) => (d * 2).clamp(BACKOFF_FIRST, BACKOFF_MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            host: format!("{name}.db-hl.ns.svc"),
            port: 5432,
        }
    }

    fn topology(primary: &str, names: &[&str]) -> Read {
        Read::Parsed(Topology {
            primary: primary.into(),
            members: names.iter().map(|n| member(n)).collect(),
            synchronous: None,
        })
    }

    #[test]
    fn start_plans() {
        let two = topology("db-0", &["db-0", "db-1"]);
        let bad = Read::Invalid("line 1".into());
        let wait = |p: &StartPlan| matches!(p, StartPlan::Wait(_));
        let table: Vec<(&str, &Read, Data, StartPlan)> = vec![
            ("db-0", &Read::Missing, Data::Empty, StartPlan::AsBefore),
            ("db-0", &Read::Missing, Data::Standby, StartPlan::AsBefore),
            ("db-1", &Read::Missing, Data::Primary, StartPlan::AsBefore),
            ("db-0", &bad, Data::Primary, StartPlan::AsBefore),
            ("db-0", &two, Data::Empty, StartPlan::AsBefore),
            ("db-0", &two, Data::Primary, StartPlan::AsBefore),
            ("db-0", &two, Data::Standby, StartPlan::AsBefore),
            ("db-1", &two, Data::Empty, StartPlan::Clone(member("db-0"))),
            (
                "db-1",
                &two,
                Data::Standby,
                StartPlan::Follow(member("db-0")),
            ),
            (
                "db-1",
                &two,
                Data::Primary,
                StartPlan::Rejoin(member("db-0")),
            ),
        ];
        for (me, read, data, want) in table {
            assert_eq!(start_plan(me, read, data), want, "{me} {read:?} {data:?}");
        }
        for (me, read, data) in [
            ("db-0", &bad, Data::Empty),
            ("db-0", &bad, Data::Standby),
            ("db-2", &two, Data::Empty),
            ("db-2", &two, Data::Primary),
            ("db-2", &two, Data::Standby),
        ] {
            assert!(wait(&start_plan(me, read, data)), "{me} {read:?} {data:?}");
        }
    }

    #[test]
    fn running_decisions() {
        let on0 = topology("db-0", &["db-0", "db-1", "db-2"]);
        let on1 = topology("db-1", &["db-0", "db-1", "db-2"]);
        let (m0, m1) = (member("db-0"), member("db-1"));
        let moved = Member {
            port: 5433,
            ..m0.clone()
        };
        let bad = Read::Invalid("x".into());
        let table: Vec<(&str, &Read, bool, Option<&Member>, Action)> = vec![
            // Nothing to follow: no topology, a bad one, or not a member.
            ("db-1", &Read::Missing, true, Some(&m0), Action::Nothing),
            ("db-0", &Read::Missing, false, None, Action::Nothing),
            ("db-1", &bad, true, Some(&m1), Action::Nothing),
            ("db-0", &bad, false, None, Action::Nothing),
            ("db-9", &on1, true, Some(&m0), Action::Nothing),
            ("db-9", &on1, false, None, Action::Nothing),
            // As it should be.
            ("db-0", &on0, false, None, Action::Nothing),
            ("db-1", &on0, true, Some(&m0), Action::Nothing),
            // The primary changed, or moved.
            ("db-2", &on1, true, Some(&m0), Action::Follow(m1.clone())),
            ("db-2", &on0, true, None, Action::Follow(m0.clone())),
            ("db-2", &on0, true, Some(&moved), Action::Follow(m0.clone())),
            // Named primary while a standby; a primary no more.
            ("db-1", &on1, true, Some(&m0), Action::Promote),
            ("db-0", &on1, false, None, Action::Fence("db-1".into())),
        ];
        for (me, read, standby, following, want) in table {
            assert_eq!(
                decide(me, read, standby, following),
                want,
                "{me} {read:?} standby={standby} following={following:?}"
            );
        }
    }

    fn slot(name: &str, active: bool) -> Slot {
        Slot {
            name: name.into(),
            active,
            restart_lsn: None,
        }
    }

    #[test]
    fn slots_are_created_at_once_and_dropped_after_the_grace_period() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(300);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let existing = [
            slot("dbop_db_1", false),
            slot("dbop_db_2", false),
            slot("dbop_gone", true),
            slot("someone_elses", false),
        ];
        let wanted = ["dbop_db_1".to_string(), "dbop_db_3".to_string()];
        let first = slot_actions(&existing, &wanted, &BTreeMap::new(), at(0), grace);
        assert_eq!(first.create, ["dbop_db_3"]);
        assert!(first.drop.is_empty(), "nothing dropped on first sight");
        assert_eq!(
            first.unwanted_since.keys().collect::<Vec<_>>(),
            ["dbop_db_2"]
        );
        let table = [(10, false), (299, false), (300, true), (3000, true)];
        for (seconds, dropped) in table {
            let next = slot_actions(
                &existing,
                &wanted,
                &first.unwanted_since,
                at(seconds),
                grace,
            );
            assert_eq!(!next.drop.is_empty(), dropped, "after {seconds} s");
            assert_eq!(next.drop.contains(&"dbop_db_2".to_string()), dropped);
            assert_eq!(next.unwanted_since.contains_key("dbop_db_2"), !dropped);
        }
        // Active again, or wanted again: the wait starts anew.
        let active = [slot("dbop_db_2", true)];
        let reset = slot_actions(&active, &[], &first.unwanted_since, at(400), grace);
        assert!(reset.drop.is_empty() && reset.unwanted_since.is_empty());
        let back = ["dbop_db_2".to_string()];
        let reset = slot_actions(&existing[..2], &back, &first.unwanted_since, at(400), grace);
        assert!(!reset.unwanted_since.contains_key("dbop_db_2") && reset.drop.is_empty());
        let later = slot_actions(&existing[..2], &[], &reset.unwanted_since, at(401), grace);
        assert!(later.drop.is_empty(), "{later:?}");
        // A wanted name twice is created once.
        let twice = ["dbop_x".to_string(), "dbop_x".to_string()];
        let made = slot_actions(&[], &twice, &BTreeMap::new(), at(0), grace);
        assert_eq!(made.create, ["dbop_x"]);
    }

    #[test]
    fn a_standby_named_primary_waits_for_the_old_one_to_stop_streaming() {
        let grace = Duration::from_secs(75);
        let table = [
            (false, 0, true),
            (false, 80, true),
            (true, 0, false),
            (true, 74, false),
            (true, 75, true),
            (true, 600, true),
        ];
        for (streaming, seconds, want) in table {
            let named_for = Duration::from_secs(seconds);
            assert_eq!(
                promote_now(streaming, named_for, grace),
                want,
                "{streaming} {seconds}"
            );
        }
    }

    #[test]
    fn a_standby_is_ready_when_it_answers_and_streams() {
        let table = [
            (true, Some("streaming"), true),
            (true, Some("streaming\n"), true),
            (false, Some("streaming"), false),
            (true, Some("waiting"), false),
            (true, Some("starting"), false),
            (true, None, false),
        ];
        for (accepting, receiver, want) in table {
            assert_eq!(
                standby_ready(accepting, receiver, None),
                want,
                "{receiver:?}"
            );
        }
    }

    #[test]
    fn a_repointed_standby_is_done_once_it_streams_from_the_new_primary_and_restarts_after_the_grace()
     {
        let new = "orders-1.orders-pods.db.svc";
        let grace = FOLLOW_GRACE;
        let s = Duration::from_secs;
        let table = [
            (
                "streaming|orders-1.orders-pods.db.svc\n",
                s(0),
                Repointed::Streaming,
            ),
            (
                "streaming|orders-1.orders-pods.db.svc",
                s(20),
                Repointed::Streaming,
            ),
            // Still the old primary's stream, or the new one's not yet streaming.
            (
                "streaming|orders-0.orders-pods.db.svc",
                s(3),
                Repointed::Waiting,
            ),
            (
                "starting|orders-1.orders-pods.db.svc",
                s(3),
                Repointed::Waiting,
            ),
            ("", s(14), Repointed::Waiting),
            // A timeline PostgreSQL refuses to follow: the WAL receiver never streams.
            ("", s(15), Repointed::Restart),
            (
                "waiting|orders-1.orders-pods.db.svc",
                s(15),
                Repointed::Restart,
            ),
            (
                "streaming|orders-0.orders-pods.db.svc",
                s(16),
                Repointed::Restart,
            ),
        ];
        for (receiver, since, want) in table {
            assert_eq!(
                repointed(true, receiver, new, since, grace),
                want,
                "{receiver:?} {since:?}"
            );
        }
        // Named primary and promoted before it streamed: never restarted for the old reload.
        for since in [s(3), s(15), s(60)] {
            assert_eq!(repointed(false, "", new, since, grace), Repointed::Promoted);
        }
    }

    #[test]
    fn a_standby_that_streamed_stays_ready_for_the_grace_and_one_that_never_did_is_not() {
        let ago = |s| Some(Duration::from_secs(s));
        assert!(standby_ready(true, Some("waiting"), ago(29)));
        assert!(!standby_ready(true, Some("waiting"), ago(30)));
        assert!(!standby_ready(true, None, None));
        assert!(!standby_ready(false, None, ago(1)));
    }

    #[test]
    fn with_a_lease_a_primary_starts_only_while_it_holds_it() {
        let named = topology("a", &["a", "b"]);
        for data in [Data::Empty, Data::Primary] {
            let plan = start_plan("a", &named, data);
            assert_eq!(plan, StartPlan::AsBefore);
            assert!(matches!(
                leased_start(plan.clone(), "a", &named, data, false),
                StartPlan::Wait(_)
            ));
            assert_eq!(
                leased_start(plan, "a", &named, data, true),
                StartPlan::AsBefore
            );
        }
        // A standby's data starts as a standby; it is promoted once it holds the Lease.
        let plan = start_plan("a", &named, Data::Standby);
        assert_eq!(
            leased_start(plan, "a", &named, Data::Standby, false),
            StartPlan::AsBefore
        );
        // A single instance does not wait for the Lease.
        let alone = topology("a", &["a"]);
        let plan = start_plan("a", &alone, Data::Primary);
        assert_eq!(
            leased_start(plan, "a", &alone, Data::Primary, false),
            StartPlan::AsBefore
        );
        // A standby's start does not wait for the Lease.
        let plan = start_plan("b", &named, Data::Primary);
        assert!(matches!(plan, StartPlan::Rejoin(_)));
        assert_eq!(
            leased_start(plan.clone(), "b", &named, Data::Primary, false),
            plan
        );
    }

    #[test]
    fn a_primary_is_fenced_when_it_may_not_write_unless_it_is_alone() {
        assert!(fenced(&topology("a", &["a", "b"]), false));
        assert!(!fenced(&topology("a", &["a", "b"]), true));
        assert!(!fenced(&topology("a", &["a"]), false));
        assert!(fenced(&Read::Invalid("not read".into()), false));
    }

    #[test]
    fn with_a_lease_nothing_starts_before_its_topology_is_read() {
        for read in [Read::Missing, Read::Invalid("not read yet".into())] {
            // Without a Lease a former primary's data would start as before.
            assert_eq!(start_plan("a", &read, Data::Primary), StartPlan::AsBefore);
            let plan = leased_start(StartPlan::AsBefore, "a", &read, Data::Primary, true);
            assert!(matches!(plan, StartPlan::Wait(_)), "{read:?}");
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_up_to_fifteen() {
        let mut seen = Vec::new();
        let mut last = None;
        for _ in 0..7 {
            let next = backoff(last);
            seen.push(next.as_secs());
            last = Some(next);
        }
        assert_eq!(seen, [1, 2, 4, 8, 15, 15, 15]);
        assert_eq!(backoff(Some(Duration::ZERO)), BACKOFF_FIRST);
    }
}
