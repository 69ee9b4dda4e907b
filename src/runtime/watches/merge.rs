//! One store fed by several watches of one kind: one watch per watched namespace (or a single
//! one for all namespaces). Why one store and not one per namespace: `Controller::for_stream`
//! reads its own kind (Databases, `DatabaseBackup`s) from exactly one `Store`, and the caches'
//! lookups (`context::caches`) stay as they are.
//!
//! kube-runtime's `Writer` takes a watch's `Init` … `InitApply` … `InitDone` as "replace the
//! whole store", so the lists of two namespaces cannot go to one writer as they come: the second
//! namespace's `InitDone` would drop the first's objects. `Merge` translates:
//! - until every watch has listed once, whatever the watches see goes into the writer's buffer
//!   (`InitApply`), and the first complete round swaps it in with one `InitDone`: the store
//!   turns ready (the controllers start) only then, as with a single watch. Objects deleted
//!   meanwhile, or missing from a list that restarted, are deleted right after the swap.
//! - after that, a watch's re-list (its resourceVersion expired) is applied object by object
//!   (`Apply`), and at its `InitDone` the objects of its namespace that the new list did not
//!   show are deleted.
//!
//! Every object stored or deleted is handed to the caller (the watch triggers its controllers).

use std::collections::HashSet;

use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, ObjectRef};
use kube::runtime::watcher::Event;

/// The writer of one kind's store and what its watches have shown.
pub struct Merge<K: Lookup<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    /// What each watch covers: one namespace, or all (`None`).
    scopes: Vec<Option<String>>,
    /// Per watch, the objects seen since its list began: kept while it lists and, before the
    /// first swap, until every watch has listed.
    seen: Vec<Option<HashSet<ObjectRef<K>>>>,
    listed: Vec<bool>,
    /// The first complete round has been swapped into the store.
    swapped: bool,
}

impl<K: Lookup<DynamicType = ()> + Clone + 'static> Merge<K> {
    /// A merge into `writer` of one watch per scope (a namespace, or `None` for all).
    pub fn new(writer: Writer<K>, scopes: Vec<Option<String>>) -> Self {
        let n = scopes.len();
        Self {
            writer,
            scopes,
            seen: (0..n).map(|_| Some(HashSet::new())).collect(),
            listed: vec![false; n],
            swapped: false,
        }
    }

    /// Applies one event of watch number `watch`; `changed` gets every object stored or
    /// deleted. True once, when every watch has listed for the first time.
    pub fn apply(&mut self, watch: usize, event: Event<K>, mut changed: impl FnMut(&K)) -> bool {
        match event {
            Event::Init => self.seen[watch] = Some(HashSet::new()),
            // The store first, then the trigger: a reconcile the trigger starts reads the store,
            // and must find this object as it now is (a spec edit, a deleted child), not the one
            // before (it would decide on the old spec and not look again until its requeue).
            Event::InitApply(object) | Event::Apply(object) => {
                if let Some(seen) = &mut self.seen[watch] {
                    seen.insert(key(&object));
                }
                let event = match self.swapped {
                    true => Event::Apply(object),
                    false => Event::InitApply(object),
                };
                self.writer.apply_watcher_event(&event);
                if let Event::Apply(object) | Event::InitApply(object) = &event {
                    changed(object);
                }
            }
            Event::Delete(object) => {
                if let Some(seen) = &mut self.seen[watch] {
                    seen.remove(&key(&object));
                }
                // Before the swap the object may sit in the buffer: the swap's clean-up drops
                // it, as it is no longer seen.
                if self.swapped {
                    self.writer
                        .apply_watcher_event(&Event::Delete(object.clone()));
                }
                changed(&object);
            }
            Event::InitDone => return self.listed(watch, &mut changed),
        }
        false
    }

    /// Watch `watch` has listed everything.
    fn listed(&mut self, watch: usize, changed: &mut impl FnMut(&K)) -> bool {
        self.listed[watch] = true;
        if self.swapped {
            self.drop_unseen(watch, changed);
            return false;
        }
        if !self.listed.iter().all(|l| *l) {
            return false;
        }
        self.writer.apply_watcher_event(&Event::InitDone);
        self.swapped = true;
        for watch in 0..self.scopes.len() {
            self.drop_unseen(watch, changed);
        }
        true
    }

    /// Deletes the stored objects of `watch`'s scope that its last list did not show.
    fn drop_unseen(&mut self, watch: usize, changed: &mut impl FnMut(&K)) {
        let Some(seen) = self.seen[watch].take() else {
            return;
        };
        let scope = self.scopes[watch].as_deref();
        let gone: Vec<K> = self
            .writer
            .as_reader()
            .state()
            .into_iter()
            .filter(|o| scope.is_none_or(|ns| o.namespace().as_deref() == Some(ns)))
            .filter(|o| !seen.contains(&key(o.as_ref())))
            .map(|o| K::clone(&o))
            .collect();
        for object in gone {
            self.writer
                .apply_watcher_event(&Event::Delete(object.clone()));
            changed(&object);
        }
    }
}

