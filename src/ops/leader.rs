//! Leader election with a `coordination.k8s.io` Lease (through `kube-lease-manager`): only the
//! holder runs the controllers; a standby waits for the lease and takes it over once the
//! holder stops renewing it (at most the lease duration after the holder died).

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Where the lease is and how long it lasts.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This process's name in the lease's `holderIdentity`.
    pub identity: String,
    /// How long the lease holds after the last renewal.
    pub duration: Duration,
    /// How long before expiry the holder renews it.
    pub grace: Duration,
}

impl LeaseSettings {
    /// A clear message for durations the lease cannot work with (the crate panics on them).
    pub fn check(&self) -> Result<(), String> {
        let (duration, grace) = (self.duration.as_secs(), self.grace.as_secs());
        if grace == 0 || duration <= grace {
            return Err(format!(
                "the lease duration ({duration}s) must be longer than the renewal grace ({grace}s), and the grace at least 1s"
            ));
        }
        Ok(())
    }
}

/// A running election: `is_leader` turns true when the lease is ours and false if it is lost.
pub struct Election {
    pub is_leader: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

/// Starts competing for the lease (creating it if it does not exist).
pub async fn start(client: Client, lease: &LeaseSettings) -> Result<Election, LeaseManagerError> {
    let manager = LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(lease.duration.as_secs())
        .with_grace(lease.grace.as_secs())
        .with_field_manager(format!("dbop-leader-{}", lease.identity))
        .build()
        .await?;
    info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "waiting for the leader lease");
    let (is_leader, task) = manager.watch().await;
    Ok(Election { is_leader, task })
}

impl Election {
    /// Waits until this process holds the lease; false if the election stopped first.
    pub async fn acquired(&mut self) -> bool {
        self.is_leader.wait_for(|leader| *leader).await.is_ok()
    }

    /// Resolves when the lease is lost (another process holds it, or it could not be renewed).
    pub async fn lost(&mut self) {
        let _ = self.is_leader.wait_for(|leader| !*leader).await;
    }

    /// Gives the lease up so a standby takes over at once instead of after expiry.
    pub async fn release(self) {
        drop(self.is_leader);
        match self.task.await {
            Ok(Ok(_)) => info!("leader lease released"),
            Ok(Err(error)) => warn!(%error, "could not release the leader lease"),
            Err(error) => warn!(%error, "the leader election task failed"),
        }
    }
}

/// This process's identity: the pod's name where the chart sets `POD_NAME`, else the host name
/// and process id (two local processes never share one).
pub fn default_identity() -> String {
    let pod = std::env::var("POD_NAME").ok().filter(|s| !s.is_empty());
    pod.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    })
}
