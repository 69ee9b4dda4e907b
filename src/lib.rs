//! dbop: a Kubernetes operator that runs PostgreSQL with its whole lifecycle.
//!
//! The layout, from the bottom up (a module imports only from those before it; the
//! `import_graph` test checks there is no circle, and that no pure module reaches an I/O one):
//! - `api`: the CRD types; `error`: the operator's errors, named by the step that failed;
//! - `objects`: the pure vocabulary of what both controllers read and publish (a Job's state,
//!   an Event, a message cut short);
//! - `settings`: the operator's settings (`dbop run`'s flags) and their defaults;
//! - `maintenance`: a Database's maintenance window and the gate it puts on restarts (pure);
//! - `resources`: pure builders of every object dbop makes, on one Job skeleton;
//! - `release`: an operator release rolled out to the Databases in waves (pure, but for the
//!   turns one process granted);
//! - `ops` (metrics, the HTTP endpoints, the leader lease), beside `context` (what every
//!   reconcile shares, the retry backoff), which records into its metrics;
//! - `kube_io`: the one place that writes (apply what drifted, create once, merge patches,
//!   deletes, the status, Events);
//! - `backup`: the backup policy both controllers share (schedule, settings, the Jobs,
//!   verification), pure but for `ca`'s read;
//! - `upgrade`: the version policy and the stage machine of a minor upgrade (pure);
//! - `database`: the Database controller (observe → facts → decide → build → apply → status,
//!   its finalizer's cleanup); `database_backup`: the `DatabaseBackup` controller (observe →
//!   facts → decide → act). Neither imports the other;
//! - `runtime`: the watches, and both controllers started side by side;
//! - `operator`: the process — endpoints, leader election, then the controllers.
//!
//! `plugin` (the `kubectl dbop` commands) depends only on `api` and `resources`.
//!
//! The backup agent is a separate crate (`backups/`, `dbop-backup`), the instance manager another
//! (`instance/`, `dbop-instance`); what they agree on with the operator is in `dbop-contract`
//! (`contract/`).

pub mod api;
pub mod backup;
pub mod context;
pub mod database;
pub mod database_backup;
pub mod error;
pub mod kube_io;
pub mod maintenance;
pub mod objects;
pub mod operator;
pub mod ops;
pub mod plugin;
pub mod release;
pub mod resources;
pub mod runtime;
pub mod settings;
pub mod telemetry;
pub mod upgrade;

/// The field manager of every server-side apply dbop sends.
pub const FIELD_MANAGER: &str = "dbop";
/// The finalizer that runs the deletion policy.
pub const FINALIZER: &str = "dbop.dev/cleanup";

/// The user agent of every request dbop sends, so the API server's audit log can tell them
/// apart.
pub const USER_AGENT: &str = concat!("dbop/", env!("CARGO_PKG_VERSION"));
