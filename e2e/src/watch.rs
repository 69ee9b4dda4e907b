//! An independent watch on one named object, opened at its current resourceVersion so no event
//! after the call is missed, with each event stamped when it arrives. Tests time repairs with
//! it (DELETED → ADDED of the replacement) and see transient states a poll would miss (the
//! Deleting phase of a Database that is gone a moment later).

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::api::{WatchEvent, WatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

type Events<K> = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<K>>> + Send>>;

/// A watch on one object.
pub struct ObjectWatch<K> {
    name: String,
    events: Events<K>,
}

impl<K> ObjectWatch<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    /// Opens the watch from the object's current resourceVersion (the object must exist).
    pub async fn start(api: &Api<K>, name: &str) -> Self {
        let current = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("cannot read {name} to watch it: {e}"));
        let version = current.meta().resource_version.clone().unwrap_or_default();
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let events = api
            .watch(&params, &version)
            .await
            .unwrap_or_else(|e| panic!("cannot watch {name}: {e}"));
        Self {
            name: name.to_string(),
            events: Box::pin(events),
        }
    }

    /// The next event `pick` accepts (it maps the event to what the test needs), with when it
    /// arrived; panics after `timeout`, naming `what`.
    pub async fn next<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut pick: impl FnMut(&WatchEvent<K>) -> Option<T>,
    ) -> (T, Instant) {
        let name = self.name.clone();
        let found = tokio::time::timeout(timeout, async {
            while let Some(event) = self.events.next().await {
                let event = event.unwrap_or_else(|e| panic!("watch on {name} broke: {e}"));
                if let WatchEvent::Error(status) = &event {
                    panic!("watch on {name} failed: {status:?}");
                }
                if let Some(value) = pick(&event) {
                    return Some((value, Instant::now()));
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(found)) => found,
            Ok(None) => panic!("the watch on {name} ended before {what}"),
            Err(_) => panic!("no {what} on {name} within {timeout:?}"),
        }
    }

    /// Every event until the object is deleted, in order; panics after `timeout`.
    pub async fn until_deleted(&mut self, timeout: Duration) -> (Vec<WatchEvent<K>>, Instant) {
        let mut seen = Vec::new();
        let (_, at) = self
            .next("a DELETED event", timeout, |event| {
                seen.push(event.clone());
                matches!(event, WatchEvent::Deleted(_)).then_some(())
            })
            .await;
        (seen, at)
    }
}

/// The median and the largest of some durations (`None` when there are none).
pub fn p50_max(samples: &[Duration]) -> Option<(Duration, Duration)> {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let max = *sorted.last()?;
    Some((sorted[(sorted.len() - 1) / 2], max))
}
