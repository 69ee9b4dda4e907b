//! What the operator and the instance manager (`dbop-instance`, the database container's
//! entrypoint) agree on: the manager's command line, which the operator writes into the
//! StatefulSet and the preflight Job and the manager parses, and the superuser it falls back to.
//!
//! The parser (`Cli`) is the manager's own: `instance/src/main.rs` runs it. The operator builds
//! its arguments with `ManagerFlags::to_args` and `server_version_args`; the tests below parse
//! them with `Cli`, so a renamed flag fails here, not in a pod. Pure: no I/O.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The superuser when the credentials Secret has no `username`.
pub const DEFAULT_SUPERUSER: &str = "postgres";
/// Where the operator mounts the Database's server configuration (its ConfigMap
/// `<name>-config`), the default of `--config-dir`.
pub const CONFIG_DIR: &str = "/etc/dbop/config";
/// The file of `CONFIG_DIR` with `spec.postgresql`'s parameters, included by the server.
pub const PARAMETERS_FILE: &str = "postgresql.conf";
/// The file of `CONFIG_DIR` with the extra `pg_hba.conf` rules.
pub const HBA_FILE: &str = "pg_hba.conf";
/// The port of the metrics endpoint the operator opens on a database pod (`run
/// --metrics-addr`).
pub const METRICS_PORT: u16 = 9187;
/// Where the operator mounts the custom metrics queries (`spec.monitoring.customQueries`).
pub const METRICS_QUERIES_DIR: &str = "/etc/dbop/metrics";
/// The file of `METRICS_QUERIES_DIR` the manager reads at every scrape (missing: none).
pub const METRICS_QUERIES_FILE: &str = "queries.yaml";

/// Where the operator mounts the Database's server certificate (its Secret
/// `<name>-server-tls`), given to `run --tls-dir`.
pub const TLS_DIR: &str = "/etc/dbop/tls";
/// The files of a TLS directory: the server's certificate, its key, and the CA that signed it
/// (the `kubernetes.io/tls` keys, and cert-manager's `ca.crt`).
pub const TLS_CERT_FILE: &str = "tls.crt";
pub const TLS_KEY_FILE: &str = "tls.key";
pub const TLS_CA_FILE: &str = "ca.crt";

/// The instance manager's command line.
#[derive(Parser, Clone, Debug, PartialEq, Eq)]
#[command(
    name = "dbop-instance",
    version,
    about = "dbop's PostgreSQL instance manager"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// initdb when needed, then run postgres as a child until it stops.
    Run(Common),
    /// Exit 0 when the instance is ready (for Kubernetes probes).
    Probe(Common),
    /// Print the version the image's `postgres` reports to the termination log; exit 0 when
    /// it is the expected one (dbop's upgrade preflight).
    ServerVersion(VersionArgs),
}

#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct VersionArgs {
    /// The PostgreSQL major version whose binaries to look for.
    #[arg(long)]
    pub major: u32,
    /// The `MAJOR.MINOR` the binary must report.
    #[arg(long)]
    pub expect: String,
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Common {
    /// The data directory.
    #[arg(long)]
    pub pgdata: PathBuf,
    /// The PostgreSQL major version the image runs.
    #[arg(long)]
    pub major: u32,
    /// The addresses the server listens on (`*`: every interface of the pod).
    #[arg(long, default_value = "*")]
    pub listen_addresses: String,
    #[arg(long, default_value_t = 5432)]
    pub port: u16,
    /// A writable directory for the server's Unix socket.
    #[arg(long, default_value = "/var/run/postgresql")]
    pub socket_dir: PathBuf,
    /// The mounted credentials Secret: files `password` and, optionally, `username`.
    #[arg(long)]
    pub credentials_dir: PathBuf,
    /// The mounted server configuration: `postgresql.conf` (parameters, included by the
    /// server) and `pg_hba.conf` (extra rules); either may be missing. Reloaded on change.
    #[arg(long, default_value = CONFIG_DIR)]
    pub config_dir: PathBuf,
    #[arg(long, default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
    /// Seconds a smart shutdown may take before a fast one.
    #[arg(long, default_value_t = 30)]
    pub smart_shutdown_seconds: u64,
    /// Seconds a fast shutdown may take before an immediate one.
    #[arg(long, default_value_t = 20)]
    pub fast_shutdown_seconds: u64,
    /// Milliseconds between two looks at the server, the signals and the password file.
    #[arg(long, default_value_t = 500)]
    pub poll_millis: u64,
    /// `run` only: serve PostgreSQL's metrics at http://ADDR/metrics (e.g. `0.0.0.0:9187`);
    /// without it, no endpoint.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `run` only: serve the instance's WAL position at http://ADDR/status
    /// (`position::Position` as JSON). Default: `0.0.0.0:8008` (`position::STATUS_PORT`) when
    /// `--primary-lease` is given, none otherwise.
    #[arg(long, value_name = "ADDR")]
    pub status_addr: Option<std::net::SocketAddr>,
    /// `run` only: the mounted server certificate (`tls.crt`, `tls.key`, `ca.crt`). With it
    /// the server serves TLS and network clients must use it (`pg_hba.conf` says `hostssl`);
    /// a renewed certificate is picked up by a reload.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// `run` only: this instance's name in the Database's topology (`topology::TOPOLOGY_FILE`
    /// in `--config-dir`). Default: the host name, which Kubernetes sets to the pod's name.
    #[arg(long, value_name = "NAME")]
    pub instance_name: Option<String>,
    /// `run` only: the mounted replication credentials (`topology::REPLICATION_DIR`).
    #[arg(long, value_name = "DIR", default_value = crate::topology::REPLICATION_DIR)]
    pub replication_dir: PathBuf,
    /// `run` only: the mounted accounts Secret (`accounts::ACCOUNTS_DIR`): the application
    /// role and database and the declared roles a primary keeps; a missing one is no error.
    #[arg(long, value_name = "DIR", default_value = crate::accounts::ACCOUNTS_DIR)]
    pub accounts_dir: PathBuf,
    /// `run` only: the Database's primary Lease (`lease::lease_name`) in the pod's namespace.
    /// With it the topology is read from the Lease, and this instance accepts writes only
    /// while it holds it (`lease`); the pod's service account may read and update that Lease.
    #[arg(long, value_name = "NAME")]
    pub primary_lease: Option<String>,
}

