//! A cached object kept packed: only its name and namespace as they are (what the store keys
//! on); the rest of its metadata (labels, annotations, owners — what a trigger reads) and
//! everything else (spec, status, data) as two deflated compact JSON bodies, unpacked only when
//! a trigger or a reconcile reads them.
//!
//! Why: a decoded Kubernetes object is mostly empty `Option`s, `String`s and maps. A
//! StatefulSet's pod template (three probes' command lines, the init container, the volumes)
//! took ~15 KiB of heap per Database, half of the stores at 1,000 Databases; once the bodies
//! were packed, the metadata — a 360-byte `ObjectMeta` per object, a map of owned strings for
//! the labels and another for the annotations, a list of owner references — was most of what
//! was left (docs/benchmarks.md, "Where the steady memory goes"). The drift check, the template
//! kept from another operator, the release's rollback all still see the whole object: nothing
//! a reader sees changes, only when it is decoded (once per pass, for the one Database the pass
//! is about).
//!
//! A watch decodes a `Watched` object: slimmed (`Slim`) and packed at once, with beside it the
//! resource version the watch resumes from; the store keeps its `Packed` part. The whole object
//! lives only while it is packed.
//!
//! Each part is deflated against a preset dictionary of its kind: the same part of the first
//! object of the kind packed in this process. The objects of one kind that dbop makes differ
//! mostly in their names, and small bodies deflate poorly alone: against another of its kind a
//! StatefulSet's body packs to ~260 bytes instead of ~1,800, a Service's metadata to ~100
//! instead of ~270 (the bench's objects; docs/benchmarks.md, "5,000 Databases").

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{PoisonError, RwLock};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Lookup;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tracing::error;

use super::Slim;

