//! The watch caches both controllers read instead of the API server: one reflector store per
//! kind, filled by the controllers' own watches (`runtime::watches`: one watch per kind,
//! shared by both controllers), slimmed to what readers look at (`Slim`), and the owned kinds
//! (StatefulSets, Services, claims, Jobs, the Secrets' metadata...) kept packed (`Packed`: the
//! identity as is, the rest deflated JSON, unpacked by `get_unpacked`). A read here
//! is a lookup in memory.
//!
//! A cache can lag the API server by the events still in flight; each of those events triggers
//! another reconcile, which then sees it. Objects dbop does not label (the user's Secrets and
//! ConfigMaps) are not watched and are still read from the API server.
//!
//! Adding a kind is one line in the `caches!` list below (and its watch in `runtime::watches`;
//! a kind stored as it is decoded, not packed, also goes in `cached_as_decoded!`).

use std::fmt;
use std::sync::Arc;

use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, NodeSpec, PersistentVolumeClaim, Pod, PodSpec, PodStatus, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::api::{Database, DatabaseBackup};

pub use self::packed::{Packed, Watched};

mod packed;

/// What wakes a controller: every object one watch of `runtime::watches` sees (never an
/// error: the watch logs and retries those itself).
pub type Trigger<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// Declares `Caches` (the readers) and `Writers` (what the watches fill), one field per kind.
macro_rules! caches {
    ($($field:ident: $kind:ty,)*) => {
        /// The stores the controllers read (cheap to clone: handles to the same maps).
        #[derive(Clone)]
        pub struct Caches {
            $(pub $field: Store<$kind>,)*
            synced: watch::Receiver<usize>,
        }

        /// The writing ends of the stores, one per watch.
        pub struct Writers {
            $(pub $field: Writer<$kind>,)*
            synced: Arc<watch::Sender<usize>>,
        }

        /// How many kinds are cached: the caches are synced once each has been listed.
        const KINDS: usize = [$(stringify!($field)),*].len();

        /// Empty caches and the writers that fill them.
        pub fn caches() -> (Caches, Writers) {
            $(let $field = reflector::store();)*
            let (sender, synced) = watch::channel(0);
            (
                Caches { $($field: $field.0,)* synced },
                Writers { $($field: $field.1,)* synced: Arc::new(sender) },
            )
        }
    };
}

caches! {
    databases: DeserializeGuard<Database>,
    backups: DatabaseBackup,
    // Packed (`Packed`): the drift check compares the whole object, the pod template is most
    // of it, and a pass unpacks only its own Database's.
    statefulsets: Packed<StatefulSet>,
    services: Packed<Service>,
    // Metadata only, packed: a generated Secret's data is never read, only its owner and
    // annotations.
    secrets: Packed<PartialObjectMeta<Secret>>,
    // Packed, slimmed to metadata and status (`Slim for Job`).
    jobs: Packed<Job>,
    claims: Packed<PersistentVolumeClaim>,
    // The server configuration dbop ships (`<name>-config`) and the inline init SQL.
    config_maps: Packed<ConfigMap>,
    // The database pods (component `database`), slimmed to their role label, node and
    // readiness (which instance is which), packed.
    pods: Packed<Pod>,
    // The database pods' PodDisruptionBudgets.
    disruption_budgets: Packed<PodDisruptionBudget>,
    // The database pods' NetworkPolicies (`spec.networkPolicy`).
    network_policies: Packed<NetworkPolicy>,
    // The primary Leases: read by every pass, never a trigger (a primary renews its Lease
    // every two seconds; a pass looks when the Lease would expire).
    leases: Lease,
    // The nodes, slimmed to whether they are cordoned: a primary on a node being drained hands
    // over first (`database::roles`). Never a trigger: a Database with standbys is looked at
    // every few seconds anyway.
    nodes: Node,
}

impl Caches {
    /// Waits until every kind has been listed once (a reconcile before that would take "not in
    /// the cache" for "does not exist").
    pub async fn wait_until_synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the writers are gone (shutdown): nothing will change any more.
        let _ = synced.wait_for(|kinds| *kinds >= KINDS).await;
    }
}

impl Writers {
    /// A handle the watch of one kind uses to say it has listed everything once.
    pub fn synced_marker(&self) -> SyncedMarker {
        SyncedMarker {
            sender: self.synced.clone(),
            done: false,
        }
    }

    /// Every kind counts as listed (for stores filled by hand, as in tests).
    pub fn mark_all_synced(&self) {
        self.synced.send_replace(KINDS);
    }
}

/// Marks one kind as listed, once.
pub struct SyncedMarker {
    sender: Arc<watch::Sender<usize>>,
    done: bool,
}

impl SyncedMarker {
    pub fn listed(&mut self) {
        if !self.done {
            self.done = true;
            self.sender.send_modify(|kinds| *kinds += 1);
        }
    }
}

/// The object `name` in `namespace`, cloned out of the store.
pub fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<K>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store
        .get(&ObjectRef::new(name).within(namespace))
        .map(|found| K::clone(&found))
}

/// The packed object `name` in `namespace`, unpacked (`Packed`).
pub fn get_unpacked<K>(store: &Store<Packed<K>>, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))?.unpack()
}

