//! The replication I/O: SQL over the local socket (psql, as the superuser through peer
//! authentication), `IDENTIFY_SYSTEM` on the primary, `pg_basebackup`, `pg_rewind`,
//! `pg_controldata`, and the managed files. Every decision is in `config`, `rejoin` and
//! `status`.
//!
//! Secrets: the replication password is read from its mounted file and goes to two places
//! only — a SCRAM verifier sent over psql's standard input (`ensure_role`), and the passfile
//! (mode 0600) libpq reads. No command line, environment variable, log line or error message
//! here holds it; children run without `PGPASSWORD`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::password::{self, Read, Sync};
use crate::replication::config::{self, Upstream};
use crate::replication::rejoin::{self, CloneReason, Rejoin, Source};
use crate::replication::status::{self, SlotPlan, Status};
use crate::run::Fatal;

fn log(message: &str) {
    eprintln!("dbop-instance: {message}");
}

/// A PostgreSQL tool with a clean environment: no password or passfile inherited.
fn tool(bin: &Path, name: &str) -> Command {
    let mut cmd = Command::new(bin.join(name));
    cmd.env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    if name == "psql" {
        cmd.env("PGOPTIONS", OWN_SESSIONS);
    }
    cmd
}

/// The options of the manager's own SQL sessions: their commits (the replication role's
/// password, slots, the accounts) never wait for synchronous standbys. They restate what the
/// mounted Secrets and the topology say, and every primary restates them, so none of them can
/// be lost in a way that matters; waiting would deadlock a new primary whose standbys cannot
/// stream before it is ready.
pub const OWN_SESSIONS: &str = "-c synchronous_commit=local";

