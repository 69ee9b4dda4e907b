//! Where a StatefulSet's pod template came from, so that upgrading the operator restarts no
//! database.
//!
//! A pod template is a function of two things: the Database (its spec, the image and version
//! the upgrade chose, the restart annotation) and the operator that built it (its builders and
//! its own image, which the `copy-dbop-instance` init container runs). A new operator version
//! changes the second for every Database at once; rebuilding every template then would restart
//! every database together. So each StatefulSet records both in annotations, and a template
//! built by another operator from the inputs the Database still has is kept as it is: the
//! pods keep their instance manager until the Database's next rollout (a spec change, a version
//! upgrade, or `dbop.dev/restartedAt`), which then builds the template anew.
//!
//! A Database with a maintenance window (`crate::maintenance`) takes another operator's
//! template in its window instead, and outside it also holds back the other changes that
//! restart pods and are not urgent ([`TemplateChoice::Hold`]).
//!
//! Pure: functions of the Database, the observed StatefulSet's record, the operator's settings
//! and the window's gate.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::{Map, Value};

use crate::api::{Database, DatabaseSpec};
use crate::maintenance::Gate;
use crate::settings::Settings;

/// The operator that built the pod template: its version and the image its pods copy dbop's
/// binaries from.
pub const BUILT_BY_ANNOTATION: &str = "dbop.dev/template-built-by";
/// The inputs the pod template was built from: the Database's spec (without the parts that
/// cannot change a pod), the image and version it runs, the restart annotation. JSON.
pub const INPUTS_ANNOTATION: &str = "dbop.dev/template-inputs";
/// On a Database: set it (to a timestamp, say) to restart its pods one by one, which also
/// moves them to the running operator's instance manager. Copied into the pod template.
pub const RESTARTED_AT_ANNOTATION: &str = "dbop.dev/restartedAt";

/// Spec fields that build no part of the pod template: a change to one of them is not a reason
/// to rebuild it (the claim templates are kept verbatim, and storage grows by expanding claims;
/// the roles reach the pods through the accounts Secret; a NetworkPolicy is an object of its own;
/// the maintenance window decides when a template is rebuilt, it is not part of one).
const NOT_IN_THE_TEMPLATE: [&str; 10] = [
    "application",
    "backup",
    "bootstrap",
    "deletionPolicy",
    "init",
    "maintenanceWindow",
    "networkPolicy",
    "roles",
    "storage",
    "upgrade",
];

/// What the pods run, as the template records it (`statefulset::PodRun` without its partition,
/// which is not part of the template).
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    pub image: &'a str,
    pub version: &'a str,
}

/// Who builds templates in this process.
pub fn builder(settings: &Settings) -> String {
    format!(
        "dbop/{} {}",
        env!("CARGO_PKG_VERSION"),
        settings.agent_image
    )
}

/// The recorded inputs of a template built now for `db` running `run`.
fn recorded_inputs(db: &Database, run: Run<'_>) -> Value {
    let mut spec = serde_json::to_value(&db.spec).unwrap_or(Value::Null);
    if let Some(fields) = spec.as_object_mut() {
        // Inline init SQL can be long and builds no pod.
        fields.remove("init");
    }
    serde_json::json!({
        "spec": spec,
        "image": run.image,
        "version": run.version,
        "restartedAt": restarted_at(db),
    })
}

/// The Database's restart request, if any.
pub fn restarted_at(db: &Database) -> Option<String> {
    db.metadata
        .annotations
        .as_ref()?
        .get(RESTARTED_AT_ANNOTATION)
        .cloned()
}

/// The part of recorded inputs that builds the pod template, read with this operator's types
/// (so an operator that serialises the spec differently still compares what it means). None
/// when the record cannot be read.
fn template_inputs(recorded: &Value) -> Option<Value> {
    let spec: DatabaseSpec = serde_json::from_value(recorded.get("spec")?.clone()).ok()?;
    let mut spec = serde_json::to_value(spec).ok()?;
    let fields = spec.as_object_mut()?;
    for field in NOT_IN_THE_TEMPLATE {
        fields.remove(field);
    }
    // `tls.allowPlaintext` reaches the pods by a reload; `tls.serverCertificate` is a volume.
    if let Some(tls) = fields.get_mut("tls").and_then(Value::as_object_mut) {
        tls.remove("allowPlaintext");
        if tls.is_empty() {
            fields.remove("tls");
        }
    }
    Some(canonical(serde_json::json!({
        "spec": spec,
        "image": recorded.get("image")?,
        "version": recorded.get("version")?,
        "restartedAt": recorded.get("restartedAt").cloned().unwrap_or(Value::Null),
    })))
}

