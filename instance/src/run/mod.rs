//! The manager's I/O: reads the data directory and the credentials files, runs `initdb`,
//! writes the managed configuration and supervises `postgres`; `syncer` keeps its password, the
//! application database and the accounts in step while it runs.
//! Every decision is delegated to the pure modules.

mod syncer;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::binaries;
use crate::config::{self, Managed};
use crate::datadir::{self, Observed, Start};
use crate::lease_keeper::PrimaryLease;
use crate::password::{self, Sync};
use crate::process;
use crate::reload::{self, Mounted, Reloader};
use crate::role_watch::Keeper;
use crate::shutdown::{self, Event, Mode, State, Timeouts};
use dbop_contract::identity::{self, Identity};
use syncer::{Syncer, read_password};

use dbop_contract::InstanceFailure;
/// The superuser when the credentials have no `username` file (the operator's too).
pub use dbop_contract::instance::DEFAULT_SUPERUSER;
/// The file, in the socket directory, that says the server took the password and has the
/// application database (the probes read it; removed at every start).
pub const READY_MARKER: &str = "dbop-instance.ready";
/// The exit code of a manager asked to stop while its server was stopping because it was
/// fenced or stepped down (without a signal it starts again in place, `Ended::Rejoin`).
pub const STEPPED_DOWN: i32 = 3;
/// How often a standby checks that it streams (its readiness).
const STANDBY_CHECK: Duration = Duration::from_secs(1);

/// Everything the manager is told on its command line.
#[derive(Clone, Debug)]
pub struct Options {
    pub pgdata: PathBuf,
    pub major: u32,
    pub listen_addresses: String,
    pub port: u16,
    pub socket_dir: PathBuf,
    /// A directory with the files `password` and (optionally) `username`: the mounted Secret.
    pub credentials_dir: PathBuf,
    /// The Database's server configuration, mounted from its ConfigMap (`reload`).
    pub config_dir: PathBuf,
    pub termination_log: PathBuf,
    pub timeouts: Timeouts,
    pub poll: Duration,
    /// Where to serve `/metrics` (`--metrics-addr`); `None`: no endpoint.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where to serve `/status` (`--status-addr`, by default on when following a primary
    /// Lease); `None`: no endpoint.
    pub status_addr: Option<std::net::SocketAddr>,
    /// The mounted server certificate (`--tls-dir`); `None`: no TLS.
    pub tls_dir: Option<PathBuf>,
    /// This instance's name in the topology (`--instance-name`); `None`: the host name.
    pub instance_name: Option<String>,
    /// The mounted replication credentials (`--replication-dir`).
    pub replication_dir: PathBuf,
    /// The mounted accounts (`--accounts-dir`): the roles and database a primary keeps.
    pub accounts_dir: PathBuf,
    /// The Database's primary Lease (`--primary-lease`); `None`: the topology file alone.
    pub primary_lease: Option<String>,
    /// The Lease followed (`run` starts it when `primary_lease` is set).
    pub lease: Option<Arc<PrimaryLease>>,
}

/// A reason to stop before the server runs; logged and written to the termination log.
#[derive(Debug)]
pub struct Fatal(pub String);

fn log(message: &str) {
    eprintln!("dbop-instance: {message}");
}

/// Writes `message` where Kubernetes reads the container's termination message.
pub fn report(termination_log: &Path, message: &str) {
    log(message);
    if let Err(e) = std::fs::write(termination_log, message) {
        log(&format!("cannot write {}: {e}", termination_log.display()));
    }
}

