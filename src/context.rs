//! What every reconcile of both controllers shares: the client, the settings, the Event
//! recorder, the metrics, the watch caches (`caches`: what observe reads) and the per-object
//! failure count behind the exponential retry backoff, with the `error_policy` that uses it, and
//! the work-queue depth both controllers report (`work_queue`).
//! Depends on nothing above it (no controller, no reconcile).

pub mod caches;
pub mod work_queue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use tracing::warn;

use self::caches::Caches;
use crate::error::Error;
use crate::ops::metrics::Metrics;
use crate::release::Turns;
use crate::settings::Settings;

/// An object's key for the failure count: (a namespace, optionally prefixed by the kind, and a
/// name), so two kinds with the same name never share a count.
pub type FailureKey = (String, String);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The watch caches observe reads from (filled by the controllers' watches).
    pub caches: Caches,
    /// The release turns this process granted (`release::Turns`).
    pub release_turns: Turns,
    /// Consecutive failures per object, for exponential backoff; reset on success.
    failures: Mutex<HashMap<FailureKey, u32>>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, caches: Caches) -> Self {
        let reporter = Reporter {
            controller: "dbop".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics: Arc::new(Metrics::new()),
            caches,
            release_turns: Turns::default(),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// The same context, recording into `metrics` (the ones the endpoint serves).
    pub fn with_metrics(self, metrics: Arc<Metrics>) -> Self {
        Self { metrics, ..self }
    }

    pub(crate) fn record_failure(&self, key: FailureKey) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn reset_failures(&self, key: &FailureKey) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The error policy of both controllers: count the failure, log it, retry after the
    /// backoff for that many failures in a row.
    /// A conflict (a write built from a stale read) is no failure: it is reconciled again
    /// after [`CONFLICT_RETRY`], from the fresh object, without counting.
    pub fn retry_after_failure(&self, key: FailureKey, error: &Error, what: &str) -> Action {
        if error.is_conflict() {
            tracing::info!(%error, retry_in = ?CONFLICT_RETRY, "{what} changed meanwhile: reconciling again");
            return Action::requeue(CONFLICT_RETRY);
        }
        let failures = self.record_failure(key);
        let delay = backoff(failures);
        warn!(%error, label = error.label(), failures, retry_in = ?delay, "{what} reconcile failed");
        Action::requeue(delay)
    }
}

/// When an object whose write conflicted is reconciled again.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(500);

/// The retry delay after `failures` consecutive failures: 5 s doubling, at most 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    Duration::from_secs((5u64 << exponent).min(300))
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let delays: Vec<_> = (1..=9).map(backoff).collect();
        let secs: Vec<u64> = delays.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(0).as_secs(), 5);
        assert_eq!(backoff(u32::MAX).as_secs(), 300);
    }
}
