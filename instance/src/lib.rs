//! dbop's instance manager: the entrypoint of the database container.
//!
//! Pure decisions live in their own modules (`datadir`, `config`, `shutdown`, `password`,
//! `binaries`, `pid_file`'s `judge`, `tls`' `settings`, `reload`'s `changed`, `replication`'s `config`, `rejoin`, `status`, `role` (which role the topology gives this instance), and `metrics`' `exposition`, `batch`,
//! `builtin`, `custom`, `http`) and are table-tested; `run`, `process`, `pid_file`, `replication::ops`, `role_start`, `role_watch` and
//! `metrics`' `psql`, `collect`, `server`, `reload`'s `Reloader` and `tls`' `install` do the I/O (files, child processes, signals) and nothing
//! else decides anything. Who PostgreSQL runs as when the image has no entry for the uid is
//! decided in `dbop_contract::identity`, which the backup agent's `recover` shares.

pub mod accounts;
pub mod binaries;
pub mod config;
pub mod datadir;
pub mod lease;
pub mod lease_keeper;
pub mod metrics;
pub mod password;
pub mod pid_file;
pub mod process;
pub mod reload;
pub mod replication;
pub mod role;
pub mod role_start;
pub mod role_watch;
pub mod run;
pub mod shutdown;
pub mod tls;
pub mod version;