/// How long a stopped server's manager waits to release the primary Lease.
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// Runs the instance to its end; returns the container's exit code.
///
/// A primary fenced or stepping down, and a standby that must check its timeline against a new
/// primary, stop their server and start again in this same process (`Ended::Rejoin`): the
/// start makes the data what the topology now says (rewound, followed or cloned). A container
/// restart would do the same, but the kubelet delays each restart more than the last (up to
/// five minutes), so after a few failovers a standby would stay down for minutes.
pub fn run(o: &Options) -> i32 {
    let setup = match Setup::new(o) {
        Ok(setup) => setup,
        Err(Fatal(message)) => {
            report(&o.termination_log, &message);
            return 1;
        }
    };
    let mut endpoints = false;
    let mut pause: Option<Duration> = None;
    loop {
        let began = Instant::now();
        let o = &match follow_lease(o) {
            Ok(o) => o,
            Err(Fatal(message)) => {
                report(&o.termination_log, &message);
                return 1;
            }
        };
        let ended = start(o, &setup).and_then(|prepared| {
            let Some(p) = prepared else {
                return Ok(Ended::Exit(0));
            };
            if !endpoints {
                start_endpoints(o, &setup);
                endpoints = true;
            }
            supervise(o, &setup, &p)
        });
        // The server is not running (stopped, never started, or died): the Lease may go.
        if let Some(lease) = &o.lease {
            lease.release(RELEASE_WAIT);
        }
        match ended {
            Ok(Ended::Exit(code)) => return code,
            Ok(Ended::Rejoin(why)) => log(&format!(
                "{why}; the server stopped: starting again in place as the topology says"
            )),
            Ok(Ended::Restart(why)) => {
                let wait = restart_pause(pause, began.elapsed());
                pause = Some(wait);
                log(&format!(
                    "{why}: starting again in place in {wait:?}, as the topology then says"
                ));
                if crate::role_start::stopped_within(wait) {
                    log("stopped before the server started again");
                    return 0;
                }
            }
            Err(Fatal(message)) => {
                report(&o.termination_log, &message);
                return 1;
            }
        }
    }
}

/// How a supervised server ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The manager exits with this code.
    Exit(i32),
    /// Fenced or told to follow another primary, and not asked to stop: start again.
    Rejoin(String),
    /// The server of an instance with standbys stopped on its own (killed, crashed): start
    /// again after a pause (`restart_pause`), as the topology then says.
    Restart(String),
}

/// How the server ended, as `ending` judges it.
#[derive(Clone, Copy, Debug)]
pub struct ServerEnd<'a> {
    pub code: i32,
    /// Why the manager stopped the server itself (fenced, stepped down, following anew).
    pub fenced: Option<&'a str>,
    /// A signal asked the manager to stop.
    pub stop_asked: bool,
    /// The instance follows a primary Lease (its Database has standbys).
    pub leased: bool,
    /// The data volume is full: the container must end, for its termination message tells
    /// the operator to grow the volume.
    pub volume_full: bool,
}

/// What to do once the server exited. Pure.
pub fn ending(end: ServerEnd) -> Ended {
    match end {
        ServerEnd {
            stop_asked: true,
            fenced: Some(_),
            ..
        } => Ended::Exit(STEPPED_DOWN),
        ServerEnd {
            stop_asked: true,
            code,
            ..
        } => Ended::Exit(code),
        ServerEnd {
            fenced: Some(why), ..
        } => Ended::Rejoin(why.to_string()),
        ServerEnd {
            leased: true,
            volume_full: false,
            code,
            ..
        } => Ended::Restart(format!("postgres exited with status {code}")),
        ServerEnd { code, .. } => Ended::Exit(code),
    }
}

/// How long the manager waits before starting a server that stopped on its own again: 1 s,
/// doubling up to 15 s while it keeps stopping, 1 s again once it ran for `RESTART_RESET`.
/// Pure.
pub fn restart_pause(previous: Option<Duration>, ran_for: Duration) -> Duration {
    if ran_for >= RESTART_RESET {
        return crate::role::backoff(None);
    }
    crate::role::backoff(previous)
}

/// How long a server must have run for its next stop to count as a first one.
const RESTART_RESET: Duration = Duration::from_secs(600);

fn start_endpoints(o: &Options, setup: &Setup) {
    if let Some(addr) = o.metrics_addr {
        crate::metrics::start(addr, o, &setup.bin, &setup.user);
    }
    if let Some(addr) = o.status_addr {
        crate::metrics::start_status(addr, o, &setup.bin, &setup.user);
    }
}

