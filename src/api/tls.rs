//! `spec.tls`: how network clients reach the server. Every Database serves TLS with a
//! certificate for its Service names, from a CA dbop makes for it (`resources::tls`), a Secret
//! of the user's, or a cert-manager issuer (`resources::cert_manager`); the spec also chooses
//! whether a client without TLS is still let in.
//!
//! Pure data: no client, no I/O.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Encryption of client connections (docs/security.md, "TLS").
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.serverCertificate) || !has(self.superuserAuthentication) || self.superuserAuthentication == 'Password'",
    "message": "superuserAuthentication Certificate needs dbop's CA (it signs the client certificate of dbop's Jobs): remove serverCertificate or use Password"
}, {
    "rule": "!has(self.issuerRef) || !has(self.serverCertificate)",
    "message": "issuerRef and serverCertificate both name where the server certificate comes from: set one of them"
}, {
    "rule": "!has(self.issuerRef) || !has(self.superuserAuthentication) || self.superuserAuthentication == 'Password'",
    "message": "superuserAuthentication Certificate needs dbop's CA (it signs the client certificate of dbop's Jobs): remove issuerRef or use Password"
}]))]
pub struct TlsSpec {
    /// Also admit network clients without TLS (SCRAM still required). Default false: a client
    /// with `sslmode=disable` is refused, one with libpq's default `prefer` uses TLS. A reload
    /// applies a change; nothing restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_plaintext: Option<bool>,

    /// The server certificate from a Secret of your own instead of dbop's CA: keys `tls.crt`,
    /// `tls.key` and `ca.crt` (what a cert-manager Certificate writes). dbop neither issues nor
    /// renews it (cert-manager does, before it expires); the server picks up a new one by a
    /// reload. It must name `<name>-rw.<namespace>.svc`, the name dbop's Jobs verify. Changing
    /// it restarts the pods one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<ServerCertificateRef>,

    /// The server certificate from a cert-manager Issuer or ClusterIssuer of yours instead of
    /// dbop's CA: dbop writes and keeps in shape a cert-manager `Certificate` `<name>-server`
    /// for the Database's names, which cert-manager fills into Secret
    /// `<name>-cert-manager-tls` and renews. The issuer must fill `ca.crt` (a CA or Vault
    /// issuer, not ACME): dbop's Jobs trust it. cert-manager must be installed. Changing it
    /// restarts the pods one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,

    /// How the superuser may log in from the network. `Password` (default): SCRAM over TLS,
    /// like every role. `Certificate`: only with a client certificate from the Database's CA
    /// (which only dbop's Jobs hold, Secret `<name>-superuser-tls`); its password works on the
    /// pod's local socket only (`kubectl dbop psql`). A reload applies a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superuser_authentication: Option<SuperuserAuthentication>,
}

/// How the superuser logs in from the network.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SuperuserAuthentication {
    /// SCRAM with its password, over TLS.
    #[default]
    Password,
    /// A client certificate from the Database's CA only; no password login from the network.
    Certificate,
}

/// A Secret in the Database's namespace with a server certificate.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerCertificateRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// A cert-manager issuer (`spec.tls.issuerRef`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// The issuer's name (an Issuer in the Database's namespace, or a ClusterIssuer).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `Issuer` (default) or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<IssuerKind>,
    /// The issuer's API group (default `cert-manager.io`; another for an external issuer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub group: Option<String>,
}

/// The kind of a cert-manager issuer.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IssuerKind {
    /// An Issuer in the Database's namespace.
    #[default]
    Issuer,
    /// A cluster-wide ClusterIssuer.
    ClusterIssuer,
}

impl IssuerRef {
    /// The issuer's kind, defaulted.
    pub fn kind(&self) -> &'static str {
        match self.kind.unwrap_or_default() {
            IssuerKind::Issuer => "Issuer",
            IssuerKind::ClusterIssuer => "ClusterIssuer",
        }
    }
    /// The issuer's group, defaulted.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or("cert-manager.io")
    }
}

impl TlsSpec {
    /// The cert-manager issuer the server certificate comes from, if the spec names one.
    pub fn issuer(spec: Option<&TlsSpec>) -> Option<&IssuerRef> {
        spec?.issuer_ref.as_ref()
    }

    /// The Secret of the user's own server certificate, if the spec names one.
    pub fn own_certificate(spec: Option<&TlsSpec>) -> Option<&str> {
        spec?
            .server_certificate
            .as_ref()
            .map(|c| c.secret_name.as_str())
    }

    /// Whether the superuser logs in from the network with dbop's client certificate only.
    pub fn superuser_by_certificate(spec: Option<&TlsSpec>) -> bool {
        spec.and_then(|t| t.superuser_authentication) == Some(SuperuserAuthentication::Certificate)
    }

    /// Whether plaintext network connections are admitted (absent: no).
    pub fn allows_plaintext(spec: Option<&TlsSpec>) -> bool {
        spec.and_then(|t| t.allow_plaintext).unwrap_or(false)
    }
}
