//! What dbop's operator and its backup agent must agree on, in one place so the two sides
//! cannot drift: durations (`units`), the retention rule (`retention`), backup ids and the
//! object layout (`layout`), and the agent's result, which the operator reads from the backup
//! Job's termination message (`result`). Pure: no I/O, no clock, no kube, no AWS.
//!
//! Behind the `test-support` feature: the PostgreSQL/s3s-fs harness both sides' tests use.

pub mod layout;
pub mod result;
pub mod retention;
pub mod units;

#[cfg(feature = "test-support")]
pub mod test_support;

pub use result::{BackupResult, Operation, Outcome, parse_termination_message};
