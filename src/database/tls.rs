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
    CA_ID_ANNOTATION, NAMES_ANNOTATION, NOT_AFTER_ANNOTATION, SERVER_VOLUME, dns_names,
};

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
}

/// The server certificate's Secret, as its annotations describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFact {
    pub ca: Option<String>,
    pub not_after: Option<DateTime<Utc>>,
    pub names: Option<String>,
}

fn annotation(secret: &Secret, key: &str) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(key).cloned()
}

impl TlsFact {
    /// From the (metadata of the) CA and server Secrets, the generated credentials Secret
    /// (None when the user's or missing) and the StatefulSet.
    pub fn of(
        ca: Option<&Secret>,
        server: Option<&Secret>,
        generated_credentials: Option<&Secret>,
        sts: Option<&StatefulSet>,
    ) -> TlsFact {
        TlsFact {
            ca: ca.and_then(|s| annotation(s, CA_ID_ANNOTATION)),
            server: server.map(|s| ServerFact {
                ca: annotation(s, CA_ID_ANNOTATION),
                not_after: annotation(s, NOT_AFTER_ANNOTATION)
                    .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                    .map(|t| t.with_timezone(&Utc)),
                names: annotation(s, NAMES_ANNOTATION),
            }),
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
}

/// The steps `fact` calls for at `now`.
pub fn steps(db: &Database, fact: &TlsFact, now: DateTime<Utc>) -> TlsSteps {
    let create_ca = fact.ca.is_none();
    let names = dns_names(db).join(",");
    let issue = match &fact.server {
        _ if create_ca => Some(Issue::CaChanged),
        None => Some(Issue::Missing),
        Some(s) if s.ca != fact.ca => Some(Issue::CaChanged),
        Some(s) if s.names.as_deref() != Some(names.as_str()) => Some(Issue::NamesChanged),
        Some(s) if s.not_after.is_none_or(|t| t - now < SERVER_VALIDITY / 3) => {
            Some(Issue::Expiring)
        }
        Some(_) => None,
    };
    let credentials_ca = match &fact.credentials_ca {
        Some(carried) => create_ca || carried != &fact.ca,
        None => false,
    };
    TlsSteps {
        create_ca,
        issue,
        credentials_ca,
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
    let valid = fact.server.as_ref().and_then(|s| s.not_after);
    let issuing = matches!(steps.issue, Some(Issue::Missing | Issue::CaChanged));
    match (valid, fact.template_serves_tls) {
        _ if issuing => not_ready(
            "Issuing",
            "dbop is issuing the server certificate from the Database's CA".into(),
        ),
        (_, None) => not_ready("Starting", "the database pods are not created yet".into()),
        (_, Some(false)) => not_ready(
            "RestartPending",
            "the pods were started by an earlier dbop without TLS: they serve it from their next restart (set the annotation dbop.dev/restartedAt on the Database to restart them one by one now)".into(),
        ),
        (None, _) => not_ready("Issuing", "the server certificate has no readable expiry: dbop issues a new one".into()),
        (Some(_), Some(true)) if !restarted => not_ready(
            "RollingOut",
            "the database pods are starting with the server certificate".into(),
        ),
        (Some(until), Some(true)) => {
            let plaintext = if TlsSpec::allows_plaintext(db.spec.tls.as_ref()) {
                "network clients without TLS are also admitted (spec.tls.allowPlaintext)"
            } else {
                "network clients without TLS are refused"
            };
            ConditionStatus::new(
                CONDITION,
                true,
                "Serving",
                format!(
                    "every pod serves TLS with a certificate from the Database's CA (Secret {}-ca, key ca.crt), valid until {}; {plaintext}",
                    db.name(),
                    until.to_rfc3339()
                ),
            )
        }
    }
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
    fn pods_started_without_tls_say_how_to_restart_them() {
        let db = testing::minimal();
        let now = Utc::now();
        let mut fact = serving(&db, now);
        fact.template_serves_tls = Some(false);
        let c = condition(&db, &fact, &TlsSteps::default(), true);
        assert_eq!((c.status, c.reason.as_str()), (false, "RestartPending"));
        assert!(c.message.contains("dbop.dev/restartedAt"));
    }
}
