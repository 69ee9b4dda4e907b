//! Random crash-resume on the real node, with the data checked: while the operator is killed
//! (SIGKILL, seeded random moments, `dbop_e2e::chaos`) a Database with init SQL is provisioned
//! for real, its data is fingerprinted, and an on-demand backup runs with the real agent to
//! S3 in a pod. After the last kill: the fingerprint is unchanged (the init SQL ran once, no
//! data lost), the backup Succeeded with one Job, nothing was created twice.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::chaos::{KillPlan, assert_each_created_once, seed, stream, with_random_kills};
use dbop_e2e::node::{DBOP_IMAGE, REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{testbed, wait_until};
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const READY_WAIT: Duration = Duration::from_secs(240);
const BACKUP_WAIT: Duration = Duration::from_secs(240);
const INIT_SQL: &str = "CREATE TABLE ledger (id bigserial PRIMARY KEY, amount numeric(12,2), memo text);\n\
    INSERT INTO ledger (amount, memo) SELECT g * 1.5, 'entry ' || g FROM generate_series(1, 5000) g;\n";

#[tokio::test]
async fn random_kills_on_the_real_node_lose_no_data() {
    let seed = seed();
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("crash-rn").await;
    let endpoint = bed.s3_server(&ns, "backups", None).await;
    let env = [
        (
            "DBOP_POSTGRES_IMAGE_TEMPLATE",
            "dbop.local/postgres:{version}",
        ),
        ("DBOP_AGENT_IMAGE", DBOP_IMAGE),
    ];
    let plan = KillPlan {
        kills: 15,
        gap: Duration::from_secs(1)..Duration::from_secs(5),
    };
    let before = Mutex::new(String::new());
    let (bed_ref, ns_ref, before_ref) = (&bed, ns.as_str(), &before);
    let mut rng = stream(seed, "real-node");
    let survived = with_random_kills(&bed, &ns, &env, &mut rng, &plan, |spent| async move {
        let (bed, ns) = (bed_ref, ns_ref);
        let spec = json!({
            "version": "15.20",
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "init": {"sql": INIT_SQL},
            "backup": {"schedule": "0 3 * * *", "s3": {
                "endpoint": endpoint, "bucket": "backups", "forcePathStyle": true,
                "credentials": {"secretName": "s3-creds"}}},
        });
        bed.apply_database(ns, json!({"metadata": {"name": "ledger"}, "spec": spec}))
            .await;
        bed.wait_for_phase(ns, "ledger", Phase::Ready, READY_WAIT)
            .await;
        bed.psql_client(ns, "client", "ledger", "ledger-credentials")
            .await;
        *before_ref.lock().unwrap() = bed.fingerprint(ns, "client", "app").await;
        let api: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
        let b: DatabaseBackup = serde_json::from_value(json!({
            "metadata": {"name": "under-kills"}, "spec": {"database": "ledger"}
        }))
        .unwrap();
        api.create(&PostParams::default(), &b).await.unwrap();
        wait_until("the backup finished", BACKUP_WAIT, || async {
            api.get("under-kills")
                .await
                .ok()?
                .status?
                .phase?
                .is_finished()
                .then_some(())
        })
        .await;
        // Kills left: they land on a Ready Database, which must not be touched either.
        wait_until("the last kill", BACKUP_WAIT, || async {
            spent.load(Ordering::SeqCst).then_some(())
        })
        .await;
    })
    .await;

    let before = before.into_inner().unwrap();
    assert!(
        before.contains("ledger:5000:"),
        "the init SQL ran once: {before}"
    );
    bed.wait_for_phase(&ns, "ledger", Phase::Ready, READY_WAIT)
        .await;
    let after = bed.fingerprint(&ns, "client", "app").await;
    assert_eq!(after, before, "the data after the kills");
    let backup = Api::<DatabaseBackup>::namespaced(bed.client.clone(), &ns)
        .get("under-kills")
        .await
        .unwrap();
    let status = backup.status.unwrap();
    assert_eq!(status.phase, Some(BackupPhase::Succeeded), "{status:?}");
    assert!(status.size_bytes.unwrap_or(0) > 0, "{status:?}");
    let jobs = Api::<Job>::namespaced(bed.client.clone(), &ns)
        .list(&ListParams::default().labels("dbop.dev/backup=under-kills"))
        .await
        .unwrap();
    assert_eq!(jobs.items.len(), 1, "one Job for the backup");
    assert_each_created_once(&bed, &ns);
    assert_eq!(survived.kills, plan.kills);
    println!(
        "crash: real node (seed {seed}, namespace {ns}): {} kills survived, fingerprint unchanged: {after}",
        survived.kills
    );
}
