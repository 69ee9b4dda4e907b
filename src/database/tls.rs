//! The TLS decision: whether the Database needs a CA, a (new) server certificate, or the CA's
//! certificate in its generated credentials Secret, and the `TLSReady` condition.
//!
//! A server certificate is issued when there is none, when the CA that signed it is not the
//! Database's (a CA deleted to rotate it), when the Service names it covers changed, and a
//! third of its life before it expires. Renewing never interrupts anything: the instance
//! manager installs the new files and reloads the server, open connections keep theirs, and
//! the condition stays True meanwhile (the old certificate is still valid).
//!
//! Pure: the Secrets' annotations (`resources::tls`), the StatefulSet's template and `now` in.

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;

use crate::api::conditions::{ConditionStatus, ConditionType};
use crate::api::{Database, TlsSpec};
use crate::resources::tls::{
    CA_ID_ANNOTATION, NAMES_ANNOTATION, NOT_AFTER_ANNOTATION, SERVER_VOLUME, ca_id, dns_names,
};
use dbop_contract::instance::{TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE};

/// The keys a server certificate Secret must have.
const FILES: [&str; 3] = [TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE];

/// How long a CA is valid: long enough that no Database outlives it unnoticed (rotate it by
/// deleting `<name>-ca`, docs/security.md).
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// How long a server certificate is valid; renewed when a third of that is left.
pub const SERVER_VALIDITY: Duration = Duration::days(90);

/// What the TLS decision reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFact {
    /// The id of the Database's CA (None: no CA Secret).
    pub ca: Option<String>,
    /// The server certificate's Secret, as its annotations describe it.
    pub server: Option<ServerFact>,
    /// The generated credentials Secret exists, and the CA id its `ca.crt` is of (None: the
    /// user's Secret, or none yet: nothing to fill in).
    pub credentials_ca: Option<Option<String>>,
    /// The StatefulSet's pod template mounts the certificate (the pods it starts serve TLS).
    pub template_serves_tls: Option<bool>,
    /// The user's own certificate Secret (`spec.tls.serverCertificate`), as read.
    pub own: Option<OwnCertificateFact>,
    /// With `superuserAuthentication: Certificate`: the superuser's name, and its client
    /// certificate's Secret as its annotations describe it (its names: the superuser).
    pub superuser: Option<(String, Option<ServerFact>)>,
}

/// The user's certificate Secret: what is wrong with it, and its CA's id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnCertificateFact {
    pub secret: String,
    pub problem: Option<String>,
    pub ca: Option<String>,
}

impl OwnCertificateFact {
    /// From the Secret `name` as read (None: it does not exist); `origin` says what names it
    /// (`resources::tls::external_certificate`).
    pub fn of(name: &str, origin: &str, secret: Option<&Secret>) -> OwnCertificateFact {
        let data = secret.and_then(|s| s.data.as_ref());
        let value = |key: &str| {
            data.and_then(|d| d.get(key))
                .filter(|v| !v.0.is_empty())
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        let missing: Vec<&str> = FILES.into_iter().filter(|k| value(k).is_none()).collect();
        let problem = match (secret, missing.as_slice()) {
            (None, _) => Some(format!(
                "Secret {name} ({origin}) does not exist: the pods wait for it"
            )),
            (Some(_), []) => None,
            (Some(_), keys) => Some(format!(
                "Secret {name} ({origin}) has no {}: it needs tls.crt, tls.key and ca.crt (a cert-manager Certificate of a CA or Vault issuer writes all three)",
                keys.join(", ")
            )),
        };
        OwnCertificateFact {
            secret: name.to_string(),
            problem,
            ca: value(TLS_CA_FILE).map(|pem| ca_id(&pem)),
        }
    }
}

/// The server certificate's Secret, as its annotations describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFact {
    pub ca: Option<String>,
    pub not_after: Option<DateTime<Utc>>,
    pub names: Option<String>,
}

