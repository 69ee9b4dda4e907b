//! What dbop's operator, its backup agent and its instance manager must agree on, in one place
//! so the sides cannot drift: durations (`units`), the retention rule (`retention`), backup ids
//! and the object layout (`layout`), the agent's result, which the operator reads from the
//! backup Job's termination message (`result`), and the instance manager's command line and
//! default superuser (`instance`), and the Database's topology its instances follow
//! (`topology`: which instance is the primary, where each is reached), and the primary Lease
//! that fences it (`lease`), and the roles and application database a primary keeps
//! (`accounts`), and where an instance stands in the WAL (`position`: the instance manager's
//! status report), and how full its data volume is (`volume`), and how PostgreSQL's programs
//! find an entry for a uid the image does not list (`identity`). Pure: no I/O, no clock, no kube, no AWS.
//!
//! Behind the `test-support` feature: the PostgreSQL/s3s-fs harness both sides' tests use.

pub mod accounts;
pub mod identity;
pub mod instance;
pub mod layout;
pub mod lease;
pub mod position;
pub mod result;
pub mod retention;
pub mod topology;
pub mod units;
pub mod volume;

#[cfg(feature = "test-support")]
pub mod test_support;

pub use result::{BackupResult, InstanceFailure, Operation, Outcome, parse_termination_message};