/// Objects with sorted keys and without nulls, whatever the JSON map's ordering.
fn canonical(value: Value) -> Value {
    match value {
        Value::Object(fields) => {
            let mut sorted: Vec<(String, Value)> = fields
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, canonical(v)))
                .collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(sorted.into_iter().collect::<Map<String, Value>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// What the observed StatefulSet records about who built its pod template, and from what.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateRecord {
    /// [`BUILT_BY_ANNOTATION`] (None: the template has no record).
    pub built_by: Option<String>,
    /// The template-building part of [`INPUTS_ANNOTATION`] (None: absent or unreadable).
    inputs: Option<Value>,
}

impl TemplateRecord {
    pub fn of(sts: &StatefulSet) -> TemplateRecord {
        let annotations = sts.metadata.annotations.clone().unwrap_or_default();
        TemplateRecord {
            built_by: annotations.get(BUILT_BY_ANNOTATION).cloned(),
            inputs: annotations
                .get(INPUTS_ANNOTATION)
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
                .and_then(|value| template_inputs(&value)),
        }
    }
}

/// What to do with the pod template of the StatefulSet about to be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateChoice {
    /// Apply the template built now, recording this operator and these inputs.
    Build,
    /// Another operator built the observed template from the inputs the Database still has:
    /// keep it, and its record, as they are.
    Keep,
    /// The observed template has no record (an operator from before records existed built it,
    /// from the spec as it was then, which it applied on every pass): keep it, and record the
    /// inputs of now as its own.
    KeepAndRecord,
    /// The template built now differs only by changes that wait for the maintenance window:
    /// keep the observed one, and its record, until it opens.
    Hold(Held),
    /// Another operator built the observed template, and this operator's release restarts the
    /// Database now (the `release` module): apply the template built now, as `Build` does.
    Release,
}

impl TemplateChoice {
    /// The template built now is applied.
    pub fn builds(&self) -> bool {
        matches!(self, TemplateChoice::Build | TemplateChoice::Release)
    }
}

/// The changes a held template keeps from the pods (besides restart-needing parameters, which
/// `restart` names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The operator whose instance manager waits (another operator built the pods' template).
    pub instance_manager: Option<String>,
    /// The image that waits (the same version from another image).
    pub image: Option<String>,
}

impl Held {
    /// What waits, in words.
    pub fn describe(&self) -> Vec<String> {
        let manager = self
            .instance_manager
            .as_ref()
            .map(|by| format!("the instance manager of {by}"));
        let image = self.image.as_ref().map(|image| format!("image {image}"));
        manager.into_iter().chain(image).collect()
    }
}

