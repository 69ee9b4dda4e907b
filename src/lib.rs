//! dbop: a Kubernetes operator that runs PostgreSQL with its whole lifecycle.
//!
//! The layout follows the reconcile: `api` (the CRD types), `resources` (pure builders of every
//! owned object), `reconcile` (observe → decide → act) and `controller` (the watches and the
//! runtime around it).

pub mod api;
pub mod backup;
pub mod controller;
pub mod error;
pub mod reconcile;
pub mod resources;
pub mod telemetry;

/// The field manager of every server-side apply dbop sends.
pub const FIELD_MANAGER: &str = "dbop";
/// The finalizer that runs the deletion policy.
pub const FINALIZER: &str = "dbop.dev/cleanup";

/// The user agent of every request dbop sends, so the API server's audit log can tell them
/// apart.
pub const USER_AGENT: &str = concat!("dbop/", env!("CARGO_PKG_VERSION"));

/// A client from the kubeconfig or the in-cluster config, identifying itself as dbop.
pub async fn client() -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    kube::Client::try_from(config)
}