/// `o` with the primary Lease followed when `--primary-lease` names one.
fn follow_lease(o: &Options) -> Result<Options, Fatal> {
    let mut o = o.clone();
    if let Some(name) = &o.primary_lease {
        let me = crate::role_start::instance_name(&o)?;
        log(&format!("following the primary Lease {name} as {me}"));
        o.lease = Some(PrimaryLease::start(name.clone(), me));
    }
    Ok(o)
}

/// The superuser name from the credentials directory.
pub fn superuser(credentials_dir: &Path) -> Result<String, Fatal> {
    let name = match std::fs::read_to_string(credentials_dir.join("username")) {
        Ok(text) => text.lines().next().unwrap_or_default().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DEFAULT_SUPERUSER.to_string(),
        Err(e) => return Err(Fatal(format!("cannot read the username file: {e}"))),
    };
    config::check_role_name(&name).map_err(Fatal)?;
    Ok(name)
}

/// The directory holding the binaries of `major`.
pub fn bin_dir(major: u32) -> Result<PathBuf, Fatal> {
    let path = std::env::var("PATH").unwrap_or_default();
    let candidates = binaries::candidates(major, &path);
    binaries::choose(&candidates, |d| d.join("postgres").is_file()).ok_or_else(|| {
        Fatal(format!(
            "no PostgreSQL {major} server binaries in /usr/lib/postgresql/{major}/bin or on \
             PATH: the image does not meet dbop's operand image contract (docs/operand-images.md)"
        ))
    })
}

/// What is found once per process: the server binaries and the superuser (and the uid's
/// passwd entry, which sets environment variables: only while the manager has one thread).
pub struct Setup {
    bin: PathBuf,
    user: String,
}

impl Setup {
    fn new(o: &Options) -> Result<Self, Fatal> {
        let bin = bin_dir(o.major)?;
        give_uid_an_entry(o)?;
        let user = superuser(&o.credentials_dir)?;
        Ok(Self { bin, user })
    }
}

/// What a start prepared for the supervisor.
struct Prepared {
    mounted: Mounted,
    /// The primary a standby streams from, as the topology said at start.
    following: Option<dbop_contract::topology::Member>,
}

/// A start of the server; `None`: stopped by a signal before the server started.
fn start(o: &Options, setup: &Setup) -> Result<Option<Prepared>, Fatal> {
    let (bin, user) = (&setup.bin, &setup.user);
    let _ = std::fs::remove_file(o.socket_dir.join(READY_MARKER));
    crate::pid_file::clear(&o.pgdata).map_err(Fatal)?;
    crate::pid_file::clear_socket(&o.socket_dir, o.port, &o.pgdata).map_err(Fatal)?;
    // Before the role's start: a standby's clone or rewind verifies the primary with its CA.
    let tls = match &o.tls_dir {
        Some(mounted) => Some(crate::tls::prepare(mounted, &o.socket_dir)?.1),
        None => None,
    };
    let following = match crate::role_start::prepare(o, bin)? {
        crate::role_start::Started::Go(following) => following,
        crate::role_start::Started::Stopped => return Ok(None),
    };
    match datadir::decide(&observe(&o.pgdata)?, o.major) {
        Start::InitDb => initdb(o, bin, user)?,
        Start::Run => log("the data directory is initialised: starting the server on it"),
        Start::Refuse(message) => return Err(Fatal(message)),
    }
    write_config(o, user)?;
    let mounted = reload::prepare(&o.pgdata, &o.config_dir, tls)?;
    Ok(Some(Prepared { mounted, following }))
}

