//! dbop: a Kubernetes operator that runs PostgreSQL with its whole lifecycle.
//!
//! The layout, from the bottom up (a module imports only from those before it; the
//! `import_graph` test checks there is no circle):
//! - `api`: the CRD types; `error`: the operator's errors;
//! - `resources`: pure builders of every owned object;
//! - `context` (what every reconcile shares, the retry backoff) and `kube_io` (the one place
//!   that writes: apply what drifted, create once, patch status, Events, a Job's state);
//! - `backup`: the schedule, the backup Job and the `DatabaseBackup` controller
//!   (observe → decide → act);
//! - `upgrade`: the version policy and the stage machine of a minor upgrade (pure);
//! - `reconcile`: the Database controller's observe → decide → act, and its finalizer's cleanup;
//! - `controller`: the watches and the runtime that run both controllers;
//! - `operator`: the process — endpoints, leader election, then the controllers.
//!
//! `plugin` (the `kubectl dbop` commands) depends only on `api` and `resources`.
//!
//! `ops` (metrics, the HTTP endpoints, the leader lease) depends only on `api` and sits beside
//! `context`, which records into its metrics.
//!
//! The backup agent is a separate crate (`agent/`, `dbop-backup`); what the two agree on is in
//! `dbop-contract` (`contract/`).

pub mod api;
pub mod backup;
pub mod context;
pub mod controller;
pub mod error;
pub mod kube_io;
pub mod operator;
pub mod ops;
pub mod plugin;
pub mod reconcile;
pub mod resources;
pub mod telemetry;
pub mod upgrade;

/// The field manager of every server-side apply dbop sends.
pub const FIELD_MANAGER: &str = "dbop";
/// The finalizer that runs the deletion policy.
pub const FINALIZER: &str = "dbop.dev/cleanup";

/// The user agent of every request dbop sends, so the API server's audit log can tell them
/// apart.
pub const USER_AGENT: &str = concat!("dbop/", env!("CARGO_PKG_VERSION"));
