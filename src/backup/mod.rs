//! Backup policy, on the operator's side, shared by both controllers (the agent that moves the
//! bytes is the `dbop-backup` crate): the Database controller plans its backups with it, the
//! `DatabaseBackup` controller runs them with it, and neither imports the other.
//!
//! - `schedule` is pure (time is passed in): when a `DatabaseBackup` is made, which ones are
//!   kept (the contract's retention rule), whether backups are healthy;
//! - `settings` parses `spec.backup` once for the plan and the Job (pure);
//! - `plan` is the pure backup part of a Database's reconcile (the due run, history, health);
//! - `job` checks that a backup or verify Job can be built, and has `resources::backup_job` build
//!   it (pure); `ca` reads whether the `s3.ca` source exists;
//! - `verify` decides backup verification (pure; its I/O is `database::verification`);
//! - `s3_secret` is the pure check of the S3 credentials Secret, read by both controllers;
//! - `window` is the pure restorable window of point-in-time recovery (`kubectl dbop status`).
//!
//! Must not import `database`, `database_backup` or `runtime` (they import this).

pub mod ca;
pub mod encryption;
pub mod job;
pub mod plan;
pub mod s3_secret;
pub mod schedule;
pub mod settings;
pub mod verify;
pub mod window;
