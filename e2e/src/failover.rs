//! The waits and checks of the failover suites (failover.rs, node_loss.rs) and of the HA
//! benchmark: which instance the status names primary, a wait for a new one that accepts
//! writes (with what the operator said when none came), and a writer in a client pod that keeps
//! its own log of acknowledged commits, to check that none is lost.

use std::time::Duration;

use crate::{TestBed, wait_until, wait_until_or_none};

/// From a primary's loss to a promoted standby: the Lease's 10 s, the operator's look, the
/// promotion; generous for a loaded machine (the benchmark measures it, not this test).
pub const FAILOVER_WAIT: Duration = Duration::from_secs(120);

/// The primary the status names.
pub async fn named_primary(bed: &TestBed, ns: &str, name: &str) -> Option<String> {
    bed.databases(ns).get(name).await.ok()?.status?.primary
}

/// Waits until the status of Database `name` names a primary other than `old`, which accepts
/// writes.
pub async fn new_primary(bed: &TestBed, ns: &str, name: &str, old: &str) -> String {
    new_primary_within(bed, ns, name, old, FAILOVER_WAIT).await
}

/// `new_primary`, waiting up to `within` for the status to name it.
pub async fn new_primary_within(
    bed: &TestBed,
    ns: &str,
    name: &str,
    old: &str,
    within: Duration,
) -> String {
    let replaced = wait_until_or_none(within, || async {
        named_primary(bed, ns, name).await.filter(|p| p != old)
    })
    .await;
    let Some(primary) = replaced else {
        panic!(
            "timed out after {within:?} waiting for a primary other than {old}; {}",
            why_no_failover(bed, ns, name).await
        );
    };
    wait_until(&format!("{primary} promoted"), FAILOVER_WAIT, || async {
        let (ok, out, _) = bed.local_psql(ns, &primary, "select pg_is_in_recovery()");
        (ok && out.trim() == "f").then_some(())
    })
    .await;
    primary
}

/// What the operator said while no failover (or no end of a rollout) came: the Database's
/// conditions, its Events, the primary Lease, and the last lines its pods' containers logged (now
/// and before their last restart).
pub async fn why_no_failover(bed: &TestBed, ns: &str, name: &str) -> String {
    let conditions = bed
        .databases(ns)
        .get(name)
        .await
        .ok()
        .and_then(|db| db.status)
        .map(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>();
    let (_, events, _) = bed.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--sort-by=.lastTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.lastTimestamp} {.reason} {.message}{\"\\n\"}{end}",
    ]);
    let (_, lease, _) = bed.kubectl(&[
        "get",
        "lease",
        "-n",
        ns,
        &format!("{name}-primary"),
        "-o",
        "yaml",
    ]);
    let selector = format!("app.kubernetes.io/instance={name}");
    let (_, pods, _) = bed.kubectl(&["get", "pods", "-n", ns, "-l", &selector, "-o", "name"]);
    let mut logs = String::new();
    for pod in pods.lines() {
        for previous in ["--previous=true", "--previous=false"] {
            let (_, out, err) = bed.kubectl(&["logs", "-n", ns, pod, "--tail=30", previous]);
            logs.push_str(&format!("{pod} ({previous}):\n{out}{err}\n"));
        }
    }
    format!("conditions: {conditions:#?}\nevents:\n{events}\nlease:\n{lease}\n{logs}")
}

/// The writer in the client pod: one insert through `-rw` per connection, each acknowledged id
/// appended to its own log, until the stop file exists.
const WRITER: &str = r#"i=0; while [ ! -f /tmp/stop ]; do i=$((i+1)); if psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "insert into acked values ($i)" >/dev/null 2>&1; then echo $i >> /tmp/acked; fi; done"#;

/// Starts the writer in the client pod `client` (made by `TestBed::psql_client`, whose
/// connection settings name `-rw`), in the background.
pub fn start_acked_writer(bed: &TestBed, ns: &str) {
    let background = format!(
        "nohup sh -c '{}' >/dev/null 2>&1 &",
        WRITER.replace('\'', "'\\''")
    );
    let (ok, _, err) = bed.exec(ns, "client", &["sh", "-c", &background]);
    assert!(ok, "starting the writer: {err}");
}

/// The ids the writer saw acknowledged, in order.
pub async fn acked(bed: &TestBed, ns: &str) -> Vec<u32> {
    let (_, out, _) = bed.exec(ns, "client", &["sh", "-c", "cat /tmp/acked 2>/dev/null"]);
    out.lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .collect()
}

/// Waits until the writer has `more` acknowledged commits beyond those it has now.
pub async fn more_acknowledged(bed: &TestBed, ns: &str, more: usize, within: Duration) {
    let before = acked(bed, ns).await.len();
    wait_until(
        &format!("{more} more acknowledged writes"),
        within,
        || async { (acked(bed, ns).await.len() >= before + more).then_some(()) },
    )
    .await;
}

/// Stops the writer and checks that every commit it saw acknowledged is on `primary`.
pub async fn every_acknowledged_commit_is_on(bed: &TestBed, ns: &str, primary: &str) {
    bed.exec(ns, "client", &["sh", "-c", "touch /tmp/stop"]);
    let acknowledged = acked(bed, ns).await;
    let present: std::collections::BTreeSet<u32> = bed
        .local_ok(ns, primary, "select id from acked")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged commits missing on {primary}: {lost:?}"
    );
}
