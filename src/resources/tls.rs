//! The Database's TLS objects: its CA Secret (`<name>-ca`: `ca.crt`, `ca.key`), its server
//! certificate Secret (`<name>-server-tls`: `tls.crt`, `tls.key`, `ca.crt`, the layout of
//! `kubernetes.io/tls` and cert-manager), the names the certificate is for, the volumes that
//! mount them, and the libpq environment of dbop's Jobs.
//!
//! What a pass decides from travels in annotations, so the metadata-only Secret cache is enough
//! (no key is held in the operator's memory between passes): the CA's id (a digest of its
//! certificate) on the CA Secret; the server certificate's expiry, names and CA on its Secret;
//! the CA the generated credentials Secret carries.
//!
//! Pure builders: the keys and certificates come in as PEM (`database::certificates` makes
//! them).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use dbop_contract::instance::{TLS_CA_FILE, TLS_CERT_FILE, TLS_DIR, TLS_KEY_FILE, tls_args};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, PodTemplateSpec, Secret, SecretVolumeSource, Volume, VolumeMount,
};

use super::pod::{env, mount};
use super::{Names, owned_meta};
use crate::api::conditions::{ConditionType, find};
use crate::api::{Database, TlsSpec};

/// The CA's private key in the CA Secret (never mounted in a pod).
pub const CA_KEY: &str = "ca.key";
/// On the CA Secret, the server certificate's and the credentials Secret: the id of the CA.
pub const CA_ID_ANNOTATION: &str = "dbop.dev/tls-ca";
/// On the server certificate's Secret: when it expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "dbop.dev/tls-not-after";
/// On the server certificate's Secret: the names it is for, comma-separated.
pub const NAMES_ANNOTATION: &str = "dbop.dev/tls-names";
/// The volume of the server certificate in a database pod, mounted at `TLS_DIR`.
pub const SERVER_VOLUME: &str = "tls";
/// Where dbop's Jobs find the CA that signed the server's certificate.
pub const JOB_CA_DIR: &str = "/etc/dbop/database-ca";
const JOB_CA_VOLUME: &str = "database-ca";

/// The id of a CA: the first 16 hex digits of the SHA-256 of its certificate's PEM.
pub fn ca_id(ca_cert_pem: &str) -> String {
    super::short_digest(ca_cert_pem.as_bytes())
}

impl Names {
    /// The CA Secret.
    pub fn ca_secret(&self) -> String {
        format!("{}-ca", self.database())
    }
    /// The server certificate's Secret.
    pub fn server_tls_secret(&self) -> String {
        format!("{}-server-tls", self.database())
    }
    /// The superuser's client certificate Secret (`spec.tls.superuserAuthentication`).
    pub fn superuser_tls_secret(&self) -> String {
        format!("{}-superuser-tls", self.database())
    }
}

/// The DNS names the server's certificate is for: the client Services' (`-rw`, `-ro`, `-r`),
/// short and qualified, and every pod's through the headless Service (the instances reach
/// each other by these).
pub fn dns_names(db: &Database) -> Vec<String> {
    let names = Names::of(db);
    let ns = db.namespace_or_default();
    let headless = names.headless_service();
    let mut out = vec![];
    for service in [names.rw_service(), names.ro_service(), names.r_service()] {
        out.extend([
            service.clone(),
            format!("{service}.{ns}"),
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.cluster.local"),
        ]);
    }
    out.extend([
        format!("*.{headless}.{ns}.svc"),
        format!("*.{headless}.{ns}.svc.cluster.local"),
    ]);
    out
}

/// The subject of the Database's CA (the same every time: a server certificate signed again
/// later names the same issuer).
pub fn ca_common_name(db: &Database) -> String {
    format!("dbop {}/{} CA", db.namespace_or_default(), db.name())
}

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

fn annotated(db: &Database, name: String, annotations: BTreeMap<String, String>) -> Secret {
    let mut metadata = owned_meta(db, name, "tls");
    metadata.annotations = Some(annotations);
    Secret {
        metadata,
        ..Secret::default()
    }
}

/// The CA Secret, with the CA's certificate and key.
pub fn ca_secret(db: &Database, cert_pem: &str, key_pem: &str) -> Secret {
    let annotations = BTreeMap::from([(CA_ID_ANNOTATION.to_string(), ca_id(cert_pem))]);
    Secret {
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (TLS_CA_FILE.to_string(), bytes(cert_pem)),
            (CA_KEY.to_string(), bytes(key_pem)),
        ])),
        ..annotated(db, Names::of(db).ca_secret(), annotations)
    }
}