/// Makes sure PostgreSQL can look the container's uid up (`identity`): when the image's
/// `/etc/passwd` lacks it, every child (initdb, postgres, psql) runs with nss_wrapper and a
/// passwd file in the socket directory; without nss_wrapper, a fatal `no-user-entry`.
fn give_uid_an_entry(o: &Options) -> Result<(), Fatal> {
    // SAFETY: getuid and getgid cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let image_passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let nss_wrapper_lib = std::env::var("NSS_WRAPPER_LIB").ok();
    let candidates = identity::wrapper_candidates(nss_wrapper_lib.as_deref());
    let library = match identity::decide(
        identity::listed(&image_passwd, uid),
        &candidates,
        Path::is_file,
    ) {
        Identity::Listed => return Ok(()),
        Identity::Unknown => {
            let failure = InstanceFailure::NoUserEntry;
            return Err(Fatal(failure.message(&identity::unknown_message(uid))));
        }
        Identity::Wrapped { library } => library,
    };
    let image_group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let home = o.pgdata.parent().unwrap_or(&o.pgdata);
    let image = [image_passwd.as_str(), image_group.as_str()];
    let wrapper = identity::wrapper(&library, image, (uid, gid), home, &o.socket_dir);
    for (path, text) in &wrapper.files {
        std::fs::write(path, text)
            .map_err(|e| Fatal(format!("cannot write {}: {e}", path.display())))?;
    }
    log(&format!(
        "uid {uid} has no entry in /etc/passwd: PostgreSQL runs with nss_wrapper ({})",
        library.display()
    ));
    // SAFETY: the manager has one thread here (the metrics thread starts after `prepare`).
    unsafe {
        for (name, value) in &wrapper.env {
            std::env::set_var(name, value);
        }
    }
    Ok(())
}

fn observe(pgdata: &Path) -> Result<Observed, Fatal> {
    let mut entries = match std::fs::read_dir(pgdata) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Observed::Missing),
        Err(e) => return Err(Fatal(format!("cannot read {}: {e}", pgdata.display()))),
    };
    if entries.next().is_none() {
        return Ok(Observed::Empty);
    }
    let pg_version = std::fs::read_to_string(pgdata.join("PG_VERSION")).ok();
    Ok(Observed::Populated { pg_version })
}

/// initdb into a scratch directory beside PGDATA, renamed into place when complete: an
/// interrupted initdb leaves nothing that looks like a data directory.
fn initdb(o: &Options, bin: &Path, user: &str) -> Result<(), Fatal> {
    let scratch = o.pgdata.with_extension("initdb");
    let _ = std::fs::remove_dir_all(&scratch);
    let password_file = o.credentials_dir.join("password");
    if password::decide(None, &read_password(&password_file)) != Sync::Apply {
        return Err(Fatal(
            "cannot initialise: the credentials have no usable password".into(),
        ));
    }
    log(&format!(
        "initialising a new data directory for superuser {user}"
    ));
    let status = Command::new(bin.join("initdb"))
        .args(config::initdb_args(&scratch, user, &password_file, o.major))
        .stdout(Stdio::inherit())
        .status()
        .map_err(|e| Fatal(format!("cannot run initdb: {e}")))?;
    if !status.success() {
        return Err(Fatal(format!(
            "initdb failed ({status}); see the log above"
        )));
    }
    std::fs::rename(&scratch, &o.pgdata).map_err(|e| {
        Fatal(format!(
            "cannot move the new data directory into place: {e}"
        ))
    })
}

fn write_config(o: &Options, user: &str) -> Result<(), Fatal> {
    let write = |name: &str, text: String| {
        std::fs::write(o.pgdata.join(name), text)
            .map_err(|e| Fatal(format!("cannot write {name}: {e}")))
    };
    write("pg_ident.conf", config::pg_ident(user))
}

fn managed(o: &Options, user: &str) -> Managed {
    Managed {
        pgdata: o.pgdata.clone(),
        listen_addresses: o.listen_addresses.clone(),
        port: o.port,
        socket_dir: o.socket_dir.clone(),
        superuser: user.to_string(),
        tls: o
            .tls_dir
            .as_ref()
            .map(|_| crate::tls::installed_dir(&o.socket_dir)),
    }
}