/// An object of kind `K` as the store keeps it: its name and namespace, the rest packed.
pub struct Packed<K> {
    name: Box<str>,
    namespace: Option<Box<str>>,
    /// The rest of the metadata (uid and resource version too), as compact JSON, deflated.
    metadata: Box<[u8]>,
    /// `K` with empty metadata, as compact JSON, deflated.
    body: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned + 'static> Packed<K> {
    /// Slims `object` (`Slim`) and packs it.
    pub fn new(mut object: K) -> Self {
        object.slim();
        let mut metadata = std::mem::take(object.meta_mut());
        Self {
            name: metadata.name.take().unwrap_or_default().into(),
            namespace: metadata.namespace.take().map(Into::into),
            metadata: pack::<K, _>(Part::Metadata, &metadata),
            body: pack::<K, _>(Part::Body, &object),
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + 'static> Packed<K> {
    /// The whole object again (None, logged, if a packed body cannot be read: both were
    /// written by `new` from the same types, so only a bug gets there).
    pub fn unpack(&self) -> Option<K> {
        let metadata = self.metadata()?;
        let mut object: K = self.read(Part::Body)?;
        *object.meta_mut() = metadata;
        Some(object)
    }

    /// The whole metadata (None, logged, as for `unpack`).
    pub fn metadata(&self) -> Option<ObjectMeta> {
        let rest: ObjectMeta = self.read(Part::Metadata)?;
        Some(ObjectMeta {
            name: Some(self.name.to_string()),
            namespace: self.namespace.as_deref().map(String::from),
            ..rest
        })
    }

    /// The metadata as an object of its own (what the release's fleet reads).
    pub fn partial(&self) -> Option<PartialObjectMeta<K>> {
        Some(PartialObjectMeta {
            types: None,
            metadata: self.metadata()?,
            _phantom: PhantomData,
        })
    }

    fn read<T: DeserializeOwned>(&self, part: Part) -> Option<T> {
        let packed = match part {
            Part::Metadata => &self.metadata,
            Part::Body => &self.body,
        };
        unpack::<K, T>(part, packed)
            .inspect_err(|problem| {
                let (kind, name) = (K::kind(&()), &self.name);
                error!(%kind, %name, ?part, problem, "a cached object cannot be unpacked");
            })
            .ok()
    }
}

impl<K> Packed<K> {
    /// Its name (known without unpacking).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace (known without unpacking).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

/// Which of an object's two packed parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Metadata,
    Body,
}

/// The largest dictionary deflate uses (its window).
const WINDOW: usize = 32 * 1024;

/// Each kind's dictionary per part, set once by the first object of the kind packed and never
/// changed (what was packed against it unpacks against the same bytes). A few kinds, two parts
/// each: kept for the life of the process.
static DICTIONARIES: RwLock<BTreeMap<(TypeId, Part), &'static [u8]>> = RwLock::new(BTreeMap::new());

/// The dictionary of `K`'s `part`, `first` (at most a window of it) if it has none yet.
fn dictionary<K: 'static>(part: Part, first: &[u8]) -> &'static [u8] {
    let key = (TypeId::of::<K>(), part);
    if let Some(known) = known_dictionary::<K>(part) {
        return known;
    }
    let mut all = DICTIONARIES.write().unwrap_or_else(PoisonError::into_inner);
    all.entry(key)
        .or_insert_with(|| Box::leak(first[..first.len().min(WINDOW)].into()))
}

fn known_dictionary<K: 'static>(part: Part) -> Option<&'static [u8]> {
    let all = DICTIONARIES.read().unwrap_or_else(PoisonError::into_inner);
    all.get(&(TypeId::of::<K>(), part)).copied()
}

/// `object` as compact JSON deflated against its kind's dictionary (fast compression: every
/// watch event of the kind is packed).
fn pack<K: 'static, T: Serialize>(part: Part, object: &T) -> Box<[u8]> {
    // Serialising a Kubernetes type into a Vec does not fail.
    let json = serde_json::to_vec(object).unwrap_or_default();
    deflate(&json, dictionary::<K>(part, &json)).into_boxed_slice()
}

fn unpack<K: 'static, T: DeserializeOwned>(part: Part, packed: &[u8]) -> Result<T, String> {
    let dictionary = known_dictionary::<K>(part).ok_or("no dictionary for its kind")?;
    let json = inflate(packed, dictionary)?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// Raw deflate of `data` with a preset dictionary (empty if it cannot deflate or stops making
/// progress, which a stream given all its input and room to write does not; unpacking it then
/// fails, logged).
fn deflate(data: &[u8], dictionary: &[u8]) -> Vec<u8> {
    let mut stream = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(data.len() / 4 + 64);
    if stream.set_dictionary(dictionary).is_err() {
        return Vec::new();
    }
    loop {
        let (read, written) = (stream.total_in(), stream.total_out());
        let at = read as usize;
        match stream.compress_vec(&data[at..], &mut out, FlushCompress::Finish) {
            Ok(Status::StreamEnd) => return out,
            Ok(_) if out.len() == out.capacity() => out.reserve(out.capacity()),
            Ok(_) if (stream.total_in(), stream.total_out()) != (read, written) => {}
            Ok(_) | Err(_) => return Vec::new(),
        }
    }
}

/// The bytes `deflate` packed against the same dictionary.
fn inflate(packed: &[u8], dictionary: &[u8]) -> Result<Vec<u8>, String> {
    let mut stream = Decompress::new(false);
    stream
        .set_dictionary(dictionary)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(packed.len() * 8 + 64);
    loop {
        let (read, written) = (stream.total_in(), stream.total_out());
        let at = read as usize;
        let status = stream
            .decompress_vec(&packed[at..], &mut out, FlushDecompress::Finish)
            .map_err(|e| e.to_string())?;
        if status == Status::StreamEnd {
            return Ok(out);
        }
        if out.len() == out.capacity() {
            out.reserve(out.capacity());
        } else if (stream.total_in(), stream.total_out()) == (read, written) {
            return Err("the packed bytes end before their stream does".into());
        }
    }
}

/// The type information of a packed object: that of the kind `K` it packs (for `Lookup` and
/// `Resource` alike).
macro_rules! of_kind_k {
    () => {
        fn kind(dt: &()) -> Cow<'_, str> {
            K::kind(dt)
        }

        fn group(dt: &()) -> Cow<'_, str> {
            K::group(dt)
        }

