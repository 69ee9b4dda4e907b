//! The operator's API client and how it retries: 429 (throttled), 503 and 504 are retried by
//! the client itself with exponential backoff (200 ms doubling, jittered, at most 5 s apart,
//! honouring the server's `Retry-After`), at most [`MAX_RETRIES`] times; after that the error
//! reaches the reconcile and the controller's own backoff takes over, so a server that keeps
//! throttling shows up as failed reconciles instead of holding a worker for minutes. Conflicts
//! (409) are not retried here: the request was built from a stale read, so the controller
//! reconciles again from a fresh one (see `context::retry_after_failure`).
//!
//! The connections under it are kube's, with one difference: a connection's read buffer stops
//! growing at [`READ_BUFFER_LIMIT`]. Each watch holds a connection for its whole life, and with
//! hyper's default (about 400 KiB, reached while a large list page streams in) the idle watches
//! of one operator kept megabytes of empty buffer.

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::rate_limit::{ApiLimits, RateLimitLayer};

/// How many times one request is retried after a 429, 503 or 504.
pub const MAX_RETRIES: u32 = 6;
/// The first retry's delay; each further one doubles, jittered up to twice as long.
pub const FIRST_RETRY: Duration = Duration::from_millis(200);
/// The longest delay between two tries (a `Retry-After` the server sends wins when longer).
pub const LONGEST_RETRY: Duration = Duration::from_secs(5);
/// The largest read buffer one API connection keeps: a list page larger than this streams
/// through it in pieces.
pub const READ_BUFFER_LIMIT: usize = 16 * 1024;

/// What the request layers sit on: kube's own stack type, so either builder below fits.
type Connections = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

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
    Ok(connections(config)?
        .with_layer(&RateLimitLayer(limits))
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(policy))
        .build())
}

/// kube's connection stack (API server address, credentials, extra headers, TLS, the config's
/// timeouts) with the read buffer capped. A proxy or an exec credential plugin takes kube's own
/// builder: it knows how to tunnel and when an exec-issued certificate expires.
fn connections(config: Config) -> Result<ClientBuilder<Connections>, kube::Error> {
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        return ClientBuilder::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let mut connector = TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let connections = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_LIMIT)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(connections)
        .map_response(|response: Response<Incoming>| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}
