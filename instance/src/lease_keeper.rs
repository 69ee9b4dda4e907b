//! The primary Lease's I/O (`dbop_contract::lease`): a thread of its own looks at the Lease
//! every `LOOK_EVERY` through the API server with the pod's service account, publishes the
//! topology the operator designates in it, takes and renews it while the topology names this
//! instance (`lease::step`), and says until when this instance may accept writes: the start of
//! its last successful renewal plus `lease::holder_validity`. The supervisor fences the server
//! when that moment passes, and releases the Lease once the server has stopped. News (another
//! topology, the Lease taken) wakes the supervisor at once rather than at its next poll.
//!
//! Every request has a timeout, and the thread never blocks the supervisor: an API server that
//! does not answer only lets the validity run out.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dbop_contract::lease::{
    DESIGNATED_AT_ANNOTATION, LeaseState, RELEASED_BY_ANNOTATION, TOPOLOGY_ANNOTATION,
    designation_grace, holder_validity,
};
use dbop_contract::topology::Topology;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client, Config};
use tokio::sync::Notify;

use crate::lease::{self, Look, Step, Want};
use crate::role::Read;

/// How often the Lease is read.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often the Lease is looked at while this instance waits to take it (it is named the
/// primary) or to see its release written.
const EAGER_LOOK: Duration = Duration::from_millis(200);
/// How long one request to the API server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn log(message: &str) {
    eprintln!("dbop-instance: {message}");
}

/// This instance's side of the primary Lease, shared by the supervisor and the Lease's thread.
pub struct PrimaryLease {
    name: String,
    shared: Arc<Mutex<Shared>>,
    /// Wakes the thread from its pause: a release is written at once, not at the next look.
    wake: Arc<Notify>,
    /// Wakes the supervisor from its pause when `Shared::news` grows.
    news: Arc<Condvar>,
}

impl std::fmt::Debug for PrimaryLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrimaryLease({})", self.name)
    }
}

#[derive(Default)]
struct Shared {
    /// The topology as last read from the Lease (`None`: not read yet).
    topology: Option<Read>,
    /// Until when this instance holds the Lease (`None`: it does not).
    valid_until: Option<Instant>,
    /// Until when this instance, designated and not holding the Lease, may go on writing
    /// (`lease::designation_grace`).
    grace_until: Option<Instant>,
    /// The server is stopping or stopped: take and renew no more.
    stopping: bool,
    /// The server stopped: release the Lease.
    release: bool,
    released: bool,
    /// The last problem logged (each is logged once).
    problem: Option<String>,
    /// Named the primary and not holding the Lease yet: looked at every `EAGER_LOOK`, for the
    /// old primary's release is the moment writes can resume.
    eager: bool,
    /// How many times the Lease said something the supervisor acts on: a topology other than
    /// the last one read (a primary to follow, or to step down for), or the Lease taken (the
    /// moment to promote).
    news: u64,
}

