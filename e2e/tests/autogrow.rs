//! `spec.storage.autoGrow` on the test bed's real node, on volumes of a real size: each
//! Database's data volume is a tmpfs of the host behind a local PersistentVolume, grown online
//! by a stand-in for the CSI resizer (`dbop_e2e::sized_volume`), so PostgreSQL, `df` in the pod
//! and the instance manager's `statvfs` all meet the volume's real limit. Writes are real: rows
//! of 1000 bytes inserted with psql through the `-rw` Service (about as much WAL as table).
//!
//! What it proves:
//! - **Grown before it fills**: a 256Mi volume (threshold 80 %, increment 128Mi, maximum 512Mi)
//!   filled past 80 % is asked for 384Mi, the filesystem grows under the running server (the
//!   pod's `df` says so), a `VolumeGrowing` Event and `StorageAutoGrow` True say it, and a
//!   writer that commits twice a second never sees a failed write. Filled past 80 % of 384Mi
//!   (more data than the first size held), it grows to 512Mi; past 80 % of that it stops there,
//!   `StorageAutoGrow` False `AtMaximum`. The reaction time (threshold crossed → claim patched)
//!   is printed.
//! - **Already full and stopped**: a Database without autoGrow on a 128Mi volume is written to
//!   until PostgreSQL stops. What happens (measured, the same in every run): inserts of 2000
//!   rows succeed until the volume is full to 0.8 MiB; the next fails with an ERROR (`could not
//!   extend file "base/5/…": wrote only 4096 of 8192 bytes`: the table cannot grow) and the
//!   server stays up. WAL that cannot grow stops it, as retained WAL does in the field:
//!   WAL-only writes (`pg_logical_emit_message`, 4 MiB each) fill the current segment, and the
//!   one that needs a new segment (16 MiB at once) PANICs the server (`could not write to file
//!   "pg_wal/xlogtemp.N": No space left on device`). Crash recovery replays to the end of that
//!   segment and its end-of-recovery checkpoint needs the new one too: FATAL, "shutting down
//!   due to startup process failure", `dbop-instance` exits 1, and the container crash-loops
//!   with the volume 0.2 MiB from full: it cannot come back by itself. (Larger inserts can
//!   reach the WAL's limit first: an 8000-row insert on a 256Mi volume at 11 MiB free stopped
//!   the server, with the same failed recovery and crash loop after.) The termination message
//!   starts with `volume-full: `. Then autoGrow is set: the claim grows, PostgreSQL is Ready
//!   again and takes a write, and every row acknowledged before the fill is there.
//! - **A class that cannot grow**: with a StorageClass without `allowVolumeExpansion`,
//!   `StorageAutoGrow` is False `CannotExpand`.
//! - **The stand-in resizer** itself: `spec.storage.size` raised by hand, the claim dbop patches
//!   grows the filesystem the pod sees, the PersistentVolume and the claim's capacity.

use std::time::{Duration, Instant};

use dbop::api::Phase;
use dbop_e2e::node::{POD_WAIT, pod_ready, real_node_placement};
use dbop_e2e::sized_volume::{
    EXPANDABLE_CLASS, FIXED_CLASS, SizedVolume, SizedVolumes, Usage, quantity_bytes,
};
use dbop_e2e::{TestBed, condition, condition_message, testbed, wait_until, wait_until_or_none};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

/// A real server: initdb, start, on a busy 2-core machine.
const READY_WAIT: Duration = Duration::from_secs(240);
/// From a volume past its threshold to the claim patched: the operator reads the volumes every
/// ~30 s; room for a reconcile queued behind others.
const GROW_WAIT: Duration = Duration::from_secs(150);
/// The data volume's mount in the database container.
const DATA_DIR: &str = "/var/lib/postgresql/data";
const MIB: u64 = 1024 * 1024;
/// What one inserted row costs the volume, table and WAL together (1000 bytes of text: ~1.2 KB
/// of heap, ~1.1 KB of WAL), to size the inserts.
const ROW_COST: u64 = 2400;

