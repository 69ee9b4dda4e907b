//! The `dbop-instance` binary: `run` is the database container's entrypoint, `probe` its
//! startup, readiness and liveness check, `replication …` the standby mechanics.

use std::time::Duration;

use clap::{Parser, Subcommand};
use dbop_contract::instance::{Cmd, Common};
use dbop_instance::run::{self, Options};
use dbop_instance::shutdown::Timeouts;

/// The manager's command line: the contract's commands (`dbop_contract::instance`, which the
/// operator writes into its pods) and the replication commands beside them.
#[derive(Parser)]
#[command(
    name = "dbop-instance",
    version,
    about = "dbop's PostgreSQL instance manager"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Contract(Cmd),
    /// Streaming replication: the replication role and slots, clone, follow, rejoin, promote,
    /// status (see `dbop_instance::replication::cli`).
    #[command(subcommand)]
    Replication(dbop_instance::replication::cli::Cmd),
}

/// The contract's flags as the manager's options.
trait IntoOptions {
    fn options(self) -> Options;
}

impl IntoOptions for Common {
    fn options(self) -> Options {
        Options {
            pgdata: self.pgdata,
            major: self.major,
            listen_addresses: self.listen_addresses,
            port: self.port,
            socket_dir: self.socket_dir,
            credentials_dir: self.credentials_dir,
            config_dir: self.config_dir,
            termination_log: self.termination_log,
            timeouts: Timeouts {
                smart: Duration::from_secs(self.smart_shutdown_seconds),
                fast: Duration::from_secs(self.fast_shutdown_seconds),
            },
            poll: Duration::from_millis(self.poll_millis),
            metrics_addr: self.metrics_addr,
            status_addr: self.status_addr.or_else(|| {
                self.primary_lease.as_ref().map(|_| {
                    std::net::SocketAddr::from(([0, 0, 0, 0], dbop_contract::position::STATUS_PORT))
                })
            }),
            tls_dir: self.tls_dir,
            instance_name: self.instance_name,
            replication_dir: self.replication_dir,
            accounts_dir: self.accounts_dir,
            primary_lease: self.primary_lease,
            lease: None,
        }
    }
}

fn main() -> std::process::ExitCode {
    let code = match Cli::parse().command {
        Command::Contract(Cmd::Run(c)) => run::run(&c.options()),
        Command::Contract(Cmd::Probe(c)) => run::probe(&c.options()),
        Command::Contract(Cmd::ServerVersion(v)) => {
            dbop_instance::version::check(v.major, &v.expect, &v.termination_log)
        }
        Command::Replication(c) => dbop_instance::replication::cli::run(c),
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
