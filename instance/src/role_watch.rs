//! While the server runs: follows the topology file (`Keeper`). A standby repoints at a new
//! primary (a reload; under a primary Lease watched until it streams from it, and restarted to
//! check its timeline if it does not in time) or is promoted when the topology names it; a
//! primary that is no longer named is fenced (the supervisor stops it, and it starts again as a
//! standby); a primary keeps the replication role's password the mounted one's and a slot for
//! every standby, dropping dbop's others only after `role::SLOT_GRACE`, and sets
//! `synchronous_standby_names` as the topology's synchronous replication says. With a primary
//! Lease (`lease_keeper`) the topology is the Lease's, a standby promotes only once it holds the
//! Lease and a primary whose hold ran out is fenced at the next poll.
//!
//! The decisions are `role`'s; this module reads files, runs SQL and writes the standby file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use dbop_contract::topology::{Member, Topology};

use crate::password::{self, Fingerprint};
use crate::replication::config;
use crate::replication::ops::{self, LocalServer};
use crate::replication::status::SlotPlan;
use crate::role::{self, Action, Read};
use crate::role_start::{self, once};
use crate::run::{Fatal, Options};

fn log(message: &str) {
    eprintln!("dbop-instance: {message}");
}

/// How often the topology file is read (the kubelet updates it within about a minute).
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How often a primary checks its replication role and slots when nothing changed.
pub const DUTIES_EVERY: Duration = Duration::from_secs(10);
/// How long a promotion may take.
const PROMOTE_SECONDS: u32 = 60;

/// Follows the topology while the server runs.
pub struct Keeper<'a> {
    o: &'a Options,
    server: LocalServer,
    /// This instance's name (`None`: unknown, so it follows no topology).
    me: Option<String>,
    /// The last topology that parsed (or `Missing`).
    last: Read,
    following: Option<Member>,
    checked: Option<Instant>,
    duties_done: Option<Instant>,
    role_password: Option<Fingerprint>,
    unwanted_since: BTreeMap<String, Instant>,
    problem: Option<String>,
    /// Since when this standby has seen itself named primary.
    named_primary: Option<Instant>,
    /// The new primary a reload repointed this standby at, and since when, until it streams.
    repointed: Option<(Member, Instant)>,
}

impl<'a> Keeper<'a> {
    pub fn new(o: &'a Options, bin: &Path, user: &str, following: Option<Member>) -> Self {
        Self {
            o,
            server: LocalServer {
                bin: bin.to_path_buf(),
                socket_dir: o.socket_dir.clone(),
                port: o.port,
                superuser: user.to_string(),
            },
            me: role_start::instance_name(o).ok(),
            last: Read::Missing,
            following,
            checked: None,
            duties_done: None,
            role_password: None,
            unwanted_since: BTreeMap::new(),
            problem: None,
            named_primary: None,
            repointed: None,
        }
    }

    /// Called at every poll of the running server; `applied`: the superuser's password is
    /// applied (the server accepts connections and writes). Returns why to fence the server.
    pub fn tick(&mut self, applied: bool) -> Option<String> {
        if let Some(lease) = &self.o.lease
            && role::fenced(&role_start::topology(self.o), lease.may_write())
            && !config::is_standby(&self.o.pgdata)
        {
            return Some(LEASE_LOST.to_string());
        }
        // The Lease's topology is in memory: read at every poll. The file, every CHECK_EVERY.
        let every = if self.o.lease.is_some() {
            Duration::ZERO
        } else {
            CHECK_EVERY
        };
        if self.checked.is_some_and(|t| t.elapsed() < every) {
            return None;
        }
        self.checked = Some(Instant::now());
        let me = self.me.clone()?;
        let read = match role_start::topology(self.o) {
            Read::Invalid(why) => {
                self.problem(format!("the topology is ignored (as if unchanged): {why}"));
                self.last.clone()
            }
            read => read,
        };
        let changed = read != self.last;
        self.last = read.clone();
        let standby = config::is_standby(&self.o.pgdata);
        let action = role::decide(&me, &read, standby, self.following.as_ref());
        if action != Action::Promote {
            self.named_primary = None;
        }
        match action {
            Action::Fence(primary) => return Some(stepped_down(&primary)),
            Action::Promote => self.promote_when_safe(),
            // Under a primary Lease a new primary's timeline may have forked before this
            // standby's last WAL (a failover): the reload is tried and watched, and a standby
            // that does not stream from the new primary in time restarts, which checks the
            // timeline and rewinds (`check_repointed`).
            Action::Follow(primary) if self.o.lease.is_some() => {
                self.follow(&me, &primary);
                if self.following.as_ref() != Some(&primary) {
                    return Some(rejoining(&primary.name));
                }
                self.repointed = Some((primary, Instant::now()));
            }
            Action::Follow(primary) => self.follow(&me, &primary),
            Action::Nothing => {
                if let Some(why) = self.check_repointed() {
                    return Some(why);
                }
            }
        }
        // Degraded synchronous replication follows who streams: looked at more often.
        let every = match &read {
            Read::Parsed(t) if t.synchronous.is_some_and(|s| !s.wait) => CHECK_EVERY,
            _ => DUTIES_EVERY,
        };
        let due = self.duties_done.is_none_or(|t| t.elapsed() >= every);
        if let Read::Parsed(topology) = &read
            && applied
            && !config::is_standby(&self.o.pgdata)
            && (changed || due)
        {
            self.duties(topology);
        }
        None
    }

