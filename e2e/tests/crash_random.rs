//! Random crash-resume on kwok: the real `dbop` binary is killed with SIGKILL at seeded random
//! moments (`dbop_e2e::chaos`) and restarted at once, during provisioning, on-demand backups,
//! scheduled backups and restores; ≥ 50 kills in all (upgrades: `e2e/tests/upgrades.rs` kills
//! at each of their stages). After the last kill each scenario checks that
//! everything converged: the phase it should reach, no object created twice (from the audit
//! log: no duplicate Job or DatabaseBackup, no regenerated Secret), exactly the Jobs expected,
//! and a status that says what happened.
//!
//! The seed is printed; `DBOP_CRASH_SEED=<n>` replays a run's kill delays.
//!
//! ## Adding a scenario
//!
//! A scenario is one async function `fn(&TestBed, ns, &mut StdRng)`: call
//! [`dbop_e2e::chaos::with_random_kills`] with a [`KillPlan`] and a closure doing the work
//! (repeat its unit while `spent` is false, so every kill lands on real work), then check the
//! outcome with the operator left running, and end with [`finish`] (audit-log duplicates, the
//! kill count). Register it with a `#[tokio::test]` that calls [`run`] with its name; add its
//! kills to `docs/reliability.md`. A restore or an upgrade scenario looks like `on_demand`:
//! create the DatabaseRestore / bump `spec.version` inside the closure, drive the held pods
//! with `backup_jobs::finish_pod`, wait for the terminal phase, check one Job per operation.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use dbop::api::{BackupPhase, DatabaseBackup, Phase};
use dbop_e2e::backup_jobs::{finish_pod, running_pod, s3_secret};
use dbop_e2e::chaos::{
    KillPlan, Survived, assert_each_created_once, seed, stream, with_random_kills,
};
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

/// Kills during work that takes a few seconds per unit: gaps of 0.3–2 s.
fn quick_kills(kills: usize) -> KillPlan {
    KillPlan {
        kills,
        gap: Duration::from_millis(300)..Duration::from_millis(2000),
    }
}

/// Runs the scenario `name` with its own random stream and prints what it survived.
async fn run<F, Fut>(name: &str, scenario: F)
where
    F: FnOnce(TestBed, String, StdRng) -> Fut,
    Fut: std::future::Future<Output = Survived>,
{
    let seed = seed();
    let bed = testbed().await;
    let ns = bed.namespace(&format!("crash-{name}")).await;
    let started = std::time::Instant::now();
    let survived = scenario(bed, ns.clone(), stream(seed, name)).await;
    println!(
        "crash: scenario {name} (seed {seed}, namespace {ns}): {} kills survived in {:.0?}",
        survived.kills,
        started.elapsed()
    );
}

/// The checks every scenario ends with: nothing created twice, and the kills really happened.
fn finish(bed: &TestBed, ns: &str, survived: &Survived, plan: &KillPlan) {
    assert_each_created_once(bed, ns);
    assert_eq!(survived.kills, plan.kills, "every planned kill happened");
}

fn hold_pods() -> serde_json::Value {
    json!({"labels": {"testbed.dbop.dev/hold": "true"}})
}

fn with_backups(schedule: Option<&str>) -> serde_json::Value {
    let mut backup = json!({
        "s3": {
            "endpoint": "http://minio.storage.svc:9000",
            "bucket": "backups",
            "forcePathStyle": true,
            "credentials": {"secretName": "s3-creds"}
        }
    });
    // A schedule is required; on-demand scenarios use one that does not fire during the test.
    backup["schedule"] = schedule.unwrap_or("0 0 1 1 *").into();
    json!({"backup": backup, "podMetadata": hold_pods()})
}

/// The result the agent would write for a good dump of backup `name`.
fn success_result(ns: &str, name: &str) -> String {
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    json!({
        "outcome": "Succeeded", "operation": "dump", "backupId": format!("id-{name}"),
        "database": "postgres", "bucket": "backups",
        "key": format!("{ns}/{name}/dump.pgc.zst"),
        "sizeBytes": 4242, "sha256": "ab".repeat(32), "engineVersion": "16.4",
        "startedAt": now, "completedAt": now, "message": format!("dumped {name}")
    })
    .to_string()
}