/// Memory for the database container: the tmpfs pages PostgreSQL writes are charged to it (the
/// default limit, 256Mi, is less than the data).
fn resources() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "256Mi"},
           "limits": {"cpu": "1", "memory": "1Gi"}})
}

fn database(name: &str, size: &str, class: &str, auto_grow: Option<Value>) -> Value {
    let mut storage = json!({"size": size, "storageClassName": class});
    if let Some(auto_grow) = auto_grow {
        storage["autoGrow"] = auto_grow;
    }
    json!({"metadata": {"name": name}, "spec": {
        "version": "15.20", "storage": storage, "placement": real_node_placement(),
        "resources": resources(),
    }})
}

/// The insert of `rows` rows of 1000 bytes into `fill`.
fn fill_sql(rows: u64) -> String {
    format!(
        "insert into fill (pad) select lpad('', 1000, md5(random()::text)) \
         from generate_series(1, {rows})"
    )
}

/// Inserts rows through `-rw` until at least `percent` % of the volume is in use; every insert
/// must succeed. Each insert is a part of what remains, so it stops within a WAL segment
/// (16 MiB) past the mark. Returns the rows inserted.
fn fill_to(bed: &TestBed, ns: &str, volume: &SizedVolume, percent: u64) -> u64 {
    let mut rows = 0;
    let mut unresolved_in_a_row = 0;
    loop {
        let usage = volume.usage();
        if usage.at_least(percent) {
            return rows;
        }
        let remaining = (usage.size_bytes * percent / 100).saturating_sub(usage.used_bytes());
        let chunk = (remaining / 3 / ROW_COST).clamp(500, 20_000);
        let (ok, _, err) = bed.psql(ns, "client", "postgres", &fill_sql(chunk));
        if !ok && err.contains(UNRESOLVED) && unresolved_in_a_row < 5 {
            println!("autogrow: an insert reached no server (the bed's DNS): {err}");
            unresolved_in_a_row += 1;
            continue;
        }
        unresolved_in_a_row = 0;
        assert!(ok, "an insert failed at {usage}: {err}");
        rows += chunk;
    }
}

/// What libpq says when the client could not resolve the Service's name: the test bed's DNS
/// did not answer in time (seen once under CI's load). Such an insert reached no server, so it
/// says nothing of the volume: it is tried again, or (the writer) counted apart.
const UNRESOLVED: &str = "could not translate host name";

/// The writer of scenario a: one insert per connection twice a second; each acknowledged id
/// goes to /tmp/acked, each failure (with its time and error) to /tmp/failed, until /tmp/stop;
/// an insert whose Service name did not resolve reached no server: its id goes to
/// /tmp/unresolved.
const TICKER: &str = r#"export PGUSER=${PGUSER:-postgres}; i=0; while [ ! -f /tmp/stop ]; do i=$((i+1)); if out=$(psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "insert into ticks values ($i)" 2>&1); then echo $i >> /tmp/acked; elif case "$out" in *"could not translate host name"*) true;; *) false;; esac; then echo $i >> /tmp/unresolved; else echo "$(date +%T) $i $out" >> /tmp/failed; fi; sleep 0.5; done; touch /tmp/stopped"#;

fn start_ticker(bed: &TestBed, ns: &str) {
    let background = format!(
        "nohup sh -c '{}' >/dev/null 2>&1 &",
        TICKER.replace('\'', "'\\''")
    );
    let (ok, _, err) = bed.exec(ns, "client", &["sh", "-c", &background]);
    assert!(ok, "starting the writer: {err}");
}

/// How many writes the writer had acknowledged so far.
fn acked_so_far(bed: &TestBed, ns: &str) -> usize {
    let (_, acked, _) = bed.exec(ns, "client", &["sh", "-c", "cat /tmp/acked 2>/dev/null"]);
    acked.lines().count()
}

