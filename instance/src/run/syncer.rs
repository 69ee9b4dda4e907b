//! The manager's running duties beside the server: the superuser's password kept equal to the
//! mounted file's, the application database made, the accounts the operator mounts applied on
//! the primary, and a standby's readiness.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Options, READY_MARKER, STANDBY_CHECK, connection_args, log};
use crate::password::{self, Fingerprint, Read, Sync};
use crate::process;
use dbop_contract::accounts::APPLICATION_PASSWORD_FILE;

/// The password file's content, as the pure `password` module judges it.
pub(super) fn read_password(file: &Path) -> Read {
    match std::fs::read(file) {
        Ok(bytes) => match password::from_file(&bytes) {
            Ok(p) => Read::Present(p),
            Err(_) => Read::Present(String::from("\u{fffd}")),
        },
        Err(_) => Read::Missing,
    }
}

/// Keeps the server's password equal to the file's and makes the application database.
pub(super) struct Syncer<'a> {
    o: &'a Options,
    bin: &'a Path,
    user: &'a str,
    applied: Option<Fingerprint>,
    database_made: bool,
    last_problem: Option<String>,
    /// Ready as a standby (accepts connections and streams: the marker is written).
    standby_ready: bool,
    standby_checked: Option<Instant>,
    /// When the standby was last seen streaming.
    streamed: Option<Instant>,
    accounts: AccountsState,
}

/// What the primary did with the mounted accounts (`accounts`).
#[derive(Default)]
struct AccountsState {
    /// The fingerprint of the files last applied in full.
    applied: Option<Fingerprint>,
    /// When an apply last ran (a failing one is retried every `ACCOUNTS_RETRY`).
    tried: Option<Instant>,
    /// The application role and database exist (or there is no document to make them from):
    /// the primary may say it is ready.
    ready: bool,
}

/// How often a failing accounts apply (a role that cannot be dropped, say) is tried again.
const ACCOUNTS_RETRY: Duration = Duration::from_secs(10);

impl<'a> Syncer<'a> {
    pub(super) fn new(o: &'a Options, bin: &'a Path, user: &'a str) -> Self {
        Self {
            o,
            bin,
            user,
            applied: None,
            database_made: false,
            last_problem: None,
            standby_ready: false,
            standby_checked: None,
            streamed: None,
            accounts: AccountsState::default(),
        }
    }

    /// The superuser's password is applied and the application database exists.
    pub(super) fn applied(&self) -> bool {
        self.database_made
    }

    pub(super) fn tick(&mut self) {
        if crate::replication::config::is_standby(&self.o.pgdata) {
            // A standby has its primary's roles, passwords and databases, and cannot write
            // them: it is ready while it answers and streams. After a promotion it syncs like
            // any primary.
            return self.standby_tick();
        }
        let read = read_password(&self.o.credentials_dir.join("password"));
        match password::decide(self.applied.as_ref(), &read) {
            Sync::Nothing if self.database_made => {}
            Sync::Nothing | Sync::Apply => {
                if let Read::Present(p) = read {
                    self.apply(&p);
                }
            }
            Sync::Problem(message) => self.problem(message),
        }
        if self.database_made {
            self.accounts_tick();
        }
    }

    /// Applies the mounted accounts when they changed (`accounts`); the primary is ready once
    /// the application role and database exist.
    fn accounts_tick(&mut self) {
        let mounted = match crate::accounts::read(&self.o.accounts_dir) {
            crate::accounts::Read::Missing => return self.accounts_ready(),
            crate::accounts::Read::Invalid(why) => {
                self.accounts_problem(why);
                return self.accounts_ready();
            }
            crate::accounts::Read::Present(m) => m,
        };
        let state = &self.accounts;
        if state.applied == Some(mounted.fingerprint)
            || state.tried.is_some_and(|t| t.elapsed() < ACCOUNTS_RETRY)
        {
            return;
        }
        self.accounts.tried = Some(Instant::now());
        let mut failures = Vec::new();
        let application = mounted.passwords[APPLICATION_PASSWORD_FILE].as_str();
        match self.scram(application) {
            Ok(v) => match self.psql(&crate::accounts::application_sql(&mounted.accounts, &v)) {
                Ok(()) => self.accounts_ready(),
                Err(why) => failures.push(format!("the application role: {why}")),
            },
            Err(why) => failures.push(why),
        }
        for role in &mounted.accounts.roles {
            let password = role
                .password_file
                .as_ref()
                .map(|f| mounted.passwords[f].as_str());
            let done = match password.map(|p| self.scram(p)).transpose() {
                Ok(v) => self.psql(&crate::accounts::role_sql(role, v.as_deref())),
                Err(why) => Err(why),
            };
            if let Err(why) = done {
                failures.push(format!("role {:?}: {why}", role.name));
            }
        }
        if failures.is_empty() {
            log("the accounts are applied (the application role and database, the declared roles)");
            self.accounts.applied = Some(mounted.fingerprint);
        } else {
            self.accounts_problem(failures.join("; "));
        }
    }

