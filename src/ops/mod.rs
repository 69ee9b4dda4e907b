//! Operating the operator: its Prometheus metrics, its HTTP endpoints (`/metrics`, `/healthz`,
//! `/readyz`), its leader election and its API request budget. Depends only on `api`; the
//! controllers record into `Metrics` through the `Context`, and `operator` wires them together.

mod database_series;
pub mod leader;
pub mod metrics;
pub mod server;
