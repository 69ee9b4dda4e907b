//! `recover`, the I/O: a whole point-in-time recovery, for a Job that runs before the
//! database's own pod. `base-restore` into the scratch sibling `<data dir>.recovering`, a
//! private PostgreSQL on it (no TCP, its own socket directory) that replays WAL through
//! `wal-fetch` until it promotes, the point reached read back, the recovery settings removed,
//! a clean shutdown, the marker written, then one rename into place. A run killed at any
//! moment leaves at most the scratch, which the next run deletes first; a finished directory
//! (its marker) is reported again and left alone; any other content is refused, never deleted.
//!
//! Every decision (paths, settings, what the log and the tools say) is `recovery`'s.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use dbop_contract::identity::{self, Identity};
use tokio::process::{Child, Command};

use crate::base::{BaseRecord, Lsn, Target};
use crate::base_restore::{self, BaseRestoreOptions};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pg::PgTools;
use crate::recovery::{self, Probe, Reached, Start};
use crate::recovery_check;
use crate::result::BackupResult;
use crate::s3::Store;
use crate::signals::Interrupt;

/// How often the recovering server is asked whether it promoted.
const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The result of the recovery already finished in `data_dir`, if there is one; an error if the
/// directory holds anything else.
pub fn finished(data_dir: &Path) -> Result<Option<BackupResult>> {
    let io = |e| Error::io(format!("cannot read {}", data_dir.display()), e);
    let entries = match std::fs::read_dir(data_dir) {
        Ok(rd) => Some(
            rd.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<Vec<String>>>()
                .map_err(io)?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(e)),
    };
    let marker = std::fs::read(data_dir.join(recovery::MARKER_FILE)).ok();
    match recovery::start_from(data_dir, entries.as_deref(), marker.as_deref()) {
        Start::Fresh => Ok(None),
        Start::Finished(result) => Ok(Some(*result)),
        Start::Occupied(message) => Err(Error::Usage(message)),
    }
}

/// The whole recovery of `opts.data_dir` (checked with [`finished`] first); `result` gets the
/// point reached. Any failure deletes the scratch.
pub async fn recover(
    store: &Store,
    layout: &Layout,
    tools: &PgTools,
    opts: &BaseRestoreOptions,
    interrupt: &Interrupt,
    result: &mut BackupResult,
) -> Result<()> {
    let scratch = recovery::scratch_dir(&opts.data_dir).ok_or_else(|| {
        Error::Usage(format!(
            "{} names no directory to recover into",
            opts.data_dir.display()
        ))
    })?;
    remove_scratch(&scratch)?;
    let into_scratch = BaseRestoreOptions {
        data_dir: scratch.clone(),
        ..opts.clone()
    };
    let outcome = async {
        let record =
            base_restore::base_restore(store, layout, tools, &into_scratch, interrupt).await?;
        result.backup_id = Some(record.backup_id.clone());
        result.engine_version = Some(record.engine_version.clone());
        let (reached, timeline) = replay(tools, &record, &scratch, &opts.target, interrupt).await?;
        *result = recovery::recovered(result.clone(), &record.backup_id, &reached, timeline);
        result.completed_at = Some(chrono::Utc::now());
        write_file(
            &scratch.join(recovery::MARKER_FILE),
            result.to_summary_line().as_bytes(),
        )?;
        move_into_place(&scratch, &opts.data_dir)
    }
    .await;
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    outcome
}

/// What a recovered data directory holds, read by starting its server privately once more:
/// the WAL segment holding `lsn` (the point the recovery reached) and every table's rows in
/// every database, each table read whole. The server is stopped cleanly after.
pub struct Inspection {
    pub wal_file: String,
    pub counts: recovery_check::Counts,
}

