//! Backups on kwok: the S3 credentials Secret a backup spec names, and the outcome a held
//! backup pod ends with (`e2e/testbed/kwok-stages.yaml` completes it with the given
//! termination message, as the real agent would write it).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::TestBed;

/// Creates the Secret `s3-creds` with test S3 keys (nothing reads them on kwok).
pub async fn s3_secret(bed: &TestBed, ns: &str) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("s3-creds".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                "AWS_ACCESS_KEY_ID".into(),
                ByteString(b"e2e-access".to_vec()),
            ),
            (
                "AWS_SECRET_ACCESS_KEY".into(),
                ByteString(b"e2e-secret".to_vec()),
            ),
        ])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(bed.client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("S3 Secret");
}

/// Ends a held (label `testbed.dbop.dev/hold`) running pod with `outcome` (`Succeeded` or
/// `Failed`) and `message` as its termination message.
pub async fn finish_pod(bed: &TestBed, ns: &str, pod: &Pod, outcome: &str, message: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let patch = json!({"metadata": {"annotations": {
        "testbed.dbop.dev/outcome": outcome,
        "testbed.dbop.dev/termination-message": message,
    }}});
    pods.patch(
        pod.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("annotate the pod");
}
