//! Backups on kwok: the S3 credentials Secret a backup spec names, and the outcome a held
//! backup pod ends with (`e2e/testbed/kwok-stages.yaml` completes it with the given
//! termination message, as the real agent would write it).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use dbop::api::{BackupPhase, DatabaseBackup};

use crate::{TestBed, WAIT, wait_until, wait_until_or_none};

/// Creates the Secret `s3-creds` with test S3 keys (nothing reads them on kwok).
pub async fn s3_secret(bed: &TestBed, ns: &str) {
    s3_secret_with_key(bed, ns, "e2e-secret").await;
}

/// Creates the Secret `s3-creds` whose secret access key is `secret_key`.
pub async fn s3_secret_with_key(bed: &TestBed, ns: &str, secret_key: &str) {
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
                ByteString(secret_key.as_bytes().to_vec()),
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

/// The running pod of a DatabaseBackup (held by the test bed).
pub async fn running_backup_pod(bed: &TestBed, ns: &str, backup: &str) -> Pod {
    running_pod(
        bed,
        ns,
        &format!("dbop.dev/backup={backup}"),
        "the backup pod running",
    )
    .await
}

/// The first running pod matching the label `selector` (a held Job pod).
pub async fn running_pod(bed: &TestBed, ns: &str, selector: &str, what: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    wait_until(what, WAIT, || async {
        pods.list(&ListParams::default().labels(selector))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await
}

/// Fails every pod the backup's Job starts (it retries once, backoffLimit 1) with `result` as
/// the termination message, until the DatabaseBackup is Failed.
pub async fn fail_every_pod_until_failed(bed: &TestBed, ns: &str, backup: &str, result: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let selector = format!("dbop.dev/backup={backup}");
    wait_until(
        "every backup pod failed and the backup Failed",
        WAIT,
        || async {
            for pod in pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
            {
                let running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let decided = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("testbed.dbop.dev/outcome"));
                if running && !decided {
                    finish_pod(bed, ns, &pod, "Failed", result).await;
                }
            }
            let b = backups.get(backup).await.ok()?;
            (b.status.as_ref()?.phase == Some(BackupPhase::Failed)).then_some(())
        },
    )
    .await;
}

/// The DatabaseBackup of `ns` named `name` (any, when `None`) once it finished; panics with the
/// namespace's backups, Jobs and pods if none did within `timeout`, or with its message if it
/// failed.
pub async fn succeeded_backup(
    bed: &TestBed,
    ns: &str,
    name: Option<&str>,
    timeout: std::time::Duration,
) -> DatabaseBackup {
    let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
    let backup = wait_until_or_none(timeout, || async {
        let list = api.list(&ListParams::default()).await.ok()?.items;
        list.into_iter().find(|b| {
            name.is_none_or(|n| b.metadata.name.as_deref() == Some(n))
                && b.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(BackupPhase::is_finished)
        })
    })
    .await;
    let Some(backup) = backup else {
        let (_, out, _) =
            bed.kubectl(&["-n", ns, "get", "databasebackups,jobs,pods", "-o", "wide"]);
        panic!("no backup {name:?} finished in {ns} within {timeout:?}:\n{out}");
    };
    let status = backup.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Succeeded),
        "{:?}",
        status.message
    );
    backup
}
