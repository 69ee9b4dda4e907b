//! TLS for the replication connection, as libpq's `sslmode` means it: `verify-full` checks the
//! chain against `PGSSLROOTCERT` and the host name against the certificate; `prefer` and
//! `require` (without a root certificate, the only case `conninfo` lets through) encrypt and
//! check nothing about who answers. The client certificate (`PGSSLCERT`, `PGSSLKEY`) is
//! presented when set. rustls with ring, as the rest of the agent. The server certificate's
//! hash for SCRAM's channel binding (`end_point_hash`) is computed here too.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, ring};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::conninfo::{Settings, SslMode};

/// The TLS session over `tcp`, for `host`, and the server certificate's hash for channel
/// binding (`None` when its signature has no hash to bind with).
pub(super) async fn wrap(
    tcp: TcpStream,
    host: &str,
    settings: &Settings,
) -> Result<(Box<dyn super::Socket>, Option<Vec<u8>>), String> {
    let config = client_config(settings)?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} is not a host name TLS can check: {e}"))?;
    let stream = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let end_point = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|certificate| end_point_hash(certificate));
    Ok((Box::new(stream), end_point))
}

/// `tls-server-end-point` (RFC 5929, section 4.1), as PostgreSQL's server computes it: the
/// certificate hashed with the hash of its own signature, SHA-256 in place of MD5 and SHA-1;
/// `None` for a signature without one hash (Ed25519, RSASSA-PSS), which is then not bound.
pub(crate) fn end_point_hash(certificate: &[u8]) -> Option<Vec<u8>> {
    let oid = signature_algorithm(certificate)?;
    let (_, hash) = SIGNATURE_HASHES.iter().find(|(known, _)| *known == oid)?;
    Some(match hash {
        Hash::Sha224 => Sha224::digest(certificate).to_vec(),
        Hash::Sha256 => Sha256::digest(certificate).to_vec(),
        Hash::Sha384 => Sha384::digest(certificate).to_vec(),
        Hash::Sha512 => Sha512::digest(certificate).to_vec(),
    })
}

enum Hash {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// Signature algorithms (their OIDs' content octets) and the hash binding uses for each.
#[rustfmt::skip]
const SIGNATURE_HASHES: [(&[u8], Hash); 11] = [
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04], Hash::Sha256), // md5WithRSA
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05], Hash::Sha256), // sha1WithRSA
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b], Hash::Sha256), // sha256WithRSA
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c], Hash::Sha384), // sha384WithRSA
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d], Hash::Sha512), // sha512WithRSA
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0e], Hash::Sha224), // sha224WithRSA
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01], Hash::Sha256),             // ecdsa-with-SHA1
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x01], Hash::Sha224),       // ecdsa-with-SHA224
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02], Hash::Sha256),       // ecdsa-with-SHA256
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03], Hash::Sha384),       // ecdsa-with-SHA384
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04], Hash::Sha512),       // ecdsa-with-SHA512
];

/// The OID of a certificate's signature algorithm: `Certificate ::= SEQUENCE {
/// tbsCertificate, signatureAlgorithm SEQUENCE { algorithm OID, … }, signature }`.
fn signature_algorithm(certificate: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (fields, _) = der_element(certificate, SEQUENCE)?;
    let (_tbs, rest) = der_element(fields, SEQUENCE)?;
    let (algorithm, _) = der_element(rest, SEQUENCE)?;
    let (oid, _) = der_element(algorithm, OID)?;
    Some(oid)
}

/// The DER element of tag `tag` at the start of `input`: its content, and what follows it.
fn der_element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = match first {
        short @ 0..=0x7f => (usize::from(short), rest),
        long @ 0x81..=0x84 => {
            let (octets, rest) = rest.split_at_checked(usize::from(long & 0x7f))?;
            let length = octets.iter().fold(0usize, |n, o| n << 8 | usize::from(*o));
            (length, rest)
        }
        _ => return None,
    };
    (found == tag).then_some(())?;
    rest.split_at_checked(length)
}

fn client_config(settings: &Settings) -> Result<ClientConfig, String> {
    let provider = Arc::new(ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match (settings.ssl_mode, &settings.root_cert) {
        (SslMode::VerifyFull, Some(root)) => builder.with_root_certificates(roots(root)?),
        (SslMode::VerifyFull, None) => return Err("verify-full needs a root certificate".into()),
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider))),
    };
    match &settings.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("the client certificate {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("the client key {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate: {e}"))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("the root certificate {}: {e}", path.display()))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(store)
}

/// `prefer` and `require`: any certificate, but the handshake's signatures still checked (the
/// session is encrypted with whoever holds the certificate's key).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element (lengths up to 65,535).
    fn der(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match content.len() {
            n @ 0..=0x7f => out.push(n as u8),
            n @ 0x80..=0xff => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(content);
        out
    }

    fn certificate(oid: &[u8]) -> Vec<u8> {
        let tbs = der(0x30, &[0x04; 600]);
        let algorithm = der(0x30, &der(0x06, oid));
        let signature = der(0x03, &[0, 1, 2, 3]);
        der(0x30, &[tbs, algorithm, signature].concat())
    }

    #[test]
    fn the_certificate_is_hashed_with_its_signature_s_hash_and_sha_256_for_weaker_ones() {
        let rsa = |last: u8| vec![0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, last];
        let ecdsa = |last: u8| vec![0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, last];
        for (oid, length) in [
            (rsa(0x0b), 32),
            (rsa(0x05), 32),
            (rsa(0x04), 32),
            (rsa(0x0c), 48),
            (rsa(0x0d), 64),
            (rsa(0x0e), 28),
            (ecdsa(0x01), 28),
            (ecdsa(0x02), 32),
            (ecdsa(0x03), 48),
            (ecdsa(0x04), 64),
        ] {
            let c = certificate(&oid);
            let hash = end_point_hash(&c).unwrap_or_else(|| panic!("{oid:x?}"));
            assert_eq!(hash.len(), length, "{oid:x?}");
            let expected = match length {
                28 => Sha224::digest(&c).to_vec(),
                32 => Sha256::digest(&c).to_vec(),
                48 => Sha384::digest(&c).to_vec(),
                _ => Sha512::digest(&c).to_vec(),
            };
            assert_eq!(hash, expected, "the whole certificate, hashed: {oid:x?}");
        }
    }

    #[test]
    fn signatures_without_one_hash_and_broken_certificates_are_not_bound() {
        let ed25519 = [0x2b, 0x65, 0x70];
        let pss = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
        assert_eq!(end_point_hash(&certificate(&ed25519)), None);
        assert_eq!(end_point_hash(&certificate(&pss)), None);
        let whole = certificate(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b]);
        for cut in [0, 1, 2, 5, 300, whole.len() - 1] {
            assert_eq!(end_point_hash(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(end_point_hash(b"not a certificate at all"), None);
        let mut wrong_tag = whole.clone();
        wrong_tag[0] = 0x31;
        assert_eq!(end_point_hash(&wrong_tag), None);
    }
}
