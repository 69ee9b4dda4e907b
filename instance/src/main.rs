//! The `dbop-instance` binary: `run` is the database container's entrypoint, `probe` its
//! startup, readiness and liveness check.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dbop_instance::run::{self, Options};
use dbop_instance::shutdown::Timeouts;

#[derive(Parser)]
#[command(
    name = "dbop-instance",
    version,
    about = "dbop's PostgreSQL instance manager"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// initdb when needed, then run postgres as a child until it stops.
    Run(Common),
    /// Exit 0 when the instance is ready (for Kubernetes probes).
    Probe(Common),
    /// Print the version the image's `postgres` reports to the termination log; exit 0 when
    /// it is the expected one (dbop's upgrade preflight).
    ServerVersion(VersionArgs),
    /// Streaming replication: the replication role and slots, clone, follow, rejoin, promote,
    /// status (see `dbop_instance::replication::cli`).
    #[command(subcommand)]
    Replication(dbop_instance::replication::cli::Cmd),
}

#[derive(Args)]
struct VersionArgs {
    /// The PostgreSQL major version whose binaries to look for.
    #[arg(long)]
    major: u32,
    /// The `MAJOR.MINOR` the binary must report.
    #[arg(long)]
    expect: String,
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
}

#[derive(Args)]
struct Common {
    /// The data directory.
    #[arg(long)]
    pgdata: PathBuf,
    /// The PostgreSQL major version the image runs.
    #[arg(long)]
    major: u32,
    /// The addresses the server listens on (`*`: every interface of the pod).
    #[arg(long, default_value = "*")]
    listen_addresses: String,
    #[arg(long, default_value_t = 5432)]
    port: u16,
    /// A writable directory for the server's Unix socket.
    #[arg(long, default_value = "/var/run/postgresql")]
    socket_dir: PathBuf,
    /// The mounted credentials Secret: files `password` and, optionally, `username`.
    #[arg(long)]
    credentials_dir: PathBuf,
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
    /// Seconds a smart shutdown may take before a fast one.
    #[arg(long, default_value_t = 30)]
    smart_shutdown_seconds: u64,
    /// Seconds a fast shutdown may take before an immediate one.
    #[arg(long, default_value_t = 20)]
    fast_shutdown_seconds: u64,
    /// Milliseconds between two looks at the server, the signals and the password file.
    #[arg(long, default_value_t = 500)]
    poll_millis: u64,
    /// `run` only: serve PostgreSQL's metrics at http://ADDR/metrics (e.g. `0.0.0.0:9187`).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

impl Common {
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
            metrics_addr: self.metrics_addr,
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
        Cmd::Replication(c) => dbop_instance::replication::cli::run(c),
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
