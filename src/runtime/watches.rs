//! The watches of both controllers: one per kind and watched namespace (or one per kind for
//! all namespaces), each kind's watches filling its one store in the watch caches
//! (`context::caches`, slimmed: `Slim`, most kinds decoded straight into their packed form:
//! `Watched`, stored `Packed`; `merge` keeps several namespaces' lists in one store) and
//! handing every object they see — added, changed or deleted — at once to each
//! controller that kind triggers. Owned objects are selected by dbop's label; Secrets are
//! watched as metadata only.
//!
//! Adding a kind: its store in `context::caches`, one `spawn` line in `start` and its field in
//! `Triggers`.

use dbop_contract::lease::RELEASED_BY_ANNOTATION;
use futures::StreamExt;
use futures::channel::mpsc;
use futures::stream::BoxStream;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::api::DatabaseBackup;
use crate::context::caches::{Cached, Packed, SyncedMarker, Trigger, Watched, Writers, slim};
use crate::database::controller::Triggers as DatabaseTriggers;
use crate::resources::{DATABASE_POD_SELECTOR, MANAGED_SELECTOR};

use self::merge::Merge;

mod merge;

/// What an owned object's trigger carries: the metadata that names its owner (and its labels,
/// for the claims). Triggers queue while every reconcile slot is busy (a restart lists
/// everything at once), so they must not be a second copy of the caches.
pub type Meta<K> = PartialObjectMeta<K>;

/// The triggers of both controllers, one per (controller, kind): Jobs wake the Database that
/// owns them (init, restore, preflight, verify) and the backup that owns them; backups wake
/// their Database (history, health) and themselves.
pub struct Triggers {
    pub database: DatabaseTriggers,
    pub backups: Trigger<DatabaseBackup>,
    pub backup_jobs: Trigger<Meta<Job>>,
}

/// The running watches; dropping this stops them.
pub struct Watches(Vec<JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// One watch of one kind: its scope (a namespace, or all) and its events.
type Watch<K> = (
    Option<String>,
    BoxStream<'static, watcher::Result<Event<K>>>,
);

/// How the watches get their first complete view (`kube_io::initial_list`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialList {
    /// As watch events, one object at a time (the API server streams initial lists).
    Streamed,
    /// By a list (from the API server's cache), decoded whole.
    Listed,
}

/// What the watches cover.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The watched namespaces (none: all).
    pub namespaces: &'a [String],
    /// Watch the nodes too (`Settings::watch_nodes`).
    pub nodes: bool,
}

