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

/// The SQL `reload` runs on each instance.
pub const RELOAD_SQL: &str = "SELECT pg_reload_conf()";

/// The arguments after `kubectl` that make the server of `pod` reread its configuration: psql
/// as for [`exec_args`] without a terminal, unaligned and tuples-only (it prints `t`), ignoring
/// any `~/.psqlrc`.
pub fn reload_args(namespace: &str, pod: &str, user: &str) -> Vec<String> {
    exec_args(
        namespace,
        pod,
        user,
        false,
        &["-X", "-A", "-t", "-c", RELOAD_SQL].map(String::from),
    )
}

/// Whether psql's output says the reload was signalled (`pg_reload_conf()` returned true).
pub fn reloaded(stdout: &str) -> bool {
    stdout.trim() == "t"
}

/// The instance pods of the Database, every one of the spec's.
pub fn instance_pods(db: &Database) -> Vec<String> {
    let names = Names::of(db);
    (0..db.spec.instances.max(1))
        .map(|i| names.pod(i))
        .collect()
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
    fn reload_runs_pg_reload_conf_on_each_instance_without_a_password() {
        let mut db = crate::resources::testing::minimal();
        db.spec.instances = 3;
        assert_eq!(instance_pods(&db), ["orders-0", "orders-1", "orders-2"]);
        let args = reload_args("shop", "orders-1", "app");
        assert_eq!(
            args.join(" "),
            "exec -i -n shop orders-1 -c postgres -- psql -h /var/run/postgresql -U app -d app -X -A -t -c SELECT pg_reload_conf()"
        );
        assert!(reloaded("t\n"));
        assert!(!reloaded("f\n"));
        assert!(!reloaded(""));
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