/// Inspects the finished recovery in `data_dir` (of a server of `engine_version`).
pub async fn inspect(
    tools: &PgTools,
    engine_version: Option<&str>,
    data_dir: &Path,
    lsn: &Lsn,
    interrupt: &Interrupt,
) -> Result<Inspection> {
    let private = Private::create(data_dir.parent().unwrap_or(data_dir))?;
    let major = engine_version.and_then(major_of);
    let mut server = start_server(tools, major, data_dir, &private)?;
    let read = async {
        until_promoted(
            tools,
            major,
            &mut server,
            &private,
            &Target::Latest,
            data_dir,
            interrupt,
        )
        .await?;
        let wal_file = query(tools, major, &private, &recovery_check::wal_file_sql(lsn)).await?;
        let names = query(tools, major, &private, recovery_check::DATABASES_SQL).await?;
        let mut counts = recovery_check::Counts::new();
        for name in recovery_check::parse_databases(&names)? {
            let answer = query_in(tools, major, &private, &name, crate::pg::ROW_COUNT_SQL);
            let answer = tokio::select! {
                a = answer => a?,
                s = interrupt.wait() => return Err(Error::Interrupted(s)),
            };
            let tables = serde_json::from_str(answer.trim()).map_err(|e| {
                crate::pg::pg_error("psql", &name, format!("unexpected row count output: {e}"))
            })?;
            counts.insert(name, tables);
        }
        Ok(Inspection { wal_file, counts })
    }
    .await;
    let stopped = stop_server(&mut server).await;
    let inspection = read?;
    match stopped {
        Ok(status) if status.success() => Ok(inspection),
        Ok(status) => Err(server_error(
            data_dir,
            format!(
                "its shutdown after reading the tables failed ({status}). Server log: {}",
                recovery::log_tail(&private.read_log())
            ),
        )),
        Err(e) => Err(Error::io("cannot stop the recovered server", e)),
    }
}

/// Deletes a scratch directory a killed run left (it is ours by its name).
fn remove_scratch(scratch: &Path) -> Result<()> {
    match std::fs::remove_dir_all(scratch) {
        Ok(()) => {
            tracing::info!(scratch = %scratch.display(), "removed the scratch of an unfinished run");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(
            format!("cannot remove the unfinished {}", scratch.display()),
            e,
        )),
    }
}

/// A private directory for the server's socket, `pg_hba.conf` and log, removed when dropped;
/// and the environment PostgreSQL's programs need to look the agent's uid up.
struct Private {
    dir: PathBuf,
    identity: Vec<(&'static str, PathBuf)>,
}

impl Private {
    fn create(home: &Path) -> Result<Private> {
        let dir = std::env::temp_dir().join(format!("dbop-recover-{}", std::process::id()));
        let io = |e| Error::io(format!("cannot create {}", dir.display()), e);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
        write_file(&dir.join("pg_hba.conf"), recovery::HBA.as_bytes())?;
        let identity = give_uid_an_entry(&dir, home)?;
        Ok(Private { dir, identity })
    }

    /// `program` with the uid's nss_wrapper environment, when it needs one.
    fn command(&self, program: PathBuf) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.identity.iter().map(|(name, value)| (name, value)));
        cmd
    }

    fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn read_log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.log()).unwrap_or_default()).into_owned()
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The major version of a backup's server, for its tools.
fn major(record: &BaseRecord) -> Option<u32> {
    major_of(&record.engine_version)
}

fn major_of(engine_version: &str) -> Option<u32> {
    engine_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
}

/// The nss_wrapper environment for PostgreSQL's programs when the image's `/etc/passwd` has no
/// entry for the agent's uid (OpenShift's arbitrary uids, Bitnami's 1001): the server looks its
/// uid up as it starts. Its files go in `dir`. An unlisted uid with no nss_wrapper in the image
/// is refused with what to change.
fn give_uid_an_entry(dir: &Path, home: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let image_passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let nss_wrapper_lib = std::env::var("NSS_WRAPPER_LIB").ok();
    let candidates = identity::wrapper_candidates(nss_wrapper_lib.as_deref());
    let listed = identity::listed(&image_passwd, uid);
    let library = match identity::decide(listed, &candidates, Path::is_file) {
        Identity::Listed => return Ok(Vec::new()),
        Identity::Unknown => return Err(Error::Usage(identity::unknown_message(uid))),
        Identity::Wrapped { library } => library,
    };
    let image_group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let image = [image_passwd.as_str(), image_group.as_str()];
    let wrapper = identity::wrapper(&library, image, (uid, gid), home, dir);
    for (path, text) in &wrapper.files {
        write_file(path, text.as_bytes())?;
    }
    tracing::info!(uid, library = %library.display(), "no entry in /etc/passwd: PostgreSQL runs with nss_wrapper");
    Ok(wrapper.env.into())
}