impl PrimaryLease {
    /// Starts the thread that follows the Lease `name` for the instance `me`.
    pub fn start(name: String, me: String) -> Arc<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let wake = Arc::new(Notify::new());
        let news = Arc::new(Condvar::new());
        let (thread_shared, thread_wake, thread_news) =
            (shared.clone(), wake.clone(), news.clone());
        let lease_name = name.clone();
        std::thread::spawn(move || {
            let side = Side {
                shared: &thread_shared,
                news: &thread_news,
            };
            follow(&lease_name, &me, side, &thread_wake)
        });
        Arc::new(Self {
            name,
            shared,
            wake,
            news,
        })
    }

    /// Sleeps `pause`, or less: until the Lease says something new since `seen` (which it
    /// then updates), so that the supervisor fences, rejoins or promotes at once.
    pub fn wait_for_news(&self, seen: &mut u64, pause: Duration) {
        let s = self.lock();
        let (s, _) = self
            .news
            .wait_timeout_while(s, pause, |s| s.news == *seen)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *seen = s.news;
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// The topology the operator designates in the Lease.
    pub fn topology(&self) -> Read {
        self.lock().topology.clone().unwrap_or_else(|| {
            Read::Invalid(format!("the primary Lease {} is not read yet", self.name))
        })
    }

    /// This instance holds the Lease: it may start or be promoted as the primary.
    pub fn holds(&self) -> bool {
        self.lock().valid_until.is_some_and(|t| Instant::now() < t)
    }

    /// A running primary may go on accepting writes: it holds the Lease, or was designated a
    /// moment ago and nobody holds it yet.
    pub fn may_write(&self) -> bool {
        let s = self.lock();
        let now = Instant::now();
        s.valid_until.is_some_and(|t| now < t) || s.grace_until.is_some_and(|t| now < t)
    }

    /// The topology read from the Lease, `None` before the first read.
    pub fn read(&self) -> Option<Read> {
        self.lock().topology.clone()
    }

    /// The server is stopping: neither take nor renew the Lease any more.
    pub fn stop_holding(&self) {
        let mut s = self.lock();
        s.stopping = true;
    }

    /// The server has stopped: releases the Lease if held, waiting at most `wait`.
    pub fn release(&self, wait: Duration) {
        {
            let mut s = self.lock();
            s.stopping = true;
            s.release = true;
            s.valid_until = None;
            s.grace_until = None;
        }
        self.wake.notify_one();
        let start = Instant::now();
        while start.elapsed() < wait && !self.lock().released {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the Lease's thread shares with the supervisor.
#[derive(Clone, Copy)]
struct Side<'a> {
    shared: &'a Mutex<Shared>,
    news: &'a Condvar,
}

impl Side<'_> {
    /// Something the supervisor acts on: counted, and the supervisor woken.
    fn tell(&self, s: &mut Shared) {
        s.news += 1;
        self.news.notify_all();
    }

    /// The topology just read: news when it is not the last one read.
    fn publish(&self, s: &mut Shared, topology: Read) {
        if s.topology.as_ref() != Some(&topology) {
            self.tell(s);
        }
        s.topology = Some(topology);
    }
}

fn problem(shared: &Mutex<Shared>, message: String) {
    let mut s = lock(shared);
    if s.problem.as_ref() != Some(&message) {
        log(&message);
        s.problem = Some(message);
    }
}

/// The thread: a client, then a look at the Lease every `LOOK_EVERY` until it is released.
fn follow(name: &str, me: &str, side: Side<'_>, wake: &Notify) {
    let shared = side.shared;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return problem(shared, format!("the primary Lease is not followed: {e}")),
    };
    runtime.block_on(async {
        let api = loop {
            match client().await {
                Ok(api) => break api,
                Err(why) => problem(shared, format!("the API server is not reachable: {why}")),
            }
            tokio::time::sleep(LOOK_EVERY).await;
        };
        let mut renewed: Option<Instant> = None;
        loop {
            look(&api, name, me, side, &mut renewed).await;
            let (release, released, eager) = {
                let s = lock(shared);
                (s.release, s.released, s.eager)
            };
            if released {
                return;
            }
            let pause = if release || eager {
                EAGER_LOOK
            } else {
                LOOK_EVERY
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = wake.notified() => {}
            }
        }
    });
}

async fn client() -> Result<Api<Lease>, String> {
    let mut config = Config::infer().await.map_err(|e| e.to_string())?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| e.to_string())?;
    Ok(Api::namespaced(client, &namespace))
}

/// One look: read the Lease, publish its topology, and take, renew or release it.
async fn look(
    api: &Api<Lease>,
    name: &str,
    me: &str,
    side: Side<'_>,
    renewed: &mut Option<Instant>,
) {
    let shared = side.shared;
    let lease = match tokio::time::timeout(REQUEST_TIMEOUT, api.get(name)).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => return problem(shared, format!("cannot read the primary Lease {name}: {e}")),
        Err(_) => {
            return problem(
                shared,
                format!("reading the primary Lease {name} timed out"),
            );
        }
    };
    let state = state_of(&lease);
    let topology = topology_of(&lease);
    // A single instance needs no hold (nothing to fence it from), and renews nothing.
    let named = matches!(&topology, Read::Parsed(t) if t.primary == me && t.members.len() > 1);
    let now = now_ms();
    let released_by = annotation(&lease, RELEASED_BY_ANNOTATION).map(String::as_str);
    let grace = designation_grace(&state, released_by, me, now);
    let want = {
        let mut s = lock(shared);
        side.publish(&mut s, topology);
        s.grace_until = grace.map(|d| Instant::now() + d);
        if state.holder.as_deref() != Some(me) {
            // Another instance holds it, or nobody: this one may not write.
            s.valid_until = None;
        }
        let want = match (s.release, s.stopping, named) {
            (true, _, _) => Want::Release,
            (false, false, true) => Want::Hold,
            _ => Want::Leave,
        };
        s.eager = want == Want::Hold && state.holder.as_deref() != Some(me);
        want
    };
    let look = Look {
        lease: &state,
        released_by,
        now_ms: now,
        since_renewed: renewed.map(|t| t.elapsed()),
    };
    let step = lease::step(look, me, want);
    if step == Step::Nothing {
        if want == Want::Release {
            lock(shared).released = true;
        }
        return;
    }
    let started = Instant::now();
    let written = written(lease, step, me);
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        api.replace(name, &PostParams::default(), &written),
    )
    .await
    {
        Ok(Ok(_)) => wrote(side, step, started, state.duration_ms, renewed),
        Ok(Err(e)) => problem(
            shared,
            format!("cannot write the primary Lease ({step:?}): {e}"),
        ),
        Err(_) => problem(
            shared,
            format!("writing the primary Lease ({step:?}) timed out"),
        ),
    }
}

