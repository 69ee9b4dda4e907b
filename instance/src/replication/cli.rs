//! `dbop-instance replication …`: the replication mechanics as subcommands the operator runs
//! in the database container (as the data directory's owner). Argument parsing and the
//! mapping to `ops`; exit codes: 0 done, 1 failed, 2 only a fresh clone can work and
//! `--allow-discard` was not given.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::replication::config::Upstream;
use crate::replication::ops::{self, LocalServer, RejoinError};
use crate::run::{self, Fatal};

#[derive(Subcommand)]
pub enum Cmd {
    /// On the primary: create or update the replication role, its password the mounted one's.
    EnsureRole {
        #[command(flatten)]
        local: LocalArgs,
        /// The file holding the replication role's password.
        #[arg(long, default_value = "/etc/dbop/replication/password")]
        replication_password_file: PathBuf,
    },
    /// On the primary: make the slots of exactly these standbys (instance names) exist; dbop's
    /// other slots are dropped once unused.
    Slots {
        #[command(flatten)]
        local: LocalArgs,
        #[arg(long = "standby")]
        standbys: Vec<String>,
    },
    /// Clone the primary into the empty data directory as a standby of it.
    Clone {
        #[command(flatten)]
        local: LocalArgs,
        #[command(flatten)]
        upstream: UpstreamArgs,
    },
    /// Repoint the running standby at another primary (a reload, no restart).
    Follow {
        #[command(flatten)]
        local: LocalArgs,
        #[command(flatten)]
        upstream: UpstreamArgs,
    },
    /// Make the stopped instance a standby of the primary: as is, after pg_rewind, or (with
    /// --allow-discard) from a fresh clone when rewinding cannot work.
    Rejoin {
        #[command(flatten)]
        local: LocalArgs,
        #[command(flatten)]
        upstream: UpstreamArgs,
        /// Replace the data by a fresh clone when it cannot be rewound.
        #[arg(long)]
        allow_discard: bool,
    },
    /// Promote the running standby; returns once it accepts writes.
    Promote {
        #[command(flatten)]
        local: LocalArgs,
        #[arg(long, default_value_t = 60)]
        wait_seconds: u32,
    },
    /// Print the role, timeline, WAL positions and slots as key=value lines.
    Status {
        #[command(flatten)]
        local: LocalArgs,
    },
}

/// The local instance.
#[derive(Args)]
pub struct LocalArgs {
    /// The data directory.
    #[arg(long)]
    pgdata: PathBuf,
    /// The PostgreSQL major version the image runs.
    #[arg(long)]
    major: u32,
    /// The local server's port (its socket's name).
    #[arg(long, default_value_t = 5432)]
    port: u16,
    /// The local server's socket directory.
    #[arg(long, default_value = "/var/run/postgresql")]
    socket_dir: PathBuf,
    /// The mounted superuser credentials (the superuser's name, for the local socket).
    #[arg(long, default_value = "/etc/dbop/credentials")]
    credentials_dir: PathBuf,
}

/// The primary to stream from.
#[derive(Args)]
pub struct UpstreamArgs {
    /// The primary's address (the operator names the pod, not a Service that may move).
    #[arg(long)]
    primary_host: String,
    /// The primary's port.
    #[arg(long, default_value_t = 5432)]
    primary_port: u16,
    /// This instance's name: its application_name on the primary and its slot's name.
    #[arg(long)]
    instance: String,
    /// The file holding the replication role's password.
    #[arg(long, default_value = "/etc/dbop/replication/password")]
    replication_password_file: PathBuf,
    /// The passfile written for libpq (mode 0600). By default on the data volume beside the
    /// data directory: it survives a restart (the walreceiver reads it at every connection)
    /// and neither pg_basebackup nor pg_rewind copies it.
    #[arg(
        long,
        default_value = "/var/lib/postgresql/data/dbop-replication.pgpass"
    )]
    passfile: PathBuf,
}