/// The packed objects in `namespace` whose name `named` accepts, unpacked, that `keep` accepts
/// (`named` spares unpacking the others).
pub fn list_unpacked<K>(
    store: &Store<Packed<K>>,
    namespace: &str,
    named: impl Fn(&str) -> bool,
    keep: impl Fn(&K) -> bool,
) -> Vec<K>
where
    K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned + 'static,
{
    store
        .state()
        .iter()
        .filter(|o| o.namespace() == Some(namespace) && named(o.name()))
        .filter_map(|o| o.unpack())
        .filter(keep)
        .collect()
}

/// Every object of the store in `namespace` that `keep` accepts, cloned.
pub fn list<K>(store: &Store<K>, namespace: &str, keep: impl Fn(&K) -> bool) -> Vec<K>
where
    K: Lookup + Resource + Clone + 'static,
    <K as Lookup>::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .into_iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace) && keep(o))
        .map(|o| K::clone(&o))
        .collect()
}

/// What the cache keeps of an object: what its readers look at, nothing more. Dropped before
/// an object is stored, for every kind: `managedFields` (often half of an object) and
/// kubectl's last-applied annotation (a second copy of what a user applied).
pub trait Slim: Resource {
    fn slim(&mut self) {
        slim_meta(self.meta_mut());
    }
}

fn slim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl Slim for DeserializeGuard<Database> {}
impl Slim for DatabaseBackup {}
/// A Secret's metadata without its type fields (`PartialObjectMetadata`, the same for all).
impl Slim for PartialObjectMeta<Secret> {
    fn slim(&mut self) {
        slim_meta(&mut self.metadata);
        self.types = None;
    }
}
impl Slim for Lease {}
impl Slim for StatefulSet {}
impl Slim for Service {}
impl Slim for PersistentVolumeClaim {}
impl Slim for ConfigMap {}
impl Slim for PodDisruptionBudget {}
impl Slim for NetworkPolicy {}
/// A watched object was slimmed as the kind it packs, before it was packed (`Packed::new`).
impl<K: Resource<DynamicType = ()>> Slim for Watched<K> {
    fn slim(&mut self) {}
}

/// How a kind's store holds what its watch decodes: as it is, or packed (`Packed`).
pub trait Cached: Lookup<DynamicType = ()> + Clone + Send + Sync + 'static {
    /// What the watch decodes.
    type Watched: Slim + Clone + DeserializeOwned + fmt::Debug + Send + 'static;
    fn from_watched(watched: Self::Watched) -> Self;
}

/// Kinds stored as they are decoded.
macro_rules! cached_as_decoded {
    ($($kind:ty),*) => {$(
        impl Cached for $kind {
            type Watched = $kind;
            fn from_watched(watched: $kind) -> $kind {
                watched
            }
        }
    )*};
}

cached_as_decoded!(DeserializeGuard<Database>, DatabaseBackup, Lease, Node);

impl<K> Cached for Packed<K>
where
    K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    type Watched = Watched<K>;
    fn from_watched(watched: Watched<K>) -> Self {
        watched.packed
    }
}

/// A Job keeps its metadata and status only: readers ask whether it ran and when (`job_state`,
/// `finished_at`, its owner); dbop creates a Job once and never compares its spec, and the pod
/// template is most of a Job's size (a thousand init Jobs, one backup Job per retained backup).
impl Slim for Job {
    fn slim(&mut self) {
        slim_meta(&mut self.metadata);
        self.spec = None;
    }
}

/// A database pod keeps its metadata (the role label), its node and service account, phase,
/// conditions and IP: the readers ask which instance is where, whether it is ready, and where
/// its manager answers. The rest of the spec (the containers, volumes and affinity the
/// StatefulSet already holds) and the container statuses are dropped; a pass that needs those
/// lists the pods.
impl Slim for Pod {
    fn slim(&mut self) {
        slim_meta(&mut self.metadata);
        self.spec = self.spec.take().map(|spec| PodSpec {
            node_name: spec.node_name,
            // Whether its manager follows the primary Lease (`resources::primary_lease`).
            service_account_name: spec.service_account_name,
            ..PodSpec::default()
        });
        self.status = self.status.take().map(|status| PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            // Where its manager reports its WAL position (`database::positions`).
            pod_ip: status.pod_ip,
            ..PodStatus::default()
        });
    }
}

/// A node keeps its name and whether it is cordoned (`spec.unschedulable`, which `kubectl
/// drain` sets first): its status (images, conditions, addresses) is most of its size.
impl Slim for Node {
    fn slim(&mut self) {
        let name = self.metadata.name.take();
        self.metadata = ObjectMeta {
            name,
            ..ObjectMeta::default()
        };
        self.spec = self.spec.take().map(|spec| NodeSpec {
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        });
        self.status = None;
    }
}

/// Whether the cached node `name` is cordoned (unknown nodes are not).
pub fn cordoned(store: &Store<Node>, name: &str) -> bool {
    store
        .get(&ObjectRef::new(name))
        .and_then(|node| node.spec.as_ref()?.unschedulable)
        .unwrap_or(false)
}

