//! The version policy: `MAJOR.MINOR` versions, which change of `spec.version` is an upgrade and
//! which is refused, and the image of a version. Pure.
//!
//! `spec.image` overrides the image, never the policy: the version decides what is allowed.

use crate::api::Database;
use crate::resources::Version;
use crate::settings::Settings;

/// What a change from the running version to the spec's version is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing to upgrade: the spec asks for the running version (or nothing runs yet).
    Stay,
    /// A newer minor of the same major: a staged upgrade.
    Upgrade { from: String, to: String },
    /// Refused: the Database keeps running `from`.
    Refused { refusal: Refusal, from: String },
}

/// Why a version change is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An older minor than the one running.
    Downgrade,
    /// Another major version: the on-disk format differs.
    MajorChange,
    /// The running or the asked version does not parse.
    Malformed,
}

impl Refusal {
    /// The `Upgrading` condition's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Downgrade => "DowngradeRefused",
            Refusal::MajorChange => "MajorUpgradeUnsupported",
            Refusal::Malformed => "VersionUnreadable",
        }
    }

    /// What to tell the user.
    pub fn message(self, from: &str, to: &str) -> String {
        match self {
            Refusal::Downgrade => format!(
                "spec.version {to} is older than the running {from}: downgrades are refused; \
                 the database keeps running {from} (set spec.version to {from} or newer)"
            ),
            Refusal::MajorChange => format!(
                "spec.version {to} is another major version than the running {from}: dbop \
                 upgrades within a major only; restore a backup into a new Database of the new \
                 major. The database keeps running {from}"
            ),
            Refusal::Malformed => format!(
                "cannot compare spec.version {to} with the running {from}: both must be \
                 MAJOR.MINOR; the database keeps running {from}"
            ),
        }
    }
}

/// The transition from `running` (None before the first start) to `wanted`.
pub fn transition(running: Option<&str>, wanted: &str) -> Transition {
    let Some(from) = running else {
        return Transition::Stay;
    };
    if from == wanted {
        return Transition::Stay;
    }
    let refused = |refusal| Transition::Refused {
        refusal,
        from: from.to_string(),
    };
    match (Version::parse(from), Version::parse(wanted)) {
        (Some(a), Some(b)) if a.major != b.major => refused(Refusal::MajorChange),
        (Some(a), Some(b)) if b.minor < a.minor => refused(Refusal::Downgrade),
        (Some(a), Some(b)) if b == a => Transition::Stay,
        (Some(_), Some(_)) => Transition::Upgrade {
            from: from.to_string(),
            to: wanted.to_string(),
        },
        _ => refused(Refusal::Malformed),
    }
}

/// The image of `version` for this Database: `spec.image` when set (it overrides the image of
/// the spec's version), else the operator's image template.
pub fn image_of(db: &Database, settings: &Settings, version: &str) -> String {
    match &db.spec.image {
        Some(image) if version == db.spec.version => image.clone(),
        _ => settings.postgres_image(version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn transitions_table() {
        let up = |f: &str, t: &str| Transition::Upgrade {
            from: f.into(),
            to: t.into(),
        };
        let no = |r, f: &str| Transition::Refused {
            refusal: r,
            from: f.into(),
        };
        let table = [
            ("first start", None, "15.18", Transition::Stay),
            ("same version", Some("15.18"), "15.18", Transition::Stay),
            ("newer minor", Some("15.18"), "15.20", up("15.18", "15.20")),
            (
                "two digit minor",
                Some("16.9"),
                "16.10",
                up("16.9", "16.10"),
            ),
            ("same, zero-padded", Some("16.4"), "16.04", Transition::Stay),
            (
                "older minor",
                Some("15.20"),
                "15.18",
                no(Refusal::Downgrade, "15.20"),
            ),
            (
                "newer major",
                Some("15.20"),
                "16.4",
                no(Refusal::MajorChange, "15.20"),
            ),
            (
                "older major",
                Some("16.4"),
                "15.20",
                no(Refusal::MajorChange, "16.4"),
            ),
            (
                "garbage running",
                Some("x"),
                "15.20",
                no(Refusal::Malformed, "x"),
            ),
        ];
        for (name, running, wanted, want) in table {
            assert_eq!(transition(running, wanted), want, "{name}");
        }
    }

    #[test]
    fn refusals_say_what_keeps_running() {
        for r in [Refusal::Downgrade, Refusal::MajorChange, Refusal::Malformed] {
            let m = r.message("15.20", "15.18");
            assert!(m.contains("keeps running 15.20"), "{m}");
        }
        assert_eq!(Refusal::Downgrade.reason(), "DowngradeRefused");
        assert_eq!(Refusal::MajorChange.reason(), "MajorUpgradeUnsupported");
    }

    #[test]
    fn spec_image_overrides_the_image_of_the_spec_version_only() {
        let settings = Settings {
            postgres_image_template: "dbop.local/postgres:{version}".into(),
            ..Settings::default()
        };
        let mut db = testing::minimal();
        db.spec.version = "15.20".into();
        assert_eq!(
            image_of(&db, &settings, "15.20"),
            "dbop.local/postgres:15.20"
        );
        db.spec.image = Some("mirror/pg:15.20-postgis".into());
        assert_eq!(image_of(&db, &settings, "15.20"), "mirror/pg:15.20-postgis");
        assert_eq!(
            image_of(&db, &settings, "15.18"),
            "dbop.local/postgres:15.18"
        );
    }
}
