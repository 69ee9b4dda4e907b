//! Streaming standbys on the test bed's real node: a 3-instance Database clones its primary
//! into two standbys that stream from it through a replication slot each; rows written through
//! `-rw` reach both standbys; `-ro` answers from a standby, which refuses writes; the status
//! lists every instance ready with its role; a backup, which reads from a standby when one
//! streams (`prefer-standby`), succeeds and holds the rows. A standby's pod deleted comes back
//! on its data and catches up; the primary's pod deleted releases its Lease, the first ready
//! standby is promoted (a FailedOver Event) and the old primary rejoins as its standby, no row
//! lost. A single instance scaled to two gains a streaming standby, and its primary does not
//! restart. A minor upgrade of three instances moves the standbys first and the primary last
//! (after a switchover to an upgraded standby), and every instance ends on the new version with
//! the data it had.

use std::time::Duration;

use dbop::api::{
    BackupPhase, BackupReason, DatabaseBackup, DatabaseBackupSpec, InstanceRole, Phase,
    UpgradeStage,
};
use dbop_e2e::instances::{REPLICATION_WAIT, instance_resources, real_node_database};
use dbop_e2e::node::{REAL_NODE_STORAGE_CLASS, real_node_placement};
use dbop_e2e::{TestBed, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

/// A primary's initdb and two clones, one after the other, on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(420);

/// Deletes the pod and waits until the StatefulSet's new one (another uid) is Ready.
async fn restart_pod(bed: &TestBed, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let old = pods.get(name).await.unwrap().metadata.uid;
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    wait_until(
        &format!("{name} replaced and ready"),
        READY_WAIT,
        || async {
            let pod = pods.get_opt(name).await.ok()??;
            (pod.metadata.uid != old && dbop_e2e::node::pod_ready(&pod)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn three_instances_stream_from_one_primary() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("ha").await;
    let _operator = bed.operator_for_real_node(&ns);
    let s3 = bed.s3_server(&ns, "backups", None).await;
    bed.apply_database(
        &ns,
        json!({"metadata": {"name": "orders"}, "spec": {
            "version": "15.20",
            "instances": 3,
            "storage": {"size": "1Gi", "storageClassName": REAL_NODE_STORAGE_CLASS},
            "placement": real_node_placement(),
            "resources": instance_resources(),
            "backup": {
                "schedule": "0 0 1 1 *",
                "s3": {"endpoint": s3, "bucket": "backups", "forcePathStyle": true,
                       "credentials": {"secretName": "s3-creds"}},
            },
        }}),
    )
    .await;
    let db = bed
        .wait_for_phase(&ns, "orders", Phase::Ready, READY_WAIT)
        .await;
    let status = db.status.unwrap();
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    let lines: Vec<_> = status
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.ready))
        .collect();
    assert_eq!(
        lines,
        [
            ("orders-0", InstanceRole::Primary, true),
            ("orders-1", InstanceRole::Standby, true),
            ("orders-2", InstanceRole::Standby, true),
        ]
    );

    // The primary is not in recovery; each standby is, and streams through its own slot.
    assert_eq!(
        bed.local_ok(&ns, "orders-0", "select pg_is_in_recovery()"),
        "f"
    );
    for standby in ["orders-1", "orders-2"] {
        assert_eq!(
            bed.local_ok(&ns, standby, "select pg_is_in_recovery()"),
            "t"
        );
        let receiver = bed.local_ok(
            &ns,
            standby,
            "select status, slot_name from pg_stat_wal_receiver",
        );
        assert_eq!(
            receiver,
            format!("streaming|dbop_{}", standby.replace('-', "_"))
        );
    }
    let senders = bed.local_ok(&ns,
        "orders-0",
        "select string_agg(application_name || ':' || state, ',' order by application_name) from pg_stat_replication",
    );
    assert_eq!(senders, "orders-1:streaming,orders-2:streaming");

    // A write on the primary reaches both standbys.
    bed.local_ok(&ns,
        "orders-0",
        "create table ledger (id int primary key, note text); insert into ledger select g, 'row ' || g from generate_series(1, 100) g",
    );
    for standby in ["orders-1", "orders-2"] {
        wait_until("the rows on the standby", REPLICATION_WAIT, || async {
            let (ok, out, _) = bed.local_psql(&ns, standby, "select count(*) from ledger");
            (ok && out.trim() == "100").then_some(())
        })
        .await;
        let (ok, _, err) = bed.local_psql(&ns, standby, "insert into ledger values (1000, 'x')");
        assert!(
            !ok && err.contains("read-only transaction"),
            "{standby}: {err}"
        );
    }

    // Through the Services, from a client pod: -rw is the primary, -ro a standby.
    bed.psql_client(&ns, "client", "orders", "orders-credentials")
        .await;
    let via = |service: &str| {
        format!(
            "PGHOST={service} PGUSER=postgres exec psql -X -d postgres -Atc 'select pg_is_in_recovery()'"
        )
    };
    for (service, in_recovery) in [("orders-rw", "f"), ("orders-ro", "t")] {
        let command = via(service);
        wait_until(
            &format!("{service} answering"),
            REPLICATION_WAIT,
            || async {
                let (ok, out, _) = bed.exec(&ns, "client", &["sh", "-c", &command]);
                (ok && out.trim() == in_recovery).then_some(())
            },
        )
        .await;
    }

    // A manual backup reads a standby (the primary only when it does not answer) and holds the
    // rows.
    let backups: Api<DatabaseBackup> = Api::namespaced(bed.client.clone(), &ns);
    let manual = DatabaseBackup::new(
        "orders-manual",
        DatabaseBackupSpec {
            database: "orders".into(),
            reason: BackupReason::Manual,
            method: dbop::api::BackupMethod::Logical,
        },
    );
    backups
        .create(&PostParams::default(), &manual)
        .await
        .unwrap();
    let done = wait_until("the backup finished", READY_WAIT, || async {
        let b = backups.get("orders-manual").await.ok()?;
        let phase = b.status.as_ref()?.phase?;
        phase.is_finished().then_some(b)
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        status.phase,
        Some(BackupPhase::Succeeded),
        "{:?}",
        status.message
    );
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), &ns);
    let job = jobs
        .list(&ListParams::default().labels("app.kubernetes.io/component=backup"))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the backup Job");
    let env = job.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let value = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    // A ready standby by its own name (the snapshot's session and pg_dump reach one server),
    // then the primary.
    let host = value("PGHOST").unwrap_or_default();
    assert!(
        host == format!("orders-1.orders-hl.{ns}.svc,orders-rw.{ns}.svc")
            || host == format!("orders-2.orders-hl.{ns}.svc,orders-rw.{ns}.svc"),
        "{host}"
    );
    assert_eq!(
        value("PGTARGETSESSIONATTRS").as_deref(),
        Some("prefer-standby")
    );

    // A standby's pod deleted: it starts again on its own data and catches up.
    restart_pod(&bed, &ns, "orders-2").await;
    bed.local_ok(
        &ns,
        "orders-0",
        "insert into ledger select g, 'after a standby restarted' from generate_series(101, 200) g",
    );
    bed.rows_on(&ns, "orders-2", "ledger", 200, READY_WAIT)
        .await;

    // The primary's pod deleted: its manager stops the server and releases the primary Lease,
    // the operator fails over to the first ready standby at once, and the old primary comes
    // back as a standby of the new one (rewound if it must be).
    restart_pod(&bed, &ns, "orders-0").await;
    let databases = bed.databases(&ns);
    wait_until("orders-1 named the primary", REPLICATION_WAIT, || async {
        let s = databases.get("orders").await.ok()?.status?;
        (s.primary.as_deref() == Some("orders-1")).then_some(())
    })
    .await;
    wait_until("orders-1 promoted", REPLICATION_WAIT, || async {
        let (ok, out, _) = bed.local_psql(&ns, "orders-1", "select pg_is_in_recovery()");
        (ok && out.trim() == "f").then_some(())
    })
    .await;
    bed.local_ok(
        &ns,
        "orders-1",
        "insert into ledger select g, 'after the failover' from generate_series(201, 300) g",
    );
    for standby in ["orders-0", "orders-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
        bed.rows_on(&ns, standby, "ledger", 300, READY_WAIT).await;
    }
    let events = bed.kubectl(&[
        "-n",
        &ns,
        "get",
        "events",
        "--field-selector",
        "reason=FailedOver",
        "-o",
        "name",
    ]);
    assert!(
        !events.1.trim().is_empty(),
        "no FailedOver Event: {events:?}"
    );
    wait_until("Ready with every instance ready", READY_WAIT, || async {
        let s = databases.get("orders").await.ok()?.status?;
        (s.phase == Some(Phase::Ready) && s.instances.iter().all(|i| i.ready)).then_some(())
    })
    .await;
}

/// `pg_postmaster_start_time()` of an instance, over its socket.
fn started_at(bed: &TestBed, ns: &str, pod: &str) -> String {
    bed.local_ok(ns, pod, "select pg_postmaster_start_time()")
}

#[tokio::test]
async fn scaling_up_adds_a_standby_without_restarting_the_primary() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("ha-scale").await;
    let _operator = bed.operator_for_real_node(&ns);
    let manifest = |instances: i32| real_node_database("grow", "15.20", instances);
    bed.apply_database(&ns, manifest(1)).await;
    bed.wait_for_phase(&ns, "grow", Phase::Ready, READY_WAIT)
        .await;
    let started = started_at(&bed, &ns, "grow-0");
    bed.local_ok(&ns,
        "grow-0",
        "create table ledger (id int primary key); insert into ledger select generate_series(1, 50)",
    );

    // One more instance: a standby that clones the running primary and streams from it.
    bed.apply_database(&ns, manifest(2)).await;
    let databases = bed.databases(&ns);
    wait_until("two ready instances", READY_WAIT, || async {
        let s = databases.get("grow").await.ok()?.status?;
        let ready = s.instances.iter().filter(|i| i.ready).count();
        (s.phase == Some(Phase::Ready) && ready == 2).then_some(())
    })
    .await;
    bed.rows_on(&ns, "grow-1", "ledger", 50, READY_WAIT).await;
    let receiver = bed.local_ok(&ns, "grow-1", "select status from pg_stat_wal_receiver");
    assert_eq!(receiver, "streaming");
    assert_eq!(
        started_at(&bed, &ns, "grow-0"),
        started,
        "scaling up restarted the primary"
    );
}