    fn problem(&mut self, message: String) {
        once(&mut self.problem, message);
    }

    /// Promotes once the old primary no longer streams to this standby (`role::promote_now`).
    fn promote_when_safe(&mut self) {
        if let Some(lease) = &self.o.lease {
            // The Lease is free only once the old primary released it after its server stopped
            // (its standbys have all of its WAL) or it expired (the old primary fenced itself).
            if lease.holds() {
                return self.promote();
            }
            return self.problem(
                "the topology names this instance the primary: promoting it once it holds the \
                 primary Lease"
                    .into(),
            );
        }
        let since = *self.named_primary.get_or_insert_with(Instant::now);
        let streaming = self
            .server
            .query("SELECT status FROM pg_stat_wal_receiver;\n")
            .is_ok_and(|s| s.trim() == "streaming");
        if role::promote_now(streaming, since.elapsed(), role::PROMOTE_GRACE) {
            self.promote();
        } else {
            self.problem(format!(
                "the topology names this instance the primary: promoting it once the old \
                 primary stops streaming to it (at most {} s)",
                role::PROMOTE_GRACE.as_secs()
            ));
        }
    }

    fn promote(&mut self) {
        log("the topology names this instance the primary: promoting it");
        let done = self
            .server
            .promote(PROMOTE_SECONDS)
            .and_then(|()| ops::write_standby_config(&self.o.pgdata, None));
        match done {
            Ok(()) => {
                log("promoted: the server accepts writes");
                self.following = None;
                self.repointed = None;
                self.role_password = None;
                self.duties_done = None;
            }
            Err(Fatal(why)) => self.problem(format!("the promotion failed: {why}")),
        }
    }

    fn follow(&mut self, me: &str, primary: &Member) {
        if let Err(Fatal(why)) = role_start::write_passfile(self.o) {
            self.problem(format!("the passfile is not rewritten: {why}"));
        }
        let upstream = role_start::upstream(self.o, me, primary);
        if let Err(Fatal(why)) = ops::ensure_upstream_slot(&self.server.bin, &upstream) {
            log(&format!(
                "the slot is not made on the new primary yet: {why}"
            ));
        }
        let done = ops::write_standby_config(&self.o.pgdata, Some(&upstream))
            .and_then(|()| self.server.reload());
        match done {
            Ok(()) => {
                log(&format!(
                    "following the new primary {} ({}:{})",
                    primary.name, primary.host, primary.port
                ));
                self.following = Some(primary.clone());
            }
            Err(Fatal(why)) => self.problem(format!("cannot follow {}: {why}", primary.name)),
        }
    }

