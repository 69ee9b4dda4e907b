//! The operator's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the process
//! serves requests) and `/readyz` (the controllers can list what they watch, or a standby waits
//! for the lease). A plain HTTP/1 server on hyper, which kube already brings in.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

use super::metrics::{CONTENT_TYPE, Metrics};

/// Whether the operator is ready: set by the runtime, read by `/readyz`.
#[derive(Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Binds `addr` (port 0 picks a free port) and returns the bound address; the server runs on a
/// spawned task until the process ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    info!(%local, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let service =
                    service_fn(move |request| answer(request, metrics.clone(), ready.clone()));
                if let Err(error) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(%error, "metrics connection ended with an error");
                }
            });
        }
    });
    Ok(local)
}

async fn answer(
    request: Request<Incoming>,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"));
    }
    Ok(match request.uri().path() {
        "/metrics" => {
            metrics.ready(ready.get());
            let mut response = Response::new(Full::new(Bytes::from(metrics.encode())));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready.get() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    })
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}