/// Runs `cmd`; its standard output, or why it failed (its standard error: the tools print no
/// password, and none is in their arguments).
fn output(mut cmd: Command, what: &str) -> Result<String, Fatal> {
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Fatal(format!("cannot run {what}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Fatal(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The local server, reached over its Unix socket as the superuser.
#[derive(Clone, Debug)]
pub struct LocalServer {
    pub bin: PathBuf,
    pub socket_dir: PathBuf,
    pub port: u16,
    pub superuser: String,
}

impl LocalServer {
    /// Runs `sql` (psql's standard input, stopping at the first error); its rows as
    /// `psql -At -F '|'` prints them.
    pub fn query(&self, sql: &str) -> Result<String, Fatal> {
        let mut child = tool(&self.bin, "psql")
            .args([
                format!("--host={}", self.socket_dir.display()),
                format!("--port={}", self.port),
                format!("--username={}", self.superuser),
                "--dbname=postgres".to_string(),
            ])
            .args([
                "--no-psqlrc",
                "--no-align",
                "--tuples-only",
                "--field-separator=|",
                "--quiet",
                "--set=ON_ERROR_STOP=1",
                "--file=-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Fatal(format!("cannot run psql: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(sql.as_bytes())
                .map_err(|e| Fatal(format!("cannot write to psql: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| Fatal(format!("psql: {e}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Fatal(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    pub fn status(&self) -> Result<Status, Fatal> {
        status::parse_status(&self.query(status::STATUS_QUERY)?).map_err(Fatal)
    }

    pub fn slots(&self) -> Result<Vec<status::Slot>, Fatal> {
        status::parse_slots(&self.query(status::SLOTS_QUERY)?).map_err(Fatal)
    }

    /// Creates (or updates) the replication role with `password`, sent as a SCRAM verifier.
    pub fn ensure_role(&self, password: &str) -> Result<(), Fatal> {
        let salt =
            crate::process::random_bytes(16).map_err(|e| Fatal(format!("no random salt: {e}")))?;
        let verifier = password::scram_verifier(password, &salt, password::SCRAM_ITERATIONS);
        self.query(&config::ensure_role_sql(&verifier)).map(|_| ())
    }

    /// Makes the slots of exactly `standbys` (instance names) exist among dbop's slots:
    /// creates the missing ones (idempotent), drops dbop's others that are not in use.
    pub fn reconcile_slots(&self, standbys: &[String]) -> Result<SlotPlan, Fatal> {
        let wanted: Vec<String> = standbys.iter().map(|s| config::slot_name(s)).collect();
        let plan = status::plan_slots(&self.slots()?, &wanted);
        self.apply_slot_plan(&plan)?;
        Ok(plan)
    }

    /// Creates the plan's slots (idempotent) and drops the ones it drops (when unused).
    pub fn apply_slot_plan(&self, plan: &SlotPlan) -> Result<(), Fatal> {
        let mut sql = String::new();
        for slot in &plan.create {
            sql.push_str(&config::ensure_slot_sql(slot));
        }
        for slot in &plan.drop {
            sql.push_str(&config::drop_slot_sql(slot));
        }
        if !sql.is_empty() {
            self.query(&sql)?;
        }
        Ok(())
    }

    /// Promotes the standby and waits (up to `wait_seconds`) until it accepts writes.
    pub fn promote(&self, wait_seconds: u32) -> Result<(), Fatal> {
        let answer = self.query(&format!("SELECT pg_promote(true, {wait_seconds});\n"))?;
        match answer.trim() {
            // The checkpoint puts the new timeline in the control file, where pg_rewind of
            // the old primary reads it (a promotion alone leaves the old one there until the
            // next checkpoint, minutes later).
            "t" => self.query("CHECKPOINT;\n").map(|_| ()),
            other => Err(Fatal(format!(
                "the server did not finish its promotion within {wait_seconds} s ({other:?})"
            ))),
        }
    }

    pub fn reload(&self) -> Result<(), Fatal> {
        self.query("SELECT pg_reload_conf();\n").map(|_| ())
    }

    /// The standbys streaming from this primary now, by their `application_name` (their
    /// instance names).
    pub fn streaming_standbys(&self) -> Result<Vec<String>, Fatal> {
        let out = self.query(
            "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming';\n",
        )?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    /// Makes `synchronous_standby_names` `names` (`ALTER SYSTEM`, then a reload) unless it is
    /// already; returns whether it changed. Instance names are DNS labels: nothing to escape
    /// but the quote, for safety.
    pub fn ensure_synchronous_standby_names(&self, names: &str) -> Result<bool, Fatal> {
        let now = self.query("SHOW synchronous_standby_names;\n")?;
        if now.trim() == names {
            return Ok(false);
        }
        self.query(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{}';\nSELECT pg_reload_conf();\n",
            names.replace('\'', "''")
        ))?;
        Ok(true)
    }
}

/// The replication password from its mounted file (its first line, ASCII, not empty).
pub fn read_password(file: &Path) -> Result<String, Fatal> {
    let read = match std::fs::read(file) {
        Ok(bytes) => match password::from_file(&bytes) {
            Ok(p) => Read::Present(p),
            Err(why) => return Err(Fatal(format!("the replication password: {why}"))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Missing,
        Err(e) => {
            return Err(Fatal(format!(
                "cannot read the replication password file {}: {e}",
                file.display()
            )));
        }
    };
    match (password::decide(None, &read), read) {
        (Sync::Apply, Read::Present(p)) => Ok(p),
        (Sync::Problem(why), _) => Err(Fatal(format!("the replication password: {why}"))),
        _ => Err(Fatal("the replication password is unusable".into())),
    }
}

/// Writes `text` to `path` through a temporary file renamed into place, with `mode`.
fn write_atomically(path: &Path, text: &[u8], mode: u32) -> Result<(), Fatal> {
    let tmp = path.with_extension("dbop-tmp");
    let _ = std::fs::remove_file(&tmp);
    let fail = |e: std::io::Error| Fatal(format!("cannot write {}: {e}", path.display()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    file.write_all(text).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// Writes the passfile for the replication role (mode 0600: libpq ignores a file others can
/// read).
pub fn write_passfile(path: &Path, password: &str) -> Result<(), Fatal> {
    write_atomically(path, config::passfile_line(password).as_bytes(), 0o600)
}

/// Writes the managed replication settings into `pgdata`: the managed file, its include line
/// in `postgresql.conf`, and `standby.signal` (present for a standby of `upstream`, absent
/// for a primary).
pub fn write_standby_config(pgdata: &Path, upstream: Option<&Upstream>) -> Result<(), Fatal> {
    write_atomically(
        &pgdata.join(config::MANAGED_FILE),
        config::standby_file(upstream).as_bytes(),
        0o600,
    )?;
    let conf_path = pgdata.join("postgresql.conf");
    let conf = std::fs::read_to_string(&conf_path)
        .map_err(|e| Fatal(format!("cannot read postgresql.conf: {e}")))?;
    if let Some(text) = config::with_include(&conf) {
        write_atomically(&conf_path, text.as_bytes(), 0o600)?;
    }
    let signal = pgdata.join(config::STANDBY_SIGNAL);
    match upstream {
        Some(_) => write_atomically(&signal, b"", 0o600),
        None => remove_if_present(&signal),
    }
}

/// A replication-protocol `command` on the upstream, over a replication connection as the
/// replication role: its output, unaligned, fields separated by `|`.
fn replication_command(bin: &Path, upstream: &Upstream, command: &str) -> Result<String, Fatal> {
    let mut cmd = tool(bin, "psql");
    cmd.arg(format!(
        "{} replication=true",
        config::replication_conninfo(upstream)
    ))
    .args([
        "--no-psqlrc",
        "--no-align",
        "--tuples-only",
        "--field-separator=|",
        "--no-password",
    ])
    .arg(format!("--command={command}"));
    output(cmd, &format!("{command} on the primary"))
}

/// `IDENTIFY_SYSTEM` on the upstream.
pub fn identify_system(bin: &Path, upstream: &Upstream) -> Result<Source, Fatal> {
    rejoin::parse_identify_system(&replication_command(bin, upstream, "IDENTIFY_SYSTEM")?)
        .map_err(Fatal)
}

/// Whether the upstream runs as a standby still (`SHOW in_hot_standby`, PostgreSQL 14 and
/// later): a standby named primary that is not promoted yet.
pub fn upstream_in_recovery(bin: &Path, upstream: &Upstream) -> Result<bool, Fatal> {
    let out = replication_command(bin, upstream, "SHOW in_hot_standby")?;
    Ok(out.trim() == "on")
}

/// Makes the standby's slot exist on the upstream, over a replication connection as the
/// replication role: a standby does not wait for its primary to see it in a newer topology.
/// Idempotent (an existing slot is left as it is).
pub fn ensure_upstream_slot(bin: &Path, upstream: &Upstream) -> Result<(), Fatal> {
    let slot = config::slot_name(&upstream.instance);
    let mut cmd = tool(bin, "psql");
    cmd.arg(format!(
        "{} replication=true",
        config::replication_conninfo(upstream)
    ))
    .args(["--no-psqlrc", "--quiet", "--no-password"])
    .arg(format!("--command={}", config::create_slot_command(&slot)));
    match output(cmd, "creating the slot on the primary") {
        Ok(_) => {
            log(&format!("the slot {slot} was created on the primary"));
            Ok(())
        }
        Err(Fatal(why)) if config::slot_already_exists(&why) => Ok(()),
        Err(e) => Err(e),
    }
}

/// What the data directory holds, for `rejoin::decide`.
pub fn observe(bin: &Path, pgdata: &Path) -> Result<rejoin::Local, Fatal> {
    let mut entries = match std::fs::read_dir(pgdata) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(rejoin::Local::Empty),
        Err(e) => return Err(Fatal(format!("cannot read {}: {e}", pgdata.display()))),
    };
    if entries.next().is_none() {
        return Ok(rejoin::Local::Empty);
    }
    let Ok(version) = std::fs::read_to_string(pgdata.join("PG_VERSION")) else {
        return Ok(rejoin::Local::Foreign);
    };
    let Ok(major) = version.trim().parse() else {
        return Ok(rejoin::Local::Foreign);
    };
    let mut cmd = tool(bin, "pg_controldata");
    cmd.arg(pgdata);
    let control = output(cmd, "pg_controldata")
        .map_err(|Fatal(m)| m)
        .and_then(|text| rejoin::parse_controldata(&text));
    Ok(rejoin::Local::Data { major, control })
}

/// Clones the upstream into the missing or empty `pgdata` as a standby: `pg_basebackup`
/// (streaming the WAL it needs, through the standby's slot, which must exist on the primary)
/// into a scratch directory, the standby settings written, then renamed into place. The
/// passfile must hold the replication password.
pub fn clone(bin: &Path, pgdata: &Path, upstream: &Upstream) -> Result<(), Fatal> {
    if observe(bin, pgdata)? != rejoin::Local::Empty {
        return Err(Fatal(format!(
            "cannot clone into {}: it is not empty",
            pgdata.display()
        )));
    }
    let scratch = pgdata.with_extension("clone");
    let _ = std::fs::remove_dir_all(&scratch);
    let slot = config::slot_name(&upstream.instance);
    log(&format!(
        "cloning {}:{} into a new data directory (slot {slot})",
        upstream.host, upstream.port
    ));
    let mut cmd = tool(bin, "pg_basebackup");
    cmd.arg(format!("--pgdata={}", scratch.display()))
        .arg(format!(
            "--dbname={}",
            config::replication_conninfo(upstream)
        ))
        .arg(format!("--slot={slot}"))
        .arg(format!("--label=dbop clone for {}", upstream.instance))
        .args([
            "--wal-method=stream",
            "--checkpoint=fast",
            "--no-password",
            "--no-manifest",
        ]);
    if let Err(e) = output(cmd, "pg_basebackup") {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(e);
    }
    write_standby_config(&scratch, Some(upstream))?;
    std::fs::rename(&scratch, pgdata).map_err(|e| {
        Fatal(format!(
            "cannot move the cloned data directory into place: {e}"
        ))
    })?;
    log("the clone is complete");
    Ok(())
}

/// Where a failed rewind is remembered, with why (beside the data directory: pg_rewind
/// replaces what is inside it).
pub fn rewind_marker(pgdata: &Path) -> PathBuf {
    pgdata.with_extension("rewind-failed")
}

/// Why an earlier rewind of `pgdata` failed, when one did (the marker's text).
fn earlier_rewind_failure(pgdata: &Path) -> Option<String> {
    let marker = rewind_marker(pgdata);
    marker
        .exists()
        .then(|| std::fs::read_to_string(&marker).unwrap_or_default())
}

/// `pg_rewind` of the stopped `pgdata` from the upstream (it does nothing when nothing
/// diverged, and finishes crash recovery first when the server did not stop cleanly).
/// `local_timeline` and `source_timeline` (from `IDENTIFY_SYSTEM`, always current) let it
/// tell a real "no rewind required" from a source whose control file still shows its old
/// timeline because it has not checkpointed since its promotion.
/// Returns whether anything was rewound.
pub fn rewind(
    bin: &Path,
    pgdata: &Path,
    upstream: &Upstream,
    local_timeline: u32,
    source_timeline: u32,
) -> Result<bool, Fatal> {
    log(&format!(
        "rewinding the data directory from {}:{}",
        upstream.host, upstream.port
    ));
    let marker = rewind_marker(pgdata);
    // Written before it starts: a rewind killed half-way leaves this reason.
    let started = format!(
        "a pg_rewind from {}:{} started and did not finish: the manager stopped during it",
        upstream.host, upstream.port
    );
    write_atomically(&marker, started.as_bytes(), 0o600)?;
    // pg_rewind finishes the target's crash recovery in single-user mode, which refuses to
    // start in standby mode ("standby mode is not supported by single-user servers"): a former
    // primary already set up as a standby that did not stop cleanly would fail the rewind, and
    // be refused for good. The standby settings are written again once it has rewound.
    for signal in [config::STANDBY_SIGNAL, config::RECOVERY_SIGNAL] {
        remove_if_present(&pgdata.join(signal))?;
    }
    ask_for_checkpoint(bin, upstream);
    let mut cmd = tool(bin, "pg_rewind");
    cmd.arg(format!("--target-pgdata={}", pgdata.display()))
        .arg(format!(
            "--source-server={}",
            config::rewind_conninfo(upstream)
        ));
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Fatal(format!("cannot run pg_rewind: {e}")))?;
    // pg_rewind reports on its standard error: where the timelines diverged, or that they
    // did not.
    let report = String::from_utf8_lossy(&out.stderr)
        .trim()
        .replace('\n', "; ");
    if !out.status.success() {
        let why = format!("pg_rewind failed ({}): {report}", out.status);
        if rejoin::rewind_began(&report) {
            write_atomically(&marker, why.as_bytes(), 0o600)?;
            return Err(Fatal(why));
        }
        // It stopped before it changed a file (in its crash recovery, or while it compared
        // the servers): the data is as a crash left it, and the next start tries again.
        std::fs::remove_file(&marker)
            .map_err(|e| Fatal(format!("cannot remove the marker: {e}")))?;
        return Err(Fatal(format!("{why}; nothing was rewound")));
    }
    log(&format!("pg_rewind: {report}"));
    if rejoin::stale_source_timeline(&report, local_timeline, source_timeline) {
        // Nothing was rewound, so nothing is half-rewound: the next start tries again rather
        // than refusing this data for good.
        std::fs::remove_file(&marker)
            .map_err(|e| Fatal(format!("cannot remove the marker: {e}")))?;
        return Err(Fatal(format!(
            "pg_rewind saw the primary on this instance's timeline {local_timeline}, but it is \
             on timeline {source_timeline}: it has not checkpointed since its promotion; \
             nothing was rewound"
        )));
    }
    std::fs::remove_file(&marker).map_err(|e| Fatal(format!("cannot remove the marker: {e}")))?;
    Ok(rejoin::rewound(&report))
}

/// pg_rewind reads the source's timeline from its control file, which a promotion updates only
/// at its next checkpoint: ask for one (the replication role may, from PostgreSQL 15:
/// pg_checkpoint). Best effort; `rewind` checks the report either way.
fn ask_for_checkpoint(bin: &Path, upstream: &Upstream) {
    let mut checkpoint = tool(bin, "psql");
    checkpoint.arg(config::rewind_conninfo(upstream)).args([
        "--no-psqlrc",
        "--quiet",
        "--no-password",
        "--command=CHECKPOINT",
    ]);
    if let Err(Fatal(why)) = output(checkpoint, "CHECKPOINT on the primary") {
        log(&why);
    }
}

/// Removes `path`; one that is not there is fine.
fn remove_if_present(path: &Path) -> Result<(), Fatal> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Fatal(format!("cannot remove {}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

fn local_timeline(local: &rejoin::Local) -> u32 {
    match local {
        rejoin::Local::Data { control: Ok(c), .. } => c.timeline,
        _ => 0,
    }
}

/// What `rejoin` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejoined {
    Followed,
    /// pg_rewind replaced what diverged.
    Rewound,
    /// pg_rewind found the data's end at or before the divergence (a clean switchover).
    NothingToRewind,
    Cloned(CloneReason),
}

/// Why `rejoin` stopped.
#[derive(Debug)]
pub enum RejoinError {
    /// Only a fresh clone can work, and it would discard data the caller did not allow to
    /// discard.
    NeedsClone(CloneReason),
    Failed(Fatal),
}

impl From<Fatal> for RejoinError {
    fn from(f: Fatal) -> Self {
        RejoinError::Failed(f)
    }
}

/// Makes the stopped instance on `pgdata` a standby of `upstream`: follows as is, rewinds, or
/// (when rewinding cannot work and `allow_discard`) replaces the data by a fresh clone. The
/// passfile must hold the replication password.
pub fn rejoin(
    bin: &Path,
    pgdata: &Path,
    major: u32,
    upstream: &Upstream,
    allow_discard: bool,
) -> Result<Rejoined, RejoinError> {
    crate::pid_file::clear(pgdata).map_err(|why| Fatal(format!("cannot rejoin: {why}")))?;
    let source = identify_system(bin, upstream)?;
    loop {
        let local = observe(bin, pgdata)?;
        let failed = earlier_rewind_failure(pgdata);
        let decision = rejoin::decide(&local, major, &source, failed.as_deref());
        log(&format!(
            "rejoining {}:{} (timeline {}): {decision:?}",
            upstream.host, upstream.port, source.timeline
        ));
        match decision {
            Rejoin::Follow => {
                write_standby_config(pgdata, Some(upstream))?;
                return Ok(Rejoined::Followed);
            }
            Rejoin::Rewind => match rewind(
                bin,
                pgdata,
                upstream,
                local_timeline(&local),
                source.timeline,
            ) {
                Ok(rewound) => {
                    write_standby_config(pgdata, Some(upstream))?;
                    return Ok(if rewound {
                        Rejoined::Rewound
                    } else {
                        Rejoined::NothingToRewind
                    });
                }
                Err(Fatal(why)) if allow_discard => {
                    log(&format!("the rewind failed, cloning instead: {why}"));
                }
                Err(fatal) => return Err(fatal.into()),
            },
            Rejoin::Clone(reason) if reason.discards_data() && !allow_discard => {
                return Err(RejoinError::NeedsClone(reason));
            }
            Rejoin::Clone(reason) => {
                if reason.discards_data() {
                    log(&format!(
                        "discarding the data directory: {}",
                        reason.message()
                    ));
                    std::fs::remove_dir_all(pgdata)
                        .map_err(|e| Fatal(format!("cannot discard the data directory: {e}")))?;
                }
                clone(bin, pgdata, upstream)?;
                let _ = std::fs::remove_file(rewind_marker(pgdata));
                return Ok(Rejoined::Cloned(reason));
            }
        }
    }
}