impl ServerFact {
    /// A certificate Secret's annotations.
    pub fn of(secret: &Secret) -> ServerFact {
        ServerFact {
            ca: annotation(secret, CA_ID_ANNOTATION),
            not_after: annotation(secret, NOT_AFTER_ANNOTATION)
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&Utc)),
            names: annotation(secret, NAMES_ANNOTATION),
        }
    }
}

fn annotation(secret: &Secret, key: &str) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(key).cloned()
}

impl TlsFact {
    /// From the (metadata of the) CA and server Secrets, the generated credentials Secret
    /// (None when the user's or missing), the StatefulSet, and the user's own certificate.
    pub fn of(
        ca: Option<&Secret>,
        server: Option<&Secret>,
        superuser: Option<(String, Option<&Secret>)>,
        generated_credentials: Option<&Secret>,
        sts: Option<&StatefulSet>,
        own: Option<OwnCertificateFact>,
    ) -> TlsFact {
        TlsFact {
            own,
            ca: ca.and_then(|s| annotation(s, CA_ID_ANNOTATION)),
            server: server.map(ServerFact::of),
            superuser: superuser.map(|(name, secret)| (name, secret.map(ServerFact::of))),
            credentials_ca: generated_credentials.map(|s| annotation(s, CA_ID_ANNOTATION)),
            template_serves_tls: sts.map(|s| {
                s.spec
                    .template
                    .spec
                    .as_ref()
                    .and_then(|p| p.volumes.as_ref())
                    .is_some_and(|v| v.iter().any(|v| v.name == SERVER_VOLUME))
            }),
        }
    }
}

/// Why a server certificate is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issue {
    /// There is none (a new Database, or its Secret was deleted).
    Missing,
    /// It was signed by another CA than the Database's.
    CaChanged,
    /// The Services' names changed.
    NamesChanged,
    /// A third of its life is left (or its expiry is unreadable).
    Expiring,
}

/// The TLS steps of a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSteps {
    /// Make the Database's CA (there is none).
    pub create_ca: bool,
    /// Issue a server certificate.
    pub issue: Option<Issue>,
    /// Put the CA's certificate into the generated credentials Secret.
    pub credentials_ca: bool,
    /// Issue the superuser's client certificate for this name.
    pub issue_superuser: Option<String>,
}

/// The steps `fact` calls for at `now`. With the user's own certificate, dbop makes nothing:
/// it only copies that certificate's CA into the generated credentials Secret.
pub fn steps(db: &Database, fact: &TlsFact, now: DateTime<Utc>) -> TlsSteps {
    if let Some(own) = &fact.own {
        let credentials_ca = match &fact.credentials_ca {
            Some(carried) => own.ca.is_some() && carried != &own.ca,
            None => false,
        };
        return TlsSteps {
            credentials_ca,
            ..TlsSteps::default()
        };
    }
    let create_ca = fact.ca.is_none();
    let names = dns_names(db).join(",");
    let due = |cert: Option<&ServerFact>, names: &str| match cert {
        _ if create_ca => Some(Issue::CaChanged),
        None => Some(Issue::Missing),
        Some(s) if s.ca != fact.ca => Some(Issue::CaChanged),
        Some(s) if s.names.as_deref() != Some(names) => Some(Issue::NamesChanged),
        Some(s) if s.not_after.is_none_or(|t| t - now < SERVER_VALIDITY / 3) => {
            Some(Issue::Expiring)
        }
        Some(_) => None,
    };
    let issue = due(fact.server.as_ref(), &names);
    let issue_superuser = fact
        .superuser
        .as_ref()
        .filter(|(user, cert)| due(cert.as_ref(), user).is_some())
        .map(|(user, _)| user.clone());
    let credentials_ca = match &fact.credentials_ca {
        Some(carried) => create_ca || carried != &fact.ca,
        None => false,
    };
    TlsSteps {
        create_ca,
        issue,
        credentials_ca,
        issue_superuser,
    }
}

const CONDITION: ConditionType = ConditionType::TlsReady;

