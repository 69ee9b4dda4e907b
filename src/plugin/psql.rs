//! The `kubectl exec` command line of `kubectl dbop psql`: pure, so what runs in the pod (and
//! that no password is on it) is unit-tested.

use k8s_openapi::api::core::v1::Secret;

use crate::api::Database;
use crate::resources::credentials::USERNAME_KEY;
use crate::resources::statefulset::SOCKET_DIR;
use crate::resources::{DEFAULT_SUPERUSER, Names};

/// The container of the database pod that runs the server (and has `psql`).
pub const CONTAINER: &str = "postgres";

/// The superuser named in the credentials Secret (`username`), `postgres` when it names none.
/// Only this key is read; the password is never looked at.
pub fn superuser(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(USERNAME_KEY))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_SUPERUSER.to_string())
}

/// The pod psql runs in: the primary the status names (after a failover, not the first
/// instance), else the first instance.
pub fn primary_pod(db: &Database) -> String {
    db.status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| Names::of(db).pod(0))
}

/// The arguments after `kubectl`: exec into `pod`'s server container and run psql over the
/// local socket (peer authentication) as the superuser, in the database of the same name.
/// `tty` adds `-t` (only when stdin is a terminal, so piped SQL works).
pub fn exec_args(
    namespace: &str,
    pod: &str,
    user: &str,
    tty: bool,
    extra: &[String],
) -> Vec<String> {
    let mut args: Vec<String> = vec!["exec".into(), if tty { "-it" } else { "-i" }.into()];
    args.extend(
        [
            "-n", namespace, pod, "-c", CONTAINER, "--", "psql", "-h", SOCKET_DIR, "-U", user,
            "-d", user,
        ]
        .map(String::from),
    );
    args.extend(extra.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn exec_targets_the_first_pod_s_server_container_as_the_superuser() {
        let s = secret(&[("username", "app"), ("password", "s3cr3t-pw")]);
        let user = superuser(&s);
        let args = exec_args(
            "shop",
            "orders-0",
            &user,
            true,
            &["-c".into(), "select 1".into()],
        );
        assert_eq!(
            args.join(" "),
            "exec -it -n shop orders-0 -c postgres -- psql -h /var/run/postgresql -U app -d app -c select 1"
        );
        assert!(!args.iter().any(|a| a.contains("s3cr3t-pw")), "{args:?}");
        assert!(
            !args.iter().any(|a| a.to_lowercase().contains("password")),
            "{args:?}"
        );
    }

    #[test]
    fn without_a_terminal_there_is_no_tty_and_the_default_user_is_postgres() {
        let user = superuser(&secret(&[("password", "x")]));
        assert_eq!(user, "postgres");
        let args = exec_args("ns", "db-0", &user, false, &[]);
        assert_eq!(&args[..2], ["exec", "-i"]);
        assert_eq!(args.last().map(String::as_str), Some("postgres"));
    }

    #[test]
    fn psql_runs_on_the_primary_the_status_names() {
        use crate::api::DatabaseStatus;
        let mut db = crate::resources::testing::minimal();
        assert_eq!(primary_pod(&db), "orders-0");
        db.status = Some(DatabaseStatus {
            primary: Some("orders-2".into()),
            ..DatabaseStatus::default()
        });
        assert_eq!(primary_pod(&db), "orders-2");
    }
}
