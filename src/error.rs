//! The operator's errors: one enum, each variant with a short label for logs, metrics and
//! Events. Messages name the object and what failed, never a secret. A pass wraps what fails
//! in the step it failed in (`Error::Step`: observe, build, apply, status, cleanup), so the
//! message says where; the label stays the cause's.
//!
//! A wait is not an error: a deletion waiting for its final backup or for an upgrade's safe
//! point ends its pass with an `Action`, after writing the status that says why.

use thiserror::Error;

/// The step of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Reading what the pass decides from.
    Observe,
    /// Building the desired objects.
    Build,
    /// Writing them (what drifted, what is created once, deletions).
    Apply,
    /// Writing the status and publishing the transition's Events.
    Status,
    /// The deletion policy (the finalizer's cleanup).
    Cleanup,
}

impl Step {
    pub fn label(self) -> &'static str {
        match self {
            Step::Observe => "observe",
            Step::Build => "build",
            Step::Apply => "apply",
            Step::Status => "status",
            Step::Cleanup => "cleanup",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[derive(Debug, Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),

    #[error("could not serialize {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// An object the watch cache holds but this operator's types cannot read (written by
    /// another version of the CRD, or by hand with the schema bypassed): `message` is the
    /// deserialiser's, which names the field.
    #[error("{kind} {name} cannot be read: {message}")]
    Unreadable {
        kind: &'static str,
        name: String,
        message: String,
    },

    /// A key or certificate of the Database's TLS could not be made (or its CA read).
    #[error("TLS: {0}")]
    Certificate(String),

    /// The finalizer's Cleanup found the deletion policy still waiting (for the final backup),
    /// which the pass before it handles as a wait: only a race reaches this, and the finalizer
    /// stays (kube's finalizer helper removes it on any `Ok`).
    #[error("deletion waits: {0}")]
    DeletionWaiting(String),

    #[error("finalizer {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),

    /// What failed, in the step of the pass it failed in.
    #[error("{step} failed: {source}")]
    Step {
        step: Step,
        #[source]
        source: Box<Error>,
    },
}

/// `.during(step)` on a result: its error, said to have happened in `step`.
pub trait During<T> {
    fn during(self, step: Step) -> Result<T>;
}

impl<T, E: Into<Error>> During<T> for std::result::Result<T, E> {
    fn during(self, step: Step) -> Result<T> {
        self.map_err(|e| match e.into() {
            already @ Error::Step { .. } => already,
            source => Error::Step {
                step,
                source: Box::new(source),
            },
        })
    }
}

impl Error {
    /// A short machine label (an Event's reason, a metric's label).
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeApiError",
            Error::Serialize { .. } => "SerializationError",
            Error::Unreadable { .. } => "UnreadableObject",
            Error::Certificate(_) => "CertificateError",
            Error::DeletionWaiting(_) => "DeletionWaiting",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::CleanupFailed(e)
                | kube::runtime::finalizer::Error::ApplyFailed(e) => e.label(),
                _ => "FinalizerError",
            },
            Error::Step { source, .. } => source.label(),
        }
    }

    /// The step of the pass that failed, when the pass said.
    pub fn step(&self) -> Option<Step> {
        match self {
            Error::Step { step, .. } => Some(*step),
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::CleanupFailed(e)
                | kube::runtime::finalizer::Error::ApplyFailed(e) => e.step(),
                _ => None,
            },
            _ => None,
        }
    }
}

impl Error {
    /// A conflict (HTTP 409, not "already exists"): the write was built from a stale read.
    /// Sending it again would fail the same way; reconciling again from a fresh read will not.
    /// The finalizer's own patches count too when their guard failed (see
    /// [`finalizers_changed_meanwhile`]).
    pub fn is_conflict(&self) -> bool {
        use kube::runtime::finalizer::Error as Finalizer;
        let kube_conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_conflict() && !s.is_already_exists());
        match self {
            Error::Kube(e) => kube_conflict(e),
            Error::Serialize { .. }
            | Error::Unreadable { .. }
            | Error::Certificate(_)
            | Error::DeletionWaiting(_) => false,
            Error::Step { source, .. } => source.is_conflict(),
            Error::Finalizer(e) => match e.as_ref() {
                Finalizer::ApplyFailed(inner) | Finalizer::CleanupFailed(inner) => {
                    inner.is_conflict()
                }
                Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => {
                    kube_conflict(e) || finalizers_changed_meanwhile(e)
                }
                Finalizer::UnnamedObject | Finalizer::InvalidFinalizer => false,
            },
        }
    }
}

/// kube's finalizer helper patches `metadata.finalizers` with a JSON Patch that first tests
/// them against the copy it read. When they changed since — the cached copy was older than the
/// helper's own last write, say, as when a Database and its first `DatabaseBackup` are applied
/// together — the API server refuses the patch itself: 422, naming no object. A patch that
/// reached validation and failed there names the object (and its fields), and is no conflict.
fn finalizers_changed_meanwhile(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 422
        && s.details.as_ref().is_none_or(|d| d.name.is_empty() && d.kind.is_empty()))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use kube::core::Status;
    use kube::runtime::finalizer::Error as Finalizer;
    use serde_json::json;

    use super::Error;

    fn api_error(status: serde_json::Value) -> kube::Error {
        let status: Status = serde_json::from_value(status).expect("a Status");
        kube::Error::Api(status.boxed())
    }

    /// What the API server answers a JSON Patch whose `test` operation failed (as seen from
    /// kube-apiserver 1.37 on the test bed).
    fn patch_test_failed() -> kube::Error {
        api_error(
            json!({"status": "Failure", "code": 422, "reason": "Invalid", "details": {},
            "message": "the server rejected our request due to an error in our request"}),
        )
    }

    /// A validation failure on the same patch: the object and its field named.
    fn invalid_object() -> kube::Error {
        api_error(
            json!({"status": "Failure", "code": 422, "reason": "Invalid",
            "message": "Database.dbop.dev \"orders\" is invalid: spec: Invalid value",
            "details": {"name": "orders", "group": "dbop.dev", "kind": "Database",
                "causes": [{"reason": "FieldValueInvalid", "field": "spec"}]}}),
        )
    }

    #[test]
    fn a_finalizer_patch_whose_guard_failed_is_a_conflict() {
        let add = Error::Finalizer(Box::new(Finalizer::AddFinalizer(patch_test_failed())));
        let remove = Error::Finalizer(Box::new(Finalizer::RemoveFinalizer(patch_test_failed())));
        assert!(add.is_conflict());
        assert!(remove.is_conflict());
    }

    #[test]
    fn a_finalizer_patch_refused_by_validation_is_no_conflict() {
        let add = Error::Finalizer(Box::new(Finalizer::AddFinalizer(invalid_object())));
        assert!(!add.is_conflict());
        // Nor is a 422 on any other write.
        assert!(!Error::Kube(patch_test_failed()).is_conflict());
    }
}
