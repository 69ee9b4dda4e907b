//! Request shapes under throttling and conflicts, against a mock API server on loopback (a real
//! HTTP server, so the operator's whole client stack runs, retry layer included): a throttled
//! (429) or unavailable (503) write is sent again with exponential backoff, honouring the
//! server's `Retry-After`, the same request each time, and gives up after a bounded number of
//! tries; a conflict (409) is not resent blindly but handed back to the controller, which
//! reconciles again from a fresh read soon, without the long error backoff.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dbop::api::{Database, DatabaseStatus, Phase};
use dbop::kube_io::client::{FIRST_RETRY, MAX_RETRIES};
use dbop::kube_io::{create_once, patch_status};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};

/// A request the mock server received, and when.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    body: String,
    at: Instant,
}

/// An answer: status, `Retry-After` (seconds), body.
type Answer = (StatusCode, Option<u64>, Value);

/// A mock API server that answers requests from a script, in order, then `fallback` forever.
struct MockServer {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl MockServer {
    async fn start(script: Vec<Answer>, fallback: Answer) -> MockServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let log = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (log, script, fallback) = (log.clone(), script.clone(), fallback.clone());
                let service = service_fn(move |request: Request<Incoming>| {
                    let (log, script, fallback) = (log.clone(), script.clone(), fallback.clone());
                    async move {
                        let (parts, body) = request.into_parts();
                        let bytes = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        log.lock().unwrap().push(Received {
                            method: parts.method.to_string(),
                            path: parts.uri.path().to_string(),
                            body: String::from_utf8_lossy(&bytes).into_owned(),
                            at: Instant::now(),
                        });
                        let answer = script.lock().unwrap().pop_front().unwrap_or(fallback);
                        Ok::<_, std::convert::Infallible>(respond(answer))
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        MockServer { addr, received }
    }

    /// A client built exactly as the operator builds its own.
    fn client(&self) -> kube::Client {
        const UNLIMITED: dbop::kube_io::rate_limit::ApiLimits =
            dbop::kube_io::rate_limit::ApiLimits { qps: 0.0, burst: 0 };
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        dbop::kube_io::client::build(config, dbop::USER_AGENT, UNLIMITED).expect("client")
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

fn respond((status, retry_after, body): Answer) -> Response<Full<Bytes>> {
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    response
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The API server's answer to a throttled request.
fn throttled(retry_after: Option<u64>) -> Answer {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
        "code": 429});
    (StatusCode::TOO_MANY_REQUESTS, retry_after, status)
}

fn unavailable() -> Answer {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "the server is currently unable to handle the request",
        "reason": "ServiceUnavailable", "code": 503});
    (StatusCode::SERVICE_UNAVAILABLE, None, status)
}

fn conflict() -> Answer {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "Operation cannot be fulfilled on databases.dbop.dev \"orders\": the object has been modified; please apply your changes to the latest version and try again",
        "reason": "Conflict", "code": 409});
    (StatusCode::CONFLICT, None, status)
}

/// The API server's answer to a JSON Patch whose `test` operation failed: 422, naming no object.
fn patch_test_failed() -> Answer {
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid", "details": {}, "code": 422});
    (StatusCode::UNPROCESSABLE_ENTITY, None, status)
}

fn database() -> Value {
    json!({"apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "resourceVersion": "7"},
        "spec": {"version": "16.4", "storage": {"size": "1Gi"}}})
}

fn ready_status() -> DatabaseStatus {
    DatabaseStatus {
        phase: Some(Phase::Ready),
        ..DatabaseStatus::default()
    }
}

/// The gaps between consecutive requests.
fn gaps(received: &[Received]) -> Vec<Duration> {
    received.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// Every request is the same request (method, path, body).
fn assert_same_request(received: &[Received]) {
    for r in received {
        assert_eq!(
            (&r.method, &r.path, &r.body),
            (&received[0].method, &received[0].path, &received[0].body),
            "a retry is the same request"
        );
    }
}

#[tokio::test]
async fn a_throttled_status_write_is_retried_after_the_servers_retry_after() {
    let server = MockServer::start(
        vec![throttled(Some(1)), throttled(Some(1))],
        (StatusCode::OK, None, database()),
    )
    .await;
    let api: Api<Database> = Api::namespaced(server.client(), "shop");
    patch_status(&api, "orders", &ready_status())
        .await
        .expect("the write succeeds once the server stops throttling");

    let received = server.received();
    assert_eq!(received.len(), 3, "{received:#?}");
    assert_same_request(&received);
    assert_eq!(received[0].method, "PATCH");
    assert_eq!(
        received[0].path,
        "/apis/dbop.dev/v1alpha1/namespaces/shop/databases/orders/status"
    );
    for gap in gaps(&received) {
        assert!(
            gap >= Duration::from_millis(990),
            "Retry-After: 1 honoured, waited {gap:?}"
        );
    }
}

#[tokio::test]
async fn a_throttled_create_backs_off_exponentially_without_retry_after() {
    let created = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "orders-credentials", "namespace": "shop"}});
    let server = MockServer::start(
        vec![throttled(None), unavailable(), throttled(None)],
        (StatusCode::CREATED, None, created),
    )
    .await;
    let api: Api<Secret> = Api::namespaced(server.client(), "shop");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "orders-credentials"}, "stringData": {"password": "x"}}))
    .unwrap();
    create_once(&api, &secret)
        .await
        .expect("created after the retries");

    let received = server.received();
    assert_eq!(received.len(), 4, "{received:#?}");
    assert_same_request(&received);
    assert_eq!(received[0].method, "POST");
    let gaps = gaps(&received);
    for (n, gap) in gaps.iter().enumerate() {
        // The n-th retry waits at least FIRST_RETRY · 2ⁿ (jitter only adds).
        let least = FIRST_RETRY * 2u32.pow(n as u32);
        assert!(
            *gap >= least,
            "retry {n} after {gap:?}, expected at least {least:?}"
        );
    }
}

