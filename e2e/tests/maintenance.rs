//! Maintenance windows on kwok, across an operator upgrade (the real `dbop run` binary, stopped
//! and started again with another instance-manager image, as a `helm upgrade` does):
//! - a Database whose window is closed keeps its pods' template — the new operator's instance
//!   manager and then a restart-needing parameter wait, and `MaintenancePending` says what and
//!   when — until its window is moved to now, when both roll out at once;
//! - a Database whose window is open takes the new instance manager straight away;
//! - a Database without a window keeps its template (the operator upgrade restarts nothing);
//! - an upgrade marked `inMaintenanceWindow` does not start while its window is closed, and
//!   starts when it opens;
//! - a window the schema cannot judge (an unknown time zone) holds everything and says what to
//!   fix; what the schema can judge it refuses.

use chrono::{TimeDelta, Utc};
use dbop::api::Phase;
use dbop_e2e::{TestBed, WAIT, condition, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const OLD_AGENT: &str = "dbop.local/dbop:maintenance-old";
const NEW_AGENT: &str = "dbop.local/dbop:maintenance-new";

/// A daily window that opens twelve hours from now: closed for the whole test.
fn closed_window() -> Value {
    let start = (Utc::now() + TimeDelta::hours(12))
        .format("%H:%M")
        .to_string();
    json!({"start": start, "duration": "1h", "timeZone": "Europe/Berlin"})
}

/// A daily window a week long: always open.
fn open_window() -> Value {
    json!({"start": "00:00", "duration": "7d"})
}

/// The pod template's image for the init container that copies dbop's binaries, and its
/// restart-needing parameters.
async fn template(bed: &TestBed, ns: &str, name: &str) -> (String, String) {
    let sets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), ns);
    let sts = sets.get(name).await.expect("the StatefulSet");
    let template = sts.spec.template;
    let copy = template.spec.unwrap().init_containers.unwrap()[0]
        .image
        .clone()
        .unwrap();
    let restart = template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("dbop.dev/restart-parameters").cloned())
        .unwrap_or_default();
    (copy, restart)
}

