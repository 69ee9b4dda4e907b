//! The agent's own client of PostgreSQL's replication protocol, for base backups: it connects
//! where pg_basebackup would (the same libpq variables, `conninfo`), sends `BASE_BACKUP` with
//! server-side zstd and takes the archive's bytes and the manifest apart as the server sends
//! them (`base_backup`). The server compresses, so what crosses the socket is the compressed
//! archive, and no pg_basebackup process copies the stream through a pipe. Servers before
//! PostgreSQL 15 and settings this client does not implement are left to pg_basebackup.

pub mod base_backup;
pub mod conninfo;
mod tls;
pub mod wire;

use tokio::io::{AsyncRead, AsyncWrite};

/// A socket the connection speaks over: TCP, TLS over TCP, or a Unix socket.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// The settings from this process's environment, or why libpq should make this connection.
pub fn settings_from_env() -> Result<conninfo::Settings, conninfo::Unsupported> {
    let vars: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    conninfo::from_env(&|name| std::env::var(name).ok(), &vars, &|path| {
        std::path::Path::new(path).exists()
    })
}