/// `TLSReady`: True once every pod serves TLS with a certificate of the Database's CA.
/// `restarted`: every pod runs the StatefulSet's latest template and is ready.
pub fn condition(
    db: &Database,
    fact: &TlsFact,
    steps: &TlsSteps,
    restarted: bool,
) -> ConditionStatus {
    let not_ready =
        |reason: &str, message: String| ConditionStatus::new(CONDITION, false, reason, message);
    if let Some(own) = &fact.own {
        return own_condition(db, own, fact, restarted);
    }
    let valid = fact.server.as_ref().and_then(|s| s.not_after);
    let issuing = matches!(steps.issue, Some(Issue::Missing | Issue::CaChanged));
    if issuing {
        return not_ready(
            "Issuing",
            "dbop is issuing the server certificate from the Database's CA".into(),
        );
    }
    if let Some(waiting) = pods_not_serving(fact, restarted) {
        return waiting;
    }
    let Some(until) = valid else {
        return not_ready(
            "Issuing",
            "the server certificate has no readable expiry: dbop issues a new one".into(),
        );
    };
    ConditionStatus::new(
        CONDITION,
        true,
        "Serving",
        format!(
            "every pod serves TLS with a certificate from the Database's CA (Secret {}-ca, key ca.crt), valid until {}; {}",
            db.name(),
            until.to_rfc3339(),
            plaintext_clause(db)
        ),
    )
}

/// What the pods and the template say, whoever made the certificate: None when they serve it.
fn pods_not_serving(fact: &TlsFact, restarted: bool) -> Option<ConditionStatus> {
    let not_ready =
        |reason: &str, message: &str| Some(ConditionStatus::new(CONDITION, false, reason, message));
    match fact.template_serves_tls {
        None => not_ready("Starting", "the database pods are not created yet"),
        Some(false) => not_ready(
            "RestartPending",
            "the pods were started by an earlier dbop without TLS: they serve it from their next restart (set the annotation dbop.dev/restartedAt on the Database to restart them one by one now)",
        ),
        Some(true) if !restarted => not_ready(
            "RollingOut",
            "the database pods are starting with the server certificate",
        ),
        Some(true) => None,
    }
}

fn plaintext_clause(db: &Database) -> &'static str {
    if TlsSpec::allows_plaintext(db.spec.tls.as_ref()) {
        "network clients without TLS are also admitted (spec.tls.allowPlaintext)"
    } else {
        "network clients without TLS are refused"
    }
}