fn message(db: &dbop::api::Database, type_: &str) -> String {
    db.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

async fn patch_spec(bed: &TestBed, ns: &str, name: &str, spec: Value) {
    bed.databases(ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the Database");
}

/// Waits until `name`'s `MaintenancePending` has `reason` and a message containing `needle`.
async fn wait_pending(bed: &TestBed, ns: &str, name: &str, reason: &str, needle: &str) -> String {
    let what = format!("{name}: MaintenancePending {reason} with {needle:?}");
    wait_until(&what, WAIT, || async {
        let db = bed.databases(ns).get(name).await.ok()?;
        let (_, r) = condition(&db, "MaintenancePending")?;
        let m = message(&db, "MaintenancePending");
        (r == reason && m.contains(needle)).then_some(m)
    })
    .await
}

async fn event_reasons(bed: &TestBed, ns: &str, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(bed.client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("events");
    list.items.into_iter().filter_map(|e| e.reason).collect()
}

/// Waits for an Event of `reason` about `name`.
async fn wait_event(bed: &TestBed, ns: &str, name: &str, reason: &str) {
    wait_until(&format!("a {reason} Event for {name}"), WAIT, || async {
        event_reasons(bed, ns, name)
            .await
            .iter()
            .any(|r| r == reason)
            .then_some(())
    })
    .await
}

#[tokio::test]
async fn changes_that_restart_pods_wait_for_the_window_across_an_operator_upgrade() {
    let bed = testbed().await;
    let ns = bed.namespace("maint").await;
    let old = bed.operator_binary_with_env(&ns, &[("DBOP_AGENT_IMAGE", OLD_AGENT)]);
    let parameters = |value: &str| json!({"parameters": {"shared_buffers": value}});
    let databases = [
        (
            "held",
            json!({"maintenanceWindow": closed_window(), "postgresql": parameters("32MB")}),
        ),
        ("open", json!({"maintenanceWindow": open_window()})),
        ("plain", json!({})),
    ];
    for (name, extra) in &databases {
        bed.apply_database(&ns, database_manifest(name, extra.clone()))
            .await;
    }
    for (name, _) in &databases {
        bed.wait_for_phase(&ns, name, Phase::Ready, WAIT).await;
        assert_eq!(template(&bed, &ns, name).await.0, OLD_AGENT, "{name}");
    }
    let (_, held_parameters) = template(&bed, &ns, "held").await;
    assert!(held_parameters.contains("32MB"), "{held_parameters}");
    let plain = bed.databases(&ns).get("plain").await.unwrap();
    assert_eq!(condition(&plain, "MaintenancePending"), None);

    // The operator upgrade.
    drop(old);
    let _new = bed.operator_binary_with_env(&ns, &[("DBOP_AGENT_IMAGE", NEW_AGENT)]);
    wait_until(
        "the open window's pods take the new instance manager",
        WAIT,
        || async { (template(&bed, &ns, "open").await.0 == NEW_AGENT).then_some(()) },
    )
    .await;
    let waiting = wait_pending(
        &bed,
        &ns,
        "held",
        "WaitingForMaintenanceWindow",
        "the instance manager of",
    )
    .await;
    assert!(
        waiting.contains(NEW_AGENT) && waiting.contains("which opens"),
        "{waiting}"
    );
    // The new operator has passed over both by now: neither changed.
    assert_eq!(template(&bed, &ns, "held").await.0, OLD_AGENT);
    assert_eq!(template(&bed, &ns, "plain").await.0, OLD_AGENT);

    // A restart-needing parameter waits too, named.
    patch_spec(&bed, &ns, "held", json!({"postgresql": parameters("48MB")})).await;
    let waiting = wait_pending(
        &bed,
        &ns,
        "held",
        "WaitingForMaintenanceWindow",
        "a restart for shared_buffers",
    )
    .await;
    assert!(waiting.contains("the instance manager of"), "{waiting}");
    assert_eq!(
        template(&bed, &ns, "held").await,
        (OLD_AGENT.to_string(), held_parameters.clone())
    );
    wait_event(&bed, &ns, "held", "MaintenanceWaiting").await;

    // Moving the window to another closed hour releases nothing.
    let later = (Utc::now() + TimeDelta::hours(18))
        .format("%H:%M")
        .to_string();
    let moved = json!({"start": later, "duration": "1h", "timeZone": "Europe/Berlin"});
    patch_spec(&bed, &ns, "held", json!({"maintenanceWindow": moved})).await;
    let generation = bed
        .databases(&ns)
        .get("held")
        .await
        .unwrap()
        .metadata
        .generation;
    wait_until("the operator saw the moved window", WAIT, || async {
        let db = bed.databases(&ns).get("held").await.ok()?;
        (db.status?.observed_generation == generation).then_some(())
    })
    .await;
    assert_eq!(
        template(&bed, &ns, "held").await,
        (OLD_AGENT.to_string(), held_parameters.clone())
    );

    // The window moves to now: both roll out together.
    patch_spec(
        &bed,
        &ns,
        "held",
        json!({"maintenanceWindow": open_window()}),
    )
    .await;
    let (copy, restart) = wait_until("the held changes roll out", WAIT, || async {
        let now = template(&bed, &ns, "held").await;
        (now.0 == NEW_AGENT).then_some(now)
    })
    .await;
    assert_eq!(copy, NEW_AGENT);
    assert!(restart.contains("48MB"), "{restart}");
    wait_pending(&bed, &ns, "held", "WindowOpen", "open until").await;
    wait_event(&bed, &ns, "held", "MaintenanceWindowOpened").await;
    // No window: the operator upgrade still restarted nothing.
    assert_eq!(template(&bed, &ns, "plain").await.0, OLD_AGENT);
}

#[tokio::test]
async fn an_upgrade_marked_for_the_window_starts_only_in_it() {
    let bed = testbed().await;
    let ns = bed.namespace("maint-up").await;
    let _operator = bed.operator_binary(&ns);
    let extra = json!({
        "maintenanceWindow": closed_window(),
        "upgrade": {"inMaintenanceWindow": true, "preUpgradeBackup": false},
    });
    bed.apply_database(&ns, database_manifest("orders", extra))
        .await;
    bed.wait_for_phase(&ns, "orders", Phase::Ready, WAIT).await;
    patch_spec(&bed, &ns, "orders", json!({"version": "16.6"})).await;
    wait_until("the upgrade waits for the window", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        let upgrading = condition(&db, "Upgrading")?;
        (upgrading == ("False".into(), "WaitingForMaintenanceWindow".into())).then_some(())
    })
    .await;
    let waiting = wait_pending(
        &bed,
        &ns,
        "orders",
        "WaitingForMaintenanceWindow",
        "the upgrade to 16.6",
    )
    .await;
    assert!(waiting.contains("which opens"), "{waiting}");
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), &ns);
    let db = bed.databases(&ns).get("orders").await.unwrap();
    assert_eq!(db.status.as_ref().unwrap().upgrade, None);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|j| {
                !j.metadata
                    .name
                    .as_deref()
                    .unwrap_or("")
                    .contains("preflight")
            }),
        "no preflight Job while the window is closed"
    );

    patch_spec(
        &bed,
        &ns,
        "orders",
        json!({"maintenanceWindow": open_window()}),
    )
    .await;
    wait_until("the upgrade starts in the window", WAIT, || async {
        let db = bed.databases(&ns).get("orders").await.ok()?;
        let upgrade = db.status?.upgrade?;
        (upgrade.to == "16.6").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_window_that_cannot_be_read_holds_and_says_what_to_fix() {
    let bed = testbed().await;
    let ns = bed.namespace("maint-bad").await;
    let _operator = bed.operator_binary(&ns);

    // What the schema can judge, it refuses.
    for (window, upgrade, needle) in [
        (
            Some(json!({"start": "25:00", "duration": "1h"})),
            None,
            "start",
        ),
        (
            Some(json!({"start": "02:00", "duration": "2 hours"})),
            None,
            "duration",
        ),
        (
            None,
            Some(json!({"inMaintenanceWindow": true})),
            "needs spec.maintenanceWindow",
        ),
    ] {
        let mut extra = json!({});
        if let Some(window) = window {
            extra["maintenanceWindow"] = window;
        }
        if let Some(upgrade) = upgrade {
            extra["upgrade"] = upgrade;
        }
        let refused = bed
            .try_apply_database(&ns, database_manifest("refused", extra))
            .await
            .expect_err("the API server refuses it");
        assert!(refused.contains(needle), "{refused}");
    }

    let window = json!({"start": "02:00", "duration": "2h", "timeZone": "Mars/Olympus"});
    bed.apply_database(
        &ns,
        database_manifest("mars", json!({"maintenanceWindow": window})),
    )
    .await;
    let said = wait_pending(
        &bed,
        &ns,
        "mars",
        "InvalidMaintenanceWindow",
        "Mars/Olympus",
    )
    .await;
    assert!(said.contains("IANA time zone"), "{said}");
    // It still runs: only restarts wait.
    bed.wait_for_phase(&ns, "mars", Phase::Ready, WAIT).await;
    wait_event(&bed, &ns, "mars", "InvalidMaintenanceWindow").await;
}

/// The release marker on `name`'s StatefulSet: its state (`rolling`, `done`, `failed`) and the
/// release it belongs to.
async fn release_marker(bed: &TestBed, ns: &str, name: &str) -> Option<(String, String)> {
    let sets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), ns);
    let sts = sets.get(name).await.ok()?;
    let text = sts.metadata.annotations?.get("dbop.dev/release")?.clone();
    let marker: Value = serde_json::from_str(&text).ok()?;
    Some((
        marker["state"].as_str()?.to_string(),
        marker["release"].as_str()?.to_string(),
    ))
}

