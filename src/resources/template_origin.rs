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
//! Pure: functions of the Database, the observed StatefulSet and the operator's settings.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::{Map, Value};

use crate::api::{Database, DatabaseSpec};
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
/// the roles reach the pods through the accounts Secret; a NetworkPolicy is an object of its own).
const NOT_IN_THE_TEMPLATE: [&str; 9] = [
    "application",
    "backup",
    "bootstrap",
    "deletionPolicy",
    "init",
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
}

/// Decides whether the template built now replaces the observed one.
pub fn choose(
    observed: Option<&StatefulSet>,
    db: &Database,
    run: Run<'_>,
    settings: &Settings,
) -> TemplateChoice {
    let Some(observed) = observed else {
        return TemplateChoice::Build;
    };
    let annotations = observed.metadata.annotations.clone().unwrap_or_default();
    let Some(built_by) = annotations.get(BUILT_BY_ANNOTATION) else {
        return TemplateChoice::KeepAndRecord;
    };
    if *built_by == builder(settings) {
        // Our own template: rebuilt on every pass, so a hand edit is undone.
        return TemplateChoice::Build;
    }
    let recorded = annotations
        .get(INPUTS_ANNOTATION)
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|value| template_inputs(&value));
    let now = template_inputs(&recorded_inputs(db, run));
    match (recorded, now) {
        (Some(recorded), Some(now)) if recorded == now => TemplateChoice::Keep,
        _ => TemplateChoice::Build,
    }
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
pub fn settle(
    desired: &mut StatefulSet,
    observed: Option<&StatefulSet>,
    db: &Database,
    run: Run<'_>,
    settings: &Settings,
) {
    let Some(observed) = observed else { return };
    let choice = choose(Some(observed), db, run, settings);
    if choice == TemplateChoice::Build {
        return;
    }
    desired.spec.template = observed.spec.template.clone();
    let annotations = desired
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if choice == TemplateChoice::KeepAndRecord {
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

    /// What the operator of `old` built and applied, then what the operator of `new` builds.
    fn upgrade(db: &Database, changed: &Database, old: &str, new: &str) -> StatefulSet {
        let old = settings(old);
        let new = settings(new);
        let mut observed = statefulset(db, &old, None);
        settle(
            &mut observed,
            None,
            db,
            PodRun::of_spec(db, &old).origin(),
            &old,
        );
        let run = PodRun::of_spec(changed, &new);
        let mut desired = statefulset(changed, &new, None);
        settle(&mut desired, Some(&observed), changed, run.origin(), &new);
        desired
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
        let mut observed = statefulset(&db, &s, None);
        settle(
            &mut observed,
            None,
            &db,
            PodRun::of_spec(&db, &s).origin(),
            &s,
        );
        observed.spec.template.spec.as_mut().unwrap().containers[0].image = Some("evil:1".into());
        let mut desired = statefulset(&db, &s, None);
        settle(
            &mut desired,
            Some(&observed),
            &db,
            PodRun::of_spec(&db, &s).origin(),
            &s,
        );
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
        let run = PodRun::of_spec(&db, &new);
        assert_eq!(
            choose(Some(&observed), &db, run.origin(), &new),
            TemplateChoice::KeepAndRecord
        );
        settle(&mut desired, Some(&observed), &db, run.origin(), &new);
        assert_eq!(copy_image(&desired).as_deref(), Some("dbop:1"));
        let annotations = desired.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[BUILT_BY_ANNOTATION], UNRECORDED);
        // Recorded now: the next pass keeps it as another operator's, unchanged.
        let mut again = statefulset(&db, &new, None);
        settle(&mut again, Some(&desired), &db, run.origin(), &new);
        assert_eq!(copy_image(&again).as_deref(), Some("dbop:1"));
        assert_eq!(again.metadata.annotations, desired.metadata.annotations);
    }

    #[test]
    fn an_unreadable_record_builds_anew() {
        let db = testing::minimal();
        let old = settings("dbop:1");
        let mut observed = statefulset(&db, &old, None);
        settle(
            &mut observed,
            None,
            &db,
            PodRun::of_spec(&db, &old).origin(),
            &old,
        );
        observed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(INPUTS_ANNOTATION.into(), "{not json".into());
        let new = settings("dbop:2");
        let run = PodRun::of_spec(&db, &new);
        assert_eq!(
            choose(Some(&observed), &db, run.origin(), &new),
            TemplateChoice::Build
        );
    }

    #[test]
    fn the_comparison_ignores_key_order_and_nulls() {
        let a = serde_json::json!({"b": 1, "a": {"y": null, "x": [ {"d": 1, "c": 2} ]}});
        let b = serde_json::json!({"a": {"x": [ {"c": 2, "d": 1} ]}, "b": 1});
        assert_eq!(canonical(a).to_string(), canonical(b).to_string());
    }
}
