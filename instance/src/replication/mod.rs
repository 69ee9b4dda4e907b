//! Streaming replication: what a primary needs, cloning a standby, following, promoting and
//! rejoining (rewind or fresh clone), and the status a controller reads.
//!
//! Pure modules: `config` (settings, pg_hba lines, the managed standby file, conninfo, the
//! passfile line, slot names), `rejoin` (rewind vs fresh clone, from `pg_controldata` and the
//! primary's `IDENTIFY_SYSTEM`), `status` (LSNs, the status query and its parser, slots).
//! I/O: `ops` (psql, pg_basebackup, pg_rewind, files) and `cli` (the `dbop-instance
//! replication …` subcommands over `ops`). Nothing here decides *which* instance is primary:
//! that is the operator's decision, these are the mechanics it drives.

pub mod cli;
pub mod config;
pub mod ops;
pub mod rejoin;
pub mod status;
