//! Backups, on the operator's side (the agent that moves the bytes is the `dbop-backup` crate
//! in `agent/`): the schedule (when a `DatabaseBackup` is made, which ones are kept, whether
//! backups are healthy), the backup Job that runs the agent, and the `DatabaseBackup`
//! controller that runs one backup at a time per Database and reports each outcome.
//!
//! - `schedule` is pure (time is passed in);
//! - `settings` parses `spec.backup` once for the plan and the Job (pure);
//! - `plan` is the pure backup part of a Database's reconcile (the due run, history, health);
//! - `job` is the pure builder of the backup Job; `ca` reads whether the `s3.ca` source exists;
//! - `verify` decides backup verification (pure), `verify_io` reads its Jobs and creates them;
//! - `s3_secret` is the pure check of the S3 credentials Secret, read by both controllers;
//! - the `DatabaseBackup` controller: `observe` (reads) → `decide` (pure) → `act` (writes),
//!   run by `controller` (the watches).
//!
//! Must not import `reconcile` or `controller` (the Database's side imports this, not back).

pub mod act;
pub mod ca;
pub mod controller;
pub mod decide;
pub mod job;
pub mod observe;
pub mod plan;
pub mod s3_secret;
pub mod schedule;
pub mod settings;
#[cfg(test)]
pub(crate) mod testing;
pub mod verify;
pub mod verify_io;