fn supervise(o: &Options, setup: &Setup, p: &Prepared) -> Result<Ended, Fatal> {
    let (bin, user) = (setup.bin.as_path(), setup.user.as_str());
    process::install_handlers().map_err(|e| Fatal(format!("cannot handle signals: {e}")))?;
    let child = Command::new(bin.join("postgres"))
        .args(config::server_args(&managed(o, user)))
        .spawn()
        .map_err(|e| Fatal(format!("cannot start postgres: {e}")))?;
    let pid = child.id();
    log(&format!("postgres started (pid {pid})"));
    let mut state = State::Running;
    let mut sync = Syncer::new(o, bin, user);
    let tls = o
        .tls_dir
        .clone()
        .map(|mounted| (mounted, crate::tls::installed_dir(&o.socket_dir)));
    let mut reloader = Reloader::new(&o.pgdata, &o.config_dir, tls, p.mounted.clone());
    let mut keeper = Keeper::new(o, bin, user, p.following.clone());
    let mut fenced: Option<String> = None;
    let mut stop_asked = false;
    let mut lease_news = 0;
    loop {
        let now = Instant::now();
        let signals = process::take_signals();
        stop_asked |= signals.iter().any(|s| *s != shutdown::Signal::Hup);
        let events = signals.into_iter().map(Event::Received);
        for event in events.chain([Event::Tick]) {
            let (next, signal) = shutdown::step(state, event, now, o.timeouts);
            if let Some(signal) = signal {
                log(&format!("sending {signal:?} to postgres"));
                process::send(pid, signal);
            }
            state = next;
        }
        if let Some(code) = server_exit(pid) {
            let ended = ending(ServerEnd {
                code,
                fenced: fenced.as_deref(),
                stop_asked,
                leased: o.lease.is_some(),
                volume_full: volume_full(&o.pgdata),
            });
            finish(o, state, &ended, fenced.as_deref());
            return Ok(ended);
        }
        if state == State::Running {
            sync.tick();
            reloader.tick(pid);
            if let Some(why) = keeper.tick(sync.applied()) {
                if let Some(lease) = &o.lease {
                    lease.stop_holding();
                }
                // Fenced: a fast shutdown (its standbys get all of its WAL), then a new start.
                log(&format!("{why}: fast shutdown"));
                let _ = std::fs::remove_file(o.socket_dir.join(READY_MARKER));
                process::send(pid, Mode::Fast.signal());
                state = State::Stopping {
                    mode: Mode::Fast,
                    since: now,
                };
                fenced = Some(why);
            }
        }
        let pause = pause_while(state, o.poll);
        match &o.lease {
            Some(lease) => lease.wait_for_news(&mut lease_news, pause),
            None => std::thread::sleep(pause),
        }
    }
}

/// How long the supervisor sleeps between two looks: `poll`, or at most `STOPPING_POLL` while
/// the server stops (its end is when the Lease is released, and a new primary can take it).
fn pause_while(state: State, poll: Duration) -> Duration {
    match state {
        State::Stopping { .. } => poll.min(STOPPING_POLL),
        State::Running => poll,
    }
}

/// How often a stopping server is looked at.
const STOPPING_POLL: Duration = Duration::from_millis(50);

fn server_exit(pid: u32) -> Option<i32> {
    process::reap()
        .into_iter()
        .find(|(p, _)| *p == pid)
        .map(|(_, code)| code)
}

/// Says how the server ended: a manager that exits leaves its reason in the termination log.
fn finish(o: &Options, state: State, ended: &Ended, fenced: Option<&str>) {
    let _ = std::fs::remove_file(o.socket_dir.join(READY_MARKER));
    match (ended, state, fenced) {
        (Ended::Rejoin(_) | Ended::Restart(_), _, _) => {}
        (Ended::Exit(_), _, Some(why)) => report(&o.termination_log, why),
        (Ended::Exit(0), State::Stopping { mode, .. }, None) => {
            log(&format!("postgres stopped ({mode:?} shutdown)"))
        }
        (Ended::Exit(code), _, None) => report(&o.termination_log, &exit_message(&o.pgdata, *code)),
    }
}

