//! Operator releases roll out in waves.
//!
//! A new operator (another version, or the same version from another image:
//! `template_origin::builder`) brings a new instance manager, which every database pod copies
//! when it starts. The operator restarts a Database onto it only where it may: in the
//! Database's open maintenance window, or anywhere when the release is urgent
//! (`settings::ReleasePolicy::urgent`); elsewhere the old instance manager stays until the Database's own
//! next rollout (`template_origin`). Restarts it causes itself go in waves: at most
//! `settings::ReleasePolicy::wave` Databases at once, each only while healthy, the next when one of them
//! is healthy again on the release. The first that is not (a pod that fails, or not healthy
//! within `settings::ReleasePolicy::timeout`) is rolled back to the pod template it had, and the release
//! stops for every Database: `ReleasePending` says why on each.
//!
//! Each StatefulSet records its part ([`MARKER_ANNOTATION`]: which release, rolling, done or
//! failed, since when) and, while rolling or failed, the template the release replaced
//! ([`PREVIOUS_ANNOTATION`]), for the rollback. The fleet ([`Fleet`]) is every StatefulSet's
//! record in the watch cache, plus the turns this process granted that the cache does not show
//! yet ([`Turns`]: two Databases reconciled at once must not both take the last place).
//!
//! Pure, but for [`Turns`] (a mutex) and the clock it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::Resource;
use serde::{Deserialize, Serialize};

use crate::api::conditions::{ConditionStatus, ConditionType};

/// On a StatefulSet: its Database's part in a release ([`Marker`], JSON).
pub const MARKER_ANNOTATION: &str = "dbop.dev/release";
/// On a StatefulSet rolling onto a release, or rolled back from one: the pod template and
/// record it had before ([`Previous`], JSON).
pub const PREVIOUS_ANNOTATION: &str = "dbop.dev/release-previous";

/// How often a Database waiting for its turn looks again (another Database's progress does not
/// wake it).
pub const LOOK_AGAIN: Duration = Duration::from_secs(10);

/// Where a Database stands in a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    Rolling,
    Done,
    Failed,
}

/// A Database's part in one release.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The release (`template_origin::builder`).
    pub release: String,
    pub state: State,
    /// When it entered `state`.
    pub since: DateTime<Utc>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Marker {
    /// The marker a StatefulSet carries (None: none, or unreadable).
    pub fn of<S: Resource>(sts: &S) -> Option<Marker> {
        let text = sts.meta().annotations.as_ref()?.get(MARKER_ANNOTATION)?;
        serde_json::from_str(text).ok()
    }
}

/// The pod template a release replaced, and the annotations that recorded who built it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Previous {
    pub template: PodTemplateSpec,
    pub record: BTreeMap<String, String>,
}

/// Where every Database stands in this operator's release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fleet {
    /// The Databases (`namespace/name`) restarting onto it now.
    pub rolling: BTreeSet<String>,
    /// The Databases it failed on, with why.
    pub failed: BTreeMap<String, String>,
    /// Every Database with a marker of this release (the cache has seen its start).
    pub seen: BTreeSet<String>,
}

impl Fleet {
    /// The fleet in `statefulsets` (the watch cache: their metadata) for `release`.
    pub fn of<'a, S: Resource + 'a>(
        statefulsets: impl IntoIterator<Item = &'a S>,
        release: &str,
    ) -> Fleet {
        let mut fleet = Fleet::default();
        for sts in statefulsets {
            let Some(marker) = Marker::of(sts).filter(|m| m.release == release) else {
                continue;
            };
            let key = key(
                sts.meta().namespace.as_deref().unwrap_or_default(),
                sts.meta().name.as_deref().unwrap_or_default(),
            );
            match marker.state {
                State::Rolling => {
                    fleet.rolling.insert(key.clone());
                }
                State::Failed => {
                    fleet
                        .failed
                        .insert(key.clone(), marker.reason.unwrap_or_default());
                }
                State::Done => {}
            }
            fleet.seen.insert(key);
        }
        fleet
    }
}

/// A Database's name in the fleet.
pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Whether a Database may restart onto the release now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    Go,
    /// Not yet: why.
    Wait(String),
    /// The release stopped: why.
    Paused(String),
}

