//! A Database's part in the operator's release (`crate::release`): its turn in the wave, this
//! pass's step (start, finish, fail), whether the release waits to restart it, and the pods to
//! replace after a rollback. A part of `decide`; pure.

use kube::ResourceExt;

use super::facts::Facts;
use crate::api::Database;
use crate::maintenance::Gate;
use crate::release::{self, Health, Progress, Turn};
use crate::resources::template_origin::{self, TemplateChoice};
use crate::settings::Settings;

/// The Database's turn in the operator's release : it starts only while
/// healthy, and only in its wave.
pub fn turn(db: &Database, facts: &Facts, settings: &Settings) -> Turn {
    let key = release::key(&db.namespace().unwrap_or_default(), &db.name());
    release::turn(
        &key,
        serving_settled(facts),
        &facts.release.fleet,
        settings.release.wave,
    )
}

/// Every pod runs the latest template and is ready.
pub fn serving_settled(facts: &Facts) -> bool {
    facts
        .statefulset
        .as_ref()
        .is_some_and(|s| s.rolled_out && s.ready_replicas >= s.replicas)
}

/// This pass's step in the release: it starts when the template choice says so, and otherwise
/// moves on as the Database's health says.
pub fn step(template: &TemplateChoice, facts: &Facts, settings: &Settings) -> release::Step {
    let name = template_origin::builder(settings);
    let on_release = facts
        .template
        .as_ref()
        .is_some_and(|t| t.built_by.as_deref() == Some(name.as_str()));
    let progress = match template {
        TemplateChoice::Release => Progress::Start,
        _ => release::progress(
            facts.release.marker.as_ref(),
            &name,
            &Health {
                on_release,
                healthy: serving_settled(facts),
                trouble: facts
                    .instance_failure
                    .as_ref()
                    .map(|f| format!("pod {}: {}", f.pod, f.message)),
            },
            facts.backups.now,
            settings.release.timeout,
        ),
    };
    release::Step {
        progress,
        release: name,
        at: facts.backups.now,
    }
}

/// After the release failed here and was rolled back, the pods still on its template: the
/// StatefulSet controller does not replace a pod that is not ready ("forced rollback").
pub fn rolled_back_pods(facts: &Facts, settings: &Settings) -> Vec<String> {
    let release = template_origin::builder(settings);
    let failed = facts
        .release
        .marker
        .as_ref()
        .is_some_and(|m| m.release == release && m.state == release::State::Failed);
    match failed {
        true => facts.release.unready_elsewhere.clone(),
        false => vec![],
    }
}

/// Whether the release waits to restart this Database: another operator built its template,
/// and the release would restart it now (its window is open, or the release is urgent) or has
/// stopped.
pub fn waits(template: &TemplateChoice, facts: &Facts, settings: &Settings, gate: &Gate) -> bool {
    let name = template_origin::builder(settings);
    let others = facts
        .template
        .as_ref()
        .and_then(|t| t.built_by.as_deref())
        .is_some_and(|b| b != name);
    let failed_here = facts
        .release
        .marker
        .as_ref()
        .is_some_and(|m| m.release == name && m.state == release::State::Failed);
    let would_restart = gate.is_open() || settings.release.urgent || failed_here;
    others && would_restart && !template.builds()
}
