//! The operator's API client and how it retries: 429 (throttled), 503 and 504 are retried by
//! the client itself with exponential backoff (200 ms doubling, jittered, at most 5 s apart,
//! honouring the server's `Retry-After`), at most [`MAX_RETRIES`] times; after that the error
//! reaches the reconcile and the controller's own backoff takes over, so a server that keeps
//! throttling shows up as failed reconciles instead of holding a worker for minutes. Conflicts
//! (409) are not retried here: the request was built from a stale read, so the controller
//! reconciles again from a fresh one (see `context::retry_after_failure`).

use std::time::Duration;

use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

use super::rate_limit::{ApiLimits, RateLimitLayer};

/// How many times one request is retried after a 429, 503 or 504.
pub const MAX_RETRIES: u32 = 6;
/// The first retry's delay; each further one doubles, jittered up to twice as long.
pub const FIRST_RETRY: Duration = Duration::from_millis(200);
/// The longest delay between two tries (a `Retry-After` the server sends wins when longer).
pub const LONGEST_RETRY: Duration = Duration::from_secs(5);

/// A client for `config` that identifies itself with `user_agent` and retries as above.
pub fn build(
    mut config: Config,
    user_agent: &'static str,
    limits: ApiLimits,
) -> Result<Client, kube::Error> {
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    // kube's default retry starts at 5 ms and gives up after 15 tries (minutes later).
    config.default_retry = false;
    let policy = RetryPolicy::new(FIRST_RETRY, LONGEST_RETRY, MAX_RETRIES, true)
        .map_err(|e| kube::Error::Service(e.into()))?;
    // Every attempt, a retry too, spends a token of the request budget. Retrying clones the
    // service: a buffer makes kube's boxed stack cloneable.
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&RateLimitLayer(limits))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(policy))
        .build())
}