/// A server certificate, as issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerCertificate {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_cert_pem: String,
    pub not_after: DateTime<Utc>,
    pub names: Vec<String>,
}

/// The server certificate's Secret.
pub fn server_secret(db: &Database, cert: &ServerCertificate) -> Secret {
    let annotations = BTreeMap::from([
        (CA_ID_ANNOTATION.to_string(), ca_id(&cert.ca_cert_pem)),
        (
            NOT_AFTER_ANNOTATION.to_string(),
            cert.not_after.to_rfc3339(),
        ),
        (NAMES_ANNOTATION.to_string(), cert.names.join(",")),
    ]);
    Secret {
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (TLS_CERT_FILE.to_string(), bytes(&cert.cert_pem)),
            (TLS_KEY_FILE.to_string(), bytes(&cert.key_pem)),
            (TLS_CA_FILE.to_string(), bytes(&cert.ca_cert_pem)),
        ])),
        ..annotated(db, Names::of(db).server_tls_secret(), annotations)
    }
}

/// The superuser's client certificate Secret (its `names`: the superuser), in the server
/// certificate's layout and annotations: dbop's Jobs mount it to log in as the superuser.
pub fn superuser_secret(db: &Database, cert: &ServerCertificate) -> Secret {
    let mut secret = server_secret(db, cert);
    let annotations = secret.metadata.annotations.take();
    secret.metadata = owned_meta(db, Names::of(db).superuser_tls_secret(), "tls");
    secret.metadata.annotations = annotations;
    secret
}

/// The merge patch that puts the CA's certificate into the generated credentials Secret.
pub fn credentials_ca_patch(ca_cert_pem: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {CA_ID_ANNOTATION: ca_id(ca_cert_pem)}},
        "data": {TLS_CA_FILE: bytes(ca_cert_pem)},
    })
}

/// A server certificate dbop does not issue: the Secret it is in, and what names that Secret
/// (for the messages of `TLSReady`). The user's own (`spec.tls.serverCertificate`), or the
/// one cert-manager fills from the Certificate of `spec.tls.issuerRef`.
pub fn external_certificate(db: &Database) -> Option<(String, String)> {
    let spec = db.spec.tls.as_ref();
    if let Some(name) = TlsSpec::own_certificate(spec) {
        return Some((name.to_string(), "spec.tls.serverCertificate".into()));
    }
    TlsSpec::issuer(spec).map(|_| {
        let names = Names::of(db);
        (
            names.cert_manager_secret(),
            format!(
                "written by cert-manager for Certificate {}, spec.tls.issuerRef",
                names.certificate()
            ),
        )
    })
}

/// The Secret the database pods mount their certificate from: the user's own
/// (`spec.tls.serverCertificate`), cert-manager's (`spec.tls.issuerRef`), or the one dbop
/// issues.
pub fn mounted_secret(db: &Database) -> String {
    external_certificate(db).map_or_else(|| Names::of(db).server_tls_secret(), |(name, _)| name)
}

/// The Secret whose `ca.crt` dbop's Jobs trust: the certificate's Secret when dbop does not
/// issue it, or dbop's CA.
fn trusted_secret(db: &Database) -> String {
    external_certificate(db).map_or_else(|| Names::of(db).ca_secret(), |(name, _)| name)
}

/// The Secret a StatefulSet's pod template mounts the server certificate from.
pub fn mounted_by(sts: Option<&StatefulSet>) -> Option<String> {
    sts?.spec
        .template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == SERVER_VOLUME)?
        .secret
        .as_ref()?
        .secret_name
        .clone()
}

