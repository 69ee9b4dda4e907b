//! PostgreSQL's own health as Prometheus metrics, served by the instance manager when
//! `dbop-instance run --metrics-addr ADDR` is given (off otherwise); and the instance's WAL
//! position at `/status` (`--status-addr`, on for an instance that follows a primary Lease).
//!
//! Pure: `exposition` (families and the text format 0.0.4), `batch` (a psql session of named
//! statements and the split of its output), `builtin` (dbop's statements and their families),
//! `custom` (the user's queries file, their SQL and families), `http` (request line to route,
//! responses). I/O: `psql` (a child bounded in time), `collect` (one scrape), `server` (the
//! listener), `shared_read` (one status reading shared by the requests that wait for it).
//! Nothing here writes to the database: every session is read-only in effect, and
//! no label or value holds a secret (no password, no connection string).

pub mod batch;
pub mod builtin;
pub mod collect;
pub mod custom;
pub mod exposition;
pub mod http;
pub mod psql;
pub mod server;
pub mod shared_read;

pub use collect::volume_usage;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use dbop_contract::instance::{METRICS_QUERIES_DIR, METRICS_QUERIES_FILE};

/// The queries file, read at every scrape (the operator mounts a ConfigMap's key at
/// `dbop_contract::instance::{METRICS_QUERIES_DIR, METRICS_QUERIES_FILE}`; a missing file means
/// none). `DBOP_METRICS_QUERIES` names another file.
pub fn queries_file() -> PathBuf {
    std::env::var_os("DBOP_METRICS_QUERIES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(METRICS_QUERIES_DIR).join(METRICS_QUERIES_FILE))
}

/// Starts the endpoint for the server `run` supervises. A failure is logged and the database
/// runs on without metrics (a scraper then sees the target down).
pub fn start(addr: SocketAddr, o: &crate::run::Options, bin: &Path, superuser: &str) {
    let collector = collect::Collector::new(source(o, bin, superuser));
    match server::start(addr, server::Endpoints::Metrics(collector)) {
        Ok(bound) => eprintln!("dbop-instance: metrics on http://{bound}/metrics"),
        Err(e) => eprintln!(
            "dbop-instance: metrics: cannot listen on {addr}: {e}; running without metrics"
        ),
    }
}

/// Starts the status endpoint (`dbop_contract::position`): the operator reads every
/// instance's WAL position there. A failure is logged and the database runs on without it
/// (the operator then knows nothing of this instance's position, and prefers others in a
/// failover).
pub fn start_status(addr: SocketAddr, o: &crate::run::Options, bin: &Path, superuser: &str) {
    match server::start(addr, server::Endpoints::status(source(o, bin, superuser))) {
        Ok(bound) => eprintln!("dbop-instance: status on http://{bound}/status"),
        Err(e) => eprintln!(
            "dbop-instance: status: cannot listen on {addr}: {e}; running without a status endpoint"
        ),
    }
}

fn source(o: &crate::run::Options, bin: &Path, superuser: &str) -> collect::Source {
    collect::Source {
        bin: bin.to_path_buf(),
        socket_dir: o.socket_dir.clone(),
        port: o.port,
        superuser: superuser.to_string(),
        pgdata: o.pgdata.clone(),
        major: o.major,
        queries_file: queries_file(),
    }
}