impl LocalArgs {
    fn server(&self) -> Result<LocalServer, Fatal> {
        Ok(LocalServer {
            bin: run::bin_dir(self.major)?,
            socket_dir: self.socket_dir.clone(),
            port: self.port,
            superuser: run::superuser(&self.credentials_dir)?,
        })
    }
}

impl UpstreamArgs {
    /// The upstream, with the passfile written from the mounted password.
    fn prepare(&self) -> Result<Upstream, Fatal> {
        let password = ops::read_password(&self.replication_password_file)?;
        ops::write_passfile(&self.passfile, &password)?;
        Ok(Upstream {
            host: self.primary_host.clone(),
            port: self.primary_port,
            instance: self.instance.clone(),
            passfile: self.passfile.clone(),
            ssl_root_cert: None,
        })
    }
}

/// Runs one subcommand; returns the exit code.
pub fn run(cmd: Cmd) -> i32 {
    match execute(cmd) {
        Ok(()) => 0,
        Err(RejoinError::NeedsClone(reason)) => {
            eprintln!(
                "dbop-instance: only a fresh clone can make this instance a standby ({}); \
                 run again with --allow-discard to discard its data",
                reason.message()
            );
            2
        }
        Err(RejoinError::Failed(Fatal(message))) => {
            eprintln!("dbop-instance: {message}");
            1
        }
    }
}

fn execute(cmd: Cmd) -> Result<(), RejoinError> {
    match cmd {
        Cmd::EnsureRole {
            local,
            replication_password_file,
        } => {
            let password = ops::read_password(&replication_password_file)?;
            local.server()?.ensure_role(&password)?;
            eprintln!("dbop-instance: the replication role has the mounted password");
        }
        Cmd::Slots { local, standbys } => {
            let plan = local.server()?.reconcile_slots(&standbys)?;
            eprintln!(
                "dbop-instance: slots created {:?}, dropped {:?}, unused but still connected {:?}",
                plan.create, plan.drop, plan.busy
            );
        }
        Cmd::Clone { local, upstream } => {
            let bin = run::bin_dir(local.major)?;
            ops::clone(&bin, &local.pgdata, &upstream.prepare()?)?;
        }
        Cmd::Follow { local, upstream } => {
            let server = local.server()?;
            let status = server.status()?;
            if status.role() != crate::replication::status::Role::Standby {
                return Err(Fatal(
                    "the server runs as a primary: stop it, then rejoin (a primary cannot \
                     simply follow another one: its timeline may have diverged)"
                        .into(),
                )
                .into());
            }
            ops::write_standby_config(&local.pgdata, Some(&upstream.prepare()?))?;
            server.reload()?;
            eprintln!(
                "dbop-instance: following {}:{}",
                upstream.primary_host, upstream.primary_port
            );
        }
        Cmd::Rejoin {
            local,
            upstream,
            allow_discard,
        } => {
            let bin = run::bin_dir(local.major)?;
            let upstream = upstream.prepare()?;
            let done = ops::rejoin(&bin, &local.pgdata, local.major, &upstream, allow_discard)?;
            eprintln!("dbop-instance: rejoined: {done:?}");
        }
        Cmd::Promote {
            local,
            wait_seconds,
        } => {
            local.server()?.promote(wait_seconds)?;
            ops::write_standby_config(&local.pgdata, None)?;
            eprintln!("dbop-instance: promoted: the server accepts writes");
        }
        Cmd::Status { local } => {
            let server = local.server()?;
            let status = server.status()?;
            let mut out = status.render();
            if status.role() == crate::replication::status::Role::Primary {
                for slot in server.slots()? {
                    out.push_str(&format!(
                        "slot.{}={} {}\n",
                        slot.name,
                        if slot.active { "active" } else { "inactive" },
                        slot.restart_lsn.map(|l| l.to_string()).unwrap_or_default()
                    ));
                }
            }
            print!("{out}");
        }
    }
    Ok(())
}