/// Decides whether the template built now replaces the observed one, given the maintenance
/// window's `gate` and whether the operator's release may restart this Database now
/// (`release_turn`: its turn in the release's wave, the `release` module).
///
/// A window that is closed holds a new operator's instance manager, a new image for the same
/// version and a change of `spec.postgresql`; any other change of the template (a version,
/// resources, a restart request) is built now and carries them with it. Another operator's
/// template with nothing else changed is the release's to replace ([`TemplateChoice::Release`]):
/// in an open window, or anywhere for an urgent release, on the Database's turn; without a
/// window it otherwise waits for the Database's next rollout.
pub fn choose(
    observed: Option<&TemplateRecord>,
    db: &Database,
    run: Run<'_>,
    settings: &Settings,
    gate: &Gate,
    release_turn: bool,
) -> TemplateChoice {
    let Some(observed) = observed else {
        return TemplateChoice::Build;
    };
    let Some(built_by) = observed.built_by.as_ref() else {
        return TemplateChoice::KeepAndRecord;
    };
    let ours = *built_by == builder(settings);
    let (Some(recorded), Some(now)) = (
        observed.inputs.as_ref(),
        template_inputs(&recorded_inputs(db, run)),
    ) else {
        return TemplateChoice::Build;
    };
    let same = *recorded == now;
    if ours && same {
        // Our own template is rebuilt on every pass, so a hand edit is undone.
        return TemplateChoice::Build;
    }
    if !same && (!gate.holds() || without_deferrable(recorded) != without_deferrable(&now)) {
        return TemplateChoice::Build;
    }
    // What remains: another operator's template, or changes a closed window holds.
    let release_may_restart = gate.is_open() || (settings.release.urgent && !gate.is_invalid());
    if !ours && release_may_restart && release_turn {
        return TemplateChoice::Release;
    }
    if same && !gate.holds() {
        return TemplateChoice::Keep;
    }
    let image = (recorded.get("image") != now.get("image")).then(|| run.image.to_string());
    TemplateChoice::Hold(Held {
        instance_manager: (!ours).then(|| builder(settings)),
        image,
    })
}

/// Template inputs without what a maintenance window may hold back: the image (`spec.image`
/// too; the version stays) and `spec.postgresql`.
fn without_deferrable(inputs: &Value) -> Value {
    let mut inputs = inputs.clone();
    if let Some(fields) = inputs.as_object_mut() {
        fields.remove("image");
        if let Some(spec) = fields.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("postgresql");
            spec.remove("image");
        }
    }
    inputs
}

/// The annotations that record who built a template for `db` running `run`, and from what
/// (every StatefulSet is built with them).
pub fn record(db: &Database, run: Run<'_>, settings: &Settings) -> BTreeMap<String, String> {
    BTreeMap::from([
        (BUILT_BY_ANNOTATION.to_string(), builder(settings)),
        (
            INPUTS_ANNOTATION.to_string(),
            recorded_inputs(db, run).to_string(),
        ),
    ])
}

/// Applies the choice to `desired` (the StatefulSet built now, with its record): the observed
/// pod template replaces the new one when it is kept, with the record that goes with it.
pub fn settle(desired: &mut StatefulSet, observed: Option<&StatefulSet>, choice: &TemplateChoice) {
    let Some(observed) = observed else { return };
    if choice.builds() {
        return;
    }
    desired.spec.template = observed.spec.template.clone();
    let annotations = desired
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if *choice == TemplateChoice::KeepAndRecord {
        annotations.insert(BUILT_BY_ANNOTATION.into(), UNRECORDED.into());
        return;
    }
    let kept = observed.metadata.annotations.clone().unwrap_or_default();
    for key in [BUILT_BY_ANNOTATION, INPUTS_ANNOTATION] {
        if let Some(value) = kept.get(key) {
            annotations.insert(key.into(), value.clone());
        }
    }
}