    fn scram(&self, password: &str) -> Result<String, String> {
        let salt = process::random_bytes(16).map_err(|e| format!("no random salt: {e}"))?;
        Ok(password::scram_verifier(
            password,
            &salt,
            password::SCRAM_ITERATIONS,
        ))
    }

    fn accounts_problem(&mut self, message: String) {
        let message = format!("the accounts are not applied: {message}");
        if self.last_problem.as_ref() != Some(&message) {
            log(&message);
            self.last_problem = Some(message);
        }
    }

    fn accounts_ready(&mut self) {
        if !self.accounts.ready {
            self.accounts.ready = true;
            let _ = std::fs::write(self.o.socket_dir.join(READY_MARKER), b"");
        }
    }

    fn standby_tick(&mut self) {
        if self
            .standby_checked
            .is_some_and(|t| t.elapsed() < STANDBY_CHECK)
        {
            return;
        }
        self.standby_checked = Some(Instant::now());
        let accepting = self.accepting();
        let receiver = accepting.then(|| self.receiver()).flatten();
        if crate::role::streaming(receiver.as_deref()) {
            self.streamed = Some(Instant::now());
        }
        let since_streamed = self.streamed.map(|t| t.elapsed());
        let ready = crate::role::standby_ready(accepting, receiver.as_deref(), since_streamed);
        if ready == self.standby_ready {
            return;
        }
        let marker = self.o.socket_dir.join(READY_MARKER);
        if ready {
            log("the server runs as a standby and streams: ready (its roles are the primary's)");
            let _ = std::fs::write(marker, b"");
        } else {
            log("the standby does not stream (for longer than the grace): not ready until it does");
            let _ = std::fs::remove_file(marker);
        }
        self.standby_ready = ready;
    }

    /// The WAL receiver's state (`None`: none runs, or the query failed).
    fn receiver(&self) -> Option<String> {
        let server = crate::replication::ops::LocalServer {
            bin: self.bin.to_path_buf(),
            socket_dir: self.o.socket_dir.clone(),
            port: self.o.port,
            superuser: self.user.to_string(),
        };
        let out = server
            .query("SELECT status FROM pg_stat_wal_receiver;\n")
            .ok()?;
        let status = out.trim();
        (!status.is_empty()).then(|| status.to_string())
    }

    fn problem(&mut self, message: String) {
        if self.last_problem.as_ref() != Some(&message) {
            log(&format!("the password is not applied: {message}"));
            self.last_problem = Some(message);
        }
    }

    fn apply(&mut self, password: &str) {
        if !self.accepting() {
            return;
        }
        let salt = match process::random_bytes(16) {
            Ok(salt) => salt,
            Err(e) => return self.problem(format!("no random salt: {e}")),
        };
        let verifier = password::scram_verifier(password, &salt, password::SCRAM_ITERATIONS);
        let sql = password::sync_sql(self.user, &verifier, !self.database_made);
        match self.psql(&sql) {
            Ok(()) => {
                log(
                    "the server's password is the mounted Secret's; the application database exists",
                );
                self.applied = Some(password::fingerprint(password));
                self.database_made = true;
                self.last_problem = None;
                if self.accounts.ready {
                    let _ = std::fs::write(self.o.socket_dir.join(READY_MARKER), b"");
                }
            }
            Err(message) => self.problem(message),
        }
    }

    fn accepting(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(connection_args(self.o, self.user, "postgres"))
            .arg("--quiet")
            .status()
            .is_ok_and(|s| s.success())
    }

    fn psql(&self, sql: &str) -> Result<(), String> {
        let mut child = Command::new(self.bin.join("psql"))
            .env("PGOPTIONS", crate::replication::ops::OWN_SESSIONS)
            .args(connection_args(self.o, self.user, "postgres"))
            .args([
                "--no-psqlrc",
                "--quiet",
                "--set=ON_ERROR_STOP=1",
                "--file=-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(sql.as_bytes())
                .map_err(|e| format!("cannot write to psql: {e}"))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}
