//! The cert-manager `Certificate` of a Database with `spec.tls.issuerRef`: `<name>-server`, for
//! the Database's names (`tls::dns_names`), from the user's issuer, into Secret
//! `<name>-cert-manager-tls`, which the pods mount as they mount a Secret of the user's own
//! (`spec.tls.serverCertificate`). Its key and lifetime are dbop's own certificates': ECDSA
//! P-256, a new key at every renewal, 90 days renewed a third before.
//!
//! A small typed struct of the fields dbop sets (not cert-manager's crate): the drift check
//! compares only those, and what cert-manager adds (status, defaults) is ignored.
//!
//! Pure builder.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::{Names, owned_meta};
use crate::api::{Database, TlsSpec};

/// How long cert-manager's certificate is valid, renewed a third before: dbop's own
/// (`database::tls::SERVER_VALIDITY`, which a test there holds this to).
pub const VALIDITY: chrono::Duration = chrono::Duration::days(90);

/// `cert-manager.io/v1` `Certificate`, the fields dbop sets.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<CertificateIssuerRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// A Certificate's `issuerRef`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateIssuerRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A Certificate's `privateKey`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKey {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_policy: Option<String>,
}

impl Names {
    /// The cert-manager Certificate of `spec.tls.issuerRef`.
    pub fn certificate(&self) -> String {
        format!("{}-server", self.database())
    }
    /// The Secret cert-manager writes for it (not `server_tls_secret`: dbop and cert-manager
    /// never write the same Secret, whichever way a Database switches).
    pub fn cert_manager_secret(&self) -> String {
        format!("{}-cert-manager-tls", self.database())
    }
}

/// A duration in cert-manager's (Go's) notation, in whole hours.
fn hours(d: chrono::Duration) -> String {
    format!("{}h", d.num_hours())
}

/// The Certificate of `spec.tls.issuerRef` (None: the spec names no issuer).
pub fn certificate(db: &Database) -> Option<Certificate> {
    let issuer = TlsSpec::issuer(db.spec.tls.as_ref())?;
    let names = Names::of(db);
    let spec = CertificateSpec {
        secret_name: names.cert_manager_secret(),
        dns_names: super::tls::dns_names(db),
        issuer_ref: Some(CertificateIssuerRef {
            name: issuer.name.clone(),
            kind: Some(issuer.kind().into()),
            group: Some(issuer.group().into()),
        }),
        private_key: Some(PrivateKey {
            algorithm: Some("ECDSA".into()),
            size: Some(256),
            rotation_policy: Some("Always".into()),
        }),
        usages: vec!["server auth".into(), "digital signature".into()],
        duration: Some(hours(VALIDITY)),
        renew_before: Some(hours(VALIDITY / 3)),
    };
    let mut certificate = Certificate::new(&names.certificate(), spec);
    certificate.metadata = owned_meta(db, names.certificate(), "tls");
    Some(certificate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;
    use serde_json::json;

    #[test]
    fn no_issuer_no_certificate() {
        assert!(certificate(&testing::minimal()).is_none());
    }

    #[test]
    fn the_certificate_names_the_databases_services_the_issuer_and_dbops_key_and_lifetime() {
        let mut db = testing::minimal();
        db.spec.tls = Some(
            serde_json::from_value(
                json!({"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}),
            )
            .unwrap(),
        );
        let cert = certificate(&db).unwrap();
        let value = serde_json::to_value(&cert).unwrap();
        assert_eq!(value["apiVersion"], "cert-manager.io/v1");
        assert_eq!(value["kind"], "Certificate");
        assert_eq!(value["metadata"]["name"], format!("{}-server", db.name()));
        assert_eq!(
            value["metadata"]["ownerReferences"][0]["kind"], "Database",
            "{value}"
        );
        assert_eq!(
            value["spec"],
            json!({
                "secretName": format!("{}-cert-manager-tls", db.name()),
                "dnsNames": crate::resources::tls::dns_names(&db),
                "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "usages": ["server auth", "digital signature"],
                "duration": "2160h",
                "renewBefore": "720h",
            })
        );
        db.spec.tls = Some(
            serde_json::from_value(json!({"issuerRef": {"name": "vault", "group": "example.com"}}))
                .unwrap(),
        );
        let spec = certificate(&db).unwrap().spec;
        assert_eq!(
            spec.issuer_ref,
            Some(CertificateIssuerRef {
                name: "vault".into(),
                kind: Some("Issuer".into()),
                group: Some("example.com".into()),
            })
        );
    }
}
