//! Why a Database cannot proceed at all (`Blocker`), and how that is worded: its phase, its
//! reason and its message. Decided (and its requeue chosen) in `decide`. Pure.

use crate::api::{Database, Phase};
use crate::resources::credentials::{SecretProblem, secret_name};
use crate::resources::{SUPPORTED_MAJORS, VersionProblem};

/// Why a Database cannot proceed at all: nothing is written until the user fixes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// A version dbop cannot run.
    Version(VersionProblem),
    /// The user's credentials Secret is missing or has no password.
    Credentials(SecretProblem),
}

impl Blocker {
    pub(super) fn phase(&self) -> Phase {
        match self {
            Blocker::Version(_) => Phase::Failed,
            Blocker::Credentials(_) => Phase::Pending,
        }
    }

    pub(super) fn reason(&self) -> &'static str {
        match self {
            Blocker::Version(_) => "UnsupportedVersion",
            Blocker::Credentials(SecretProblem::NotFound) => "CredentialsSecretNotFound",
            Blocker::Credentials(SecretProblem::MissingPassword) => "CredentialsSecretInvalid",
        }
    }

    pub(super) fn message(&self, db: &Database) -> String {
        let secret = secret_name(db);
        match self {
            Blocker::Version(VersionProblem::Malformed) => format!(
                "version {:?} is not of the form MAJOR.MINOR",
                db.spec.version
            ),
            Blocker::Version(VersionProblem::UnsupportedMajor(major)) => format!(
                "PostgreSQL {major} is not supported: use a version with a major of {} to {}",
                SUPPORTED_MAJORS.start(),
                SUPPORTED_MAJORS.end()
            ),
            Blocker::Credentials(SecretProblem::NotFound) => format!(
                "Secret {secret} (spec.credentials.secretName) does not exist: create it with a \
                 `password` key (and optionally `username`)"
            ),
            Blocker::Credentials(SecretProblem::MissingPassword) => {
                format!("Secret {secret} has no non-empty `password` key: add one")
            }
        }
    }
}