/// The turn of Database `key` (`healthy`: it serves, on its current template) in `fleet`.
pub fn turn(key: &str, healthy: bool, fleet: &Fleet, wave: u32) -> Turn {
    if let Some((failed, why)) = fleet.failed.iter().next() {
        return Turn::Paused(format!(
            "the release stopped: it failed on {failed} ({why}), which was rolled back; once the \
             cause is fixed, remove the annotation {MARKER_ANNOTATION} from that StatefulSet to \
             try again"
        ));
    }
    if fleet.rolling.contains(key) {
        return Turn::Go;
    }
    if !healthy {
        return Turn::Wait("waiting until it is healthy before it restarts".into());
    }
    if fleet.rolling.len() < wave as usize {
        return Turn::Go;
    }
    let others: Vec<&str> = fleet.rolling.iter().map(String::as_str).collect();
    Turn::Wait(format!(
        "waiting for its wave: {} restart onto it now ({}), at most {wave} at once",
        others.len(),
        others.join(", ")
    ))
}

/// What happens to a Database's own marker in this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Keep the marker (and the previous template) as they are.
    Carry,
    /// It restarts onto the release now: mark it rolling, keep the template it replaces.
    Start,
    /// Healthy on the release: done.
    Finish,
    /// It failed: roll it back, and stop the release.
    Fail(String),
}

/// How a Database on the release is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Its pods run the template of this release.
    pub on_release: bool,
    /// Every pod runs the latest template and is ready.
    pub healthy: bool,
    /// Why it cannot become healthy (a pod that fails), if it cannot.
    pub trouble: Option<String>,
}

/// The progress of a Database whose marker is `marker`, given how it is doing.
pub fn progress(
    marker: Option<&Marker>,
    release: &str,
    health: &Health,
    now: DateTime<Utc>,
    timeout: Duration,
) -> Progress {
    let Some(marker) = marker.filter(|m| m.release == release && m.state == State::Rolling) else {
        return Progress::Carry;
    };
    if !health.on_release {
        return Progress::Carry;
    }
    if health.healthy {
        return Progress::Finish;
    }
    if let Some(trouble) = &health.trouble {
        return Progress::Fail(trouble.clone());
    }
    let waited = (now - marker.since).to_std().unwrap_or_default();
    if waited > timeout {
        return Progress::Fail(format!(
            "not healthy {}s after it restarted onto the release",
            timeout.as_secs()
        ));
    }
    Progress::Carry
}

/// When to look again at a Database rolling onto the release, or waiting for its turn
/// (`waiting`: the release would restart it; None: nothing to wait for).
pub fn look_again(
    marker: Option<&Marker>,
    release: &str,
    turn: &Turn,
    waiting: bool,
) -> Option<Duration> {
    let rolling = marker.is_some_and(|m| m.release == release && m.state == State::Rolling);
    (rolling || (waiting && matches!(turn, Turn::Wait(_)))).then_some(LOOK_AGAIN)
}

/// A pass's step in the release: its progress, which release, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub progress: Progress,
    pub release: String,
    pub at: DateTime<Utc>,
}

impl Default for Step {
    fn default() -> Self {
        Step {
            progress: Progress::Carry,
            release: String::new(),
            at: DateTime::UNIX_EPOCH,
        }
    }
}

/// Writes the release's part of the StatefulSet about to be applied: the marker (and the
/// template it replaced) as the step's progress says, and for a failure the previous template
/// and its record in place of the new ones (the rollback).
pub fn settle(desired: &mut StatefulSet, observed: Option<&StatefulSet>, step: &Step) {
    let Some(observed) = observed else { return };
    let kept = observed.metadata.annotations.clone().unwrap_or_default();
    let annotations = desired
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let marker = |state, reason| Marker {
        release: step.release.clone(),
        state,
        since: step.at,
        reason,
    };
    let (marker, previous) = match &step.progress {
        Progress::Carry => (
            kept.get(MARKER_ANNOTATION).cloned(),
            kept.get(PREVIOUS_ANNOTATION).cloned(),
        ),
        Progress::Start => {
            let previous = Previous {
                template: observed.spec.template.clone(),
                record: record_of(&kept),
            };
            (
                Some(json(&marker(State::Rolling, None))),
                Some(serde_json::to_string(&previous).unwrap_or_default()),
            )
        }
        Progress::Finish => (Some(json(&marker(State::Done, None))), None),
        Progress::Fail(reason) => (
            Some(json(&marker(State::Failed, Some(reason.clone())))),
            kept.get(PREVIOUS_ANNOTATION).cloned(),
        ),
    };
    for (key, value) in [(MARKER_ANNOTATION, marker), (PREVIOUS_ANNOTATION, previous)] {
        match value {
            Some(value) => annotations.insert(key.to_string(), value),
            None => annotations.remove(key),
        };
    }
    if matches!(step.progress, Progress::Fail(_)) {
        roll_back(desired, kept.get(PREVIOUS_ANNOTATION));
    }
}

