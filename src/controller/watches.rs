//! The watches of both controllers: one per kind, each filling its store in the watch caches
//! (`context::caches`, slimmed: `Slim`) and handing every object it sees — added,
//! changed or deleted — at once to each controller that kind triggers. Owned objects are
//! selected by dbop's label; Secrets are watched as metadata only.
//!
//! Adding a kind: its store in `context::caches`, one `spawn` line in `start` and its field in
//! `Triggers`.

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::api::{Database, DatabaseBackup};
use crate::context::caches::{Slim, SyncedMarker, Trigger, Writers, slim};
use crate::resources::MANAGED_SELECTOR;

/// What an owned object's trigger carries: the metadata that names its owner (and its labels,
/// for the claims). Triggers queue while every reconcile slot is busy (a restart lists
/// everything at once), so they must not be a second copy of the caches.
pub type Meta<K> = PartialObjectMeta<K>;

/// The triggers of both controllers, one per (controller, kind).
pub struct Triggers {
    pub databases: Trigger<DeserializeGuard<Database>>,
    pub statefulsets: Trigger<Meta<StatefulSet>>,
    pub services: Trigger<Meta<Service>>,
    pub secrets: Trigger<Meta<PartialObjectMeta<Secret>>>,
    pub claims: Trigger<Meta<PersistentVolumeClaim>>,
    /// Jobs wake the Database that owns them (init) and the backup that owns them.
    pub jobs: [Trigger<Meta<Job>>; 2],
    /// Backups wake their Database (history, health) and themselves.
    pub backups: [Trigger<DatabaseBackup>; 2],
}

/// The running watches; dropping this stops them.
pub struct Watches(Vec<JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// Starts one watch per kind, in `namespace` or in all.
pub fn start(client: &Client, namespace: &Option<String>, writers: Writers) -> (Triggers, Watches) {
    let all = watcher::Config::default().any_semantic();
    let managed = all.clone().labels(MANAGED_SELECTOR);
    let mut watches = Watches(Vec::new());
    let marker = || writers.synced_marker();
    let (m1, m2, m3, m4, m5, m6, m7) = (
        marker(),
        marker(),
        marker(),
        marker(),
        marker(),
        marker(),
        marker(),
    );
    let Writers {
        databases,
        backups,
        statefulsets,
        services,
        secrets,
        jobs,
        claims,
        ..
    } = writers;
    let c = (client, namespace);
    let [databases] = watches.spawn(watcher(api(c), all.clone()), databases, m1, Clone::clone);
    let backups = watches.spawn(watcher(api(c), all), backups, m2, Clone::clone);
    let [statefulsets] = watches.spawn(watcher(api(c), managed.clone()), statefulsets, m3, meta);
    let [services] = watches.spawn(watcher(api(c), managed.clone()), services, m4, meta);
    let secrets_meta = api::<PartialObjectMeta<Secret>>(c);
    let [secrets] = watches.spawn(watcher(secrets_meta, managed.clone()), secrets, m5, meta);
    let jobs = watches.spawn(watcher(api(c), managed.clone()), jobs, m6, meta);
    let [claims] = watches.spawn(watcher(api(c), managed), claims, m7, meta);
    let triggers = Triggers {
        databases,
        statefulsets,
        services,
        secrets,
        claims,
        jobs,
        backups,
    };
    (triggers, watches)
}

/// `K`s in the watched namespace, or in all.
fn api<K>((client, namespace): (&Client, &Option<String>)) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

impl Watches {
    /// Runs one watch in its own task: it fills the store through `writer`, marks the kind
    /// listed after its first complete list, and hands `trigger(object)` of each object it
    /// sees to `N` triggers.
    fn spawn<K, T, const N: usize>(
        &mut self,
        events: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
        writer: Writer<K>,
        mut synced: SyncedMarker,
        trigger: fn(&K) -> T,
    ) -> [Trigger<T>; N]
    where
        K: Resource<DynamicType = ()> + Slim + Clone + Send + Sync + 'static,
        T: Clone + Send + 'static,
    {
        let mut senders = Vec::with_capacity(N);
        let triggers = std::array::from_fn(|_| {
            let (sender, trigger) = mpsc::unbounded();
            senders.push(sender);
            trigger.map(Ok).boxed()
        });
        let events = events
            .backoff(crate::kube_io::watch::backoff())
            .modify(slim::<K>)
            .reflect(writer);
        self.0.push(tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) => {
                        let t = trigger(&o);
                        for sender in &senders {
                            let _ = sender.unbounded_send(t.clone());
                        }
                    }
                    Ok(Event::InitDone) => synced.listed(),
                    Ok(Event::Init) => {}
                    Err(error) => {
                        warn!(%error, kind = %<K as Resource>::kind(&()), "watch failed, retrying")
                    }
                }
            }
        }));
        triggers
    }
}

/// The trigger of an owned object: its name, namespace, owners and labels.
fn meta<K: Resource>(object: &K) -> Meta<K> {
    let m = object.meta();
    PartialObjectMeta {
        types: None,
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            owner_references: m.owner_references.clone(),
            labels: m.labels.clone(),
            ..ObjectMeta::default()
        },
        _phantom: PhantomData,
    }
}
