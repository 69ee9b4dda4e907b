//! The operator's errors: one enum, each variant with a short label for logs, metrics and
//! Events. Messages name the object and what failed, never a secret.

use thiserror::Error;

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

    /// The deletion policy still waits (for the final backup): the finalizer stays.
    #[error("deletion waits: {0}")]
    DeletionWaiting(String),

    #[error("finalizer {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),

    /// Not a failure: a deleted Database's pods are changing version, and the finalizer must
    /// not finish yet (kube's finalizer helper removes the finalizer on any `Ok`).
    #[error("{0}")]
    DeletionWaitsForUpgrade(String),
}

impl Error {
    /// A short machine label (an Event's reason, a metric's label).
    pub fn label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeApiError",
            Error::Serialize { .. } => "SerializationError",
            Error::DeletionWaiting(_) => "DeletionWaiting",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::CleanupFailed(e)
                | kube::runtime::finalizer::Error::ApplyFailed(e) => e.label(),
                _ => "FinalizerError",
            },
            Error::DeletionWaitsForUpgrade(_) => "DeletionWaitsForUpgrade",
        }
    }
}

impl Error {
    /// A conflict (HTTP 409, not "already exists"): the write was built from a stale read.
    /// Sending it again would fail the same way; reconciling again from a fresh read will not.
    pub fn is_conflict(&self) -> bool {
        use kube::runtime::finalizer::Error as Finalizer;
        let kube_conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_conflict() && !s.is_already_exists());
        match self {
            Error::Kube(e) => kube_conflict(e),
            Error::Serialize { .. }
            | Error::DeletionWaiting(_)
            | Error::DeletionWaitsForUpgrade(_) => false,
            Error::Finalizer(e) => match e.as_ref() {
                Finalizer::ApplyFailed(inner) | Finalizer::CleanupFailed(inner) => {
                    inner.is_conflict()
                }
                Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => kube_conflict(e),
                Finalizer::UnnamedObject | Finalizer::InvalidFinalizer => false,
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