/// Stops the writer; (acknowledged ids, failures).
async fn stop_ticker(bed: &TestBed, ns: &str) -> (u64, String) {
    bed.exec(ns, "client", &["touch", "/tmp/stop"]);
    wait_until("the writer stopped", POD_WAIT, || async {
        bed.exec(ns, "client", &["test", "-f", "/tmp/stopped"])
            .0
            .then_some(())
    })
    .await;
    let (_, acked, _) = bed.exec(ns, "client", &["sh", "-c", "cat /tmp/acked 2>/dev/null"]);
    let (_, failed, _) = bed.exec(ns, "client", &["sh", "-c", "cat /tmp/failed 2>/dev/null"]);
    (acked.lines().count() as u64, failed)
}

/// The claim's requested size in bytes.
async fn requested(bed: &TestBed, ns: &str, claim: &str) -> u64 {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), ns)
        .get(claim)
        .await
        .expect("the claim");
    let request = pvc
        .spec
        .and_then(|s| s.resources?.requests?.get("storage").cloned())
        .expect("a storage request");
    quantity_bytes(&request.0).expect("a quantity")
}

/// The data filesystem's size as `df` in the database container gives it.
fn pod_df_size(bed: &TestBed, ns: &str, pod: &str) -> u64 {
    let (ok, out, err) = bed.exec(ns, pod, &["df", "-B1", "--output=size,avail", DATA_DIR]);
    assert!(ok, "df in {pod}: {err}");
    out.lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("df in {pod}: {out}"))
}

/// Waits for the Database's condition `StorageAutoGrow` to have this status (and reason, when
/// given); returns (status, reason, message).
async fn wait_auto_grow(
    bed: &TestBed,
    ns: &str,
    name: &str,
    status: &str,
    reason: Option<&str>,
    timeout: Duration,
) -> (String, String, String) {
    let dbs = bed.databases(ns);
    let found = wait_until_or_none(timeout, || async {
        let db = dbs.get(name).await.ok()?;
        let (s, r) = condition(&db, "StorageAutoGrow")?;
        (s == status && reason.is_none_or(|want| want == r)).then(|| {
            let message = condition_message(&db, "StorageAutoGrow");
            (s, r, message)
        })
    })
    .await;
    if let Some(found) = found {
        return found;
    }
    let last = dbs
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|db| db.status);
    panic!(
        "StorageAutoGrow of {ns}/{name} not {status} {reason:?} within {timeout:?}; last status: {last:#?}"
    )
}

