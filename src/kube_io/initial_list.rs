//! How the watches get their first complete view: as a stream of watch events when the API
//! server can send one (Kubernetes' streaming lists, `sendInitialEvents`), otherwise by a list.
//!
//! Why it matters: a list arrives as one response that is decoded whole before any object is
//! stored, with every object's `managedFields`. On a restart with 1,000 Databases the list of
//! StatefulSets alone took ~40 MiB while it was decoded (heaptrack; docs/benchmarks.md), more
//! than all the caches together. Streamed, each object is decoded, slimmed and stored on its own.
//!
//! Whether the server can is asked once at startup by one short streaming watch: a server that
//! can ends its initial events with a bookmark annotated `k8s.io/initial-events-end`; an older
//! one refuses the parameters or ignores them (no such bookmark). Any doubt means lists.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{WatchEvent, WatchParams};
use kube::core::watch::Bookmark;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

/// The annotation of the bookmark that ends a streamed initial list.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How long the question may take (the server streams the probed kind's metadata first).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The bookmark that ends a streamed initial list.
pub fn ends_initial_events(bookmark: &Bookmark) -> bool {
    bookmark
        .metadata
        .annotations
        .get(INITIAL_EVENTS_END)
        .is_some_and(|v| v == "true")
}

/// Whether the API server streams initial lists, asked through a streaming watch of `api`'s
/// metadata (an `api` the operator may watch: its own kind in a watched namespace).
pub async fn server_streams_initial_lists<K>(api: &Api<K>) -> bool
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let timeout = u32::try_from(PROBE_TIMEOUT.as_secs()).unwrap_or(10);
    let params = WatchParams::streaming_lists().timeout(timeout);
    let events = match api.watch_metadata(&params, "0").await {
        Ok(events) => events,
        Err(error) => {
            info!(%error, "the API server does not stream initial lists: watches list first");
            return false;
        }
    };
    let mut events = std::pin::pin!(events);
    // The watch ends by itself after `timeout`; the client-side bound covers a silent server.
    let answer = tokio::time::timeout(PROBE_TIMEOUT + Duration::from_secs(2), async {
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Bookmark(bookmark)) if ends_initial_events(&bookmark) => {
                    return true;
                }
                Ok(WatchEvent::Error(_)) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !answer {
        info!("the API server did not end a streamed initial list: watches list first");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bookmark(annotations: serde_json::Value) -> Bookmark {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"resourceVersion": "42", "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_annotated_bookmark_ends_the_initial_events() {
        assert!(ends_initial_events(&bookmark(
            serde_json::json!({INITIAL_EVENTS_END: "true"})
        )));
        assert!(!ends_initial_events(&bookmark(serde_json::json!({}))));
        assert!(!ends_initial_events(&bookmark(
            serde_json::json!({INITIAL_EVENTS_END: "false"})
        )));
    }
}
