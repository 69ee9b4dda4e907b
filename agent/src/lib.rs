//! dbop's backup agent as a library: the data path between PostgreSQL and S3-compatible storage.
//!
//! The pure parts (`layout`, `retention`, `result`, `manifest`, `units`) hold every decision and
//! format and are unit-tested table by table; the I/O parts (`s3`, `pg`, `dump`, `restore`,
//! `catalog`) only move bytes and call those decisions. `result::BackupResult` is the contract
//! with the operator, which reads it from the Job's termination message.

pub mod catalog;
pub mod cli;
pub mod dump;
pub mod error;
pub mod layout;
pub mod manifest;
pub mod pg;
pub mod restore;
pub mod result;
pub mod retention;
pub mod run;
pub mod s3;
pub mod signals;
pub mod units;

pub use error::Error;
pub use manifest::Manifest;
pub use result::{BackupResult, Operation, Outcome};

/// The agent's version, written into every manifest.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