    /// A standby repointed by a reload: done once it streams from the new primary; restarted
    /// (`rejoining`) when it has not within `role::FOLLOW_GRACE`.
    fn check_repointed(&mut self) -> Option<String> {
        let (primary, since) = self.repointed.as_ref()?;
        let receiver = self
            .server
            .query("SELECT status || '|' || coalesce(sender_host, '') FROM pg_stat_wal_receiver;\n")
            .unwrap_or_default();
        match role::repointed(
            config::is_standby(&self.o.pgdata),
            &receiver,
            &primary.host,
            since.elapsed(),
            role::FOLLOW_GRACE,
        ) {
            role::Repointed::Waiting => None,
            // Named primary and promoted before it streamed: nothing to follow any more.
            role::Repointed::Promoted => {
                self.repointed = None;
                None
            }
            role::Repointed::Streaming => {
                log(&format!(
                    "streaming from the new primary {} {} ms after the reload, without a restart",
                    primary.name,
                    since.elapsed().as_millis()
                ));
                self.repointed = None;
                None
            }
            role::Repointed::Restart => {
                let why = rejoining(&primary.name);
                log(&format!(
                    "not streaming from the new primary {} {} s after the reload",
                    primary.name,
                    role::FOLLOW_GRACE.as_secs()
                ));
                self.repointed = None;
                Some(why)
            }
        }
    }

    /// The primary's duties: the replication role's password and the standbys' slots.
    fn duties(&mut self, topology: &Topology) {
        let standbys = topology.standbys();
        match ops::read_password(&role_start::password_file(self.o)) {
            Ok(p) if self.role_password != Some(password::fingerprint(&p)) => {
                match self.server.ensure_role(&p) {
                    Ok(()) => {
                        log("the replication role has the mounted password");
                        self.role_password = Some(password::fingerprint(&p));
                    }
                    Err(Fatal(why)) => return self.problem(format!("replication role: {why}")),
                }
            }
            Ok(_) => {}
            Err(Fatal(why)) if !standbys.is_empty() => {
                self.problem(format!("standbys cannot connect: {why}"));
            }
            Err(_) => {}
        }
        if let Err(Fatal(why)) = self.synchronous(topology) {
            return self.problem(format!("synchronous replication is not applied: {why}"));
        }
        match self.reconcile_slots(&standbys) {
            Ok(()) => self.duties_done = Some(Instant::now()),
            Err(Fatal(why)) => self.problem(format!("the slots are not reconciled: {why}")),
        }
    }

    /// `synchronous_standby_names` as the topology's synchronous replication says (empty
    /// without it: asynchronous).
    fn synchronous(&mut self, topology: &Topology) -> Result<(), Fatal> {
        let names = match topology.synchronous {
            None => String::new(),
            Some(sync) if sync.wait => sync.standby_names(&topology.standbys(), &[]),
            Some(sync) => {
                sync.standby_names(&topology.standbys(), &self.server.streaming_standbys()?)
            }
        };
        if self.server.ensure_synchronous_standby_names(&names)? {
            log(&format!("synchronous_standby_names is now '{names}'"));
        }
        Ok(())
    }

    fn reconcile_slots(&mut self, standbys: &[String]) -> Result<(), Fatal> {
        let wanted: Vec<String> = standbys.iter().map(|s| config::slot_name(s)).collect();
        let existing = self.server.slots()?;
        let plan = role::slot_actions(
            &existing,
            &wanted,
            &self.unwanted_since,
            Instant::now(),
            role::SLOT_GRACE,
        );
        let changes = SlotPlan {
            create: plan.create.clone(),
            drop: plan.drop.clone(),
            busy: Vec::new(),
        };
        self.server.apply_slot_plan(&changes)?;
        if !plan.create.is_empty() || !plan.drop.is_empty() {
            log(&format!(
                "slots created {:?}, dropped {:?}",
                plan.create, plan.drop
            ));
        }
        self.unwanted_since = plan.unwanted_since;
        Ok(())
    }
}

/// The termination message of a primary that lost its Lease.
pub const LEASE_LOST: &str = "fenced: this primary could not renew its primary Lease in time (the \
     API server did not answer, or another instance was named): it stops accepting writes before \
     another instance may take the Lease, and restarts as the topology says";

/// The termination message of a standby that restarts to join a new primary.
pub fn rejoining(new_primary: &str) -> String {
    format!(
        "following a new primary: the topology names {new_primary}; this standby restarts to \
         check its timeline against it (rewound where it diverged) and stream from it"
    )
}

/// The termination message of a fenced primary.
pub fn stepped_down(new_primary: &str) -> String {
    format!(
        "stepped down: the topology names {new_primary} the primary; this instance stops and \
         restarts as its standby"
    )
}
