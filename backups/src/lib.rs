//! dbop's backup agent as a library: the data path between PostgreSQL and S3-compatible storage.
//!
//! The pure parts hold every decision and format and are unit-tested table by table:
//! `manifest`, `archive` (row counts from pg_dump's archive stream), `wal` (WAL file names,
//! keys, idempotence), `base` (base backup records, which one for a recovery target, recovery
//! settings), `base_retention` (which base backups and WAL segments retention deletes),
//! `recovery` (a whole point-in-time recovery's paths, server settings and what PostgreSQL
//! says), `recovery_check` (what a verification of a base backup checks and reports) and `tar`
//! (pg_basebackup's tar stream) here, and `layout`, `retention`, `result` and `units` from
//! `dbop_contract`, which the operator links too; the I/O parts (`s3`, `pg`,
//! `dump`, `restore`, `globals`, `catalog`, `wal_store`, `base_store`, `base_prune`,
//! `base_restore`, `recover`, `verify_base`) only move bytes and call those decisions.
//! `result::BackupResult` is the contract with the operator, which reads it from the Job's
//! termination message.

pub mod archive;
pub mod base;
pub mod base_direct;
pub mod base_prune;
pub mod base_restore;
pub mod base_retention;
pub mod base_store;
pub mod catalog;
pub mod cli;
pub mod crypto;
pub mod databases;
pub mod dump;
pub mod error;
pub mod globals;
pub mod manifest;
pub mod pg;
pub mod prune;
pub mod recover;
pub mod recovery;
pub mod recovery_check;
pub mod replication;
pub mod restore;
pub mod restore_database;
pub mod restore_stream;
pub mod run;
pub mod s3;
pub mod secrets;
pub mod signals;
pub mod slices;
pub mod streams;
pub mod tar;
pub mod upload;
pub mod verify;
pub mod verify_base;
pub mod wal;
pub mod wal_store;

// The parts the operator shares, from the contract crate under their old names.
pub use dbop_contract::{layout, result, retention, units};

pub use error::Error;
pub use manifest::Manifest;
pub use result::{BackupResult, Operation, Outcome};

/// The agent's version, written into every manifest.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