/// Starts one watch per kind and namespace of the scope (no namespaces: one per kind, in all),
/// and the nodes' when the scope says so.
pub fn start(
    client: &Client,
    scope: Scope<'_>,
    initial: InitialList,
    writers: Writers,
) -> (Triggers, Watches) {
    let namespaces = scope.namespaces;
    let all = match initial {
        InitialList::Streamed => watcher::Config::default().streaming_lists(),
        InitialList::Listed => watcher::Config::default().any_semantic(),
    };
    let managed = all.clone().labels(MANAGED_SELECTOR);
    let mut watches = Watches(Vec::new());
    let [m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, mut m13] =
        std::array::from_fn(|_| writers.synced_marker());
    let w = writers;
    let scopes: Vec<Option<String>> = match namespaces {
        [] => vec![None],
        some => some.iter().cloned().map(Some).collect(),
    };
    let c = (client, scopes.as_slice());
    let [databases] = watches.spawn(watch(c, &all), w.databases, m1, Clone::clone);
    let backups = watches.spawn(watch(c, &all), w.backups, m2, Clone::clone);
    let [statefulsets] = watches.spawn(watch(c, &managed), w.statefulsets, m3, packed_meta);
    let [services] = watches.spawn(watch(c, &managed), w.services, m4, packed_meta);
    let secrets_meta = watch::<Watched<PartialObjectMeta<Secret>>>(c, &managed);
    let [secrets] = watches.spawn(secrets_meta, w.secrets, m5, packed_meta);
    let jobs = watches.spawn(watch(c, &managed), w.jobs, m6, packed_meta);
    let [claims] = watches.spawn(watch(c, &managed), w.claims, m7, packed_meta);
    // Cached only (no trigger): a reconcile reads its ConfigMaps and rewrites what drifted.
    let [] = watches.spawn(watch(c, &managed), w.config_maps, m8, packed_meta);
    // The database pods: their roles and readiness (a new pod is labelled at once).
    let database_pods = all.clone().labels(DATABASE_POD_SELECTOR);
    let [pods] = watches.spawn(watch(c, &database_pods), w.pods, m9, packed_meta);
    let budgets = watch(c, &managed);
    let [disruption_budgets] = watches.spawn(budgets, w.disruption_budgets, m10, packed_meta);
    let policies = watch(c, &managed);
    let [network_policies] = watches.spawn(policies, w.network_policies, m12, packed_meta);
    // The primary Leases are renewed every two seconds: only a release wakes the Database (its
    // primary's server stopped, and a failover must come before the old primary is back).
    let [leases] = watches.spawn(watch(c, &managed), w.leases, m11, released);
    let released_leases = leases
        .filter_map(|lease| std::future::ready(lease.transpose()))
        .boxed();
    // The nodes, cluster-wide (a node is no namespace's), unless turned off (the chart's
    // watchNamespaces mode is granted nothing cluster-wide). They never hold the start: without
    // them no drain is seen, and nothing else changes.
    m13.listed();
    if scope.nodes {
        let [] = watches.spawn(watch_cluster(client, &all), w.nodes, m13, meta);
    }
    let ([jobs, backup_jobs], [backups, backups_self]) = (jobs, backups);
    let database = DatabaseTriggers {
        databases,
        statefulsets,
        services,
        secrets,
        claims,
        pods,
        disruption_budgets,
        network_policies,
        released_leases,
        jobs,
        backups,
    };
    let triggers = Triggers {
        database,
        backups: backups_self,
        backup_jobs,
    };
    (triggers, watches)
}

/// The watches of `K`: one per scope (a namespace, or all).
fn watch<K>(
    (client, scopes): (&Client, &[Option<String>]),
    config: &watcher::Config,
) -> Vec<Watch<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    scopes
        .iter()
        .map(|scope| {
            let api = match scope {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            (scope.clone(), watcher(api, config.clone()).boxed())
        })
        .collect()
}

/// The one watch of the cluster-scoped kind `K`.
fn watch_cluster<K>(client: &Client, config: &watcher::Config) -> Vec<Watch<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api = Api::all(client.clone());
    vec![(None, watcher(api, config.clone()).boxed())]
}

impl Watches {
    /// Runs the watches of one kind in one task: they fill the store through `writer` (one
    /// `Merge`) with what they decode, slimmed and in the store's form (`Cached`), mark the kind
    /// listed once each has listed completely, and hand `trigger(object)` of each object stored
    /// or deleted to `N` triggers.
    fn spawn<S, T, const N: usize>(
        &mut self,
        watches: Vec<Watch<S::Watched>>,
        writer: Writer<S>,
        mut synced: SyncedMarker,
        trigger: fn(&S) -> T,
    ) -> [Trigger<T>; N]
    where
        S: Cached,
        S::Watched: Resource,
        T: Clone + Send + 'static,
    {
        let mut senders = Vec::with_capacity(N);
        let triggers = std::array::from_fn(|_| {
            let (sender, trigger) = mpsc::unbounded();
            senders.push(sender);
            trigger.map(Ok).boxed()
        });
        let mut merge = Merge::new(writer, watches.iter().map(|w| w.0.clone()).collect());
        let events = futures::stream::select_all(watches.into_iter().enumerate().map(
            |(i, (scope, events))| {
                events
                    .backoff(crate::kube_io::watch::backoff())
                    .modify(slim::<S::Watched>)
                    .map(move |event| (i, scope.clone(), event.map(stored::<S>)))
                    .boxed()
            },
        ));
        self.0.push(tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some((i, scope, event)) = events.next().await {
                match event {
                    Ok(event) => {
                        let listed = merge.apply(i, event, |o| {
                            let t = trigger(o);
                            for sender in &senders {
                                let _ = sender.unbounded_send(t.clone());
                            }
                        });
                        if listed {
                            synced.listed();
                        }
                    }
                    Err(error) => {
                        let namespace = scope.as_deref().unwrap_or("<all>");
                        let kind = S::kind(&());
                        warn!(%error, %kind, namespace, "watch failed, retrying")
                    }
                }
            }
        }));
        triggers
    }
}

