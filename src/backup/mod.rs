//! Backups: the schedule (when a `DatabaseBackup` is made, which ones are kept, whether backups
//! are healthy), the backup Job that runs the agent, and the `DatabaseBackup` controller that
//! runs one backup at a time per Database and reports each outcome.
//!
//! - `schedule` is pure (time is passed in);
//! - `job` is the pure builder of the backup Job; `ca` checks the `s3.ca` source exists;
//! - `plan` is the pure backup part of a Database's reconcile (the due run, history, health);
//! - `controller` is the second controller: observe → decide → act for `DatabaseBackup`.

pub mod ca;
pub mod controller;
pub mod job;
pub mod plan;
pub mod schedule;
