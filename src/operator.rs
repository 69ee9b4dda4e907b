//! The operator process: start the endpoints, take the leader lease when election is on, and
//! only then run the controllers; stop when the lease is lost (a standby takes over) or on
//! SIGTERM/SIGINT (releasing the lease so the standby takes over at once). One signal stops it
//! in every state: work in flight gets `SHUTDOWN_GRACE` to finish, then the process stops
//! anyway (an API server that does not answer would otherwise hold it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tracing::{error, info, warn};

use crate::kube_io::rate_limit::ApiLimits;
use crate::ops::leader::{self, LeaseSettings};
use crate::ops::metrics::Metrics;
use crate::ops::server::{self, Readiness};
use crate::settings::Settings;

/// How the process runs, beside what the controllers need.
pub struct ProcessSettings {
    pub metrics_addr: SocketAddr,
    /// `None`: no election, this process runs the controllers at once.
    pub lease: Option<LeaseSettings>,
    /// The watched namespaces (none: all).
    pub namespaces: Vec<String>,
    /// Database reconciles at once (0: unbounded).
    pub reconcile_concurrency: u16,
}

/// Why the process stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// SIGTERM/SIGINT: a clean stop.
    Signal,
    /// The lease was lost (or could not be taken): exit non-zero and let the pod restart.
    LostLease,
    /// The endpoints could not listen.
    Endpoints,
}

/// The operator's client (kubeconfig or in-cluster, dbop's user agent): its request budget and
/// retries (`kube_io::client`).
pub async fn client(limits: ApiLimits) -> Result<Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    crate::kube_io::client::build(config, crate::USER_AGENT, limits)
}

/// After SIGTERM/SIGINT, how long reconciles in flight may take to finish (and the leader to
/// release its Lease) before the process stops without them. Within Kubernetes' default
/// termination grace of 30 s.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs until SIGTERM/SIGINT or, with election, until the Lease is lost.
pub async fn run(client: Client, settings: Settings, process: ProcessSettings) -> Stopped {
    // Listening first: a signal at any later moment is ours, never the default action's.
    let signal = shutdown_signal();
    let work = run_until_stopped(client, settings, process);
    stop_on_signal_within_grace(work, signal, SHUTDOWN_GRACE).await
}

/// `work`'s outcome, or `Stopped::Signal` once `signal` has fired and `work` has not finished
/// `grace` later (the controllers begin their own graceful stop on the same signal).
pub async fn stop_on_signal_within_grace(
    work: impl Future<Output = Stopped>,
    signal: impl Future<Output = ()>,
    grace: Duration,
) -> Stopped {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        stopped = &mut work => return stopped,
        () = signal => {}
    }
    info!(grace = ?grace, "stopping: work in flight may finish within the grace");
    match tokio::time::timeout(grace, work).await {
        Ok(stopped) => stopped,
        Err(_) => {
            warn!(grace = ?grace, "work in flight did not finish within the grace: stopping without it");
            Stopped::Signal
        }
    }
}

async fn run_until_stopped(
    client: Client,
    settings: Settings,
    process: ProcessSettings,
) -> Stopped {
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(Readiness::default());
    if let Err(error) = server::serve(process.metrics_addr, metrics.clone(), ready.clone()).await {
        error!(%error, addr = %process.metrics_addr, "cannot listen for /metrics (--metrics-addr)");
        return Stopped::Endpoints;
    }
    let controllers = crate::runtime::run_observed(
        client.clone(),
        settings,
        &process.namespaces,
        process.reconcile_concurrency,
        metrics,
        ready.clone(),
    );
    match process.lease {
        None => {
            controllers.await;
            Stopped::Signal
        }
        Some(lease) => lead(client, &lease, controllers, &ready).await,
    }
}

/// Waits for the Lease as a ready standby, then runs `controllers` while holding it.
async fn lead(
    client: Client,
    lease: &LeaseSettings,
    controllers: impl Future<Output = ()>,
    ready: &Readiness,
) -> Stopped {
    let mut election = match leader::start(client, lease).await {
        Ok(election) => election,
        Err(error) => {
            error!(%error, "cannot take part in leader election (RBAC for leases?)");
            return Stopped::LostLease;
        }
    };
    // A standby is ready: it serves its purpose by waiting.
    ready.set(true);
    tokio::select! {
        acquired = election.acquired() => if !acquired { return Stopped::LostLease },
        _ = shutdown_signal() => { election.release().await; return Stopped::Signal },
    }
    info!(identity = %lease.identity, "leader lease acquired: starting the controllers");
    ready.set(false);
    tokio::select! {
        _ = controllers => { election.release().await; Stopped::Signal }
        _ = election.lost() => {
            error!("leader lease lost: stopping so that only the new leader writes");
            Stopped::LostLease
        }
    }
}

/// SIGTERM or SIGINT. The handlers are installed when this is called, not when it is first
/// polled: a signal in between is still seen.
#[cfg(unix)]
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

#[cfg(not(unix))]
fn shutdown_signal() -> impl Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
