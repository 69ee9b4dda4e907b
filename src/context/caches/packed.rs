//! A cached object kept packed: its metadata as it is (what the store's lookups, the triggers
//! and the release's fleet read), and everything else (spec, status, data) as deflated compact
//! JSON, unpacked into the whole object only when a reconcile reads it.
//!
//! Why: a decoded Kubernetes object is mostly empty `Option`s, `String`s and maps. A
//! StatefulSet's pod template (three probes' command lines, the init container, the volumes)
//! took ~15 KiB of heap per Database, half of the stores at 1,000 Databases; packed it is a few
//! hundred bytes. The drift check, the template kept from another operator, the release's
//! rollback all still see the whole object: nothing a reader sees changes, only when it is
//! decoded (once per pass, for the one Database the pass is about).
//!
//! A packed object is decoded straight from the watch (`Deserialize`), so the whole object lives
//! only while it is packed.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use tracing::error;

/// An object of kind `K` with all but its metadata packed.
pub struct Packed<K> {
    metadata: ObjectMeta,
    /// `K` with empty metadata, as compact JSON, deflated.
    body: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Packed<K> {
    /// Packs `object`.
    pub fn new(mut object: K) -> Self {
        let metadata = std::mem::take(object.meta_mut());
        Self {
            metadata,
            body: pack(&object).into_boxed_slice(),
            kind: PhantomData,
        }
    }

    /// The whole object again (None, logged, if the packed body cannot be read: it was written
    /// by `new` from the same type, so only a bug gets there).
    pub fn unpack(&self) -> Option<K> {
        match unpack::<K>(&self.body) {
            Ok(mut object) => {
                *object.meta_mut() = self.metadata.clone();
                Some(object)
            }
            Err(problem) => {
                let (kind, name) = (K::kind(&()), &self.metadata.name);
                error!(%kind, ?name, problem, "a cached object cannot be unpacked");
                None
            }
        }
    }
}

/// Deflated compact JSON of `object` (fast compression: every watch event of the kind is
/// packed).
fn pack<K: Serialize>(object: &K) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    // Writing into a Vec fails only if serialising fails, which no Kubernetes type does.
    let _ = serde_json::to_writer(&mut encoder, object);
    encoder.finish().unwrap_or_default()
}

fn unpack<K: DeserializeOwned>(body: &[u8]) -> Result<K, String> {
    let mut json = Vec::new();
    DeflateDecoder::new(body)
        .read_to_end(&mut json)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// Decodes a `K` and packs it (the watch decodes `Packed<K>` directly).
impl<'de, K> Deserialize<'de> for Packed<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
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

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K> Clone for Packed<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            body: self.body.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Packed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Packed")
            .field("metadata", &self.metadata)
            .field("packed_bytes", &self.body.len())
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
        assert_eq!(packed.meta(), &observed.metadata);
        assert_eq!(packed.unpack(), Some(observed.clone()));
        let json = serde_json::to_vec(&observed).unwrap().len();
        assert!(
            packed.body.len() * 3 < json,
            "{} packed bytes of {json}",
            packed.body.len()
        );
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