/// Runs the private server on the scratch until it promoted, reads the point reached, removes
/// the recovery settings and stops it cleanly: the point and the new timeline.
async fn replay(
    tools: &PgTools,
    record: &BaseRecord,
    scratch: &Path,
    target: &Target,
    interrupt: &Interrupt,
) -> Result<(Reached, u32)> {
    let private = Private::create(scratch.parent().unwrap_or(scratch))?;
    let major = major(record);
    let mut server = start_server(tools, major, scratch, &private)?;
    let reached = async {
        until_promoted(
            tools,
            major,
            &mut server,
            &private,
            target,
            scratch,
            interrupt,
        )
        .await?;
        let answer = query(tools, major, &private, recovery::REACHED_SQL).await?;
        recovery::parse_reached(&answer).map_err(|d| server_error(scratch, d))
    }
    .await;
    let stopped = stop_server(&mut server).await;
    let reached = reached?;
    let status = stopped.map_err(|e| Error::io("cannot stop the recovered server", e))?;
    if !status.success() {
        return Err(server_error(
            scratch,
            format!(
                "its shutdown failed ({status}). Server log: {}",
                recovery::log_tail(&private.read_log())
            ),
        ));
    }
    let control = control_data(tools, major, scratch).await?;
    if control.state != "shut down" {
        return Err(server_error(
            scratch,
            format!("after its shutdown pg_controldata says {:?}", control.state),
        ));
    }
    settle(scratch, control.timeline)?;
    tracing::info!(timeline = control.timeline, lsn = ?reached.lsn, "recovered and promoted");
    Ok((reached, control.timeline))
}

fn server_error(scratch: &Path, detail: impl Into<String>) -> Error {
    Error::Postgres {
        tool: "postgres".into(),
        database: "(instance)".into(),
        server: format!("data directory {}", scratch.display()),
        detail: detail.into(),
    }
}