/// What a written Lease means: released, or held until its validity counted from `started`
/// (the moment the write was sent, never later) — unless the server is stopping.
fn wrote(
    side: Side<'_>,
    step: Step,
    started: Instant,
    duration_ms: i64,
    renewed: &mut Option<Instant>,
) {
    let mut s = lock(side.shared);
    if step == Step::Release {
        s.released = true;
        log("released the primary Lease");
        return;
    }
    *renewed = Some(started);
    s.valid_until = (!s.stopping).then(|| started + holder_validity(duration_ms));
    s.problem = None;
    if step == Step::Take {
        log("took the primary Lease: this instance may run as the primary");
        side.tell(&mut s);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a String> {
    lease.metadata.annotations.as_ref()?.get(key)
}

/// The Lease as the contract's rules read it.
pub fn state_of(lease: &Lease) -> LeaseState {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseState {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        renewed_ms: spec.renew_time.map(|t| t.0.as_millisecond()),
        duration_ms: i64::from(spec.lease_duration_seconds.unwrap_or(0)) * 1000,
        designated_ms: annotation(lease, DESIGNATED_AT_ANNOTATION).and_then(|v| v.parse().ok()),
    }
}

fn topology_of(lease: &Lease) -> Read {
    match annotation(lease, TOPOLOGY_ANNOTATION) {
        Some(text) => match Topology::parse(text) {
            Ok(topology) => Read::Parsed(topology),
            Err(why) => Read::Invalid(why),
        },
        None => Read::Invalid("the primary Lease has no topology yet".into()),
    }
}

/// The Lease after `step` by `me` (its `resourceVersion` kept: the write is a compare-and-swap).
fn written(mut lease: Lease, step: Step, me: &str) -> Lease {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(Default::default);
    match step {
        Step::Take => {
            spec.holder_identity = Some(me.to_string());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        Step::Release => spec.holder_identity = None,
        Step::Renew | Step::Nothing => {}
    }
    spec.renew_time = Some(now);
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if step == Step::Release {
        annotations.insert(RELEASED_BY_ANNOTATION.into(), me.to_string());
    } else {
        annotations.remove(RELEASED_BY_ANNOTATION);
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Lease side with no thread following an API server: the test plays the thread.
    fn unfollowed() -> PrimaryLease {
        PrimaryLease {
            name: "orders-primary".into(),
            shared: Arc::new(Mutex::new(Shared::default())),
            wake: Arc::new(Notify::new()),
            news: Arc::new(Condvar::new()),
        }
    }

    fn topology(primary: &str) -> Read {
        let text = format!(
            "primary={primary}\ninstance=orders-0 orders-0.orders-hl 5432\n\
             instance=orders-1 orders-1.orders-hl 5432\n"
        );
        Read::Parsed(Topology::parse(&text).unwrap())
    }

    /// What the thread does with the topology it read.
    fn read(lease: &PrimaryLease, read: Read) {
        let side = Side {
            shared: &lease.shared,
            news: &lease.news,
        };
        side.publish(&mut lock(side.shared), read);
    }

    /// Long enough that a supervisor not woken fails the test (its `seen` stays as it was).
    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn the_supervisor_wakes_when_the_lease_names_another_primary_not_at_every_look() {
        let lease = Arc::new(unfollowed());
        let mut seen = 0;
        read(&lease, topology("orders-0"));
        // The first topology is news: no wait.
        lease.wait_for_news(&mut seen, LONG);
        assert_eq!(seen, 1);
        // The same topology read again is not: the wait lasts its pause.
        read(&lease, topology("orders-0"));
        let start = Instant::now();
        lease.wait_for_news(&mut seen, Duration::from_millis(100));
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert_eq!(seen, 1);
        // A switchover read while the supervisor waits ends its wait.
        let thread = {
            let lease = lease.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                read(&lease, topology("orders-1"));
            })
        };
        lease.wait_for_news(&mut seen, LONG);
        assert_eq!(seen, 2);
        thread.join().unwrap();
    }

    #[test]
    fn taking_the_lease_wakes_the_supervisor_to_promote() {
        let lease = unfollowed();
        let side = Side {
            shared: &lease.shared,
            news: &lease.news,
        };
        let mut renewed = None;
        wrote(side, Step::Renew, Instant::now(), 10_000, &mut renewed);
        let mut seen = 0;
        let start = Instant::now();
        lease.wait_for_news(&mut seen, Duration::from_millis(100));
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "a renewal is no news"
        );
        wrote(side, Step::Take, Instant::now(), 10_000, &mut renewed);
        lease.wait_for_news(&mut seen, LONG);
        assert_eq!(seen, 1);
        assert!(lease.holds());
    }
}
