//! The agent's one error type. Every message names what failed (endpoint, bucket, database,
//! tool) and never carries a secret: callers build messages only from names, never from
//! connection strings or credentials.

use std::fmt;

pub use dbop_contract::result::{EXIT_PERMANENT as PERMANENT, EXIT_USAGE as USAGE};

/// Result alias for the agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flags, environment or input that no retry can fix.
    #[error("{0}")]
    Usage(String),
    /// An S3 request failed.
    #[error("S3 {operation} failed (endpoint {endpoint}, bucket '{bucket}'{}): {detail}", key_suffix(.key))]
    S3 {
        operation: &'static str,
        endpoint: String,
        bucket: String,
        key: Option<String>,
        detail: String,
    },
    /// PostgreSQL or one of its client tools failed.
    #[error("{tool} failed for database '{database}' on {server}: {detail}")]
    Postgres {
        tool: String,
        database: String,
        server: String,
        detail: String,
    },
    /// The stored backup is not what its manifest says (checksum, size, truncation, format).
    #[error("integrity check failed for {key}: {detail}")]
    Integrity { key: String, detail: String },
    /// `verify` found a difference between the manifest and the restored database.
    #[error("verification failed: {0}")]
    Verify(String),
    /// The requested backup does not exist or is incomplete.
    #[error("{0}")]
    NotFound(String),
    /// The backup cannot go into this server (a dump of a newer major version).
    #[error("{0}")]
    Incompatible(String),
    /// The backup's encryption key is missing, malformed, or not the one the backup was
    /// written with: the message says which key and what to fix, never the key.
    #[error("{0}")]
    Key(String),
    /// No base backup ends before the recovery target: the message gives the earliest and the
    /// newest restorable points.
    #[error("{0}")]
    TargetBeforeBackups(String),
    /// Recovery replayed every archived WAL file without reaching the target: the message
    /// names the last point reached.
    #[error("{0}")]
    TargetUnreachable(String),
    /// SIGTERM or SIGINT arrived.
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
    /// A restore in steps failed after committing some: the cause, and what the target holds.
    #[error(
        "{cause}. Database '{target}' now holds the backup's schema and some of its rows: drop it and create it again empty before restoring again"
    )]
    Partial { cause: Box<Error>, target: String },
    /// A local I/O or internal failure.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

fn key_suffix(key: &Option<String>) -> String {
    match key {
        Some(k) => format!(", key '{k}'"),
        None => String::new(),
    }
}

impl Error {
    /// A short machine label, for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Usage(_) => "usage",
            Error::S3 { .. } => "s3",
            Error::Postgres { .. } => "postgres",
            Error::Integrity { .. } => "integrity",
            Error::Verify(_) => "verify",
            Error::NotFound(_) => "not-found",
            Error::Incompatible(_) => "incompatible-version",
            Error::Key(_) => "encryption-key",
            Error::TargetBeforeBackups(_) => "target-before-backups",
            Error::TargetUnreachable(_) => "target-unreachable",
            Error::Interrupted(_) => "interrupted",
            Error::Partial { cause, .. } => cause.label(),
            Error::Io { .. } => "io",
        }
    }

    /// The process exit code for this error: [`USAGE`], [`PERMANENT`] for what no retry can
    /// change (the backup, its key, the target, a target partly restored), 130/143 for a signal, else 1 (S3, PostgreSQL,
    /// local I/O: what may pass).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => USAGE,
            Error::Integrity { .. }
            | Error::Verify(_)
            | Error::NotFound(_)
            | Error::Incompatible(_)
            | Error::Key(_)
            | Error::TargetBeforeBackups(_)
            | Error::TargetUnreachable(_)
            | Error::Partial { .. } => PERMANENT,
            Error::Interrupted("SIGINT") => 130,
            Error::Interrupted(_) => 143,
            Error::S3 { .. } | Error::Postgres { .. } | Error::Io { .. } => 1,
        }
    }

    pub fn io(context: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            context: context.to_string(),
            source,
        }
    }
}