#[tokio::test]
async fn throttling_that_never_ends_reaches_the_reconcile_after_bounded_retries() {
    let server = MockServer::start(vec![], throttled(None)).await;
    let api: Api<Database> = Api::namespaced(server.client(), "shop");
    let started = Instant::now();
    let error = patch_status(&api, "orders", &ready_status())
        .await
        .expect_err("the 429 reaches the caller in the end");
    let waited = started.elapsed();

    assert!(error.to_string().contains("Too many requests"), "{error}");
    let received = server.received();
    assert_eq!(received.len() as u32, 1 + MAX_RETRIES, "{received:#?}");
    // 200 ms doubling, capped at 5 s: ≥ 0.2+0.4+0.8+1.6+3.2+5 s; jittered ≤ 2× each, ≤ 5 s each.
    assert!(
        waited >= Duration::from_millis(11_200) && waited <= Duration::from_secs(31),
        "gave up after {waited:?}"
    );
}

#[tokio::test]
async fn a_conflict_is_not_resent_and_is_reconciled_again_soon() {
    let server = MockServer::start(vec![conflict()], (StatusCode::OK, None, database())).await;
    let api: Api<Database> = Api::namespaced(server.client(), "shop");
    let error = patch_status(&api, "orders", &ready_status())
        .await
        .expect_err("a conflict goes back to the controller");
    assert_eq!(
        server.received().len(),
        1,
        "a stale write is not resent as it was"
    );

    // The controller's error policy: a conflict is retried from a fresh read within a second,
    // and does not count towards the long backoff of real failures.
    let (caches, _writers) = dbop::context::caches::caches();
    let ctx =
        dbop::context::Context::new(server.client(), dbop::settings::Settings::default(), caches);
    let key = ("shop".to_string(), "orders".to_string());
    for _ in 0..5 {
        let action = ctx.retry_after_failure(key.clone(), &error, "Database");
        assert_eq!(
            action,
            kube::runtime::controller::Action::requeue(dbop::context::CONFLICT_RETRY),
            "a conflict is reconciled again soon"
        );
    }
    let other = dbop::error::Error::Kube(kube::Error::Api(Box::new(
        kube::core::Status::failure("boom", "InternalError").with_code(500),
    )));
    assert_eq!(
        ctx.retry_after_failure(key, &other, "Database"),
        kube::runtime::controller::Action::requeue(Duration::from_secs(5)),
        "the conflicts did not count as failures"
    );
}

/// kube's finalizer helper guards its patch with a test of the finalizers it read; on a copy
/// older than its own last write (a Database applied with its first DatabaseBackup wakes two
/// passes at once) the API server refuses it. That is a conflict: reconciled again soon, from
/// the fresh object, and (`database::controller`) no Warning Event.
#[tokio::test]
async fn a_finalizer_added_from_a_stale_copy_is_a_conflict() {
    let server = MockServer::start(
        vec![patch_test_failed()],
        (StatusCode::OK, None, database()),
    )
    .await;
    let api: Api<Database> = Api::namespaced(server.client(), "shop");
    let stale: Database = serde_json::from_value(database()).unwrap();
    let outcome = kube::runtime::finalizer::finalizer(
        &api,
        "dbop.dev/cleanup",
        std::sync::Arc::new(stale),
        |_| async {
            Ok::<_, dbop::error::Error>(kube::runtime::controller::Action::await_change())
        },
    )
    .await;
    let error = dbop::error::Error::Finalizer(Box::new(outcome.expect_err("the patch refused")));
    let received = server.received();
    assert_eq!(received.len(), 1, "{received:#?}");
    assert_eq!(received[0].method, "PATCH");
    assert!(
        received[0].body.contains("\"op\":\"test\""),
        "{}",
        received[0].body
    );
    assert!(error.is_conflict(), "{error:?}");
}