        fn version(dt: &()) -> Cow<'_, str> {
            K::version(dt)
        }

        fn api_version(dt: &()) -> Cow<'_, str> {
            K::api_version(dt)
        }

        fn plural(dt: &()) -> Cow<'_, str> {
            K::plural(dt)
        }
    };
}

/// What the store reads of a packed object: its kind (that of `K`), name and namespace. No
/// resource version nor uid: the store would copy them into its key.
impl<K: Resource<DynamicType = ()>> Lookup for Packed<K> {
    type DynamicType = ();

    of_kind_k!();

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.namespace.as_deref().map(Cow::Borrowed)
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("packed_bytes", &(self.metadata.len() + self.body.len()))
            .finish()
    }
}

/// An object of kind `K` as its watch decodes it: packed at once, and its identity (name,
/// namespace, resource version: what the watch resumes from) beside. Lives until the store
/// takes its `packed` part.
pub struct Watched<K> {
    identity: ObjectMeta,
    pub packed: Packed<K>,
}

impl<K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned + 'static> Watched<K> {
    pub fn new(object: K) -> Self {
        let meta = object.meta();
        let identity = ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            resource_version: meta.resource_version.clone(),
            ..ObjectMeta::default()
        };
        Self {
            identity,
            packed: Packed::new(object),
        }
    }
}

/// Decodes a `K` and packs it.
impl<'de, K> Deserialize<'de> for Watched<K>
where
    K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned + 'static,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(Watched::new)
    }
}

/// To the API, a watched object is of its kind `K`.
impl<K: Resource<DynamicType = ()>> Resource for Watched<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    of_kind_k!();

    /// A packed `PartialObjectMeta` is watched as metadata only, as the kind it packs.
    fn metadata_api() -> bool {
        K::metadata_api()
    }

    /// The identity only (name, namespace, resource version): what the watch reads.
    fn meta(&self) -> &ObjectMeta {
        &self.identity
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.identity
    }
}

impl<K> Clone for Watched<K> {
    fn clone(&self) -> Self {
        Self {
            identity: self.identity.clone(),
            packed: self.packed.clone(),
        }
    }
}

