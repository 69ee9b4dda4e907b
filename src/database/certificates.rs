//! The keys and certificates of a Database's TLS (rcgen, on ring, which kube's TLS already
//! builds): a CA made once per Database, and server certificates it signs. This and
//! `apply::new_password` are a pass's only randomness; no I/O here: the CA's key comes in,
//! read from its Secret by `observe::signing_ca` only in a pass that signs (the Secret cache
//! holds metadata only).
//!
//! Keys are ECDSA P-256: what every supported libpq and PostgreSQL accept, and a fraction of
//! an RSA key's signing cost.

use chrono::{DateTime, Duration, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};

use super::tls::{CA_VALIDITY, SERVER_VALIDITY, TlsSteps};
use crate::api::Database;
use crate::error::{Error, Result};
use crate::resources::tls::{ServerCertificate, ca_common_name, dns_names};

/// A CA: its certificate and key, PEM.
#[derive(Clone, Debug)]
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a pass's TLS steps made: a new CA (to store), a new server certificate (to store),
/// and the CA's certificate for the credentials Secret.
#[derive(Clone, Debug, Default)]
pub struct Issued {
    pub new_ca: Option<Ca>,
    pub server: Option<ServerCertificate>,
    /// The superuser's client certificate (`spec.tls.superuserAuthentication`).
    pub superuser: Option<ServerCertificate>,
    pub ca_cert_pem: Option<String>,
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Certificate(format!("{what}: {e}"))
}

fn time(t: DateTime<Utc>) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|e| failed("time", e))
}

fn ca_params(db: &Database, now: DateTime<Utc>) -> Result<CertificateParams> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, ca_common_name(db));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = time(now - Duration::hours(1))?;
    params.not_after = time(now + CA_VALIDITY)?;
    Ok(params)
}

/// A new CA for `db`.
pub fn new_ca(db: &Database, now: DateTime<Utc>) -> Result<Ca> {
    let key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
    let cert = ca_params(db, now)?
        .self_signed(&key)
        .map_err(|e| failed("CA certificate", e))?;
    Ok(Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A server certificate for `db`'s names, signed by `ca` (whose subject is always
/// `ca_common_name`, so the issuer needs only its key).
pub fn new_server(db: &Database, ca: &Ca, now: DateTime<Utc>) -> Result<ServerCertificate> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| failed("the CA's key", e))?;
    let issuer = Issuer::new(ca_params(db, now)?, ca_key);
    let names = dns_names(db);
    let mut params = CertificateParams::new(names.clone()).map_err(|e| failed("names", e))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, names[0].clone());
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
    let not_after = now + SERVER_VALIDITY;
    params.not_before = time(now - Duration::hours(1))?;
    params.not_after = time(not_after)?;
    let key = KeyPair::generate().map_err(|e| failed("server key", e))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| failed("server certificate", e))?;
    Ok(ServerCertificate {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_cert_pem: ca.cert_pem.clone(),
        not_after: DateTime::from_timestamp(not_after.timestamp(), 0).unwrap_or(not_after),
        names,
    })
}

/// The superuser's client certificate (common name `user`, for PostgreSQL's `cert` method),
/// signed by `ca`.
pub fn new_superuser(
    db: &Database,
    ca: &Ca,
    user: &str,
    now: DateTime<Utc>,
) -> Result<ServerCertificate> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| failed("the CA's key", e))?;
    let issuer = Issuer::new(ca_params(db, now)?, ca_key);
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, user);
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
    let not_after = now + SERVER_VALIDITY;
    params.not_before = time(now - Duration::hours(1))?;
    params.not_after = time(not_after)?;
    let key = KeyPair::generate().map_err(|e| failed("client key", e))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| failed("client certificate", e))?;
    Ok(ServerCertificate {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_cert_pem: ca.cert_pem.clone(),
        not_after: DateTime::from_timestamp(not_after.timestamp(), 0).unwrap_or(not_after),
        names: vec![user.to_string()],
    })
}

/// Does the pass's TLS steps' making: a CA when there is none, a server certificate when one
/// is due, and the CA's certificate when the credentials Secret lacks it. `existing` is the
/// Database's CA, read when the steps need it and there is one.
pub fn issue(
    db: &Database,
    steps: &TlsSteps,
    existing: Option<Ca>,
    now: DateTime<Utc>,
) -> Result<Issued> {
    if steps.issue.is_none() && !steps.credentials_ca && steps.issue_superuser.is_none() {
        return Ok(Issued::default());
    }
    let (ca, new_ca) = match (existing, steps.create_ca) {
        (_, true) => {
            let ca = new_ca(db, now)?;
            (ca.clone(), Some(ca))
        }
        (Some(ca), false) => (ca, None),
        // The user's own certificate: nothing to sign with, nothing to make.
        (None, false) => return Ok(Issued::default()),
    };
    let server = match steps.issue {
        Some(_) => Some(new_server(db, &ca, now)?),
        None => None,
    };
    let superuser = match &steps.issue_superuser {
        Some(user) => Some(new_superuser(db, &ca, user, now)?),
        None => None,
    };
    Ok(Issued {
        new_ca,
        server,
        superuser,
        ca_cert_pem: Some(ca.cert_pem),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    #[test]
    fn a_server_certificate_is_signed_by_the_ca_for_the_services_names() {
        let db = testing::minimal();
        let now = Utc::now();
        let ca = new_ca(&db, now).unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("PRIVATE KEY"));
        let server = new_server(&db, &ca, now).unwrap();
        assert_eq!(server.ca_cert_pem, ca.cert_pem);
        assert_eq!(server.names, dns_names(&db));
        assert_eq!(
            server.not_after.timestamp(),
            (now + SERVER_VALIDITY).timestamp()
        );
        let again = new_server(&db, &ca, now).unwrap();
        assert_ne!(
            again.cert_pem, server.cert_pem,
            "a fresh key and serial each time"
        );
        assert_ne!(again.key_pem, server.key_pem);
    }

    #[test]
    fn the_superuser_certificate_names_the_superuser_and_is_issued_with_the_ca() {
        let db = testing::minimal();
        let now = Utc::now();
        let steps = TlsSteps {
            create_ca: true,
            issue_superuser: Some("admin".into()),
            ..TlsSteps::default()
        };
        let issued = issue(&db, &steps, None, now).unwrap();
        let ca = issued.new_ca.unwrap();
        let client = issued.superuser.unwrap();
        assert_eq!(client.names, ["admin"]);
        assert_eq!(client.ca_cert_pem, ca.cert_pem);
        assert!(issued.server.is_none());
        // Only the superuser's is due: it is signed with the existing CA.
        let steps = TlsSteps {
            issue_superuser: Some("admin".into()),
            ..TlsSteps::default()
        };
        let again = issue(&db, &steps, Some(ca.clone()), now).unwrap();
        assert!(again.new_ca.is_none() && again.superuser.is_some());
    }

    #[test]
    fn a_ca_key_that_is_not_one_is_an_error_not_a_panic() {
        let db = testing::minimal();
        let bad = Ca {
            cert_pem: "x".into(),
            key_pem: "not a key".into(),
        };
        assert!(new_server(&db, &bad, Utc::now()).is_err());
    }
}
