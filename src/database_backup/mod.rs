//! The `DatabaseBackup` controller: runs one backup Job per `DatabaseBackup`, one at a time per
//! Database (the oldest waiting one first), and reports each outcome in its status.
//!
//! - `observe` reads (the backup's Database, its siblings, its Job and that Job's pods, the S3
//!   credentials) and reduces what it read to `BackupFacts`;
//! - `decide` is pure: the phase, the Job to create, the Events;
//! - `act` writes through `kube_io`;
//! - `controller` runs it: the watches' triggers, one pass, a metric per reconcile.
//!
//! Uses the backup policy in `backup` (settings, the Job, the S3 checks). Must not import
//! `database` (the Database controller) nor `runtime`: the two controllers share `backup`.

pub mod act;
pub mod controller;
pub mod decide;
pub mod facts;
pub mod observe;
#[cfg(test)]
pub(crate) mod testing;
