//! Operating the operator: its Prometheus metrics, its HTTP endpoints (`/metrics`, `/healthz`,
//! `/readyz`) and its leader election. Depends only on `api`; the controllers record into
//! `Metrics` through the `Context`, and `operator` wires the three together.

pub mod leader;
pub mod metrics;
pub mod server;
