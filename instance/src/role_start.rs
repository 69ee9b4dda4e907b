//! The start of an instance that follows the operator's topology: reads the topology file and
//! this instance's name, and before the server starts makes the data directory what
//! `role::start_plan` says (clone the primary, point the standby at it, rewind a former
//! primary, or wait for a topology that names this instance). Without a topology file it does
//! nothing: the start is exactly what it was before topologies.
//!
//! Also owns what the running side (`role_watch`) shares with it: the topology read, the
//! instance name, the passfile and the upstream a standby streams from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dbop_contract::topology::{Member, REPLICATION_PASSWORD_FILE, TOPOLOGY_FILE, Topology};

use crate::process;
use crate::replication::config::{self, Upstream};
use crate::replication::ops::{self, RejoinError};
use crate::role::{self, Data, Read, StartPlan};
use crate::run::{Fatal, Options};
use crate::shutdown::Signal;

fn log(message: &str) {
    eprintln!("dbop-instance: {message}");
}

/// How often a start that waits for its topology looks at it again.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// The topology this instance follows: the primary Lease's when it follows one, else the file.
/// Before the Lease is first read (the API server does not answer), a file that names a single
/// instance is followed: a single instance needs no Lease to run.
pub fn topology(o: &Options) -> Read {
    let Some(lease) = &o.lease else {
        return read_topology(&o.config_dir);
    };
    match (lease.read(), read_topology(&o.config_dir)) {
        (Some(read), _) => read,
        (None, Read::Parsed(single)) if single.members.len() == 1 => Read::Parsed(single),
        (None, _) => lease.topology(),
    }
}

/// The topology file of `config_dir`, as read.
pub fn read_topology(config_dir: &Path) -> Read {
    match std::fs::read_to_string(config_dir.join(TOPOLOGY_FILE)) {
        Ok(text) => match Topology::parse(&text) {
            Ok(topology) => Read::Parsed(topology),
            Err(why) => Read::Invalid(why),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Missing,
        Err(e) => Read::Invalid(format!("cannot read the topology file: {e}")),
    }
}

/// This instance's name: `--instance-name`, or the host name (the pod's name).
pub fn instance_name(o: &Options) -> Result<String, Fatal> {
    if let Some(name) = &o.instance_name {
        return Ok(name.clone());
    }
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Fatal(format!(
            "cannot read the host name (the instance's name): {e}"
        )));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err(Fatal(
            "the host name (the instance's name) is empty or not UTF-8".into(),
        )),
    }
}

/// The passfile for the replication role: beside the data directory (never inside it, which
/// pg_basebackup and pg_rewind replace), mode 0600.
pub fn passfile(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("pgpass")
}

/// Where this instance streams from when `primary` is the primary.
pub fn upstream(o: &Options, me: &str, primary: &Member) -> Upstream {
    Upstream {
        host: primary.host.clone(),
        port: primary.port,
        instance: me.to_string(),
        passfile: passfile(&o.pgdata),
        ssl_root_cert: o.tls_dir.as_ref().map(|_| {
            crate::tls::installed_dir(&o.socket_dir).join(dbop_contract::instance::TLS_CA_FILE)
        }),
    }
}

/// The mounted replication password's file.
pub fn password_file(o: &Options) -> PathBuf {
    o.replication_dir.join(REPLICATION_PASSWORD_FILE)
}

/// Writes the passfile from the mounted replication password.
pub fn write_passfile(o: &Options) -> Result<(), Fatal> {
    let password = ops::read_password(&password_file(o))?;
    ops::write_passfile(&passfile(&o.pgdata), &password)
}

fn observe(pgdata: &Path) -> Data {
    let populated = std::fs::read_dir(pgdata).is_ok_and(|mut e| e.next().is_some());
    match (populated, config::is_standby(pgdata)) {
        (false, _) => Data::Empty,
        (true, true) => Data::Standby,
        (true, false) => Data::Primary,
    }
}

/// How the start went.
#[derive(Debug)]
pub enum Started {
    /// Start the server; a standby streams from this primary (`None`: not known to follow).
    Go(Option<Member>),
    /// SIGTERM, SIGINT or SIGQUIT arrived while waiting: exit cleanly.
    Stopped,
}

/// Before the server starts: the data directory made what the topology says it is.
pub fn prepare(o: &Options, bin: &Path) -> Result<Started, Fatal> {
    let mut read = topology(o);
    if read == Read::Missing {
        return Ok(Started::Go(None));
    }
    let me = instance_name(o)?;
    process::install_handlers().map_err(|e| Fatal(format!("cannot handle signals: {e}")))?;
    let mut said: Option<String> = None;
    let mut wait: Option<Duration> = None;
    let mut promotion: Option<std::time::Instant> = None;
    loop {
        let data = observe(&o.pgdata);
        let plan = match &o.lease {
            Some(lease) => role::leased_start(
                role::start_plan(&me, &read, data),
                &me,
                &read,
                data,
                lease.holds(),
            ),
            None => role::start_plan(&me, &read, data),
        };
        let pause = match plan {
            StartPlan::AsBefore => {
                if let Read::Invalid(why) = &read {
                    log(&format!("the topology is ignored: {why}"));
                }
                return Ok(Started::Go(None));
            }
            StartPlan::Wait(why) => {
                once(&mut said, format!("waiting for the topology: {why}"));
                WAIT_POLL
            }
            StartPlan::Clone(primary) => match clone(o, bin, &me, &primary) {
                Ok(()) => return Ok(Started::Go(Some(primary))),
                Err(Fatal(why)) => {
                    once(&mut said, format!("the clone failed, trying again: {why}"));
                    let next = role::backoff(wait);
                    wait = Some(next);
                    next
                }
            },
            StartPlan::Follow(primary) => {
                let since = *promotion.get_or_insert_with(std::time::Instant::now);
                match promoted(o, bin, &me, &primary) {
                    Ok(false) if since.elapsed() < PROMOTION_WAIT => {
                        once(&mut said, not_promoted(&primary));
                        WAIT_POLL
                    }
                    answer => {
                        if answer.unwrap_or(false) {
                            // Its timeline checked: followed as is, or rewound where it diverged.
                            rejoin(o, bin, &me, &primary)?;
                        } else {
                            // Not answering, or not promoted for long: as a standby always started.
                            follow(o, bin, &me, &primary)?;
                        }
                        return Ok(Started::Go(Some(primary)));
                    }
                }
            }
            StartPlan::Rejoin(primary) => {
                match rejoin_once_promoted(o, bin, &me, &primary, &mut said)? {
                    Some(pause) => pause,
                    None => return Ok(Started::Go(Some(primary))),
                }
            }
        };
        if stopped_within(pause) {
            log("stopped before the server started");
            return Ok(Started::Stopped);
        }
        read = topology(o);
    }
}

