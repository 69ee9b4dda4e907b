//! The startup question "does the API server stream initial lists?" (`kube_io::initial_list`)
//! against scripted answers: the request it sends, and that only a stream ended by the
//! `k8s.io/initial-events-end` bookmark counts as yes. The real API server's answer (yes, on the
//! test bed's Kubernetes) is checked in e2e/tests/operate.rs.

use std::sync::{Arc, Mutex};

use dbop::api::Database;
use dbop::kube_io::initial_list::server_streams_initial_lists;
use http::{Request, Response, StatusCode};
use kube::Api;
use kube::client::Body;
use serde_json::{Value, json};

/// Asks a mock server that answers the first request with `status` and `lines` (one watch
/// event each); returns the answer and the query of the request it got.
async fn ask(status: StatusCode, lines: Vec<Value>) -> (bool, String) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let query = Arc::new(Mutex::new(String::new()));
    let seen = query.clone();
    tokio::spawn(async move {
        if let Some((request, respond)) = handle.next_request().await {
            *seen.lock().unwrap() = request.uri().query().unwrap_or_default().to_string();
            let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(body.into_bytes()))
                .unwrap();
            respond.send_response(response);
        }
    });
    let api: Api<Database> = Api::namespaced(kube::Client::new(service, "default"), "shop");
    let answer = server_streams_initial_lists(&api).await;
    let query = query.lock().unwrap().clone();
    (answer, query)
}

fn added() -> Value {
    json!({"type": "ADDED", "object": {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "orders", "namespace": "shop", "resourceVersion": "7"}}})
}

fn bookmark(annotations: Value) -> Value {
    json!({"type": "BOOKMARK", "object": {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"resourceVersion": "8", "annotations": annotations}}})
}

#[tokio::test]
async fn a_stream_ended_by_the_initial_events_bookmark_means_streamed_lists() {
    let end = bookmark(json!({"k8s.io/initial-events-end": "true"}));
    let (answer, query) = ask(StatusCode::OK, vec![added(), end]).await;
    assert!(answer);
    for part in [
        "watch=true",
        "sendInitialEvents=true",
        "resourceVersionMatch=NotOlderThan",
        "allowWatchBookmarks=true",
    ] {
        assert!(query.contains(part), "{part} missing from {query}");
    }
}

#[tokio::test]
async fn a_server_that_ignores_the_question_means_lists() {
    // An older server that ignores sendInitialEvents: events, plain bookmarks, then the end.
    let plain = bookmark(json!({}));
    let (answer, _) = ask(StatusCode::OK, vec![added(), plain]).await;
    assert!(!answer);
}

#[tokio::test]
async fn a_server_that_refuses_the_question_means_lists() {
    let refusal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        "reason": "Invalid", "code": 422});
    let (answer, _) = ask(StatusCode::UNPROCESSABLE_ENTITY, vec![refusal]).await;
    assert!(!answer);
}