impl<K> fmt::Debug for Watched<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.packed.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use crate::settings::Settings;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Service;

    /// What dbop builds, with what the API server adds (defaults, status), comes back whole.
    #[test]
    fn an_object_unpacks_to_what_was_packed() {
        let mut sts = crate::resources::statefulset::statefulset(
            &testing::minimal(),
            &Settings::default(),
            None,
        );
        sts.metadata.namespace = Some("shop".into());
        sts.metadata.resource_version = Some("42".into());
        let mut observed = serde_json::to_value(&sts).unwrap();
        observed["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            "IfNotPresent".into();
        observed["status"] = serde_json::json!({"replicas": 1, "readyReplicas": 1,
            "currentRevision": "orders-5d4", "updateRevision": "orders-5d4"});
        let observed: StatefulSet = serde_json::from_value(observed).unwrap();
        let watched: Watched<StatefulSet> =
            serde_json::from_value(serde_json::to_value(&observed).unwrap()).unwrap();
        let packed = watched.packed;
        assert_eq!(packed.metadata().as_ref(), Some(&observed.metadata));
        assert_eq!(packed.unpack(), Some(observed.clone()));
        let json = serde_json::to_vec(&observed).unwrap().len();
        let bytes = packed.metadata.len() + packed.body.len();
        // The metadata is deflated on its own (a trigger reads it alone): it packs less well.
        assert!(
            packed.body.len() * 3 < json,
            "{bytes} packed bytes of {json}"
        );
        assert!(bytes * 2 < json, "{bytes} packed bytes of {json}");
    }

    /// Another object of a kind packs against the kind's dictionary: a few hundred bytes where
    /// deflating it alone takes thousands.
    #[test]
    fn an_object_packs_against_its_kind() {
        let statefulset = |name: &str| {
            let mut db = testing::minimal();
            db.metadata.name = Some(name.into());
            let mut sts =
                crate::resources::statefulset::statefulset(&db, &Settings::default(), None);
            sts.metadata.namespace = Some("shop".into());
            sts
        };
        let first = Packed::new(statefulset("orders"));
        let other = statefulset("billing-eu");
        let alone = deflate(&serde_json::to_vec(&other.spec).unwrap(), &[]).len();
        let packed = Packed::new(other.clone());
        assert_eq!(packed.unpack(), Some(other), "{first:?}");
        assert!(
            packed.body.len() * 4 < alone,
            "{} bytes against its kind, {alone} alone",
            packed.body.len()
        );
    }

    /// Bytes that end early or were packed against other bytes do not unpack, and say so.
    #[test]
    fn a_damaged_pack_is_refused() {
        let json = br#"{"spec":{"replicas":1,"serviceName":"orders"}}"#;
        let packed = deflate(json, b"{\"spec\":{\"replicas\":3}}");
        assert_eq!(
            inflate(&packed, b"{\"spec\":{\"replicas\":3}}").unwrap(),
            json
        );
        assert!(inflate(&packed[..packed.len() / 2], b"{\"spec\":{\"replicas\":3}}").is_err());
        assert_ne!(
            inflate(&packed, b"something else entirely").ok().as_deref(),
            Some(&json[..])
        );
    }

    /// The watch sees the identity, the store the name and namespace; the labels, annotations,
    /// owners and uid are packed.
    #[test]
    fn only_the_identity_is_kept_unpacked() {
        let sts = crate::resources::statefulset::statefulset(
            &testing::minimal(),
            &Settings::default(),
            None,
        );
        let mut observed = serde_json::to_value(&sts).unwrap();
        observed["metadata"]["namespace"] = "shop".into();
        observed["metadata"]["uid"] = "5f0c".into();
        observed["metadata"]["resourceVersion"] = "42".into();
        observed["metadata"]["managedFields"] = serde_json::json!([{"manager": "dbop"}]);
        let watched: Watched<StatefulSet> = serde_json::from_value(observed).unwrap();
        let identity = ObjectMeta {
            name: sts.metadata.name.clone(),
            namespace: Some("shop".into()),
            resource_version: Some("42".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(watched.meta(), &identity);
        let packed = watched.packed;
        assert_eq!(
            Lookup::name(&packed).as_deref(),
            sts.metadata.name.as_deref()
        );
        assert_eq!(Lookup::namespace(&packed).as_deref(), Some("shop"));
        assert_eq!(
            packed.resource_version(),
            None,
            "not copied into the store's key"
        );
        assert_eq!(packed.uid(), None, "not copied into the store's key");
        let whole = packed.partial().unwrap().metadata;
        assert_eq!(whole.uid.as_deref(), Some("5f0c"));
        assert_eq!(whole.resource_version.as_deref(), Some("42"));
        assert_eq!(whole.labels, sts.metadata.labels);
        assert!(whole.labels.is_some_and(|l| !l.is_empty()));
        assert_eq!(whole.owner_references, sts.metadata.owner_references);
        assert_eq!(whole.managed_fields, None, "slimmed before it was packed");
    }

    /// A Secret packed as metadata is still watched as metadata only.
    #[test]
    fn a_packed_metadata_kind_is_watched_as_metadata() {
        use k8s_openapi::api::core::v1::Secret;
        assert!(Watched::<PartialObjectMeta<Secret>>::metadata_api());
        assert!(!Watched::<Secret>::metadata_api());
    }

    #[test]
    fn a_packed_kind_is_its_kind_to_the_api() {
        assert_eq!(<Watched<Service> as Resource>::kind(&()), "Service");
        assert_eq!(<Watched<Service> as Resource>::plural(&()), "services");
        assert_eq!(
            <Watched<StatefulSet> as Resource>::api_version(&()),
            "apps/v1"
        );
        assert_eq!(Watched::<StatefulSet>::url_path(&(), Some("shop")), {
            StatefulSet::url_path(&(), Some("shop"))
        });
        assert_eq!(<Packed<Service> as Lookup>::kind(&()), "Service");
        assert_eq!(<Packed<Service> as Lookup>::plural(&()), "services");
    }
}