/// A minor upgrade of three instances: the standbys move first (highest ordinal first), the
/// primary last; every instance ends on 15.20, streaming, with the data it had.
#[tokio::test]
async fn three_instances_upgrade_standbys_first_and_keep_their_data() {
    let bed = testbed().await;
    bed.require_real_node().await;
    let ns = bed.real_node_namespace("ha-upgrade").await;
    let _operator = bed.operator_for_real_node(&ns);
    let spec = |version: &str| real_node_database("up", version, 3);
    bed.apply_database(&ns, spec("15.18")).await;
    bed.wait_for_phase(&ns, "up", Phase::Ready, READY_WAIT)
        .await;
    bed.local_ok(&ns,
        "up-0",
        "create table ledger (id int primary key, note text); insert into ledger select g, md5(g::text) from generate_series(1, 300) g",
    );
    let fingerprint =
        "select count(*) || ':' || md5(string_agg(id || note, ',' order by id)) from ledger";
    let before = bed.local_ok(&ns, "up-0", fingerprint);
    bed.rows_on(&ns, "up-2", "ledger", 300, READY_WAIT).await;

    bed.apply_database(&ns, spec("15.20")).await;
    let databases = bed.databases(&ns);
    let finished = wait_until_or_none(READY_WAIT, || async {
        let db = databases.get("up").await.ok()?;
        let u = db.status.as_ref()?.upgrade.clone()?;
        (u.to == "15.20" && u.stage.is_finished()).then_some(db)
    })
    .await;
    let Some(done) = finished else {
        // Why not: the Database's status, and each pod's story (CI hit this once).
        let status = databases.get("up").await.map(|db| db.status);
        let stories: Vec<String> = (0..3)
            .map(|o| bed.pod_story(&ns, &format!("up-{o}")))
            .collect();
        panic!(
            "timed out after {READY_WAIT:?} waiting for the upgrade to finish\nstatus: {status:#?}\n{}",
            stories.join("\n")
        );
    };
    let status = done.status.unwrap();
    let upgrade = status.upgrade.unwrap();
    assert_eq!(upgrade.stage, UpgradeStage::Complete, "{upgrade:#?}");
    // Before its pod moved, the primary handed over to the lowest upgraded standby by a
    // switchover (the `failover` suite checks its Event and a writer's commits), and the old
    // primary came back on the new version as its standby.
    assert_eq!(status.primary.as_deref(), Some("up-1"));

    // Standbys first, the old primary last: the pods' creation times say in which order they
    // moved.
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut created = vec![];
    for name in ["up-2", "up-1", "up-0"] {
        let pod = pods.get(name).await.unwrap();
        created.push(pod.metadata.creation_timestamp.unwrap().0);
    }
    assert!(
        created.windows(2).all(|w| w[0] <= w[1]),
        "not standbys first, primary last: {created:?}"
    );
    for pod in ["up-0", "up-1", "up-2"] {
        wait_until(
            &format!("{pod} on 15.20 with the data"),
            READY_WAIT,
            || async {
                let (ok, version, _) = bed.local_psql(&ns, pod, "show server_version");
                let (_, now, _) = bed.local_psql(&ns, pod, fingerprint);
                (ok && version.starts_with("15.20") && now.trim() == before).then_some(())
            },
        )
        .await;
    }
    for standby in ["up-0", "up-2"] {
        bed.streaming_standby(&ns, standby, READY_WAIT).await;
    }
}