/// Puts the previous template and its record in place of the new ones.
fn roll_back(desired: &mut StatefulSet, previous: Option<&String>) {
    let Some(previous) = previous.and_then(|p| serde_json::from_str::<Previous>(p).ok()) else {
        return;
    };
    desired.spec.template = previous.template;
    let annotations = desired
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.extend(previous.record);
}

/// The annotations that record who built a template (`template_origin`).
fn record_of(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    use crate::resources::template_origin::{BUILT_BY_ANNOTATION, INPUTS_ANNOTATION};
    [BUILT_BY_ANNOTATION, INPUTS_ANNOTATION]
        .into_iter()
        .filter_map(|k| Some((k.to_string(), annotations.get(k)?.clone())))
        .collect()
}

fn json(marker: &Marker) -> String {
    serde_json::to_string(marker).unwrap_or_default()
}

/// The `ReleasePending` condition of a Database (None when the release has nothing to do with
/// it: its pods run this operator's instance manager, or the release leaves them alone).
/// `waiting`: the release would restart it now, but for its turn.
pub fn condition(
    step: &Step,
    marker: Option<&Marker>,
    turn: &Turn,
    waiting: bool,
) -> Option<ConditionStatus> {
    let release = &step.release;
    let rolling = marker.is_some_and(|m| m.release == *release && m.state == State::Rolling);
    let (status, reason, message) = match (&step.progress, turn) {
        (Progress::Fail(why), _) => (
            true,
            FAILED,
            format!("{release} failed here ({why}): rolled back, and the release stopped"),
        ),
        (Progress::Finish, _) => return None,
        (Progress::Start, _) => (true, ROLLING_OUT, rolling_out(release)),
        (_, _) if rolling => (true, ROLLING_OUT, rolling_out(release)),
        (_, Turn::Paused(why)) if waiting => (true, PAUSED, why.clone()),
        (_, Turn::Wait(why)) if waiting => (true, "WaitingForWave", why.clone()),
        _ => return None,
    };
    Some(ConditionStatus::new(
        ConditionType::ReleasePending,
        status,
        reason,
        message,
    ))
}

/// `ReleasePending` reasons that have Events of their own.
pub const ROLLING_OUT: &str = "RollingOut";
pub const FAILED: &str = "ReleaseFailed";
pub const PAUSED: &str = "ReleasePaused";

fn rolling_out(release: &str) -> String {
    format!("restarting onto the instance manager of {release}")
}

/// The turns this process granted and the cache may not show yet, for [`Turns::LAG`].
#[derive(Debug, Default)]
pub struct Turns {
    granted: Mutex<BTreeMap<String, Instant>>,
}

impl Turns {
    /// Longest a granted turn counts without the cache showing it.
    const LAG: Duration = Duration::from_secs(60);

    /// The turns granted that `fleet` (from the cache) does not show yet.
    pub fn pending(&self, fleet: &Fleet) -> BTreeSet<String> {
        let mut granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
        Self::prune(&mut granted, fleet);
        granted.keys().cloned().collect()
    }

    /// Takes a turn for `key` unless `wave` Databases have one already (in `fleet` or granted
    /// here since): whether it got one. One lock for the look and the take, so two passes at
    /// once cannot both take the last turn.
    pub fn take(&self, key: &str, fleet: &Fleet, wave: u32) -> bool {
        let mut granted = self.granted.lock().unwrap_or_else(|e| e.into_inner());
        Self::prune(&mut granted, fleet);
        let rolling: BTreeSet<&String> = fleet.rolling.iter().chain(granted.keys()).collect();
        let free = rolling.contains(&key.to_string()) || rolling.len() < wave as usize;
        if free {
            granted.insert(key.to_string(), Instant::now());
        }
        free
    }

