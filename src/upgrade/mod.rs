//! Staged minor upgrades: the version policy and the stage machine of one upgrade.
//!
//! - `policy`: which version changes are upgrades, which are refused, and the image of a version;
//! - `facts`: what an upgrade needs to know about the world (its preflight Job, its backup, the
//!   pods), reduced from observed objects; pure;
//! - `plan`: from the Database, those facts and `now`, the next stage, the pod template to run
//!   (image and partition), what to create or delete, and the `Upgrading` condition; pure;
//! - `events`: the Events of a stage change; pure;
//! - `gate`: whether a deletion waits for the upgrade to reach a safe point; pure.
//!
//! Pure throughout: no client, no clock (`now` comes in). `reconcile` observes, calls `plan`,
//! and acts; this module must not import `reconcile` or `controller`.

pub mod events;
pub mod facts;
pub mod gate;
pub mod plan;
pub mod policy;