/// A former primary rejoins `primary` once it answers as promoted: never before, for its WAL
/// may be ahead of where the promotion will fork the timeline. The pause before looking again,
/// or `None` once it rejoined.
fn rejoin_once_promoted(
    o: &Options,
    bin: &Path,
    me: &str,
    primary: &Member,
    said: &mut Option<String>,
) -> Result<Option<Duration>, Fatal> {
    match promoted(o, bin, me, primary) {
        Ok(true) => {
            rejoin(o, bin, me, primary)?;
            Ok(None)
        }
        Ok(false) => {
            once(said, not_promoted(primary));
            Ok(Some(WAIT_POLL))
        }
        Err(Fatal(why)) => {
            once(
                said,
                format!("waiting for {} to answer: {why}", primary.name),
            );
            Ok(Some(WAIT_POLL))
        }
    }
}

/// How long a standby's start waits for the primary it is to follow to be promoted before it
/// follows it as it is (without checking its timeline).
const PROMOTION_WAIT: Duration = Duration::from_secs(60);

fn not_promoted(primary: &Member) -> String {
    format!(
        "waiting for {} to be promoted before joining it (its timeline decides whether this \
         instance's data is rewound)",
        primary.name
    )
}

/// Whether `primary` answers as a primary (not in recovery).
fn promoted(o: &Options, bin: &Path, me: &str, primary: &Member) -> Result<bool, Fatal> {
    write_passfile(o)?;
    ops::upstream_in_recovery(bin, &upstream(o, me, primary)).map(|standby| !standby)
}

/// Logs `message` unless it was the last one logged.
pub fn once(last: &mut Option<String>, message: String) {
    if last.as_ref() != Some(&message) {
        log(&message);
        *last = Some(message);
    }
}

/// Sleeps `pause`; whether a signal to stop arrived meanwhile.
pub fn stopped_within(pause: Duration) -> bool {
    let step = Duration::from_millis(100);
    let mut slept = Duration::ZERO;
    while slept < pause {
        let stop = process::take_signals()
            .into_iter()
            .any(|s| matches!(s, Signal::Term | Signal::Int | Signal::Quit));
        if stop {
            return true;
        }
        std::thread::sleep(step);
        slept += step;
    }
    false
}

fn clone(o: &Options, bin: &Path, me: &str, primary: &Member) -> Result<(), Fatal> {
    write_passfile(o)?;
    let upstream = upstream(o, me, primary);
    ops::ensure_upstream_slot(bin, &upstream)?;
    ops::clone(bin, &o.pgdata, &upstream)
}

/// A standby's data: pointed at the current primary (its slot made when missing).
fn follow(o: &Options, bin: &Path, me: &str, primary: &Member) -> Result<(), Fatal> {
    if let Err(Fatal(why)) = write_passfile(o) {
        log(&format!(
            "the passfile is not rewritten (the last one stays): {why}"
        ));
    }
    let upstream = upstream(o, me, primary);
    if let Err(Fatal(why)) = ops::ensure_upstream_slot(bin, &upstream) {
        log(&format!("the slot is not made on the primary yet: {why}"));
    }
    log(&format!(
        "starting as a standby of {} ({}:{})",
        primary.name, primary.host, primary.port
    ));
    ops::write_standby_config(&o.pgdata, Some(&upstream))
}

/// A former primary's data: rewound (or followed as is) to become a standby of the primary.
fn rejoin(o: &Options, bin: &Path, me: &str, primary: &Member) -> Result<(), Fatal> {
    write_passfile(o)?;
    let upstream = upstream(o, me, primary);
    match ops::rejoin(bin, &o.pgdata, o.major, &upstream, false) {
        Ok(done) => log(&format!(
            "rejoined {} as its standby: {done:?}",
            primary.name
        )),
        Err(RejoinError::NeedsClone(reason)) => {
            return Err(Fatal(format!(
                "this instance cannot become a standby of {} without discarding its data ({}): \
                 dbop does not discard data on its own; empty the data volume to clone it anew",
                primary.name,
                reason.message()
            )));
        }
        Err(RejoinError::Failed(Fatal(why))) => {
            return Err(Fatal(format!(
                "this instance cannot rejoin {} as its standby: {why}",
                primary.name
            )));
        }
    }
    if let Err(Fatal(why)) = ops::ensure_upstream_slot(bin, &upstream) {
        log(&format!("the slot is not made on the primary yet: {why}"));
    }
    Ok(())
}
