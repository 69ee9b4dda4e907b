//! The work-queue depth of one controller (`dbop_workqueue_depth`), measured from outside
//! kube-runtime's scheduler, which is private: the set of objects that a trigger has woken and
//! whose reconcile has not started yet.
//!
//! An object enters the set where its trigger enters the controller (`recording`, `mapping`:
//! the object itself, the owners an owned object names, or what a mapper returns — the same refs
//! the controller schedules) and leaves it when its reconcile starts (`started`), or when the
//! controller reports it gone from the store (`ObjectNotFound`: the trigger ran into nothing).
//! The scheduler runs an object once however many triggers it got, so the set's size is the
//! number of objects waiting to run. A `requeue_after` timer is a delay, not a queued object.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Resource;
use kube::runtime::controller;
use kube::runtime::reflector::ObjectRef;
use prometheus_client::metrics::gauge::Gauge;

use crate::context::caches::Trigger;

/// An object of the controller's kind: (namespace, name).
pub type Key = (String, String);

/// The objects waiting for a reconcile, and the gauge that shows how many.
pub struct WorkQueue {
    pending: Mutex<HashSet<Key>>,
    depth: Gauge,
}

impl WorkQueue {
    /// An empty queue reported through `depth` (set to 0 now).
    pub fn new(depth: Gauge) -> Arc<Self> {
        depth.set(0);
        Arc::new(Self {
            pending: Mutex::new(HashSet::new()),
            depth,
        })
    }

    /// Triggers woke these objects.
    pub fn queued(&self, keys: impl IntoIterator<Item = Key>) {
        self.change(|pending| pending.extend(keys));
    }

    /// The reconcile of `key` started, or the controller found it gone.
    pub fn started(&self, key: &Key) {
        self.change(|pending| {
            pending.remove(key);
        });
    }

    /// How many objects wait.
    pub fn depth(&self) -> usize {
        self.lock().len()
    }

    /// `trigger` with the objects each item wakes (`keys`) recorded as queued.
    pub fn recording<T, I>(
        self: &Arc<Self>,
        trigger: Trigger<T>,
        keys: impl Fn(&T) -> I + Send + 'static,
    ) -> Trigger<T>
    where
        T: Send + 'static,
        I: IntoIterator<Item = Key>,
    {
        let queue = self.clone();
        trigger
            .inspect(move |item| {
                if let Ok(object) = item {
                    queue.queued(keys(object));
                }
            })
            .boxed()
    }