/// Ends every running, undecided backup pod with a good result for its backup.
async fn finish_running_backup_pods(bed: &TestBed, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let Ok(list) = pods
        .list(&ListParams::default().labels("dbop.dev/backup"))
        .await
    else {
        return;
    };
    for pod in list.items {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let decided = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("testbed.dbop.dev/outcome"));
        let backup = pod.metadata.labels.as_ref().unwrap()["dbop.dev/backup"].clone();
        if running && !decided {
            finish_pod(bed, ns, &pod, "Succeeded", &success_result(ns, &backup)).await;
        }
    }
}

async fn all_backups(bed: &TestBed, ns: &str) -> Vec<DatabaseBackup> {
    let mut list = Api::<DatabaseBackup>::namespaced(bed.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list DatabaseBackups")
        .items;
    list.sort_by_key(|b| b.metadata.name.clone());
    list
}

/// Each backup Succeeded with the status its agent reported, and has exactly one Job.
async fn assert_backups_right(bed: &TestBed, ns: &str, backups: &[DatabaseBackup]) {
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), ns);
    for b in backups {
        let name = b.metadata.name.clone().unwrap();
        let status = b.status.clone().unwrap_or_default();
        assert_eq!(
            status.phase,
            Some(BackupPhase::Succeeded),
            "{name}: {status:?}"
        );
        assert_eq!(
            status.key,
            Some(format!("{ns}/{name}/dump.pgc.zst")),
            "{name}"
        );
        assert_eq!(status.size_bytes, Some(4242), "{name}");
        assert_eq!(status.message, Some(format!("dumped {name}")), "{name}");
        let selector = format!("dbop.dev/backup={name}");
        let found = jobs
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .len();
        assert_eq!(found, 1, "Jobs of backup {name}");
    }
}

/// Waits until the Database names `last` as its last successful backup with BackupHealthy True.
async fn assert_database_backup_status(bed: &TestBed, ns: &str, db: &str, last: &str) {
    let dbs = bed.databases(ns);
    let found = wait_until(&format!("{db}: lastSuccessful {last}"), WAIT, || async {
        let d = dbs.get(db).await.ok()?;
        let named = d
            .status
            .as_ref()?
            .backup
            .as_ref()?
            .last_successful
            .as_deref()
            == Some(last);
        (named && condition(&d, "BackupHealthy")?.0 == "True").then_some(d)
    })
    .await;
    assert_eq!(found.status.unwrap().phase, Some(Phase::Ready));
}

/// Provisioning: Databases with init SQL are applied one after another while the operator is
/// killed; each must reach Ready with one Secret (never regenerated), one StatefulSet, two
/// Services, one volume claim and one init Job that succeeded once.
async fn provisioning(bed: TestBed, ns: String, mut rng: StdRng) -> Survived {
    let (bed, ns) = (&bed, ns.as_str());
    let plan = quick_kills(20);
    let made = std::sync::Mutex::new(Vec::new());
    let made_ref = &made;
    let survived = with_random_kills(bed, ns, &[], &mut rng, &plan, |spent| async move {
        let mut i = 0;
        while i < 2 || !spent.load(Ordering::SeqCst) {
            let name = format!("prov-{i}");
            let sql = json!({"init": {"sql": "CREATE TABLE t (id int);"}});
            bed.apply_database(ns, database_manifest(&name, sql)).await;
            bed.wait_for_phase(ns, &name, Phase::Ready, WAIT).await;
            made_ref.lock().unwrap().push(name);
            i += 1;
        }
    })
    .await;
    for name in made.into_inner().unwrap() {
        assert_one_of_each(bed, ns, &name).await;
    }
    finish(bed, ns, &survived, &plan);
    survived
}

async fn count<K>(bed: &TestBed, ns: &str, selector: &ListParams) -> usize
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(bed.client.clone(), ns);
    api.list(selector).await.expect("list").items.len()
}

async fn assert_one_of_each(bed: &TestBed, ns: &str, name: &str) {
    let s = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let counts = (
        count::<Secret>(bed, ns, &s).await,
        count::<StatefulSet>(bed, ns, &s).await,
        count::<Service>(bed, ns, &s).await,
        count::<Job>(bed, ns, &s).await,
        count::<PersistentVolumeClaim>(bed, ns, &s).await,
    );
    assert_eq!(
        counts,
        (5, 1, 4, 1, 1),
        "{name}: secrets (credentials, CA, server certificate, application, accounts), statefulsets, services (-hl, -rw, -ro, -r), jobs, claims"
    );
    let job = Api::<Job>::namespaced(bed.client.clone(), ns)
        .get(&format!("{name}-init"))
        .await
        .unwrap();
    assert_eq!(
        job.status.unwrap().succeeded,
        Some(1),
        "{name}: the init SQL ran once"
    );
}