/// `run`'s arguments for following the primary Lease `name`.
pub fn lease_args(name: &str) -> Vec<String> {
    vec![format!("--primary-lease={name}")]
}

/// The flags the operator gives `run` and `probe` (the others keep the manager's defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerFlags {
    pub pgdata: String,
    pub major: u32,
    pub port: u16,
    pub socket_dir: String,
    pub credentials_dir: String,
    pub smart_shutdown_seconds: u64,
    pub fast_shutdown_seconds: u64,
}

impl ManagerFlags {
    /// The flags as arguments, after the subcommand.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--pgdata={}", self.pgdata),
            format!("--major={}", self.major),
            format!("--port={}", self.port),
            format!("--socket-dir={}", self.socket_dir),
            format!("--credentials-dir={}", self.credentials_dir),
            format!("--smart-shutdown-seconds={}", self.smart_shutdown_seconds),
            format!("--fast-shutdown-seconds={}", self.fast_shutdown_seconds),
        ]
    }
}

/// `run`'s arguments for the metrics endpoint on every IPv4 interface of the pod at `port`.
pub fn metrics_args(port: u16) -> Vec<String> {
    vec![format!("--metrics-addr=0.0.0.0:{port}")]
}

/// `run`'s arguments for TLS with the certificate mounted at `dir`.
pub fn tls_args(dir: &str) -> Vec<String> {
    vec![format!("--tls-dir={dir}")]
}

/// `server-version`'s arguments (the subcommand first): check that the binaries of `major`
/// report `expect`.
pub fn server_version_args(major: u32, expect: &str) -> Vec<String> {
    vec![
        "server-version".into(),
        format!("--major={major}"),
        format!("--expect={expect}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(sub: &str, args: Vec<String>) -> Cmd {
        let all = ["dbop-instance".to_string(), sub.to_string()]
            .into_iter()
            .chain(args);
        Cli::try_parse_from(all)
            .expect("the manager parses it")
            .command
    }

    #[test]
    fn the_manager_parses_the_flags_the_operator_writes() {
        let flags = ManagerFlags {
            pgdata: "/data/pgdata".into(),
            major: 17,
            port: 5433,
            socket_dir: "/run/pg".into(),
            credentials_dir: "/etc/creds".into(),
            smart_shutdown_seconds: 31,
            fast_shutdown_seconds: 21,
        };
        for sub in ["run", "probe"] {
            let common = match parse(sub, flags.to_args()) {
                Cmd::Run(c) | Cmd::Probe(c) => c,
                other => panic!("{other:?}"),
            };
            assert_eq!(common.pgdata, PathBuf::from("/data/pgdata"));
            assert_eq!(common.major, 17);
            assert_eq!(common.port, 5433);
            assert_eq!(common.socket_dir, PathBuf::from("/run/pg"));
            assert_eq!(common.credentials_dir, PathBuf::from("/etc/creds"));
            assert_eq!(common.smart_shutdown_seconds, 31);
            assert_eq!(common.fast_shutdown_seconds, 21);
        }
        let mut run = flags.to_args();
        run.extend(metrics_args(METRICS_PORT));
        run.extend(tls_args(TLS_DIR));
        let Cmd::Run(common) = parse("run", run) else {
            panic!("not run");
        };
        assert_eq!(common.tls_dir, Some(PathBuf::from(TLS_DIR)));
        assert_eq!(
            common.metrics_addr,
            Some(std::net::SocketAddr::from(([0, 0, 0, 0], METRICS_PORT)))
        );
        let args = server_version_args(16, "16.4");
        let Cmd::ServerVersion(v) = parse(&args[0], args[1..].to_vec()) else {
            panic!("not server-version");
        };
        assert_eq!((v.major, v.expect.as_str()), (16, "16.4"));
    }
}
