//! The reconciles the in-process operator runs, seen from inside the test process: kube-runtime
//! opens a `reconciling object` span (target `kube_runtime::controller`) around every call of
//! the reconciler, and this layer records when each opens and closes. A test uses it to show
//! that reconciles did run (and finished) in a window where the API server saw no write, so a
//! hung operator cannot pass a "no writes" check.

use std::sync::Mutex;
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The span kube-runtime's controller opens around each reconcile.
const SPAN_NAME: &str = "reconciling object";

/// One reconcile of one object.
#[derive(Clone, Debug)]
pub struct Reconcile {
    /// kube-runtime's object reference, `Kind.version.group/name.namespace`.
    pub object_ref: String,
    /// Why it ran (`object updated`, `related object updated`, `reconciler requested retry`…).
    pub reason: String,
    pub started: Instant,
    /// When the reconciler's future ended (None while it runs, or if it never ends).
    pub finished: Option<Instant>,
}

static RECONCILES: Mutex<Vec<Reconcile>> = Mutex::new(Vec::new());

/// The index of a span's record, kept in the span's extensions.
struct Slot(usize);

/// The tracing layer that records reconciles (installed by `testbed()`).
pub struct Recorder;

impl Recorder {
    /// The layer, filtered to the controller's spans whatever `RUST_LOG` says.
    pub fn layer<S>() -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        Recorder.with_filter(Targets::new().with_target("kube_runtime::controller", Level::INFO))
    }
}

#[derive(Default)]
struct Fields {
    object_ref: String,
    reason: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "object.ref" => self.object_ref = format!("{value:?}"),
            "object.reason" => self.reason = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN_NAME {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut all = RECONCILES.lock().unwrap_or_else(|p| p.into_inner());
        all.push(Reconcile {
            object_ref: fields.object_ref,
            reason: fields.reason,
            started: Instant::now(),
            finished: None,
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Slot(all.len() - 1));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(index) = span.extensions().get::<Slot>().map(|s| s.0) else {
            return;
        };
        if let Some(r) = RECONCILES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(index)
        {
            r.finished = Some(Instant::now());
        }
    }
}

/// The reconciles of the Database `namespace/name` recorded so far, oldest first.
pub fn of_database(namespace: &str, name: &str) -> Vec<Reconcile> {
    let suffix = format!("/{name}.{namespace}");
    RECONCILES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|r| r.object_ref.starts_with("Database.") && r.object_ref.ends_with(&suffix))
        .cloned()
        .collect()
}
