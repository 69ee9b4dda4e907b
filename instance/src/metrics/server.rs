//! The manager's HTTP endpoints: a TCP listener on its own thread, one short-lived thread per
//! connection (at most `MAX_CONNECTIONS` at once, the others get a 503), one scrape at a time
//! (a second scraper waits for the first: the database never runs two scrapes' queries at
//! once). A listener serves `/metrics` or `/status` and `/volume` (what `Endpoints` it is given) and
//! `/healthz`, reads nothing but the request head, and never blocks the manager's supervision
//! loop. Status requests that arrive together share one reading (`shared_read`).
//!
//! I/O only: routing and responses are `http`'s, the scrape is `collect`'s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::collect::{Collector, Source, position, volume_usage};
use crate::metrics::exposition::CONTENT_TYPE;
use crate::metrics::http::{self, Route};
use crate::metrics::shared_read::SharedRead;
use dbop_contract::position::Position;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 4;
/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one listener serves beside `/healthz`.
pub enum Endpoints {
    /// `/metrics`, scraped by this collector.
    Metrics(Collector),
    /// `/status`, the position of the server at this source.
    Status(Arc<StatusReader>),
}

impl Endpoints {
    /// `/status` of the server at `source`.
    pub fn status(source: Source) -> Endpoints {
        Endpoints::Status(Arc::new(StatusReader {
            source,
            readings: SharedRead::new(),
        }))
    }
}

/// The server's position, one reading at a time shared by the requests waiting for it.
pub struct StatusReader {
    source: Source,
    readings: SharedRead<Result<Position, String>>,
}

/// Binds `addr` and serves on a thread of its own; returns the address bound.
pub fn start(addr: SocketAddr, endpoints: Endpoints) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let collector = Arc::new(Mutex::new(endpoints));
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::SeqCst);
                    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                    let _ =
                        (&stream).write_all(&http::response(503, "text/plain", "busy\n", false));
                    continue;
                }
                let (collector, done) = (collector.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        serve(stream, &collector);
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })?;
    Ok(bound)
}

fn serve(mut stream: TcpStream, endpoints: &Mutex<Endpoints>) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !http::head_complete(&head) {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > http::MAX_HEAD {
            let _ = stream.write_all(&http::response(400, "text/plain", "too long\n", false));
            return;
        }
    }
    let not_found = || http::response(404, "text/plain", "not found\n", false);
    let response = match http::route(&head) {
        Route::Metrics { head } => {
            match &mut *endpoints.lock().unwrap_or_else(|e| e.into_inner()) {
                Endpoints::Metrics(collector) => {
                    http::response(200, CONTENT_TYPE, &collector.scrape(), head)
                }
                Endpoints::Status(_) => not_found(),
            }
        }
        Route::Status { head } => {
            let reader = match &*endpoints.lock().unwrap_or_else(|e| e.into_inner()) {
                Endpoints::Status(reader) => Some(reader.clone()),
                Endpoints::Metrics(_) => None,
            };
            match reader.map(|r| r.readings.fresh(|| position(&r.source))) {
                None => not_found(),
                Some(Ok(p)) => http::response(200, "application/json", &p.to_json(), head),
                Some(Err(e)) => http::response(503, "text/plain", &format!("{e}\n"), head),
            }
        }
        // From the filesystem alone: answered while PostgreSQL is down, which is when a full
        // volume matters most.
        Route::Volume { head } => match &*endpoints.lock().unwrap_or_else(|e| e.into_inner()) {
            Endpoints::Status(reader) => match volume_usage(&reader.source.pgdata) {
                Ok(v) => http::response(200, "application/json", &v.to_json(), head),
                Err(e) => http::response(503, "text/plain", &format!("statvfs: {e}\n"), head),
            },
            Endpoints::Metrics(_) => not_found(),
        },
        Route::Health { head } => http::response(200, "text/plain", "ok\n", head),
        Route::NotFound => not_found(),
        Route::MethodNotAllowed => http::response(405, "text/plain", "", false),
        Route::BadRequest => http::response(400, "text/plain", "bad request\n", false),
    };
    let _ = stream.write_all(&response);
}