    /// `trigger` of the controller's own kind, recorded.
    pub fn own<T: Resource + Send + 'static>(self: &Arc<Self>, trigger: Trigger<T>) -> Trigger<T> {
        self.recording(trigger, |object| [own_key(object)])
    }

    /// `trigger` of objects owned by `Owner`s (an `owns_stream`), recorded.
    pub fn owned<Owner, T>(self: &Arc<Self>, trigger: Trigger<T>) -> Trigger<T>
    where
        Owner: Resource<DynamicType = ()> + 'static,
        T: Resource + Send + 'static,
    {
        self.recording(trigger, owner_keys::<Owner, T>)
    }

    /// `reconcile`, taking its object out of the queue as it starts.
    pub fn starting<K, C, F, R>(
        self: &Arc<Self>,
        reconcile: R,
    ) -> impl FnMut(Arc<K>, C) -> F + use<K, C, F, R>
    where
        K: Resource,
        R: Fn(Arc<K>, C) -> F,
    {
        let queue = self.clone();
        move |object, ctx| {
            queue.started(&own_key(object.as_ref()));
            reconcile(object, ctx)
        }
    }

    /// A `watches_stream` mapper that records the object it maps to as queued.
    pub fn mapping<T, K>(
        self: &Arc<Self>,
        mapper: impl Fn(T) -> Option<ObjectRef<K>> + Send + Sync + 'static,
    ) -> impl Fn(T) -> Option<ObjectRef<K>> + Send + Sync + 'static
    where
        K: Resource<DynamicType = ()>,
    {
        let queue = self.clone();
        move |object| {
            let target = mapper(object);
            if let Some(target) = &target {
                queue.queued([key_of_ref(target)]);
            }
            target
        }
    }

    fn change(&self, change: impl FnOnce(&mut HashSet<Key>)) {
        let mut pending = self.lock();
        change(&mut pending);
        self.depth
            .set(i64::try_from(pending.len()).unwrap_or(i64::MAX));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One result of a controller's run: a trigger for an object gone from the store
/// (`ObjectNotFound`) takes it out of the queue (no reconcile starts for it).
pub fn forget_if_gone<T, E1, E2>(queue: &WorkQueue, result: &Result<T, controller::Error<E1, E2>>)
where
    E1: std::error::Error + 'static,
    E2: std::error::Error + 'static,
{
    if let Err(controller::Error::ObjectNotFound(gone)) = result {
        queue.started(&key_of_ref(gone));
    }
}

/// The key of an object of the controller's own kind.
pub fn own_key<K: Resource>(object: &K) -> Key {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The keys of an owned object's owners of kind `Owner` (kube's `owns_stream` rule: same
/// apiVersion and kind, in the object's namespace).
pub fn owner_keys<Owner, K>(object: &K) -> Vec<Key>
where
    Owner: Resource<DynamicType = ()>,
    K: Resource,
{
    let meta = object.meta();
    let ns = meta.namespace.as_deref();
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| ObjectRef::<Owner>::from_owner_ref(ns, owner, ()))
        .map(|r| key_of_ref(&r))
        .collect()
}

/// The key of a reference (of any kind: the controller's `ObjectNotFound` erases it).
pub fn key_of_ref<K: kube::runtime::reflector::Lookup>(r: &ObjectRef<K>) -> Key
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    (r.namespace.clone().unwrap_or_default(), r.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Database;
    use futures::stream;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn key(ns: &str, name: &str) -> Key {
        (ns.into(), name.into())
    }

    fn owned_by(owners: &[(&str, &str)]) -> StatefulSet {
        let mut sts = StatefulSet::default();
        sts.metadata.name = Some("orders".into());
        sts.metadata.namespace = Some("shop".into());
        sts.metadata.owner_references = Some(
            owners
                .iter()
                .map(|(kind, name)| OwnerReference {
                    api_version: if *kind == "Database" {
                        Database::api_version(&()).into()
                    } else {
                        "v1".into()
                    },
                    kind: (*kind).into(),
                    name: (*name).into(),
                    uid: "u".into(),
                    ..OwnerReference::default()
                })
                .collect(),
        );
        sts
    }

    #[test]
    fn an_object_triggered_twice_waits_once_and_leaves_when_its_reconcile_starts() {
        let gauge = Gauge::default();
        let queue = WorkQueue::new(gauge.clone());
        queue.queued([key("shop", "orders"), key("shop", "users")]);
        queue.queued([key("shop", "orders")]);
        assert_eq!((queue.depth(), gauge.get()), (2, 2));
        queue.started(&key("shop", "orders"));
        assert_eq!(gauge.get(), 1);
        // A reconcile the queue never saw (a requeue timer) changes nothing.
        queue.started(&key("shop", "orders"));
        queue.started(&key("other", "users"));
        assert_eq!(gauge.get(), 1);
        queue.started(&key("shop", "users"));
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn an_owned_object_queues_only_its_database_owners() {
        let sts = owned_by(&[("Database", "orders"), ("ConfigMap", "x")]);
        assert_eq!(owner_keys::<Database, _>(&sts), [key("shop", "orders")]);
        assert!(owner_keys::<Database, _>(&owned_by(&[])).is_empty());
        assert_eq!(own_key(&sts), key("shop", "orders"));
    }

    #[test]
    fn a_wrapped_reconcile_takes_its_object_out_of_the_queue_as_it_starts() {
        let queue = WorkQueue::new(Gauge::default());
        queue.queued([key("shop", "orders"), key("shop", "users")]);
        let mut reconcile = queue.starting(|sts: Arc<StatefulSet>, ctx: u8| (own_key(&*sts), ctx));
        let sts = Arc::new(owned_by(&[]));
        assert_eq!(reconcile(sts, 7), (key("shop", "orders"), 7));
        assert_eq!(queue.depth(), 1);
    }

    #[tokio::test]
    async fn a_recorded_trigger_queues_what_passes_through_it_and_a_mapper_what_it_maps_to() {
        let queue = WorkQueue::new(Gauge::default());
        let items = vec![
            Ok(owned_by(&[("Database", "a")])),
            Err(kube::runtime::watcher::Error::NoResourceVersion),
            Ok(owned_by(&[("Database", "b")])),
        ];
        let trigger = queue.recording(stream::iter(items).boxed(), owner_keys::<Database, _>);
        assert_eq!(trigger.count().await, 3);
        assert_eq!(queue.depth(), 2);

        let mapper = queue.mapping(|name: &str| Some(ObjectRef::<Database>::new(name).within("x")));
        assert!(mapper("c").is_some());
        assert_eq!(queue.depth(), 3);
        queue.started(&key("x", "c"));
        assert_eq!(queue.depth(), 2);
    }
}