/// On-demand backups: Manual DatabaseBackups are made one after another while the operator is
/// killed; the (held) backup pod of each is ended with a good result at a random moment.
async fn on_demand(bed: TestBed, ns: String, mut rng: StdRng) -> Survived {
    let (bed, ns) = (&bed, ns.as_str());
    s3_secret(bed, ns).await;
    let plan = quick_kills(20);
    let mut pod_rng = stream(rng.random(), "on-demand pods");
    let survived = with_random_kills(bed, ns, &[], &mut rng, &plan, |spent| async move {
        bed.apply_database(ns, database_manifest("orders", with_backups(None)))
            .await;
        let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), ns);
        let mut i = 0;
        while i < 2 || !spent.load(Ordering::SeqCst) {
            let name = format!("orders-manual-{i}");
            let b: DatabaseBackup = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"database": "orders", "reason": "Manual"}
            }))
            .unwrap();
            backups.create(&PostParams::default(), &b).await.unwrap();
            let pod = dbop_e2e::backup_jobs::running_backup_pod(bed, ns, &name).await;
            tokio::time::sleep(Duration::from_millis(pod_rng.random_range(0..1500))).await;
            finish_pod(bed, ns, &pod, "Succeeded", &success_result(ns, &name)).await;
            wait_until(&format!("{name} finished"), WAIT, || async {
                let b = backups.get(&name).await.ok()?;
                b.status?.phase?.is_finished().then_some(())
            })
            .await;
            i += 1;
        }
    })
    .await;
    let backups = all_backups(bed, ns).await;
    assert_backups_right(bed, ns, &backups).await;
    let last = backups
        .iter()
        .filter_map(|b| b.metadata.name.clone())
        .max_by_key(|n| n.rsplit('-').next().and_then(|i| i.parse::<u32>().ok()));
    assert_database_backup_status(bed, ns, "orders", &last.unwrap()).await;
    finish(bed, ns, &survived, &plan);
    survived
}

/// Scheduled backups: a per-minute schedule runs while the operator is killed every 1–4 s
/// (so the kills span at least one due time); every backup pod is ended with a good result.
/// At least two scheduled backups must succeed, one per minute with no minute missing, each
/// with one Job.
async fn scheduled(bed: TestBed, ns: String, mut rng: StdRng) -> Survived {
    let (bed, ns) = (&bed, ns.as_str());
    s3_secret(bed, ns).await;
    let plan = KillPlan {
        kills: 20,
        gap: Duration::from_secs(1)..Duration::from_secs(4),
    };
    let survived = with_random_kills(bed, ns, &[], &mut rng, &plan, |spent| async move {
        bed.apply_database(
            ns,
            database_manifest("orders", with_backups(Some("* * * * *"))),
        )
        .await;
        wait_until(
            "two scheduled backups succeeded after the kills",
            Duration::from_secs(240),
            || {
                let (bed, ns, spent) = (&bed, &ns, spent.clone());
                async move {
                    finish_running_backup_pods(bed, ns).await;
                    let done = all_backups(bed, ns)
                        .await
                        .iter()
                        .filter(|b| {
                            b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Succeeded)
                        })
                        .count();
                    (done >= 2 && spent.load(Ordering::SeqCst)).then_some(())
                }
            },
        )
        .await;
    })
    .await;
    // Let a backup started at the last moment finish too.
    wait_until("every scheduled backup finished", WAIT, || async {
        finish_running_backup_pods(bed, ns).await;
        let list = all_backups(bed, ns).await;
        list.iter()
            .all(|b| {
                b.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(BackupPhase::is_finished)
            })
            .then_some(list)
    })
    .await;
    let backups = all_backups(bed, ns).await;
    assert_backups_right(bed, ns, &backups).await;
    assert_consecutive_minutes(&backups);
    let last = backups
        .last()
        .and_then(|b| b.metadata.name.clone())
        .unwrap();
    assert_database_backup_status(bed, ns, "orders", &last).await;
    finish(bed, ns, &survived, &plan);
    survived
}

