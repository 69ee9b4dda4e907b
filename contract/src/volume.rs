//! How full an instance's data volume is, as its manager reports it at `GET /volume` on the
//! status port (`position::STATUS_PORT`) and, when PostgreSQL died for want of room, in the
//! container's termination message (`InstanceFailure::VolumeFull`). The operator grows the
//! volume from either (`spec.storage.autoGrow`). The figures come from the filesystem
//! (`statvfs`), not from PostgreSQL: they are there when the server is not.
//!
//! Pure: the report's JSON shape, when a volume counts as full, and the failure's message.

use serde::{Deserialize, Serialize};

/// The path of the report.
pub const VOLUME_PATH: &str = "/volume";

/// Room PostgreSQL needs to come back after a crash: a WAL segment for the end-of-recovery
/// checkpoint, twice over.
pub const RESTART_ROOM_BYTES: u64 = 32 * 1024 * 1024;

/// The filesystem holding the data directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUsage {
    /// The filesystem's size (`f_blocks × f_frsize`).
    pub size_bytes: u64,
    /// What an unprivileged writer such as PostgreSQL can still use (`f_bavail × f_frsize`).
    pub free_bytes: u64,
}

impl VolumeUsage {
    /// The share in use, in percent (0 for an empty or unknown size).
    pub fn used_percent(&self) -> u64 {
        let (size, free) = (u128::from(self.size_bytes), u128::from(self.free_bytes));
        match size {
            0 => 0,
            size => ((size - free.min(size)) * 100).div_ceil(size) as u64,
        }
    }

    /// Too full for PostgreSQL to start again: less than `RESTART_ROOM_BYTES` free, or less
    /// than 1 % of the volume.
    pub fn full(&self) -> bool {
        self.free_bytes < RESTART_ROOM_BYTES
            || u128::from(self.free_bytes) * 100 < u128::from(self.size_bytes)
    }

    /// The JSON body of `GET /volume`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a body of `GET /volume`.
    pub fn from_json(body: &str) -> Result<VolumeUsage, String> {
        serde_json::from_str(body).map_err(|e| format!("not a volume report: {e}"))
    }

    /// The rest of a `volume-full` termination message: the figures first, so the operator
    /// can tell whether the volume grew since, then what happened.
    pub fn full_message(&self) -> String {
        format!(
            "{} of {} bytes free: PostgreSQL stopped because its data volume is full. Grow \
             spec.storage.size, or set spec.storage.autoGrow so dbop grows it.",
            self.free_bytes, self.size_bytes
        )
    }

    /// The figures of a `volume-full` termination message (`full_message`).
    pub fn from_full_message(message: &str) -> Option<VolumeUsage> {
        let (free, rest) = message.split_once(" of ")?;
        let (size, _) = rest.split_once(" bytes free")?;
        Some(VolumeUsage {
            size_bytes: size.parse().ok()?,
            free_bytes: free.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn used_percent_rounds_up_and_never_divides_by_zero() {
        let at = |size, free| {
            VolumeUsage {
                size_bytes: size,
                free_bytes: free,
            }
            .used_percent()
        };
        assert_eq!(at(1000, 200), 80);
        assert_eq!(at(1000, 201), 80);
        assert_eq!(at(1000, 1000), 0);
        assert_eq!(at(1000, 0), 100);
        assert_eq!(at(0, 0), 0);
        // A free figure above the size (a racing statvfs) is an empty volume, not a panic.
        assert_eq!(at(1000, 5000), 0);
        assert_eq!(at(u64::MAX, 0), 100);
    }

    #[test]
    fn full_is_too_little_room_to_restart() {
        let usage = |size: u64, free: u64| VolumeUsage {
            size_bytes: size,
            free_bytes: free,
        };
        assert!(usage(256 * MIB, 31 * MIB).full());
        assert!(!usage(256 * MIB, 33 * MIB).full());
        // On a large volume, 1 %.
        assert!(usage(10_000 * MIB, 99 * MIB).full());
        assert!(!usage(10_000 * MIB, 101 * MIB).full());
    }

    #[test]
    fn reports_and_full_messages_round_trip() {
        let u = VolumeUsage {
            size_bytes: 268_435_456,
            free_bytes: 1_048_576,
        };
        assert_eq!(
            u.to_json(),
            r#"{"sizeBytes":268435456,"freeBytes":1048576}"#
        );
        assert_eq!(VolumeUsage::from_json(&u.to_json()).unwrap(), u);
        assert!(VolumeUsage::from_json(r#"{"sizeBytes":-1}"#).is_err());
        assert_eq!(VolumeUsage::from_full_message(&u.full_message()), Some(u));
        for bad in [
            "",
            "postgres exited",
            "x of 5 bytes free",
            "1 of y bytes free",
        ] {
            assert_eq!(VolumeUsage::from_full_message(bad), None, "{bad:?}");
        }
    }
}
