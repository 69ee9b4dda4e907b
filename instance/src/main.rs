//! The `dbop-instance` binary: `run` is the database container's entrypoint, `probe` its
//! startup, readiness and liveness check.

use std::time::Duration;

use clap::Parser;
use dbop_contract::instance::{Cli, Cmd, Common};
use dbop_instance::run::{self, Options};
use dbop_instance::shutdown::Timeouts;

/// The command line is the contract's (`dbop_contract::instance`): the operator writes it.
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
            termination_log: self.termination_log,
            timeouts: Timeouts {
                smart: Duration::from_secs(self.smart_shutdown_seconds),
                fast: Duration::from_secs(self.fast_shutdown_seconds),
            },
            poll: Duration::from_millis(self.poll_millis),
        }
    }
}

fn main() -> std::process::ExitCode {
    let code = match Cli::parse().command {
        Cmd::Run(c) => run::run(&c.options()),
        Cmd::Probe(c) => run::probe(&c.options()),
        Cmd::ServerVersion(v) => {
            dbop_instance::version::check(v.major, &v.expect, &v.termination_log)
        }
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