/// When each of `name`'s release Events happened (reason → time), from events.k8s.io.
async fn release_event_times(
    bed: &TestBed,
    ns: &str,
    name: &str,
) -> Vec<(String, chrono::DateTime<Utc>)> {
    let events: Api<Event> = Api::namespaced(bed.client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("events");
    list.items
        .into_iter()
        .filter_map(|e| {
            let reason = e.reason?;
            let at = e.event_time?.0;
            let at = chrono::DateTime::from_timestamp_micros(at.as_microsecond())?;
            reason.starts_with("Release").then_some((reason, at))
        })
        .collect()
}

/// The most Databases restarting onto a release at once, from each one's `ReleaseStarted` and
/// `ReleaseFinished` Events (panics when one lacks either).
async fn most_at_once(bed: &TestBed, ns: &str, names: &[&str], release: &str) -> usize {
    let mut edges = Vec::new();
    for name in names {
        let times = release_event_times(bed, ns, name).await;
        let at = |reason: &str| {
            times
                .iter()
                .filter(|(r, _)| r == reason)
                .map(|(_, t)| *t)
                .max()
                .unwrap_or_else(|| panic!("{name}: no {reason} Event for {release}: {times:?}"))
        };
        // A start sorts before a finish at the same instant: overlaps are never hidden.
        edges.push((at("ReleaseStarted"), 0, 1i32));
        edges.push((at("ReleaseFinished"), 1, -1i32));
    }
    edges.sort();
    let mut now = 0;
    let mut most = 0;
    for (_, _, change) in edges {
        now += change;
        most = most.max(now);
    }
    most as usize
}

/// An operator upgrade with six Databases and a wave of two: the four in an open window restart
/// onto the new instance manager two at a time (never more, by the markers watched throughout
/// and by their Events), one whose window is closed and one without a window keep theirs; an
/// urgent release then takes both, still in waves.
#[tokio::test]
async fn an_operator_release_restarts_databases_in_waves_inside_their_windows() {
    const NEWER_AGENT: &str = "dbop.local/dbop:maintenance-newer";
    let bed = testbed().await;
    let ns = bed.namespace("waves").await;
    let old = bed.operator_binary_with_env(&ns, &[("DBOP_AGENT_IMAGE", OLD_AGENT)]);
    let windowed = ["w1", "w2", "w3", "w4"];
    for name in windowed {
        let extra = json!({"maintenanceWindow": open_window()});
        bed.apply_database(&ns, database_manifest(name, extra))
            .await;
    }
    let closed = json!({"maintenanceWindow": closed_window()});
    bed.apply_database(&ns, database_manifest("closed", closed))
        .await;
    bed.apply_database(&ns, database_manifest("plain", json!({})))
        .await;
    let everyone = ["w1", "w2", "w3", "w4", "closed", "plain"];
    for name in everyone {
        bed.wait_for_phase(&ns, name, Phase::Ready, WAIT).await;
        assert_eq!(template(&bed, &ns, name).await.0, OLD_AGENT, "{name}");
    }

    drop(old);
    let wave = [("DBOP_RELEASE_WAVE", "2")];
    let new = bed.operator_binary_with_env(&ns, &[("DBOP_AGENT_IMAGE", NEW_AGENT), wave[0]]);
    let most_rolling = std::sync::atomic::AtomicUsize::new(0);
    wait_until("the windowed Databases take the release", WAIT, || async {
        let mut rolling = 0;
        let mut done = 0;
        for name in windowed {
            match release_marker(&bed, &ns, name).await {
                Some((state, _)) if state == "rolling" => rolling += 1,
                Some((state, _)) if state == "done" => done += 1,
                _ => {}
            }
        }
        most_rolling.fetch_max(rolling, std::sync::atomic::Ordering::Relaxed);
        (done == windowed.len()).then_some(())
    })
    .await;
    let most_rolling = most_rolling.into_inner();
    assert!(
        most_rolling <= 2,
        "{most_rolling} Databases restarted at once"
    );
    assert!(
        most_at_once(&bed, &ns, &windowed, NEW_AGENT).await <= 2,
        "the Events show more than two Databases restarting at once"
    );
    for name in windowed {
        assert_eq!(template(&bed, &ns, name).await.0, NEW_AGENT, "{name}");
        bed.wait_for_phase(&ns, name, Phase::Ready, WAIT).await;
    }
    for name in ["closed", "plain"] {
        assert_eq!(template(&bed, &ns, name).await.0, OLD_AGENT, "{name}");
        assert_eq!(release_marker(&bed, &ns, name).await, None, "{name}");
    }

    // An urgent release: outside windows too, still two at a time.
    drop(new);
    let _newer = bed.operator_binary_with_env(
        &ns,
        &[
            ("DBOP_AGENT_IMAGE", NEWER_AGENT),
            wave[0],
            ("DBOP_RELEASE_URGENT", "true"),
        ],
    );
    wait_until("every Database takes the urgent release", WAIT, || async {
        for name in everyone {
            if template(&bed, &ns, name).await.0 != NEWER_AGENT {
                return None;
            }
            let (state, release) = release_marker(&bed, &ns, name).await?;
            (state == "done" && release.ends_with(NEWER_AGENT)).then_some(())?;
        }
        Some(())
    })
    .await;
    assert!(
        most_at_once(&bed, &ns, &everyone, NEWER_AGENT).await <= 2,
        "the Events show more than two Databases restarting at once"
    );
}

/// A release whose instance manager never gets a pod ready (`never-ready` in its image: the
/// test bed's kwok keeps such pods unready): the first Database to take it is not healthy within
/// the timeout, is rolled back to the template it had and serves again, and the release stops —
/// the others keep theirs and say why, with Events.
#[tokio::test]
async fn a_release_that_fails_on_one_database_is_rolled_back_and_stops() {
    const BROKEN_AGENT: &str = "dbop.local/dbop:never-ready";
    let bed = testbed().await;
    let ns = bed.namespace("waves-fail").await;
    let old = bed.operator_binary_with_env(&ns, &[("DBOP_AGENT_IMAGE", OLD_AGENT)]);
    let names = ["f1", "f2", "f3"];
    for name in names {
        let extra = json!({"maintenanceWindow": open_window()});
        bed.apply_database(&ns, database_manifest(name, extra))
            .await;
    }
    for name in names {
        bed.wait_for_phase(&ns, name, Phase::Ready, WAIT).await;
    }
    drop(old);
    let _broken = bed.operator_binary_with_env(
        &ns,
        &[
            ("DBOP_AGENT_IMAGE", BROKEN_AGENT),
            ("DBOP_RELEASE_TIMEOUT", "30"),
        ],
    );
    let failed = wait_until("the release fails on one Database", WAIT, || async {
        for name in names {
            if let Some((state, _)) = release_marker(&bed, &ns, name).await
                && state == "failed"
            {
                return Some(name);
            }
        }
        None
    })
    .await;
    // Rolled back: the old template, serving again.
    wait_until(
        "the failed Database is back on its template",
        WAIT,
        || async { (template(&bed, &ns, failed).await.0 == OLD_AGENT).then_some(()) },
    )
    .await;
    bed.wait_for_phase(&ns, failed, Phase::Ready, WAIT).await;
    wait_event(&bed, &ns, failed, "ReleaseFailed").await;
    // The others never started, and say why.
    for name in names.iter().filter(|n| **n != failed) {
        let said = wait_until(
            &format!("{name} says the release stopped"),
            WAIT,
            || async {
                let db = bed.databases(&ns).get(name).await.ok()?;
                let (_, reason) = condition(&db, "ReleasePending")?;
                (reason == "ReleasePaused").then(|| message(&db, "ReleasePending"))
            },
        )
        .await;
        assert!(said.contains(failed), "{said}");
        assert_eq!(template(&bed, &ns, name).await.0, OLD_AGENT, "{name}");
        assert_eq!(release_marker(&bed, &ns, name).await, None, "{name}");
        wait_event(&bed, &ns, name, "ReleasePaused").await;
    }
}