/// The builder recorded for a template found without a record.
const UNRECORDED: &str = "unrecorded";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::statefulset::{PodRun, statefulset, template_image};
    use crate::resources::testing;

    fn settings(agent_image: &str) -> Settings {
        Settings {
            agent_image: agent_image.into(),
            ..Settings::default()
        }
    }

    fn copy_image(sts: &StatefulSet) -> Option<String> {
        let pod = sts.spec.template.spec.as_ref()?;
        pod.init_containers.as_ref()?.first()?.image.clone()
    }

    /// The choice for `db` over `observed` without a window, applied to `desired`.
    fn settle_now(
        desired: &mut StatefulSet,
        observed: Option<&StatefulSet>,
        db: &Database,
        s: &Settings,
    ) -> TemplateChoice {
        settle_at(desired, observed, db, s, &Gate::NoWindow)
    }

    fn settle_at(
        desired: &mut StatefulSet,
        observed: Option<&StatefulSet>,
        db: &Database,
        s: &Settings,
        gate: &Gate,
    ) -> TemplateChoice {
        let record = observed.map(TemplateRecord::of);
        let run = PodRun::of_spec(db, s);
        let choice = choose(record.as_ref(), db, run.origin(), s, gate, true);
        settle(desired, observed, &choice);
        choice
    }

    /// What the operator of `old` built and applied for `db`.
    fn applied(db: &Database, old: &Settings) -> StatefulSet {
        let mut observed = statefulset(db, old, None);
        settle_now(&mut observed, None, db, old);
        observed
    }

    /// What the operator of `old` built and applied, then what the operator of `new` builds.
    fn upgrade(db: &Database, changed: &Database, old: &str, new: &str) -> StatefulSet {
        upgrade_at(db, changed, old, new, &Gate::NoWindow).0
    }

    fn upgrade_at(
        db: &Database,
        changed: &Database,
        old: &str,
        new: &str,
        gate: &Gate,
    ) -> (StatefulSet, TemplateChoice) {
        let observed = applied(db, &settings(old));
        let new = settings(new);
        let mut desired = statefulset(changed, &new, None);
        let choice = settle_at(&mut desired, Some(&observed), changed, &new, gate);
        (desired, choice)
    }

    #[test]
    fn a_new_operator_keeps_the_template_of_an_unchanged_database() {
        let db = testing::minimal();
        let desired = upgrade(&db, &db, "dbop:1", "dbop:2");
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:1"));
        let annotations = desired.metadata.annotations.unwrap();
        assert!(annotations[BUILT_BY_ANNOTATION].ends_with(" dbop:1"));
    }

    #[test]
    fn a_change_that_builds_no_pod_keeps_the_template_too() {
        let db = testing::minimal();
        let mut changed = db.clone();
        changed.spec.storage.size = "20Gi".into();
        changed.spec.deletion_policy = crate::api::DeletionPolicy::Delete;
        changed.spec.roles =
            serde_json::from_value(serde_json::json!([{"name": "reporting"}])).unwrap();
        // A NetworkPolicy is an object of its own: turning it on restarts no database.
        changed.spec.network_policy = Some(Default::default());
        let desired = upgrade(&db, &changed, "dbop:1", "dbop:2");
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:1"));
    }

    #[test]
    fn a_spec_change_that_builds_the_pod_takes_the_new_operator_s_template() {
        let db = testing::minimal();
        let mut changed = db.clone();
        changed.spec.version = "16.5".into();
        let desired = upgrade(&db, &changed, "dbop:1", "dbop:2");
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:2"));
        assert_eq!(
            template_image(&desired).as_deref(),
            Some("docker.io/library/postgres:16.5")
        );
        assert!(desired.metadata.annotations.unwrap()[BUILT_BY_ANNOTATION].ends_with(" dbop:2"));
    }

    #[test]
    fn a_restart_request_takes_the_new_operator_s_template() {
        let db = testing::minimal();
        let mut changed = db.clone();
        changed
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                RESTARTED_AT_ANNOTATION.into(),
                "2026-12-01T12:00:00Z".into(),
            );
        let desired = upgrade(&db, &changed, "dbop:1", "dbop:2");
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:2"));
    }

    #[test]
    fn the_same_operator_rebuilds_its_template_so_a_hand_edit_is_undone() {
        let db = testing::minimal();
        let s = settings("dbop:1");
        let mut observed = applied(&db, &s);
        observed.spec.template.spec.as_mut().unwrap().containers[0].image = Some("evil:1".into());
        let mut desired = statefulset(&db, &s, None);
        settle_now(&mut desired, Some(&observed), &db, &s);
        assert_eq!(
            template_image(&desired).as_deref(),
            Some("docker.io/library/postgres:16.4")
        );
    }

    #[test]
    fn a_template_without_a_record_is_kept_and_recorded() {
        let db = testing::minimal();
        let old = settings("dbop:1");
        let mut observed = statefulset(&db, &old, None);
        observed.metadata.annotations = None;
        let new = settings("dbop:2");
        let mut desired = statefulset(&db, &new, None);
        assert_eq!(
            settle_now(&mut desired, Some(&observed), &db, &new),
            TemplateChoice::KeepAndRecord
        );
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:1"));
        let annotations = desired.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[BUILT_BY_ANNOTATION], UNRECORDED);
        // Recorded now: the next pass keeps it as another operator's, unchanged.
        let mut again = statefulset(&db, &new, None);
        settle_now(&mut again, Some(&desired), &db, &new);
        assert_eq!(copy_image(&again).as_deref(), Some("dbop:1"));
        assert_eq!(again.metadata.annotations, desired.metadata.annotations);
    }

    #[test]
    fn an_unreadable_record_builds_anew() {
        let db = testing::minimal();
        let mut observed = applied(&db, &settings("dbop:1"));
        observed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(INPUTS_ANNOTATION.into(), "{not json".into());
        let new = settings("dbop:2");
        let mut desired = statefulset(&db, &new, None);
        assert_eq!(
            settle_now(&mut desired, Some(&observed), &db, &new),
            TemplateChoice::Build
        );
    }

    fn closed() -> Gate {
        Gate::Closed {
            opens: "Sat 2026-12-05 02:00 UTC".into(),
            at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    fn open() -> Gate {
        Gate::Open {
            closes: "Sat 2026-12-05 04:00 UTC".into(),
            at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    fn restart_parameters(sts: &StatefulSet) -> Option<String> {
        let annotations = sts.spec.template.metadata.as_ref()?.annotations.as_ref()?;
        annotations
            .get(crate::resources::server_config::RESTART_ANNOTATION)
            .cloned()
    }

    fn with_shared_buffers(db: &Database, value: &str) -> Database {
        let mut changed = db.clone();
        changed.spec.postgresql = Some(
            serde_json::from_value(serde_json::json!({"parameters": {"shared_buffers": value}}))
                .unwrap(),
        );
        changed
    }

    #[test]
    fn a_new_operator_s_instance_manager_waits_for_the_window_and_rolls_in_it() {
        let db = testing::minimal();
        let (held, choice) = upgrade_at(&db, &db, "dbop:1", "dbop:2", &closed());
        assert_eq!(copy_image(&held).as_deref(), Some("dbop:1"));
        let TemplateChoice::Hold(what) = choice else {
            panic!("held, got {choice:?}")
        };
        assert_eq!(
            what.describe(),
            [format!(
                "the instance manager of {}",
                builder(&settings("dbop:2"))
            )]
        );
        // A window that cannot be read holds it too.
        let invalid = Gate::Invalid {
            message: "bad".into(),
        };
        let (still, _) = upgrade_at(&db, &db, "dbop:1", "dbop:2", &invalid);
        assert_eq!(copy_image(&still).as_deref(), Some("dbop:1"));
        // In the window it rolls; once applied it is this operator's own, so the rollout goes
        // on after the window closes (a window shorter than a restart ends none half-way).
        let (rolled, choice) = upgrade_at(&db, &db, "dbop:1", "dbop:2", &open());
        assert_eq!(
            (copy_image(&rolled).as_deref(), choice),
            (Some("dbop:2"), TemplateChoice::Release)
        );
        let new = settings("dbop:2");
        let mut after = statefulset(&db, &new, None);
        let choice = settle_at(&mut after, Some(&rolled), &db, &new, &closed());
        assert_eq!(
            (copy_image(&after).as_deref(), choice),
            (Some("dbop:2"), TemplateChoice::Build)
        );
    }

    /// The choice for an unchanged `db` whose template the operator of `dbop:1` built, made by
    /// the operator of `dbop:2` (`urgent` or not) under `gate`, on the Database's turn or not.
    fn release_choice(gate: &Gate, urgent: bool, turn: bool) -> TemplateChoice {
        let db = testing::minimal();
        let observed = applied(&db, &settings("dbop:1"));
        let mut new = settings("dbop:2");
        new.release.urgent = urgent;
        let run = PodRun::of_spec(&db, &new);
        let record = TemplateRecord::of(&observed);
        choose(Some(&record), &db, run.origin(), &new, gate, turn)
    }

    #[test]
    fn the_release_restarts_a_database_only_on_its_turn_and_in_its_window_unless_urgent() {
        let held = TemplateChoice::Hold(Held {
            instance_manager: Some(builder(&settings("dbop:2"))),
            image: None,
        });
        let invalid = Gate::Invalid {
            message: "bad".into(),
        };
        let cases = [
            // (gate, urgent, turn) → choice
            (open(), false, true, TemplateChoice::Release),
            (open(), false, false, TemplateChoice::Keep),
            (Gate::NoWindow, false, true, TemplateChoice::Keep),
            (closed(), false, true, held.clone()),
            (Gate::NoWindow, true, true, TemplateChoice::Release),
            (Gate::NoWindow, true, false, TemplateChoice::Keep),
            (closed(), true, true, TemplateChoice::Release),
            (closed(), true, false, held.clone()),
            // A window that cannot be read holds even an urgent release.
            (invalid, true, true, held),
        ];
        for (gate, urgent, turn, expected) in cases {
            assert_eq!(
                release_choice(&gate, urgent, turn),
                expected,
                "{gate:?}, urgent {urgent}, turn {turn}"
            );
        }
    }

    #[test]
    fn a_restart_needing_parameter_waits_for_the_window() {
        let s = settings("dbop:1");
        let db = with_shared_buffers(&testing::minimal(), "128MB");
        let observed = applied(&db, &s);
        let changed = with_shared_buffers(&db, "256MB");
        let mut desired = statefulset(&changed, &s, None);
        let choice = settle_at(&mut desired, Some(&observed), &changed, &s, &closed());
        assert_eq!(choice, TemplateChoice::Hold(Held::default()));
        assert_eq!(restart_parameters(&desired), restart_parameters(&observed));
        // Kept with its record: the next pass holds it again, until the window opens; moving
        // the window (to another closed one) releases nothing either.
        let mut moved = changed.clone();
        moved.spec.maintenance_window = Some(Box::new(crate::api::MaintenanceWindowSpec {
            start: "03:00".into(),
            duration: "1h".into(),
            ..Default::default()
        }));
        let mut again = statefulset(&moved, &s, None);
        let choice = settle_at(&mut again, Some(&desired), &moved, &s, &closed());
        assert_eq!(choice, TemplateChoice::Hold(Held::default()));
        let mut opened = statefulset(&changed, &s, None);
        settle_at(&mut opened, Some(&again), &changed, &s, &open());
        assert_ne!(restart_parameters(&opened), restart_parameters(&observed));
        assert!(restart_parameters(&opened).unwrap().contains("256MB"));
    }

    #[test]
    fn a_new_image_for_the_same_version_waits_for_the_window() {
        let s = settings("dbop:1");
        let db = testing::minimal();
        let observed = applied(&db, &s);
        let mut changed = db.clone();
        changed.spec.image = Some("mirror/postgres:16.4-patched".into());
        let mut desired = statefulset(&changed, &s, None);
        let choice = settle_at(&mut desired, Some(&observed), &changed, &s, &closed());
        assert_eq!(
            choice,
            TemplateChoice::Hold(Held {
                instance_manager: None,
                image: Some("mirror/postgres:16.4-patched".into()),
            })
        );
        assert_eq!(template_image(&desired), template_image(&observed));
    }

    #[test]
    fn other_changes_do_not_wait_and_carry_the_held_ones_with_them() {
        let db = with_shared_buffers(&testing::minimal(), "128MB");
        let mut changed = with_shared_buffers(&db, "256MB");
        changed.spec.resources =
            Some(serde_json::from_value(serde_json::json!({"limits": {"memory": "2Gi"}})).unwrap());
        let (desired, choice) = upgrade_at(&db, &changed, "dbop:1", "dbop:2", &closed());
        assert_eq!(choice, TemplateChoice::Build);
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:2"));
        assert!(restart_parameters(&desired).unwrap().contains("256MB"));
        // A restart request is not held either.
        let mut restart = db.clone();
        restart
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RESTARTED_AT_ANNOTATION.into(), "now".into());
        let (_, choice) = upgrade_at(&db, &restart, "dbop:1", "dbop:1", &closed());
        assert_eq!(choice, TemplateChoice::Build);
    }

    #[test]
    fn the_comparison_ignores_key_order_and_nulls() {
        let a = serde_json::json!({"b": 1, "a": {"y": null, "x": [ {"d": 1, "c": 2} ]}});
        let b = serde_json::json!({"a": {"x": [ {"c": 2, "d": 1} ]}, "b": 1});
        assert_eq!(canonical(a).to_string(), canonical(b).to_string());
    }
}