/// `TLSReady` with the user's own certificate Secret.
fn own_condition(
    db: &Database,
    own: &OwnCertificateFact,
    fact: &TlsFact,
    restarted: bool,
) -> ConditionStatus {
    if let Some(problem) = &own.problem {
        return ConditionStatus::new(
            CONDITION,
            false,
            "CertificateSecretInvalid",
            problem.clone(),
        );
    }
    pods_not_serving(fact, restarted).unwrap_or_else(|| {
        ConditionStatus::new(
            CONDITION,
            true,
            "Serving",
            format!(
                "every pod serves TLS with the certificate of Secret {} (renewed by whoever writes it; a new one is picked up by a reload); {}",
                own.secret,
                plaintext_clause(db)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing;

    fn serving(db: &Database, now: DateTime<Utc>) -> TlsFact {
        TlsFact {
            ca: Some("ca1".into()),
            server: Some(ServerFact {
                ca: Some("ca1".into()),
                not_after: Some(now + SERVER_VALIDITY),
                names: Some(dns_names(db).join(",")),
            }),
            credentials_ca: Some(Some("ca1".into())),
            template_serves_tls: Some(true),
            own: None,
            superuser: None,
        }
    }

    #[test]
    fn a_serving_database_needs_nothing_and_is_ready() {
        let db = testing::minimal();
        let now = Utc::now();
        let fact = serving(&db, now);
        let s = steps(&db, &fact, now);
        assert_eq!(s, TlsSteps::default());
        let c = condition(&db, &fact, &s, true);
        assert!(c.status, "{c:?}");
        assert!(
            c.message.contains("without TLS are refused"),
            "{}",
            c.message
        );
        assert!(!condition(&db, &fact, &s, false).status);
    }

    #[test]
    fn a_new_database_gets_a_ca_a_certificate_and_the_ca_in_its_secret() {
        let db = testing::minimal();
        let fact = TlsFact {
            credentials_ca: Some(None),
            ..TlsFact::default()
        };
        let s = steps(&db, &fact, Utc::now());
        assert!(s.create_ca && s.credentials_ca);
        assert_eq!(s.issue, Some(Issue::CaChanged));
        assert_eq!(condition(&db, &fact, &s, false).reason, "Issuing");
    }

    #[test]
    fn certificates_are_renewed_a_third_before_they_expire_and_when_their_ca_or_names_change() {
        let db = testing::minimal();
        let now = Utc::now();
        let mut fact = serving(&db, now);
        fact.server.as_mut().unwrap().not_after =
            Some(now + SERVER_VALIDITY / 3 + Duration::hours(1));
        assert_eq!(steps(&db, &fact, now).issue, None);
        fact.server.as_mut().unwrap().not_after =
            Some(now + SERVER_VALIDITY / 3 - Duration::hours(1));
        let s = steps(&db, &fact, now);
        assert_eq!(s.issue, Some(Issue::Expiring));
        // Renewing a valid certificate keeps the condition True.
        assert!(condition(&db, &fact, &s, true).status);
        let mut fact = serving(&db, now);
        fact.server.as_mut().unwrap().ca = Some("old".into());
        assert_eq!(steps(&db, &fact, now).issue, Some(Issue::CaChanged));
        let mut fact = serving(&db, now);
        fact.server.as_mut().unwrap().names = Some("orders-rw".into());
        assert_eq!(steps(&db, &fact, now).issue, Some(Issue::NamesChanged));
        let mut fact = serving(&db, now);
        fact.server = None;
        assert_eq!(steps(&db, &fact, now).issue, Some(Issue::Missing));
    }

    #[test]
    fn the_credentials_secret_follows_the_ca_and_a_users_secret_is_left_alone() {
        let db = testing::minimal();
        let now = Utc::now();
        let mut fact = serving(&db, now);
        fact.credentials_ca = Some(Some("old".into()));
        assert!(steps(&db, &fact, now).credentials_ca);
        fact.credentials_ca = None;
        assert!(!steps(&db, &fact, now).credentials_ca);
    }

    #[test]
    fn with_the_users_certificate_dbop_makes_nothing_and_says_what_is_wrong_with_it() {
        use k8s_openapi::ByteString;
        let db = testing::minimal();
        let now = Utc::now();
        let secret = |keys: &[&str]| Secret {
            data: Some(
                keys.iter()
                    .map(|k| (k.to_string(), ByteString(format!("{k} pem").into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let missing = OwnCertificateFact::of("mine", "spec.tls.serverCertificate", None);
        assert!(
            missing
                .problem
                .as_deref()
                .unwrap()
                .contains("does not exist")
        );
        let partial = OwnCertificateFact::of(
            "mine",
            "spec.tls.serverCertificate",
            Some(&secret(&["tls.crt", "ca.crt"])),
        );
        assert!(
            partial
                .problem
                .as_deref()
                .unwrap()
                .contains("has no tls.key"),
            "{partial:?}"
        );
        let own =
            OwnCertificateFact::of("mine", "spec.tls.serverCertificate", Some(&secret(&FILES)));
        assert_eq!(own.problem, None);
        assert_eq!(own.ca, Some(ca_id("ca.crt pem")));
        let fact = TlsFact {
            credentials_ca: Some(None),
            template_serves_tls: Some(true),
            own: Some(own.clone()),
            ..TlsFact::default()
        };
        let s = steps(&db, &fact, now);
        assert_eq!(
            s,
            TlsSteps {
                credentials_ca: true,
                ..TlsSteps::default()
            }
        );
        let c = condition(&db, &fact, &s, true);
        assert!(c.status && c.message.contains("Secret mine"), "{c:?}");
        let bad = TlsFact {
            own: Some(partial),
            ..fact.clone()
        };
        let c = condition(&db, &bad, &steps(&db, &bad, now), true);
        assert_eq!(
            (c.status, c.reason.as_str()),
            (false, "CertificateSecretInvalid")
        );
        let carried = TlsFact {
            credentials_ca: Some(own.ca.clone()),
            ..fact
        };
        assert_eq!(steps(&db, &carried, now), TlsSteps::default());
    }

    #[test]
    fn cert_managers_certificate_lives_as_long_as_dbops() {
        assert_eq!(crate::resources::cert_manager::VALIDITY, SERVER_VALIDITY);
    }

    #[test]
    fn with_a_cert_manager_issuer_dbop_makes_no_ca_and_checks_cert_managers_secret() {
        use k8s_openapi::ByteString;
        let mut db = testing::minimal();
        db.spec.tls = Some(
            serde_json::from_value(serde_json::json!({"issuerRef": {"name": "corp-ca"}})).unwrap(),
        );
        let now = Utc::now();
        let (name, origin) = crate::resources::tls::external_certificate(&db).unwrap();
        let missing = OwnCertificateFact::of(&name, &origin, None);
        let fact = TlsFact {
            credentials_ca: Some(None),
            template_serves_tls: Some(true),
            own: Some(missing),
            ..TlsFact::default()
        };
        let s = steps(&db, &fact, now);
        assert_eq!(s, TlsSteps::default(), "no CA, no certificate of dbop's");
        let c = condition(&db, &fact, &s, true);
        assert_eq!(
            (c.status, c.reason.as_str()),
            (false, "CertificateSecretInvalid")
        );
        assert!(
            c.message.contains("orders-cert-manager-tls")
                && c.message.contains("Certificate orders-server"),
            "{c:?}"
        );
        let filled = Secret {
            data: Some(
                FILES
                    .iter()
                    .map(|k| (k.to_string(), ByteString(format!("{k} pem").into_bytes())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let fact = TlsFact {
            own: Some(OwnCertificateFact::of(&name, &origin, Some(&filled))),
            ..fact
        };
        let s = steps(&db, &fact, now);
        assert_eq!(
            s,
            TlsSteps {
                credentials_ca: true,
                ..TlsSteps::default()
            },
            "only cert-manager's CA into the credentials Secret"
        );
        let c = condition(&db, &fact, &s, true);
        assert!(
            c.status && c.message.contains("orders-cert-manager-tls"),
            "{c:?}"
        );
    }

    #[test]
    fn pods_started_without_tls_say_how_to_restart_them() {
        let db = testing::minimal();
        let now = Utc::now();
        let mut fact = serving(&db, now);
        fact.template_serves_tls = Some(false);
        let c = condition(&db, &fact, &TlsSteps::default(), true);
        assert_eq!((c.status, c.reason.as_str()), (false, "RestartPending"));
        assert!(c.message.contains("dbop.dev/restartedAt"));
    }

    #[test]
    fn the_superuser_certificate_is_issued_when_asked_and_renewed_like_the_server_s() {
        let db = testing::minimal();
        let now = Utc::now();
        let mut fact = serving(&db, now);
        assert_eq!(steps(&db, &fact, now).issue_superuser, None);
        fact.superuser = Some(("postgres".into(), None));
        assert_eq!(
            steps(&db, &fact, now).issue_superuser.as_deref(),
            Some("postgres")
        );
        let current = ServerFact {
            ca: Some("ca1".into()),
            not_after: Some(now + SERVER_VALIDITY),
            names: Some("postgres".into()),
        };
        fact.superuser = Some(("postgres".into(), Some(current.clone())));
        assert_eq!(steps(&db, &fact, now).issue_superuser, None);
        let cases = [
            ServerFact {
                ca: Some("old".into()),
                ..current.clone()
            },
            ServerFact {
                names: Some("admin".into()),
                ..current.clone()
            },
            ServerFact {
                not_after: Some(now + SERVER_VALIDITY / 4),
                ..current.clone()
            },
        ];
        for cert in cases {
            fact.superuser = Some(("postgres".into(), Some(cert.clone())));
            assert!(steps(&db, &fact, now).issue_superuser.is_some(), "{cert:?}");
        }
    }
}
