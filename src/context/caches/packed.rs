//! A cached object kept packed: of its metadata only what the store keys on and the watch
//! resumes from (name, namespace, resource version) as it is; the rest of the metadata
//! (labels, annotations, owners — what a trigger reads) and everything else (spec, status,
//! data) as two deflated compact JSON bodies, unpacked only when a trigger or a reconcile reads
//! them.
//!
//! Why: a decoded Kubernetes object is mostly empty `Option`s, `String`s and maps. A
//! StatefulSet's pod template (three probes' command lines, the init container, the volumes)
//! took ~15 KiB of heap per Database, half of the stores at 1,000 Databases; and once the
//! bodies were packed, the metadata — a map of owned strings for the labels and another for the
//! annotations, a list of owner references — was most of what was left (docs/benchmarks.md,
//! "Where the steady memory goes"). The drift check, the template kept from another operator,
//! the release's rollback all still see the whole object: nothing a reader sees changes, only
//! when it is decoded (once per pass, for the one Database the pass is about).
//!
//! A packed object is decoded straight from the watch (`Deserialize`), slimmed (`Slim`) and
//! packed, so the whole object lives only while it is packed.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::PartialObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tracing::error;

use super::Slim;

/// An object of kind `K` with all but its identity packed.
pub struct Packed<K> {
    /// Name, namespace and resource version; nothing else (`Resource::meta` answers with this:
    /// the whole metadata is `metadata()`). Not the uid: the store would copy it into its key.
    identity: ObjectMeta,
    /// The rest of the metadata, as compact JSON, deflated.
    metadata: Box<[u8]>,
    /// `K` with empty metadata, as compact JSON, deflated.
    body: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned> Packed<K> {
    /// Slims `object` (`Slim`) and packs it.
    pub fn new(mut object: K) -> Self {
        object.slim();
        let mut metadata = std::mem::take(object.meta_mut());
        let identity = ObjectMeta {
            name: metadata.name.take(),
            namespace: metadata.namespace.take(),
            resource_version: metadata.resource_version.take(),
            ..ObjectMeta::default()
        };
        Self {
            identity,
            metadata: pack(&metadata).into_boxed_slice(),
            body: pack(&object).into_boxed_slice(),
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Packed<K> {
    /// The whole object again (None, logged, if a packed body cannot be read: both were
    /// written by `new` from the same types, so only a bug gets there).
    pub fn unpack(&self) -> Option<K> {
        let metadata = self.metadata()?;
        let mut object: K = self.read(&self.body, "body")?;
        *object.meta_mut() = metadata;
        Some(object)
    }

    /// The whole metadata (None, logged, as for `unpack`).
    pub fn metadata(&self) -> Option<ObjectMeta> {
        let rest: ObjectMeta = self.read(&self.metadata, "metadata")?;
        let identity = self.identity.clone();
        Some(ObjectMeta {
            name: identity.name,
            namespace: identity.namespace,
            resource_version: identity.resource_version,
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

    fn read<T: DeserializeOwned>(&self, packed: &[u8], part: &str) -> Option<T> {
        unpack(packed)
            .inspect_err(|problem| {
                let (kind, name) = (K::kind(&()), &self.identity.name);
                error!(%kind, ?name, part, problem, "a cached object cannot be unpacked");
            })
            .ok()
    }
}

/// Deflated compact JSON of `object` (fast compression: every watch event of the kind is
/// packed).
fn pack<T: Serialize>(object: &T) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    // Writing into a Vec fails only if serialising fails, which no Kubernetes type does.
    let _ = serde_json::to_writer(&mut encoder, object);
    encoder.finish().unwrap_or_default()
}

fn unpack<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let mut json = Vec::new();
    DeflateDecoder::new(body)
        .read_to_end(&mut json)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// Decodes a `K` and packs it (the watch decodes `Packed<K>` directly).
impl<'de, K> Deserialize<'de> for Packed<K>
where
    K: Resource<DynamicType = ()> + Slim + Serialize + DeserializeOwned,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(Packed::new)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Packed<K> {
    type DynamicType = ();
    type Scope = K::Scope;

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

    /// A packed `PartialObjectMeta` is watched as metadata only, as the kind it packs.
    fn metadata_api() -> bool {
        K::metadata_api()
    }

    /// The identity only (name, namespace, resource version): what the store and the watch
    /// read.
    fn meta(&self) -> &ObjectMeta {
        &self.identity
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.identity
    }
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            identity: self.identity.clone(),
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("identity", &self.identity)
            .field("packed_bytes", &(self.metadata.len() + self.body.len()))
            .finish()
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
        let packed: Packed<StatefulSet> =
            serde_json::from_value(serde_json::to_value(&observed).unwrap()).unwrap();
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

    /// The store and the watch see the identity; the labels, annotations and owners are packed.
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
        let packed: Packed<StatefulSet> = serde_json::from_value(observed).unwrap();
        let identity = ObjectMeta {
            name: sts.metadata.name.clone(),
            namespace: Some("shop".into()),
            resource_version: Some("42".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(packed.meta(), &identity);
        let whole = packed.partial().unwrap().metadata;
        assert_eq!(whole.uid.as_deref(), Some("5f0c"));
        assert_eq!(whole.labels, sts.metadata.labels);
        assert!(whole.labels.is_some_and(|l| !l.is_empty()));
        assert_eq!(whole.owner_references, sts.metadata.owner_references);
        assert_eq!(whole.managed_fields, None, "slimmed before it was packed");
    }

    /// A Secret packed as metadata is still watched as metadata only.
    #[test]
    fn a_packed_metadata_kind_is_watched_as_metadata() {
        use k8s_openapi::api::core::v1::Secret;
        assert!(Packed::<PartialObjectMeta<Secret>>::metadata_api());
        assert!(!Packed::<Secret>::metadata_api());
    }

    #[test]
    fn a_packed_kind_is_its_kind_to_the_api() {
        assert_eq!(Packed::<Service>::kind(&()), "Service");
        assert_eq!(Packed::<Service>::plural(&()), "services");
        assert_eq!(Packed::<StatefulSet>::api_version(&()), "apps/v1");
        assert_eq!(Packed::<StatefulSet>::url_path(&(), Some("shop")), {
            StatefulSet::url_path(&(), Some("shop"))
        });
    }
}
