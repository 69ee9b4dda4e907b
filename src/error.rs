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
                Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => kube_conflict(e),
                Finalizer::UnnamedObject | Finalizer::InvalidFinalizer => false,
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
