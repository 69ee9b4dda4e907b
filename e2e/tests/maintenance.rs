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
