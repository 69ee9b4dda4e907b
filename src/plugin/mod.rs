//! `kubectl dbop`: the kubectl plugin's commands (status, list, logs, backup, restore, restart,
//! reload, promote, psql, report, completion).
//!
//! `render`, `health`, `text`, `output`, `psql`, `logs`, `kubectl`, `restore`, `complete` and
//! `report` are pure (a screen, a document or a new object from objects and scrapes, an argv from names;
//! `report` also writes its bundle to local files); `read` is the one place that talks to the
//! API server. The binary (`src/kubectl_dbop.rs`) only parses flags, runs kubectl and wires them
//! together.

pub mod complete;
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
