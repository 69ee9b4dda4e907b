//! The primary Lease as the instance managers write it, for the suites where kwok plays the
//! kubelets and so no manager runs: the primary it designates, a write as one instance would
//! make it (take, renew or release), and renewals every 2 s — for one instance, or for
//! whichever instance the Lease designates. Without them a Database with standbys in kwok has a
//! primary that never takes its Lease, and the operator rightly fails over once the designation
//! is the Lease's 10 s old.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dbop_contract::topology::Topology;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use crate::{TestBed, WAIT, wait_until};

/// How often a manager renews the Lease (the Lease lasts 10 s).
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// The primary Lease of Database `database`.
pub fn lease_name(database: &str) -> String {
    format!("{database}-primary")
}

/// The primary the Lease designates.
pub async fn designated(leases: &Api<Lease>, lease: &str) -> Option<String> {
    let lease = leases.get(lease).await.ok()?;
    let text = lease
        .metadata
        .annotations?
        .get("dbop.dev/topology")?
        .clone();
    Topology::parse(&text).ok().map(|t| t.primary)
}

/// Writes the Lease as instance `me` would: take or renew it (`release`: give it up).
pub async fn write_as(leases: &Api<Lease>, lease: &str, me: &str, release: bool) -> bool {
    let Ok(mut current) = leases.get(lease).await else {
        return false;
    };
    let spec = current.spec.get_or_insert_with(Default::default);
    spec.holder_identity = (!release).then(|| me.to_string());
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    let annotations = current
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if release {
        annotations.insert("dbop.dev/released-by".into(), me.into());
    } else {
        annotations.remove("dbop.dev/released-by");
    }
    leases
        .replace(lease, &PostParams::default(), &current)
        .await
        .is_ok()
}

/// Who renews.
#[derive(Clone)]
enum Renewer {
    /// Always this instance.
    Instance(String),
    /// Whichever instance the Lease designates (the managers of a healthy Database, which
    /// follow every designation: failover, switchover).
    Designated,
}

/// Renewals of one primary Lease every 2 s until stopped or dropped; counts the successful
/// writes.
pub struct Renewing {
    stop: Arc<AtomicBool>,
    renewals: Arc<AtomicU32>,
}

impl Renewing {
    /// Instance `me`'s renewals.
    pub fn start(leases: &Api<Lease>, lease: &str, me: &str) -> Renewing {
        Self::spawn(leases, lease, Renewer::Instance(me.to_string()))
    }

    /// The renewals of every designated primary of Database `database` in `ns`, as its
    /// managers would make them.
    pub fn as_managers(bed: &TestBed, ns: &str, database: &str) -> Renewing {
        let leases = Api::namespaced(bed.client.clone(), ns);
        Self::spawn(&leases, &lease_name(database), Renewer::Designated)
    }

    fn spawn(leases: &Api<Lease>, lease: &str, renewer: Renewer) -> Renewing {
        let (stop, renewals) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU32::new(0)),
        );
        let (leases, lease) = (leases.clone(), lease.to_string());
        let (s, r) = (stop.clone(), renewals.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::SeqCst) {
                let me = match &renewer {
                    Renewer::Instance(me) => Some(me.clone()),
                    Renewer::Designated => designated(&leases, &lease).await,
                };
                if let Some(me) = me
                    && write_as(&leases, &lease, &me, false).await
                {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(RENEW_EVERY).await;
            }
        });
        Renewing { stop, renewals }
    }

    /// Waits until it renewed `n` more times (`n` × 2 s).
    pub async fn for_renewals(&self, n: u32) {
        let target = self.renewals.load(Ordering::SeqCst) + n;
        let renewals = self.renewals.clone();
        wait_until(&format!("{n} more renewals"), WAIT, || async {
            (renewals.load(Ordering::SeqCst) >= target).then_some(())
        })
        .await;
    }

    /// Stops renewing (as dropping it does).
    pub fn stop(self) {
        drop(self)
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