/// Drops what no reader looks at before an object is stored (`Slim`).
pub fn slim<K: Slim>(object: &mut K) {
    object.slim();
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    #[tokio::test]
    async fn a_cached_object_is_found_by_namespace_and_name() {
        let (caches, mut writers) = caches();
        let mut service = Service::default();
        service.metadata.name = Some("orders-rw".into());
        service.metadata.namespace = Some("shop".into());
        writers
            .services
            .apply_watcher_event(&Event::Apply(Packed::new(service)));
        assert!(get(&caches.services, "shop", "orders-rw").is_some());
        assert!(get(&caches.services, "other", "orders-rw").is_none());
        let all = |_: &str| true;
        assert_eq!(
            list_unpacked(&caches.services, "shop", all, |_| true).len(),
            1
        );
        assert!(list_unpacked(&caches.services, "other", all, |_| true).is_empty());
    }

    /// Packed objects are picked by name before they are unpacked, then by what they hold.
    #[test]
    fn packed_objects_are_listed_by_name_then_by_content() {
        let (caches, mut writers) = caches();
        let pods = [
            ("shop", "orders-0", "primary"),
            ("shop", "orders-1", "replica"),
            ("shop", "orders-archive-0", "primary"),
            ("other", "orders-0", "primary"),
        ];
        for (namespace, name, role) in pods {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": namespace, "labels": {"role": role}},
            }))
            .unwrap();
            writers
                .pods
                .apply_watcher_event(&Event::Apply(Packed::new(pod)));
        }
        let of_orders = |name: &str| {
            name.strip_prefix("orders-")
                .is_some_and(|o| o.parse::<u8>().is_ok())
        };
        let primary = |pod: &Pod| pod.metadata.labels.as_ref().unwrap()["role"] == "primary";
        let found = list_unpacked(&caches.pods, "shop", of_orders, primary);
        let names: Vec<_> = found.iter().map(|p| p.metadata.name.as_deref()).collect();
        assert_eq!(names, [Some("orders-0")]);
        assert_eq!(found[0].metadata.namespace.as_deref(), Some("shop"));
    }

    #[test]
    fn a_cached_node_keeps_its_name_and_whether_it_is_cordoned() {
        let (caches, mut writers) = caches();
        let node = |name: &str, unschedulable: Option<bool>| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"zone": "a"}},
                "spec": {"unschedulable": unschedulable, "podCIDR": "10.0.0.0/24"},
                "status": {"images": [{"names": ["postgres:16"]}]},
            }))
            .unwrap()
        };
        let mut drained = node("drained", Some(true));
        slim(&mut drained);
        assert_eq!(drained.status, None);
        assert_eq!(drained.metadata.labels, None);
        assert_eq!(drained.spec.as_ref().unwrap().pod_cidr, None);
        writers.nodes.apply_watcher_event(&Event::Apply(drained));
        writers
            .nodes
            .apply_watcher_event(&Event::Apply(node("serving", None)));
        assert!(cordoned(&caches.nodes, "drained"));
        assert!(!cordoned(&caches.nodes, "serving"));
        assert!(!cordoned(&caches.nodes, "unknown"));
    }

    #[test]
    fn a_cached_job_keeps_its_metadata_and_status_only() {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders-init", "namespace": "shop",
                         "managedFields": [{"manager": "dbop"}],
                         "annotations": {LAST_APPLIED: "{}", "keep": "me"}},
            "spec": {"template": {"spec": {"containers": [{"name": "init", "image": "pg"}]}}},
            "status": {"succeeded": 1},
        }))
        .unwrap();
        slim(&mut job);
        assert_eq!(job.spec, None);
        assert_eq!(job.status.and_then(|s| s.succeeded), Some(1));
        assert_eq!(job.metadata.managed_fields, None);
        let annotations = job.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["keep"]);
    }

    #[test]
    fn other_kinds_keep_their_spec() {
        let (caches, mut writers) = caches();
        let statefulset: Watched<StatefulSet> = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders", "namespace": "shop",
                         "managedFields": [{"manager": "dbop"}]},
            "spec": {"selector": {}, "serviceName": "orders-hl", "template": {}},
        }))
        .unwrap();
        writers
            .statefulsets
            .apply_watcher_event(&Event::Apply(Packed::from_watched(statefulset)));
        let statefulset = get_unpacked(&caches.statefulsets, "shop", "orders").unwrap();
        assert_eq!(statefulset.spec.service_name.as_deref(), Some("orders-hl"));
        assert_eq!(statefulset.metadata.managed_fields, None);
    }

    #[tokio::test]
    async fn synced_once_every_kind_is_listed() {
        let (caches, writers) = caches();
        let mut markers: Vec<_> = (0..KINDS).map(|_| writers.synced_marker()).collect();
        for marker in &mut markers[1..] {
            marker.listed();
            marker.listed(); // a re-list counts once
        }
        let early =
            tokio::time::timeout(std::time::Duration::ZERO, caches.wait_until_synced()).await;
        assert!(early.is_err(), "one kind is not listed yet");
        markers[0].listed();
        caches.wait_until_synced().await;
    }
}
