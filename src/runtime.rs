//! The runtime of both controllers: the watches (`watches`: one per kind and watched namespace,
//! filling the caches observe reads and triggering the controllers), the start of the Database
//! controller (`database::controller`) and of the `DatabaseBackup` controller
//! (`database_backup::controller`) side by side, and the readiness once both kinds can be
//! listed. The shared `Context` and backoff live in `context`.

use std::sync::Arc;

use kube::api::ListParams;
use kube::{Api, Client, Resource};
use tracing::{info, warn};

use crate::api::{Database, DatabaseBackup};
use crate::context::Context;
use crate::context::caches::caches;
use crate::kube_io::initial_list;
use crate::ops::metrics::Metrics;
use crate::ops::server::Readiness;
use crate::settings::Settings;
use crate::{database, database_backup};

pub mod watches;

use self::watches::{InitialList, Triggers};

/// `K`s in each watched namespace, or in all (no namespaces).
fn owned<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    if namespaces.is_empty() {
        return vec![Api::all(client.clone())];
    }
    namespaces
        .iter()
        .map(|ns| Api::namespaced(client.clone(), ns))
        .collect()
}

/// Runs the controller until SIGTERM/SIGINT. `namespace` limits it to one namespace.
pub async fn run(client: Client, settings: Settings, namespace: Option<String>) {
    let (metrics, ready) = (Arc::new(Metrics::new()), Arc::new(Readiness::default()));
    let concurrency = DEFAULT_RECONCILE_CONCURRENCY;
    let namespaces: Vec<String> = namespace.into_iter().collect();
    run_observed(client, settings, &namespaces, concurrency, metrics, ready).await;
}

/// `run`, recording into `metrics`; `ready` turns true once both watched kinds can be listed.
/// `namespaces` are the watched namespaces (none: all). `concurrency` bounds the Database
/// reconciles at once (0: unbounded).
pub async fn run_observed(
    client: Client,
    settings: Settings,
    namespaces: &[String],
    concurrency: u16,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
) {
    let (caches, writers) = caches();
    let probe = owned::<Database>(&client, namespaces).swap_remove(0);
    let initial = if initial_list::server_streams_initial_lists(&probe).await {
        InitialList::Streamed
    } else {
        InitialList::Listed
    };
    // One watch per kind and namespace, shared by both controllers; stopped when this returns.
    let scope = watches::Scope {
        namespaces,
        nodes: settings.watch_nodes,
    };
    let (triggers, _watches) = watches::start(&client, scope, initial, writers);
    let ctx = Arc::new(Context::new(client.clone(), settings, caches).with_metrics(metrics));
    let watched = if namespaces.is_empty() {
        "<all>".into()
    } else {
        namespaces.join(",")
    };
    info!(namespaces = %watched, ?initial, "dbop controller starting");
    let Triggers {
        database,
        backups,
        backup_jobs,
    } = triggers;
    // Both controllers stop on SIGTERM/SIGINT (each has `shutdown_on_signal`).
    let backup_controller = database_backup::controller::run(ctx.clone(), backups, backup_jobs);
    tokio::spawn(mark_ready_once_listed(
        client.clone(),
        namespaces.to_vec(),
        ready,
    ));
    let database_controller = database::controller::run(ctx, concurrency, database);
    futures::join!(database_controller, backup_controller);
    info!("dbop controller stopped");
}

/// How many Databases are reconciled at once by default (`--reconcile-concurrency`; 0 is
/// unbounded). Bounded because a thousand Databases created at once otherwise send a thousand
/// first reconciles' writes together, and an API server that times some of them out (a Service's
/// cluster IP allocation is the first to) makes each of those wait out a retry backoff; a
/// bounded queue drains steadily instead (see docs/benchmarks.md).
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 16;

/// Ready once both kinds the controllers watch can be listed in every watched namespace (the
/// API server answers, RBAC allows it). Not the stores' own readiness: kube-runtime's
/// `Store::wait_until_ready` wakes one waiter only, and the controller's runner is already
/// waiting on it.
async fn mark_ready_once_listed(client: Client, namespaces: Vec<String>, ready: Arc<Readiness>) {
    let mut failures = 0;
    loop {
        match list_both_kinds(&client, &namespaces).await {
            Ok(()) => {
                info!("Databases and DatabaseBackups listed: ready");
                ready.set(true);
                return;
            }
            Err(error) => {
                failures += 1;
                warn!(%error, "cannot list Databases or DatabaseBackups yet: not ready");
                tokio::time::sleep(crate::context::backoff(failures)).await;
            }
        }
    }
}

/// Lists one Database and one `DatabaseBackup` in every watched namespace (or in all).
async fn list_both_kinds(client: &Client, namespaces: &[String]) -> Result<(), kube::Error> {
    let one = ListParams::default().limit(1);
    for api in owned::<Database>(client, namespaces) {
        api.list_metadata(&one).await?;
    }
    for api in owned::<DatabaseBackup>(client, namespaces) {
        api.list_metadata(&one).await?;
    }
    Ok(())
}