/// An object's reference without its resourceVersion and uid (equality ignores them).
fn key<K: Lookup<DynamicType = ()>>(object: &K) -> ObjectRef<K> {
    let reference = ObjectRef::new(&object.name().unwrap_or_default());
    match object.namespace() {
        Some(ns) => reference.within(&ns),
        None => reference,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::reflector::{self, Store};

    fn service(ns: &str, name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(ns.into());
        s
    }

    fn names(store: &Store<Service>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap(),
                    s.metadata.name.as_deref().unwrap()
                )
            })
            .collect();
        names.sort();
        names
    }

    fn two_namespaces() -> (Merge<Service>, Store<Service>) {
        let (store, writer) = reflector::store();
        let scopes = vec![Some("a".to_string()), Some("b".to_string())];
        (Merge::new(writer, scopes), store)
    }

    /// Applies events of one watch; returns the names handed to `changed` and whether that
    /// completed the first round.
    fn feed(
        merge: &mut Merge<Service>,
        watch: usize,
        events: Vec<Event<Service>>,
    ) -> (Vec<String>, bool) {
        let mut changed = Vec::new();
        let mut listed = false;
        for event in events {
            listed |= merge.apply(watch, event, |s| {
                changed.push(s.metadata.name.clone().unwrap())
            });
        }
        (changed, listed)
    }

    fn list(ns: &str, names: &[&str]) -> Vec<Event<Service>> {
        let mut events = vec![Event::Init];
        events.extend(names.iter().map(|n| Event::InitApply(service(ns, n))));
        events.push(Event::InitDone);
        events
    }

    #[tokio::test]
    async fn the_store_holds_both_namespaces_and_turns_ready_once_both_listed() {
        let (mut merge, store) = two_namespaces();
        let (changed, listed) = feed(&mut merge, 0, list("a", &["x", "y"]));
        assert_eq!((changed, listed), (vec!["x".into(), "y".into()], false));
        // The first namespace's events after its list wait in the buffer with it.
        feed(&mut merge, 0, vec![Event::Apply(service("a", "z"))]);
        assert!(store.state().is_empty(), "not swapped before both listed");
        let early = tokio::time::timeout(std::time::Duration::ZERO, store.wait_until_ready());
        assert!(early.await.is_err(), "not ready before both listed");
        let (_, listed) = feed(&mut merge, 1, list("b", &["x"]));
        assert!(listed);
        store.wait_until_ready().await.unwrap();
        assert_eq!(names(&store), ["a/x", "a/y", "a/z", "b/x"]);
        // Live events go to the store at once.
        feed(
            &mut merge,
            1,
            vec![
                Event::Apply(service("b", "w")),
                Event::Delete(service("a", "y")),
            ],
        );
        assert_eq!(names(&store), ["a/x", "a/z", "b/w", "b/x"]);
    }

    /// A trigger starts a reconcile that reads the store: when `changed` is called, the store
    /// already holds the change (an edit is there, a deletion is gone).
    #[test]
    fn the_store_holds_a_change_before_its_trigger_fires() {
        let (mut merge, store) = two_namespaces();
        feed(&mut merge, 0, list("a", &["web"]));
        feed(&mut merge, 1, list("b", &[]));
        let mut edited = service("a", "web");
        edited.metadata.labels = Some([("edited".to_string(), "yes".to_string())].into());
        let mut seen_in_store = Vec::new();
        let mut look = |s: &Service| {
            let stored = store.get(&ObjectRef::from_obj(s));
            seen_in_store.push(stored.map(|o| o.metadata.labels.is_some()));
        };
        merge.apply(0, Event::Apply(edited.clone()), &mut look);
        merge.apply(0, Event::Delete(edited), &mut look);
        assert_eq!(
            seen_in_store,
            vec![Some(true), None],
            "the edit stored and the deletion applied before each trigger"
        );
    }

    #[test]
    fn a_relist_deletes_what_it_no_longer_shows_in_its_namespace_only() {
        let (mut merge, store) = two_namespaces();
        feed(&mut merge, 0, list("a", &["x", "y"]));
        feed(&mut merge, 1, list("b", &["x", "y"]));
        let (changed, listed) = feed(&mut merge, 0, list("a", &["y", "new"]));
        assert_eq!(names(&store), ["a/new", "a/y", "b/x", "b/y"]);
        assert!(
            changed.contains(&"x".to_string()),
            "the deletion triggers: {changed:?}"
        );
        assert!(!listed, "the first round completes once");
    }

    #[test]
    fn what_was_deleted_or_relisted_away_before_the_first_swap_is_not_stored() {
        let (mut merge, store) = two_namespaces();
        feed(&mut merge, 0, list("a", &["x", "y"]));
        feed(&mut merge, 0, vec![Event::Delete(service("a", "x"))]);
        // Namespace b's list fails half way and restarts without "gone".
        feed(
            &mut merge,
            1,
            vec![Event::Init, Event::InitApply(service("b", "gone"))],
        );
        feed(&mut merge, 1, list("b", &["kept"]));
        assert_eq!(names(&store), ["a/y", "b/kept"]);
    }

    #[test]
    fn one_watch_for_all_namespaces_relists_everything() {
        let (store, writer) = reflector::store();
        let mut merge = Merge::new(writer, vec![None]);
        let mut events = list("a", &["x"]);
        events.insert(2, Event::InitApply(service("b", "x")));
        assert!(feed(&mut merge, 0, events).1);
        assert_eq!(names(&store), ["a/x", "b/x"]);
        feed(&mut merge, 0, list("b", &["x"]));
        assert_eq!(names(&store), ["b/x"]);
    }
}
