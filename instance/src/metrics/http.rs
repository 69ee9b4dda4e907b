//! The little HTTP/1.x the metrics endpoint speaks: the request head to a route, and a
//! complete response (`Connection: close`, a `Content-Length`, no keep-alive, no chunking).
//!
//! Pure: bytes in, bytes out.

/// The largest request head read (a scraper sends a few hundred bytes).
pub const MAX_HEAD: usize = 8 * 1024;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (`head`: a HEAD request, no body sent).
    Metrics {
        head: bool,
    },
    /// `GET /status`: the instance's WAL position (`dbop_contract::position`).
    Status {
        head: bool,
    },
    /// `GET /volume`: how full the data volume is (`dbop_contract::volume`).
    Volume {
        head: bool,
    },
    /// `GET /healthz`: the endpoint itself answers.
    Health {
        head: bool,
    },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Whether `bytes` holds a complete request head (up to the blank line).
pub fn head_complete(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n") || bytes.windows(2).any(|w| w == b"\n\n")
}

/// The route of a request head (only its request line matters; a query string is ignored).
pub fn route(head: &[u8]) -> Route {
    let Ok(text) = std::str::from_utf8(head) else {
        return Route::BadRequest;
    };
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::MethodNotAllowed,
    };
    match target.split('?').next().unwrap_or_default() {
        "/metrics" => Route::Metrics { head },
        "/healthz" => Route::Health { head },
        dbop_contract::position::STATUS_PATH => Route::Status { head },
        dbop_contract::volume::VOLUME_PATH => Route::Volume { head },
        _ => Route::NotFound,
    }
}

/// A complete response; `body` is left out (its length still given) for a HEAD request.
pub fn response(status: u16, content_type: &str, body: &str, head: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head {
        out.push_str(body);
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let table: [(&[u8], Route); 12] = [
            (
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                Route::Metrics { head: false },
            ),
            (
                b"HEAD /metrics HTTP/1.0\r\n\r\n",
                Route::Metrics { head: true },
            ),
            (
                b"GET /metrics?x=1 HTTP/1.1\r\n\r\n",
                Route::Metrics { head: false },
            ),
            (
                b"GET /healthz HTTP/1.1\r\n\r\n",
                Route::Health { head: false },
            ),
            (
                b"GET /status HTTP/1.1\r\n\r\n",
                Route::Status { head: false },
            ),
            (
                b"GET /volume HTTP/1.1\r\n\r\n",
                Route::Volume { head: false },
            ),
            (b"GET / HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Route::MethodNotAllowed),
            (b"GET /metrics\r\n\r\n", Route::BadRequest),
            (b"GET /metrics SPDY/3\r\n\r\n", Route::BadRequest),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"\xff\xfe\r\n\r\n", Route::BadRequest),
        ];
        for (head, want) in table {
            assert_eq!(route(head), want, "{:?}", String::from_utf8_lossy(head));
        }
        assert!(head_complete(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"));
        assert!(head_complete(b"GET / HTTP/1.1\n\n"));
        assert!(!head_complete(b"GET / HTTP/1.1\r\nA: b\r\n"));
    }

    #[test]
    fn responses() {
        assert_eq!(
            response(200, "text/plain", "ok\n", false),
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\
              Connection: close\r\n\r\nok\n"
        );
        let head = String::from_utf8(response(200, "text/plain", "ok\n", true)).unwrap();
        assert!(head.ends_with("Content-Length: 3\r\nConnection: close\r\n\r\n"));
        let refused = String::from_utf8(response(405, "text/plain", "", false)).unwrap();
        assert!(refused.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(refused.contains("Allow: GET, HEAD\r\n"));
    }
}