/// `postgres -D scratch` with the private settings, its output into the private log.
fn start_server(
    tools: &PgTools,
    major: Option<u32>,
    scratch: &Path,
    private: &Private,
) -> Result<Child> {
    let log = std::fs::File::create(private.log())
        .map_err(|e| Error::io("cannot create the server's log", e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::io("cannot create the server's log", e))?;
    let mut cmd = private.command(tools.path("postgres", major));
    cmd.arg("-D").arg(scratch);
    for (name, value) in recovery::server_settings(&private.dir, &private.dir.join("pg_hba.conf")) {
        cmd.arg("-c").arg(format!("{name}={value}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .current_dir(&private.dir);
    tracing::info!(data_dir = %scratch.display(), "starting PostgreSQL to replay WAL");
    cmd.spawn()
        .map_err(|e| server_error(scratch, format!("cannot start postgres: {e}")))
}

/// Waits until the server promoted; its exit, a refused connection or a signal is an error.
async fn until_promoted(
    tools: &PgTools,
    major: Option<u32>,
    server: &mut Child,
    private: &Private,
    target: &Target,
    scratch: &Path,
    interrupt: &Interrupt,
) -> Result<()> {
    loop {
        if let Some(status) = server
            .try_wait()
            .map_err(|e| Error::io("cannot watch the server", e))?
        {
            return Err(recovery::exit_failure(
                target,
                scratch,
                &status.to_string(),
                &private.read_log(),
            ));
        }
        let answer = try_query(tools, major, private, None, "SELECT pg_is_in_recovery()").await;
        match recovery::probe(answer.as_deref().map_err(String::as_str)) {
            Probe::Promoted => return Ok(()),
            Probe::Refused(m) => {
                return Err(server_error(
                    scratch,
                    format!(
                        "it promoted but refused the agent's connection (libpq's PGUSER must be a role of the backup): {m}"
                    ),
                ));
            }
            Probe::Recovering => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(PROBE_EVERY) => {}
            s = interrupt.wait() => return Err(Error::Interrupted(s)),
        }
    }
}

/// psql on the private socket (no password: the socket is the agent's own).
async fn try_query(
    tools: &PgTools,
    major: Option<u32>,
    private: &Private,
    database: Option<&str>,
    sql: &str,
) -> std::result::Result<String, String> {
    let mut cmd = private.command(tools.path("psql", major));
    cmd.args(crate::pg::QUERY_ARGS)
        .arg(sql)
        .env("PGHOST", &private.dir)
        .env("PGPORT", recovery::PORT.to_string())
        .env("PGDATABASE", database.unwrap_or(recovery::CONNECT_DATABASE))
        .env("PGAPPNAME", "dbop-backup recover")
        .env("PGCONNECT_TIMEOUT", "10");
    for unset in ["PGHOSTADDR", "PGSERVICE", "PGSERVICEFILE", "PGOPTIONS"] {
        cmd.env_remove(unset);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn query(
    tools: &PgTools,
    major: Option<u32>,
    private: &Private,
    sql: &str,
) -> Result<String> {
    query_in(tools, major, private, recovery::CONNECT_DATABASE, sql).await
}

async fn query_in(
    tools: &PgTools,
    major: Option<u32>,
    private: &Private,
    database: &str,
    sql: &str,
) -> Result<String> {
    try_query(tools, major, private, Some(database), sql)
        .await
        .map_err(|e| crate::pg::pg_error("psql", database, crate::pg::tail_text(&e)))
}

/// A fast shutdown (SIGINT), waited for; a server that already exited is left as it is.
async fn stop_server(server: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    if let Some(status) = server.try_wait()? {
        return Ok(status);
    }
    if let Some(pid) = server.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    server.wait().await
}

/// `pg_controldata` of the stopped server.
async fn control_data(
    tools: &PgTools,
    major: Option<u32>,
    scratch: &Path,
) -> Result<recovery::Control> {
    let out = Command::new(tools.path("pg_controldata", major))
        .arg(scratch)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| server_error(scratch, format!("cannot run pg_controldata: {e}")))?;
    if !out.status.success() {
        let detail = crate::pg::tail_text(&String::from_utf8_lossy(&out.stderr));
        return Err(server_error(scratch, format!("pg_controldata: {detail}")));
    }
    recovery::parse_controldata(&String::from_utf8_lossy(&out.stdout))
        .map_err(|d| server_error(scratch, d))
}

/// The stopped, promoted server made a plain primary: its recovery settings removed, and the
/// new timeline's history file marked for archiving (this run did not archive), so the
/// database's own server archives it.
fn settle(scratch: &Path, timeline: u32) -> Result<()> {
    let auto = scratch.join("postgresql.auto.conf");
    let text = std::fs::read_to_string(&auto)
        .map_err(|e| Error::io(format!("cannot read {}", auto.display()), e))?;
    write_file(&auto, recovery::without_recovery_settings(&text).as_bytes())?;
    for leftover in ["recovery.signal", "standby.signal"] {
        match std::fs::remove_file(scratch.join(leftover)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("cannot remove {leftover}"), e));
            }
            _ => {}
        }
    }
    let history = format!("{timeline:08X}.history");
    let status = scratch.join("pg_wal/archive_status");
    let archived = ["ready", "done"]
        .iter()
        .any(|s| status.join(format!("{history}.{s}")).exists());
    if timeline > 1 && scratch.join("pg_wal").join(&history).is_file() && !archived {
        write_file(&status.join(format!("{history}.ready")), b"")?;
    }
    Ok(())
}

/// Writes a file (mode 0600) through a temporary name, synced, then renamed over it.
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| Error::io(format!("cannot write {}", path.display()), e);
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("cannot sync {}", dir.display()), e))
}

/// The finished scratch renamed onto the data directory (absent, or an empty directory, which
/// the rename replaces), then the parent synced. The server's own shutdown synced the files.
fn move_into_place(scratch: &Path, data_dir: &Path) -> Result<()> {
    sync_dir(scratch)?;
    std::fs::rename(scratch, data_dir).map_err(|e| {
        Error::io(
            format!(
                "cannot rename {} to {} (the data directory must be absent or empty, and not a mount point: recover needs its parent on the same volume)",
                scratch.display(),
                data_dir.display()
            ),
            e,
        )
    })?;
    sync_dir(
        data_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    )
}