/// The messages of the Database's Events with this reason.
async fn database_events(bed: &TestBed, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(bed.client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("list Events");
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Database")
        })
        .map(|e| {
            format!(
                "{} {}",
                e.type_.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// Fills the volume past `threshold` and waits for the claim to be asked for `expect_mib`:
/// asserts the request, the grown filesystem on the host and in the pod; returns the reaction
/// time (threshold crossed → claim patched, as the resizer saw it).
async fn grow_step(
    bed: &TestBed,
    ns: &str,
    pod: &str,
    volumes: &SizedVolumes,
    volume: &SizedVolume,
    threshold: u64,
    expect_mib: u64,
) -> Duration {
    let before = volumes.resizes_of(&volume.claim).len();
    let acked_before = acked_so_far(bed, ns);
    let started = Instant::now();
    let rows = fill_to(bed, ns, volume, threshold);
    let crossed = Instant::now();
    let usage = volume.usage();
    println!(
        "autogrow: {rows} rows inserted in {:.1} s; now {usage}",
        started.elapsed().as_secs_f64()
    );
    let resize = wait_until(
        &format!("the claim {} asked for {expect_mib}Mi", volume.claim),
        GROW_WAIT,
        || async { volumes.resizes_of(&volume.claim).get(before).cloned() },
    )
    .await;
    let reaction = resize.seen.saturating_duration_since(crossed);
    println!(
        "autogrow: {} asked for {} {:.1} s after the volume crossed {threshold} % (resized in {:.2} s)",
        volume.claim,
        resize.request,
        reaction.as_secs_f64(),
        resize.took.as_secs_f64()
    );
    assert_eq!(resize.to_bytes, expect_mib * MIB, "{resize:?}");
    assert_eq!(requested(bed, ns, &volume.claim).await, expect_mib * MIB);
    assert_eq!(
        volume.usage().size_bytes,
        expect_mib * MIB,
        "the tmpfs grew"
    );
    assert_eq!(
        pod_df_size(bed, ns, pod),
        expect_mib * MIB,
        "df in the pod shows the new size"
    );
    // The writer went on while the volume filled and after it grew.
    let at_growth = acked_so_far(bed, ns);
    assert!(
        at_growth > acked_before,
        "no write from the fill to the growth"
    );
    wait_until("a write after the growth", POD_WAIT, || async {
        (acked_so_far(bed, ns) > at_growth).then_some(())
    })
    .await;
    reaction
}

#[tokio::test]
async fn a_volume_grows_before_it_fills_and_stops_at_its_maximum() {
    let bed = testbed().await;
    let ns = bed.real_node_namespace("autogrow").await;
    let volumes = bed.sized_volumes(&ns).await;
    let _operator = bed.operator_for_real_node(&ns);
    let volume = volumes.add("data-grow-0", EXPANDABLE_CLASS, 256).await;
    let auto_grow = json!({"thresholdPercent": 80, "increment": "128Mi", "maximum": "512Mi"});
    bed.apply_database(
        &ns,
        database("grow", "256Mi", EXPANDABLE_CLASS, Some(auto_grow)),
    )
    .await;
    bed.wait_for_phase(&ns, "grow", Phase::Ready, READY_WAIT)
        .await;
    println!("autogrow: Ready on a fresh volume: {}", volume.usage());
    bed.psql_client(&ns, "client", "grow", "grow-credentials")
        .await;
    bed.psql_until_ok(
        &ns,
        "client",
        "postgres",
        "create table fill (id bigserial primary key, pad text not null); \
         create table ticks (id int primary key)",
        READY_WAIT,
    )
    .await;
    let (status, reason, _) = wait_auto_grow(&bed, &ns, "grow", "True", None, GROW_WAIT).await;
    println!("autogrow: StorageAutoGrow {status} {reason} before any growth");
    start_ticker(&bed, &ns);

    // 256Mi past 80 % → 384Mi, under a writer that must never fail.
    let first = grow_step(&bed, &ns, "grow-0", &volumes, &volume, 80, 384).await;
    let events = wait_until("a VolumeGrowing Event", POD_WAIT, || async {
        let events = database_events(&bed, &ns, "grow", "VolumeGrowing").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    println!("autogrow: Events: {events:?}");
    assert!(events.iter().all(|e| e.starts_with("Normal")), "{events:?}");
    let (_, reason, message) = wait_auto_grow(&bed, &ns, "grow", "True", None, GROW_WAIT).await;
    println!("autogrow: StorageAutoGrow True {reason}: {message}");

    // 384Mi past 80 %: more data than 256Mi held, then 512Mi.
    let second = grow_step(&bed, &ns, "grow-0", &volumes, &volume, 80, 512).await;
    let usage_before_max = volume.usage();
    assert!(
        usage_before_max.used_bytes() > 256 * MIB,
        "the grown volume holds more than the first size: {usage_before_max}"
    );

    // 512Mi past 80 %: the maximum, no further growth.
    let rows = fill_to(&bed, &ns, &volume, 80);
    println!(
        "autogrow: {rows} more rows; at the maximum: {}",
        volume.usage()
    );
    let (_, _, message) =
        wait_auto_grow(&bed, &ns, "grow", "False", Some("AtMaximum"), GROW_WAIT).await;
    println!("autogrow: StorageAutoGrow False AtMaximum: {message}");
    assert_eq!(requested(&bed, &ns, "data-grow-0").await, 512 * MIB);
    assert_eq!(
        volumes.resizes_of("data-grow-0").len(),
        2,
        "{:?}",
        volumes.resizes()
    );

    // Every write was acknowledged, and kept.
    let (acked, failed) = stop_ticker(&bed, &ns).await;
    assert!(failed.is_empty(), "failed writes:\n{failed}");
    let ticks = bed
        .psql_until_ok(
            &ns,
            "client",
            "postgres",
            "select count(*) from ticks",
            POD_WAIT,
        )
        .await;
    assert_eq!(
        ticks,
        acked.to_string(),
        "every acknowledged write is there"
    );
    println!(
        "autogrow: reaction (threshold crossed → claim patched): {:.1} s and {:.1} s; \
         {acked} writes during the test, none failed",
        first.as_secs_f64(),
        second.as_secs_f64()
    );
}

/// The database container's status in the pod.
fn postgres_status(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "postgres")
        .cloned()
}

#[tokio::test]
async fn a_full_volume_that_stopped_postgres_grows_and_postgres_comes_back() {
    let bed = testbed().await;
    let ns = bed.real_node_namespace("autogrow-full").await;
    let volumes = bed.sized_volumes(&ns).await;
    let _operator = bed.operator_for_real_node(&ns);
    let volume = volumes.add("data-full-0", EXPANDABLE_CLASS, 128).await;
    let manifest = |auto_grow| database("full", "128Mi", EXPANDABLE_CLASS, auto_grow);
    bed.apply_database(&ns, manifest(None)).await;
    bed.wait_for_phase(&ns, "full", Phase::Ready, READY_WAIT)
        .await;
    bed.psql_client(&ns, "client", "full", "full-credentials")
        .await;
    bed.psql_until_ok(
        &ns,
        "client",
        "postgres",
        "create table kept (id int primary key); \
         insert into kept select generate_series(1, 1000); \
         create table fill (id bigserial primary key, pad text not null)",
        READY_WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let restarts = |pod: &Pod| postgres_status(pod).map_or(0, |c| c.restart_count);
    let pod_before = pods.get("full-0").await.expect("the pod");

    // Inserts until one fails.
    let started = Instant::now();
    let mut acked_rows = 0;
    let chunk = 2000;
    let (failure, failed_at) = loop {
        let usage = volume.usage();
        let (ok, _, err) = bed.psql(&ns, "client", "postgres", &fill_sql(chunk));
        if !ok {
            break (err, usage);
        }
        acked_rows += chunk;
        assert!(
            acked_rows < 200_000,
            "no write failed on a 128Mi volume: {}",
            volume.usage()
        );
    };
    println!(
        "autogrow: {acked_rows} rows acknowledged in {:.1} s; the next insert (at {failed_at}) \
         failed: {}",
        started.elapsed().as_secs_f64(),
        failure.trim()
    );
    // A failed write need not stop the server (a table that cannot grow is an ERROR); WAL
    // that cannot grow does. Retained WAL is what fills volumes in the field: WAL-only writes.
    let mut wal_writes = 0;
    loop {
        let pod = pods.get("full-0").await.expect("the pod");
        if restarts(&pod) > restarts(&pod_before) || !pod_ready(&pod) {
            break;
        }
        let (ok, _, err) = bed.psql(
            &ns,
            "client",
            "postgres",
            "select pg_logical_emit_message(true, 'dbop-e2e-fill', repeat('x', 4194304))",
        );
        wal_writes += 1;
        if !ok {
            println!(
                "autogrow: WAL-only write {wal_writes} failed at {}: {}",
                volume.usage(),
                err.trim()
            );
        }
        assert!(
            wal_writes < 100,
            "the server never stopped: {}",
            volume.usage()
        );
        if !ok {
            // Give the server a moment to go down, or write again.
            let down = wait_until_or_none(Duration::from_secs(10), || async {
                let pod = pods.get("full-0").await.ok()?;
                (restarts(&pod) > restarts(&pod_before) || !pod_ready(&pod)).then_some(())
            })
            .await;
            if down.is_some() {
                break;
            }
        }
    }
    // Down, and not coming back by itself: the container terminated.
    let terminated = wait_until("the database container terminated", POD_WAIT, || async {
        let pod = pods.get("full-0").await.ok()?;
        let status = postgres_status(&pod)?;
        let last = status.last_state?.terminated?;
        (status.restart_count > restarts(&pod_before)).then_some(last)
    })
    .await;
    let (_, previous, _) =
        bed.kubectl(&["-n", &ns, "logs", "full-0", "-c", "postgres", "--previous"]);
    let server_log: Vec<&str> = previous
        .lines()
        .filter(|l| {
            l.contains("PANIC")
                || l.contains("FATAL")
                || l.contains("exited")
                || l.contains("shutting down")
        })
        .collect();
    println!(
        "autogrow: full at {}: the container terminated ({} exit {}): {:?}\n  server log: {server_log:#?}",
        volume.usage(),
        terminated.reason.as_deref().unwrap_or_default(),
        terminated.exit_code,
        terminated.message.as_deref().unwrap_or_default()
    );
    let message = terminated.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("volume-full: "),
        "the termination message says the volume is full: {message:?}"
    );

    // Deep enough in its crash back-off that a pod Ready again soon after the growth is one dbop
    // replaced, not one the kubelet happened to restart meanwhile: the back-off doubles from
    // 10 s, so after a second restart the next waits 40 s. (A run that set autoGrow during the
    // first, 10 s back-off saw the kubelet restart it 3.9 s after the growth, before dbop did.)
    wait_until("full-0 in a 40 s crash back-off", READY_WAIT, || async {
        let pod = pods.get("full-0").await.ok()?;
        let status = postgres_status(&pod)?;
        let waiting = status.state?.waiting?;
        let backing_off = waiting.reason.as_deref() == Some("CrashLoopBackOff");
        (backing_off && status.restart_count >= restarts(&pod_before) + 2).then_some(())
    })
    .await;

    // autoGrow set: the claim grows, the server comes back and takes writes.
    let patched = Instant::now();
    bed.apply_database(
        &ns,
        manifest(Some(json!({"increment": "64Mi", "maximum": "256Mi"}))),
    )
    .await;
    let resize = wait_until("the full claim grown", GROW_WAIT, || async {
        volumes.resizes_of("data-full-0").first().cloned()
    })
    .await;
    assert_eq!(resize.to_bytes, 192 * MIB, "{resize:?}");
    let grown = Instant::now();
    let pod = wait_until("full-0 Ready again", READY_WAIT, || async {
        let pod = pods.get("full-0").await.ok()?;
        pod_ready(&pod).then_some(pod)
    })
    .await;
    let ready = Instant::now();
    bed.wait_for_phase(&ns, "full", Phase::Ready, READY_WAIT)
        .await;
    println!(
        "autogrow: autoGrow set → claim asked for {} in {:.1} s → the pod Ready {:.1} s later \
         ({}; restarts {}); now {}",
        resize.request,
        resize.seen.saturating_duration_since(patched).as_secs_f64(),
        ready.saturating_duration_since(grown).as_secs_f64(),
        if pod.metadata.uid == pod_before.metadata.uid {
            "the same pod"
        } else {
            "a new pod"
        },
        restarts(&pod),
        volume.usage()
    );
    // dbop replaced the crash-looping pod once the volume had grown, rather than leave it to its
    // back-off (up to five minutes).
    assert_ne!(
        pod.metadata.uid, pod_before.metadata.uid,
        "the pod stopped on the full volume was not replaced"
    );
    bed.psql_until_ok(
        &ns,
        "client",
        "postgres",
        "insert into kept values (1001)",
        READY_WAIT,
    )
    .await;
    let kept = bed
        .psql_until_ok(
            &ns,
            "client",
            "postgres",
            "select count(*) from kept",
            POD_WAIT,
        )
        .await;
    assert_eq!(
        kept, "1001",
        "the rows from before the fill, and the new one"
    );
    let filled: u64 = bed
        .psql_until_ok(
            &ns,
            "client",
            "postgres",
            "select count(*) from fill",
            POD_WAIT,
        )
        .await
        .parse()
        .expect("a count");
    // The insert that failed may have committed unseen.
    assert!(
        filled == acked_rows || filled == acked_rows + chunk,
        "{filled} rows in fill, {acked_rows} acknowledged"
    );
}

#[tokio::test]
async fn a_class_without_expansion_says_it_cannot_grow() {
    let bed = testbed().await;
    let ns = bed.real_node_namespace("autogrow-fixed").await;
    let volumes = bed.sized_volumes(&ns).await;
    let _operator = bed.operator_for_real_node(&ns);
    volumes.add("data-fixed-0", FIXED_CLASS, 128).await;
    let auto_grow = json!({"maximum": "256Mi"});
    bed.apply_database(
        &ns,
        database("fixed", "128Mi", FIXED_CLASS, Some(auto_grow)),
    )
    .await;
    let (_, _, message) = wait_auto_grow(
        &bed,
        &ns,
        "fixed",
        "False",
        Some("CannotExpand"),
        READY_WAIT,
    )
    .await;
    println!("autogrow: StorageAutoGrow False CannotExpand: {message}");
    // Said before anything fills, maybe before the StatefulSet made the claim: it asks for the
    // spec's size, no more.
    let claims = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), &ns);
    wait_until("the claim made", READY_WAIT, || async {
        claims.get_opt("data-fixed-0").await.ok().flatten()
    })
    .await;
    assert_eq!(requested(&bed, &ns, "data-fixed-0").await, 128 * MIB);
    assert!(volumes.resizes().is_empty());
}

#[tokio::test]
async fn the_stand_in_resizer_grows_the_filesystem_the_pod_sees() {
    let bed = testbed().await;
    let ns = bed.real_node_namespace("autogrow-resizer").await;
    let volumes = bed.sized_volumes(&ns).await;
    let _operator = bed.operator_for_real_node(&ns);
    let volume = volumes.add("data-plain-0", EXPANDABLE_CLASS, 128).await;
    bed.apply_database(&ns, database("plain", "128Mi", EXPANDABLE_CLASS, None))
        .await;
    bed.wait_for_phase(&ns, "plain", Phase::Ready, READY_WAIT)
        .await;
    assert_eq!(pod_df_size(&bed, &ns, "plain-0"), 128 * MIB);
    let before: Usage = volume.usage();

    // The size raised by hand: dbop asks the claim for it, the resizer grows the volume.
    bed.apply_database(&ns, database("plain", "192Mi", EXPANDABLE_CLASS, None))
        .await;
    let resize = wait_until("the claim grown", GROW_WAIT, || async {
        volumes.resizes_of("data-plain-0").first().cloned()
    })
    .await;
    assert_eq!((resize.from_bytes, resize.to_bytes), (128 * MIB, 192 * MIB));
    assert_eq!(pod_df_size(&bed, &ns, "plain-0"), 192 * MIB);
    let after = volume.usage();
    assert_eq!(after.size_bytes, 192 * MIB);
    assert!(
        after.used_bytes().abs_diff(before.used_bytes()) < 32 * MIB,
        "the data is still there: {before} → {after}"
    );
    let pv = Api::<PersistentVolume>::all(bed.client.clone())
        .get(&volume.pv)
        .await
        .expect("the PersistentVolume");
    let capacity = pv.spec.and_then(|s| s.capacity?.get("storage").cloned());
    assert_eq!(
        capacity.map(|q| quantity_bytes(&q.0).unwrap()),
        Some(192 * MIB)
    );
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), &ns)
        .get("data-plain-0")
        .await
        .expect("the claim");
    let status = pvc.status.expect("the claim's status");
    let capacity = status.capacity.and_then(|c| c.get("storage").cloned());
    assert_eq!(
        capacity.map(|q| quantity_bytes(&q.0).unwrap()),
        Some(192 * MIB)
    );
    assert!(
        status
            .allocated_resource_statuses
            .is_none_or(|s| s.is_empty()),
        "no resize left in progress"
    );
    // dbop sees the expansion done.
    let dbs = bed.databases(&ns);
    wait_until("StorageReady True", GROW_WAIT, || async {
        let db = dbs.get("plain").await.ok()?;
        (condition(&db, "StorageReady")?.0 == "True").then_some(())
    })
    .await;
    println!(
        "autogrow: by hand 128Mi → 192Mi: resized {:.2} s after the claim asked; df in the pod {}",
        resize.took.as_secs_f64(),
        after
    );
}
