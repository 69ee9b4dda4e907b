//! Staged minor upgrades: the version policy and the stage machine of one upgrade.
//!
//! - `policy`: which version changes are upgrades, which are refused, and the image of a version;
//! - `facts`: what an upgrade needs to know about the world (its preflight Job, its backup, the
//!   pods), reduced from observed objects; pure;
//! - `plan`: from the Database, those facts and `now`, the next stage, the pod template to run
//!   (image and partition), what to create or delete, and the `Upgrading` condition; pure;
//! - `events`: the Events of a stage change; pure;
//! - `deletion_gate`: whether a deletion waits for the upgrade to reach a safe point; pure.
//!
//! Pure throughout: no client, no clock (`now` comes in). `database` observes, calls `plan`,
//! and applies; this module must not import `database` or `runtime`.

pub mod deletion_gate;
pub mod events;
pub mod facts;
pub mod plan;
pub mod policy;

#[cfg(test)]
pub(crate) mod testing {
    //! An upgrade record for the tests of the modules that read one.
    use chrono::{DateTime, Utc};

    use crate::api::{UpgradeStage, UpgradeStatus};

    /// An upgrade 15.18 → 15.20 (images `pg:15.18`, `pg:15.20`) at `stage`, started at `started`.
    pub fn upgrade(stage: UpgradeStage, started: DateTime<Utc>) -> UpgradeStatus {
        UpgradeStatus {
            from: "15.18".into(),
            to: "15.20".into(),
            from_image: "pg:15.18".into(),
            to_image: "pg:15.20".into(),
            stage,
            started_at: started,
            stages: vec![],
            reason: None,
            message: None,
            preflight_job: None,
            verified_image_id: None,
            pre_upgrade_backup: None,
            partition: None,
            partition_since: None,
            stopped_at_generation: None,
        }
    }
}