    /// Forgets the turns the cache shows by now, or that it never showed in `LAG`.
    fn prune(granted: &mut BTreeMap<String, Instant>, fleet: &Fleet) {
        granted.retain(|key, at| at.elapsed() < Self::LAG && !fleet.seen.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const RELEASE: &str = "dbop/0.2.0 dbop:new";

    fn at(minute: u32) -> DateTime<Utc> {
        format!("2026-12-04T10:{minute:02}:00Z").parse().unwrap()
    }

    fn marker(state: State, minute: u32) -> Marker {
        Marker {
            release: RELEASE.into(),
            state,
            since: at(minute),
            reason: (state == State::Failed).then(|| "a pod fails".into()),
        }
    }

    fn sts(name: &str, marker: Option<&Marker>) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                annotations: marker
                    .map(|m| BTreeMap::from([(MARKER_ANNOTATION.to_string(), json(m))])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn fleet(rolling: &[&str]) -> Fleet {
        let sets: Vec<StatefulSet> = rolling
            .iter()
            .map(|n| sts(n, Some(&marker(State::Rolling, 0))))
            .collect();
        Fleet::of(&sets, RELEASE)
    }

    #[test]
    fn the_fleet_counts_only_this_release() {
        let other = Marker {
            release: "dbop/0.1.0 dbop:old".into(),
            ..marker(State::Rolling, 0)
        };
        let sets = [
            sts("a", Some(&marker(State::Rolling, 0))),
            sts("b", Some(&marker(State::Done, 0))),
            sts("c", Some(&marker(State::Failed, 0))),
            sts("d", Some(&other)),
            sts("e", None),
        ];
        let fleet = Fleet::of(&sets, RELEASE);
        assert_eq!(fleet.rolling, BTreeSet::from(["ns/a".to_string()]));
        assert_eq!(
            fleet.failed,
            BTreeMap::from([("ns/c".to_string(), "a pod fails".to_string())])
        );
        assert_eq!(fleet.seen.len(), 3);
    }

    #[test]
    fn at_most_a_wave_restarts_at_once() {
        assert_eq!(turn("ns/c", true, &fleet(&["a"]), 2), Turn::Go);
        let Turn::Wait(why) = turn("ns/c", true, &fleet(&["a", "b"]), 2) else {
            panic!("a third Database in a wave of two")
        };
        assert!(
            why.contains("ns/a, ns/b") && why.contains("at most 2"),
            "{why}"
        );
        // One already rolling keeps its turn.
        assert_eq!(turn("ns/a", true, &fleet(&["a", "b"]), 2), Turn::Go);
        assert_eq!(turn("ns/a", true, &fleet(&[]), 1), Turn::Go);
    }

    #[test]
    fn an_unhealthy_database_does_not_start_and_a_failure_stops_everyone() {
        assert!(matches!(
            turn("ns/a", false, &fleet(&[]), 3),
            Turn::Wait(why) if why.contains("healthy")
        ));
        let mut failed = fleet(&["b"]);
        failed.failed.insert("ns/c".into(), "a pod fails".into());
        for key in ["ns/a", "ns/b", "ns/c"] {
            let Turn::Paused(why) = turn(key, true, &failed, 5) else {
                panic!("{key} goes on after a failure")
            };
            assert!(why.contains("ns/c (a pod fails)"), "{why}");
        }
    }

    #[test]
    fn progress_of_a_rolling_database() {
        let rolling = marker(State::Rolling, 0);
        let timeout = Duration::from_secs(600);
        let on = |healthy, trouble: Option<&str>| Health {
            on_release: true,
            healthy,
            trouble: trouble.map(String::from),
        };
        let p =
            |m: Option<&Marker>, h: &Health, minute| progress(m, RELEASE, h, at(minute), timeout);
        assert_eq!(p(Some(&rolling), &on(true, None), 1), Progress::Finish);
        assert_eq!(p(Some(&rolling), &on(false, None), 5), Progress::Carry);
        assert!(
            matches!(p(Some(&rolling), &on(false, None), 11), Progress::Fail(why) if why.contains("600s"))
        );
        assert_eq!(
            p(Some(&rolling), &on(false, Some("CrashLoopBackOff")), 1),
            Progress::Fail("CrashLoopBackOff".into())
        );
        // The cache still shows the template from before the release: nothing to judge.
        let before = Health {
            on_release: false,
            healthy: true,
            trouble: None,
        };
        assert_eq!(p(Some(&rolling), &before, 1), Progress::Carry);
        // Done, failed, another release's or no marker: nothing moves.
        for m in [marker(State::Done, 0), marker(State::Failed, 0)] {
            assert_eq!(p(Some(&m), &on(false, Some("x")), 30), Progress::Carry);
        }
        assert_eq!(p(None, &on(true, None), 1), Progress::Carry);
    }

    fn with_template(image: &str, built_by: &str, marker: Option<&Marker>) -> StatefulSet {
        let mut s = sts("a", marker);
        s.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                crate::resources::template_origin::BUILT_BY_ANNOTATION.into(),
                built_by.into(),
            );
        s.spec.template = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("image".to_string(), image.to_string())])),
                ..Default::default()
            }),
            spec: None,
        };
        s
    }

    fn step(progress: Progress, minute: u32) -> Step {
        Step {
            progress,
            release: RELEASE.into(),
            at: at(minute),
        }
    }

    fn annotation(s: &StatefulSet, key: &str) -> Option<String> {
        s.metadata.annotations.as_ref()?.get(key).cloned()
    }

    #[test]
    fn a_start_keeps_the_old_template_and_a_failure_puts_it_back() {
        let old = with_template("old", "dbop/0.1.0 dbop:old", None);
        let mut desired = with_template("new", RELEASE, None);
        settle(&mut desired, Some(&old), &step(Progress::Start, 0));
        let m: Marker =
            serde_json::from_str(&annotation(&desired, MARKER_ANNOTATION).unwrap()).unwrap();
        assert_eq!(m, marker(State::Rolling, 0));
        assert!(annotation(&desired, PREVIOUS_ANNOTATION).is_some());
        assert_eq!(
            desired
                .spec
                .template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .as_ref()
                .unwrap()["image"],
            "new"
        );

        // The next pass carries both; a failure then restores the old template and record.
        let applied = desired.clone();
        let mut next = with_template("new", RELEASE, None);
        settle(&mut next, Some(&applied), &step(Progress::Carry, 1));
        assert_eq!(
            annotation(&next, PREVIOUS_ANNOTATION),
            annotation(&applied, PREVIOUS_ANNOTATION)
        );
        let mut failing = with_template("new", RELEASE, None);
        let fail = step(Progress::Fail("a pod fails".into()), 2);
        settle(&mut failing, Some(&applied), &fail);
        assert_eq!(failing.spec.template, old.spec.template);
        let built_by = crate::resources::template_origin::BUILT_BY_ANNOTATION;
        assert_eq!(
            annotation(&failing, built_by).as_deref(),
            Some("dbop/0.1.0 dbop:old")
        );
        let m: Marker =
            serde_json::from_str(&annotation(&failing, MARKER_ANNOTATION).unwrap()).unwrap();
        assert_eq!(
            (m.state, m.reason.as_deref()),
            (State::Failed, Some("a pod fails"))
        );

        // Healthy: done, and the old template is let go.
        let mut done = with_template("new", RELEASE, None);
        settle(&mut done, Some(&applied), &step(Progress::Finish, 3));
        assert!(annotation(&done, PREVIOUS_ANNOTATION).is_none());
    }

    #[test]
    fn many_passes_at_once_take_no_more_turns_than_the_wave() {
        let turns = std::sync::Arc::new(Turns::default());
        let threads: Vec<_> = (0..16)
            .map(|n| {
                let turns = turns.clone();
                std::thread::spawn(move || turns.take(&format!("ns/{n}"), &Fleet::default(), 2))
            })
            .collect();
        let taken = threads
            .into_iter()
            .map(|t| t.join().unwrap_or(false))
            .filter(|taken| *taken)
            .count();
        assert_eq!(taken, 2);
    }

    #[test]
    fn two_databases_reconciled_at_once_do_not_both_take_the_last_turn() {
        let turns = Turns::default();
        let empty = Fleet::default();
        assert!(turns.take("ns/a", &empty, 1));
        // The cache does not show a's start yet.
        assert!(!turns.take("ns/b", &empty, 1));
        assert!(turns.take("ns/a", &empty, 1));
        // Once the cache shows it (done), the turn is free again.
        let mut done = Fleet::default();
        done.seen.insert("ns/a".into());
        assert!(turns.take("ns/b", &done, 1));
    }
}