fn volume_full(pgdata: &Path) -> bool {
    crate::metrics::volume_usage(pgdata).is_ok_and(|usage| usage.full())
}

/// Why the server stopped on its own: a full data volume (which the operator can grow, see
/// `dbop_contract::volume`), or only its exit status.
fn exit_message(pgdata: &Path, code: i32) -> String {
    match crate::metrics::volume_usage(pgdata) {
        Ok(usage) if usage.full() => {
            let message = InstanceFailure::VolumeFull.message(&usage.full_message());
            log(&message);
            message
        }
        _ => format!("postgres exited with status {code}"),
    }
}

/// libpq arguments for the local socket.
pub fn connection_args(o_socket: &Options, user: &str, database: &str) -> Vec<String> {
    vec![
        format!("--host={}", o_socket.socket_dir.display()),
        format!("--port={}", o_socket.port),
        format!("--username={user}"),
        format!("--dbname={database}"),
    ]
}

/// The probe: the manager finished start-up and the server accepts connections to the
/// application database as the superuser (so a custom superuser name logs no failures).
pub fn probe(o: &Options) -> i32 {
    if !o.socket_dir.join(READY_MARKER).exists() {
        log("not ready: the instance manager has not applied the password yet");
        return 1;
    }
    let (bin, user) = match bin_dir(o.major).and_then(|b| Ok((b, superuser(&o.credentials_dir)?))) {
        Ok(found) => found,
        Err(Fatal(message)) => {
            log(&message);
            return 1;
        }
    };
    Command::new(bin.join("pg_isready"))
        .args(connection_args(o, &user, &user))
        .arg("--timeout=5")
        .status()
        .map(|s| s.code().unwrap_or(1))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(code: i32, fenced: Option<&str>, stop_asked: bool) -> ServerEnd<'_> {
        ServerEnd {
            code,
            fenced,
            stop_asked,
            leased: true,
            volume_full: false,
        }
    }

    #[test]
    fn a_fenced_server_starts_again_in_place_unless_the_manager_was_asked_to_stop() {
        let why = "stepped down: the topology names db-1 the primary";
        assert_eq!(ending(end(0, Some(why), false)), Ended::Rejoin(why.into()));
        // A fast shutdown that had to be escalated: the same.
        assert_eq!(
            ending(end(131, Some(why), false)),
            Ended::Rejoin(why.into())
        );
        assert_eq!(ending(end(0, Some(why), true)), Ended::Exit(STEPPED_DOWN));
        assert_eq!(ending(end(0, None, true)), Ended::Exit(0));
    }

    #[test]
    fn a_server_that_stops_on_its_own_restarts_in_place_only_with_standbys_and_room() {
        let killed = "postgres exited with status 137".to_string();
        assert_eq!(ending(end(137, None, false)), Ended::Restart(killed));
        // A single instance: the container restarts, as it always did.
        let single = ServerEnd {
            leased: false,
            ..end(137, None, false)
        };
        assert_eq!(ending(single), Ended::Exit(137));
        // A full volume: the container ends with the message the operator grows it on.
        let full = ServerEnd {
            volume_full: true,
            ..end(1, None, false)
        };
        assert_eq!(ending(full), Ended::Exit(1));
    }

    #[test]
    fn restarts_in_place_back_off_from_one_to_fifteen_seconds_and_reset_after_ten_minutes() {
        let s = Duration::from_secs;
        let mut pause = None;
        let mut seen = vec![];
        for _ in 0..6 {
            let next = restart_pause(pause, s(3));
            seen.push(next.as_secs());
            pause = Some(next);
        }
        assert_eq!(seen, [1, 2, 4, 8, 15, 15]);
        assert_eq!(restart_pause(pause, s(600)), s(1));
    }
}
