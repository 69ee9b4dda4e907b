//! `spec.tls`: how network clients reach the server. Every Database serves TLS with a
//! certificate for its Service names, from a CA dbop makes for it (`resources::tls`); what the
//! spec chooses is whether a client without TLS is still let in.
//!
//! Pure data: no client, no I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Encryption of client connections (docs/security.md, "TLS").
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Also admit network clients without TLS (SCRAM still required). Default false: a client
    /// with `sslmode=disable` is refused, one with libpq's default `prefer` uses TLS. A reload
    /// applies a change; nothing restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_plaintext: Option<bool>,
}

impl TlsSpec {
    /// Whether plaintext network connections are admitted (absent: no).
    pub fn allows_plaintext(spec: Option<&TlsSpec>) -> bool {
        spec.and_then(|t| t.allow_plaintext).unwrap_or(false)
    }
}