/// The server certificate's volume in a database pod: readable by the pod's group only (the
/// instance manager copies it to a file of its own, mode 0600, for the server).
pub fn server_volume(db: &Database) -> Volume {
    let items = [TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE]
        .map(|key| KeyToPath {
            key: key.into(),
            path: key.into(),
            ..KeyToPath::default()
        })
        .to_vec();
    Volume {
        name: SERVER_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(mounted_secret(db)),
            items: Some(items),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Mounts the server certificate into the database container and tells the instance manager
/// (`run --tls-dir`) to serve TLS with it.
pub fn add_to_pod_template(template: &mut PodTemplateSpec, db: &Database) {
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    let Some(postgres) = pod.containers.iter_mut().find(|c| c.name == "postgres") else {
        return;
    };
    postgres
        .command
        .get_or_insert_with(Vec::new)
        .extend(tls_args(TLS_DIR));
    postgres
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount(SERVER_VOLUME, TLS_DIR, true));
    pod.volumes
        .get_or_insert_with(Vec::new)
        .push(server_volume(db));
}

/// The `pg_hba.conf` rules `spec.tls.allowPlaintext` adds after the Database's own: SCRAM
/// without TLS from anywhere (dbop's own rules are `hostssl`).
pub fn plaintext_rules(db: &Database) -> Option<String> {
    TlsSpec::allows_plaintext(db.spec.tls.as_ref()).then(|| {
        "# spec.tls.allowPlaintext: clients without TLS too (SCRAM)\n\
         host all all 0.0.0.0/0 scram-sha-256\n\
         host all all ::/0 scram-sha-256\n"
            .to_string()
    })
}

/// The `pg_hba.conf` rules of `superuserAuthentication: Certificate`, before the Database's
/// own: the superuser from the network only over TLS with a certificate of the Database's CA
/// whose common name is its name (PostgreSQL's `cert` method), never with a password.
pub fn superuser_rules(db: &Database, superuser: &str) -> Option<String> {
    TlsSpec::superuser_by_certificate(db.spec.tls.as_ref()).then(|| {
        let user = format!("\"{}\"", superuser.replace('"', "\"\""));
        format!(
            "# spec.tls.superuserAuthentication: Certificate (dbop's Jobs only)\n\
             hostssl all {user} 0.0.0.0/0 cert\n\
             hostssl all {user} ::/0 cert\n\
             host all {user} 0.0.0.0/0 reject\n\
             host all {user} ::/0 reject\n"
        )
    })
}

/// Whether the Database's status says every pod serves TLS (`TLSReady`): then dbop's Jobs
/// verify the server's certificate and name; before (a Database whose pods have not restarted
/// on TLS yet), they use TLS when it is offered, as libpq does by default.
pub fn verified(db: &Database) -> bool {
    db.status
        .as_ref()
        .and_then(|s| find(&s.conditions, ConditionType::TlsReady))
        .is_some_and(|c| c.status == "True")
}

/// The libpq environment of a Job that connects to the Database. With
/// `superuserAuthentication: Certificate` the Job presents the superuser's client certificate
/// (`client_ca` mounts it), over TLS even before the server is known to serve it verified.
pub fn client_env(db: &Database) -> Vec<EnvVar> {
    let file = |name: &str| format!("{JOB_CA_DIR}/{name}");
    let mut vars = match (verified(db), by_certificate(db)) {
        (false, false) => return vec![env("PGSSLMODE", "prefer")],
        (false, true) => vec![env("PGSSLMODE", "require")],
        (true, _) => vec![
            env("PGSSLMODE", "verify-full"),
            env("PGSSLROOTCERT", &file(TLS_CA_FILE)),
        ],
    };
    if by_certificate(db) {
        vars.push(env("PGSSLCERT", &file(TLS_CERT_FILE)));
        vars.push(env("PGSSLKEY", &file(TLS_KEY_FILE)));
    }
    vars
}

fn by_certificate(db: &Database) -> bool {
    TlsSpec::superuser_by_certificate(db.spec.tls.as_ref())
}

/// What a Job that connects mounts: the CA's certificate (never its key) when it verifies the
/// server; with `superuserAuthentication: Certificate`, the superuser's client certificate
/// Secret instead (its `ca.crt`, `tls.crt` and `tls.key`; mode 0440: libpq takes a key owned
/// by root that the group may read).
pub fn client_ca(db: &Database) -> Option<(Volume, VolumeMount)> {
    let (secret, keys, mode) = if by_certificate(db) {
        let keys = vec![TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE];
        (Names::of(db).superuser_tls_secret(), keys, Some(0o440))
    } else if verified(db) {
        (trusted_secret(db), vec![TLS_CA_FILE], None)
    } else {
        return None;
    };
    let items = keys
        .into_iter()
        .map(|key| KeyToPath {
            key: key.into(),
            path: key.into(),
            ..KeyToPath::default()
        })
        .collect();
    let volume = Volume {
        name: JOB_CA_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            items: Some(items),
            default_mode: mode,
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    Some((volume, mount(JOB_CA_VOLUME, JOB_CA_DIR, true)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::ConditionStatus;
    use crate::resources::testing;

    fn cert() -> ServerCertificate {
        ServerCertificate {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
            ca_cert_pem: "CA".into(),
            not_after: "2027-03-01T00:00:00Z".parse().unwrap(),
            names: vec!["orders-rw".into(), "orders-rw.shop".into()],
        }
    }

    #[test]
    fn names_cover_the_services_and_the_pods() {
        let names = dns_names(&testing::minimal());
        assert!(names.contains(&"orders-rw".to_string()));
        assert!(names.contains(&"orders-rw.shop.svc".to_string()));
        assert!(names.contains(&"*.orders-hl.shop.svc".to_string()));
    }

    #[test]
    fn secrets_carry_their_facts_in_annotations_and_the_key_only_where_needed() {
        let db = testing::minimal();
        let ca = ca_secret(&db, "CA", "CAKEY");
        assert_eq!(ca.metadata.name.as_deref(), Some("orders-ca"));
        let annotations = ca.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[CA_ID_ANNOTATION], ca_id("CA"));
        assert_eq!(ca.data.unwrap()[CA_KEY].0, b"CAKEY");
        let server = server_secret(&db, &cert());
        assert_eq!(server.type_.as_deref(), Some("kubernetes.io/tls"));
        let a = server.metadata.annotations.unwrap();
        assert_eq!(a[CA_ID_ANNOTATION], ca_id("CA"));
        assert_eq!(a[NAMES_ANNOTATION], "orders-rw,orders-rw.shop");
        assert_eq!(a[NOT_AFTER_ANNOTATION], "2027-03-01T00:00:00+00:00");
        let data = server.data.unwrap();
        assert!(!data.contains_key(CA_KEY));
        assert_eq!(data[TLS_KEY_FILE].0, b"KEY");
        assert_ne!(ca_id("CA"), ca_id("CA2"));
    }

    #[test]
    fn the_database_pods_mount_the_certificate_and_serve_tls_with_it() {
        let db = testing::minimal();
        let sts = crate::resources::statefulset::statefulset(
            &db,
            &crate::settings::Settings::default(),
            None,
        );
        let pod = sts.spec.template.spec.unwrap();
        let postgres = &pod.containers[0];
        let command = postgres.command.as_ref().unwrap();
        assert_eq!(command[1], "run");
        assert!(
            command.contains(&format!("--tls-dir={TLS_DIR}")),
            "{command:?}"
        );
        let probe = postgres.readiness_probe.as_ref().unwrap();
        let probe = probe.exec.as_ref().unwrap().command.as_ref().unwrap();
        assert!(
            !probe.iter().any(|a| a.starts_with("--tls-dir")),
            "run only"
        );
        let mounts = postgres.volume_mounts.as_ref().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == SERVER_VOLUME && m.mount_path == TLS_DIR)
        );
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == SERVER_VOLUME)
            .unwrap();
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("orders-server-tls"));
        assert_eq!(secret.default_mode, Some(0o440));
    }

    #[test]
    fn plaintext_is_admitted_only_when_the_spec_says_so() {
        let mut db = testing::minimal();
        assert_eq!(plaintext_rules(&db), None);
        db.spec.tls = Some(TlsSpec {
            allow_plaintext: Some(true),
            server_certificate: None,
            superuser_authentication: None,
            issuer_ref: None,
        });
        let rules = plaintext_rules(&db).unwrap();
        assert!(
            rules.contains("\nhost all all 0.0.0.0/0 scram-sha-256\n"),
            "{rules}"
        );
    }

    #[test]
    fn jobs_verify_the_server_once_tls_is_ready() {
        let mut db = testing::minimal();
        assert_eq!(client_env(&db)[0].value.as_deref(), Some("prefer"));
        assert!(client_ca(&db).is_none());
        let ready = ConditionStatus::new(ConditionType::TlsReady, true, "Ready", "ok");
        let status = crate::api::DatabaseStatus {
            conditions: crate::api::conditions::merge(&[], &[ready], None, Utc::now()),
            ..crate::api::DatabaseStatus::default()
        };
        db.status = Some(status);
        let vars = client_env(&db);
        assert_eq!(vars[0].value.as_deref(), Some("verify-full"));
        assert_eq!(
            vars[1].value.as_deref(),
            Some("/etc/dbop/database-ca/ca.crt")
        );
        let (volume, _) = client_ca(&db).unwrap();
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("orders-ca"));
        let items = secret.items.unwrap();
        assert_eq!(items.len(), 1, "only the CA's certificate, never its key");
        assert_eq!(items[0].key, TLS_CA_FILE);
    }

    #[test]
    fn a_certificate_of_the_users_own_is_mounted_and_trusted_instead() {
        let mut db = testing::minimal();
        db.spec.tls = Some(TlsSpec {
            allow_plaintext: None,
            server_certificate: Some(crate::api::tls::ServerCertificateRef {
                secret_name: "orders-cert-manager".into(),
            }),
            superuser_authentication: None,
            issuer_ref: None,
        });
        let volume = server_volume(&db);
        assert_eq!(
            volume.secret.unwrap().secret_name.as_deref(),
            Some("orders-cert-manager")
        );
        assert_eq!(trusted_secret(&db), "orders-cert-manager");
    }

    #[test]
    fn a_cert_manager_issuers_certificate_is_mounted_and_trusted_instead_of_dbops_ca() {
        let mut db = testing::minimal();
        db.spec.tls = Some(
            serde_json::from_value(serde_json::json!({"issuerRef": {"name": "corp-ca"}})).unwrap(),
        );
        let (secret, origin) = external_certificate(&db).unwrap();
        assert_eq!(secret, "orders-cert-manager-tls");
        assert!(origin.contains("Certificate orders-server"), "{origin}");
        let volume = server_volume(&db);
        assert_eq!(
            volume.secret.unwrap().secret_name.as_deref(),
            Some("orders-cert-manager-tls")
        );
        assert_eq!(trusted_secret(&db), "orders-cert-manager-tls");
        let mut template = PodTemplateSpec {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "postgres".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        add_to_pod_template(&mut template, &db);
        let sts = StatefulSet {
            spec: k8s_openapi::api::apps::v1::StatefulSetSpec {
                template,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            mounted_by(Some(&sts)).as_deref(),
            Some("orders-cert-manager-tls")
        );
        assert_eq!(mounted_by(None), None);
    }

    #[test]
    fn superuser_by_certificate_refuses_its_password_from_the_network_and_jobs_carry_the_certificate()
     {
        let mut db = testing::minimal();
        assert_eq!(superuser_rules(&db, "postgres"), None);
        let (volume, _) = client_ca(&db).map_or((None, None), |(v, m)| (Some(v), Some(m)));
        assert!(volume.is_none(), "an unverified Job mounts nothing");
        db.spec.tls = Some(TlsSpec {
            superuser_authentication: Some(crate::api::SuperuserAuthentication::Certificate),
            ..TlsSpec::default()
        });
        let rules = superuser_rules(&db, "admin").unwrap();
        let lines: Vec<&str> = rules.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "hostssl all \"admin\" 0.0.0.0/0 cert",
                "hostssl all \"admin\" ::/0 cert",
                "host all \"admin\" 0.0.0.0/0 reject",
                "host all \"admin\" ::/0 reject",
            ]
        );
        // Before TLSReady: TLS required and the certificate presented.
        let vars = client_env(&db);
        let value = |name: &str| {
            vars.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("PGSSLMODE").as_deref(), Some("require"));
        assert_eq!(
            value("PGSSLKEY").as_deref(),
            Some("/etc/dbop/database-ca/tls.key")
        );
        let (volume, mount) = client_ca(&db).unwrap();
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("orders-superuser-tls"));
        assert_eq!(secret.default_mode, Some(0o440));
        assert_eq!(secret.items.unwrap().len(), 3);
        assert_eq!(mount.mount_path, JOB_CA_DIR);
        let cert = superuser_secret(&db, &cert());
        assert_eq!(cert.metadata.name.as_deref(), Some("orders-superuser-tls"));
        assert!(
            cert.metadata
                .annotations
                .unwrap()
                .contains_key(NOT_AFTER_ANNOTATION)
        );
        assert!(cert.metadata.owner_references.is_some());
    }
}
