//! `kubectl dbop`: the kubectl plugin's commands (status, backup, psql).
//!
//! `render`, `health`, `text` and `psql` are pure (a screen from objects and scrapes, an argv from
//! names); `read` is the one place that talks to the API server. The binary (`src/kubectl_dbop.rs`) only parses flags and
//! wires them together.

pub mod health;
pub mod kubectl;
pub mod logs;
pub mod output;
pub mod psql;
pub mod read;
pub mod render;
pub mod report;
pub mod restore;
pub mod text;