/// Restores: Databases bootstrapped from an S3 location, one after another, while the operator
/// is killed; each (held) restore pod is ended with a good result at a random moment. Each must
/// end Ready and `RestoredFromBackup` with exactly one restore Job and no init Job.
async fn restores(bed: TestBed, ns: String, mut rng: StdRng) -> Survived {
    let (bed, ns) = (&bed, ns.as_str());
    s3_secret(bed, ns).await;
    let plan = quick_kills(10);
    let made = std::sync::Mutex::new(Vec::new());
    let made_ref = &made;
    let mut pod_rng = stream(rng.random(), "restore pods");
    let survived = with_random_kills(bed, ns, &[], &mut rng, &plan, |spent| async move {
        let mut i = 0;
        while i < 2 || !spent.load(Ordering::SeqCst) {
            let name = format!("copy-{i}");
            bed.apply_database(ns, database_manifest(&name, restored_from_s3()))
                .await;
            let job = format!("{name}-restore");
            let selector = format!("batch.kubernetes.io/job-name={job}");
            let pod = running_pod(bed, ns, &selector, &job).await;
            tokio::time::sleep(Duration::from_millis(pod_rng.random_range(0..1500))).await;
            finish_pod(bed, ns, &pod, "Succeeded", &restore_result(ns)).await;
            bed.wait_for_phase(ns, &name, Phase::Ready, WAIT).await;
            made_ref.lock().unwrap().push(name);
            i += 1;
        }
    })
    .await;
    for name in made.into_inner().unwrap() {
        assert_restored_once(bed, ns, &name).await;
    }
    finish(bed, ns, &survived, &plan);
    survived
}

/// The id of the backup the restore scenario restores.
const RESTORED_ID: &str = "20260101T020000Z-orders-manual";

/// A Database restored from backup [`RESTORED_ID`] of `orders`, with init SQL that must not run.
fn restored_from_s3() -> serde_json::Value {
    let mut spec = with_backups(None);
    let s3 = spec["backup"]["s3"].take();
    json!({
        "init": {"sql": "CREATE TABLE must_not_run (id int);"},
        "podMetadata": hold_pods(),
        "bootstrap": {"fromBackup": {"s3": s3, "backupId": RESTORED_ID, "database": "orders"}}
    })
}

/// The result the agent would write for a good restore of [`RESTORED_ID`].
fn restore_result(ns: &str) -> String {
    let now = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    json!({
        "outcome": "Succeeded", "operation": "restore", "backupId": RESTORED_ID,
        "key": format!("{ns}/orders/postgres/{RESTORED_ID}/dump.pgc.zst"),
        "completedAt": now, "message": "restored"
    })
    .to_string()
}

/// One restore Job that succeeded once, no init Job, and a status that names the backup.
async fn assert_restored_once(bed: &TestBed, ns: &str, name: &str) {
    let s = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let jobs = Api::<Job>::namespaced(bed.client.clone(), ns)
        .list(&s)
        .await
        .expect("list Jobs");
    let names: Vec<_> = jobs
        .iter()
        .filter_map(|j| j.metadata.name.clone())
        .collect();
    assert_eq!(names, vec![format!("{name}-restore")], "{name}: its Jobs");
    let succeeded = jobs.items[0].status.as_ref().and_then(|s| s.succeeded);
    assert_eq!(succeeded, Some(1), "{name}: the restore ran once");
    let db = bed.wait_for_phase(ns, name, Phase::Ready, WAIT).await;
    assert_eq!(
        condition(&db, "Initialized"),
        Some(("True".into(), "RestoredFromBackup".into()))
    );
    let restored = db
        .status
        .and_then(|s| s.bootstrap)
        .expect("status.bootstrap");
    assert_eq!(restored.restored_backup_id.as_deref(), Some(RESTORED_ID));
}

/// Scheduled backups are named `orders-<yyyymmddhhmm>`: one per minute, none skipped.
fn assert_consecutive_minutes(backups: &[DatabaseBackup]) {
    let minutes: Vec<chrono::NaiveDateTime> = backups
        .iter()
        .map(|b| {
            let name = b.metadata.name.clone().unwrap();
            let stamp = name.trim_start_matches("orders-");
            chrono::NaiveDateTime::parse_from_str(&format!("{stamp}00"), "%Y%m%d%H%M%S")
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        })
        .collect();
    for pair in minutes.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::TimeDelta::minutes(1),
            "scheduled backups {minutes:?}"
        );
    }
}

#[tokio::test]
async fn random_kills_during_provisioning() {
    run("provisioning", provisioning).await;
}

#[tokio::test]
async fn random_kills_during_on_demand_backups() {
    run("on-demand", on_demand).await;
}

#[tokio::test]
async fn random_kills_during_restores() {
    run("restores", restores).await;
}

#[tokio::test]
async fn random_kills_during_scheduled_backups() {
    run("scheduled", scheduled).await;
}