/// A watch's event in the store's form (`Cached`).
fn stored<S: Cached>(event: Event<S::Watched>) -> Event<S> {
    match event {
        Event::Apply(o) => Event::Apply(S::from_watched(o)),
        Event::Delete(o) => Event::Delete(S::from_watched(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(S::from_watched(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// The trigger of a primary Lease that its holder released (`RELEASED_BY_ANNOTATION`, no
/// holder); none for any other.
fn released(lease: &Lease) -> Option<Meta<Lease>> {
    let held = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty());
    let released = lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(RELEASED_BY_ANNOTATION));
    (released && !held).then(|| meta(lease))
}

/// The trigger of an owned object: its name, namespace, owners and labels.
fn meta<K: Resource>(object: &K) -> Meta<K> {
    meta_of(object.meta())
}

/// The trigger of a packed owned object (`Packed`): that of the object it packs (its name and
/// namespace alone if its metadata cannot be unpacked, which `Packed` logs).
fn packed_meta<K>(object: &Packed<K>) -> Meta<K>
where
    K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    let metadata = object.metadata().unwrap_or_else(|| ObjectMeta {
        name: Some(object.name().to_string()),
        namespace: object.namespace().map(String::from),
        ..ObjectMeta::default()
    });
    meta_of(&metadata)
}

/// A trigger of kind `K` from an object's metadata: its name, namespace, owners and labels.
fn meta_of<K>(m: &ObjectMeta) -> Meta<K> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    fn lease(holder: Option<&str>, released_by: Option<&str>) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some("orders-primary".into());
        lease.metadata.annotations =
            released_by.map(|by| [(RELEASED_BY_ANNOTATION.to_string(), by.to_string())].into());
        lease.spec = Some(LeaseSpec {
            holder_identity: holder.map(String::from),
            ..LeaseSpec::default()
        });
        lease
    }

    /// A packed object's trigger carries what the controller maps it by: its owners and labels
    /// (packed with the rest of its metadata, not in what the store keys on).
    #[test]
    fn a_packed_objects_trigger_names_its_owner_and_labels() {
        use k8s_openapi::api::core::v1::Service;
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "orders-rw", "namespace": "shop",
                "labels": {"app.kubernetes.io/instance": "orders"},
                "ownerReferences": [{"apiVersion": "dbop.dev/v1alpha1", "kind": "Database",
                                     "name": "orders", "uid": "5f0c", "controller": true}],
            },
        }))
        .unwrap();
        let trigger = packed_meta(&Packed::new(service.clone()));
        assert_eq!(trigger.metadata.name.as_deref(), Some("orders-rw"));
        assert_eq!(trigger.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            trigger.metadata.owner_references,
            service.metadata.owner_references
        );
        assert_eq!(trigger.metadata.labels, service.metadata.labels);
    }

    /// Renewals (every two seconds) and designations of a Lease never taken wake nobody; a
    /// release does.
    #[test]
    fn only_a_released_lease_wakes_its_database() {
        assert!(released(&lease(Some("orders-0"), None)).is_none());
        assert!(released(&lease(None, None)).is_none());
        let woken = released(&lease(None, Some("orders-0"))).expect("a trigger");
        assert_eq!(woken.metadata.name.as_deref(), Some("orders-primary"));
        // Taken again (the annotation goes with the next write, but a holder is enough).
        assert!(released(&lease(Some("orders-1"), Some("orders-0"))).is_none());
    }
}
