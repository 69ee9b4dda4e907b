//! The configuration dbop manages: the authentication files, the server's command line, and
//! the line of `postgresql.conf` that includes the Database's own parameters.
//!
//! Pure: text and argument lists from the settings (the replication part comes from
//! `replication::config`). The server reads the command line last,
//! so these settings win over `postgresql.conf` and `ALTER SYSTEM`; the Database's parameters
//! (the mounted `postgresql.conf` of `--config-dir`) are included at the end of the data
//! directory's `postgresql.conf`, so they win over initdb's, and `ALTER SYSTEM` over them.

use std::path::{Path, PathBuf};

/// Settings of the server dbop manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Managed {
    pub pgdata: PathBuf,
    pub listen_addresses: String,
    pub port: u16,
    pub socket_dir: PathBuf,
    pub superuser: String,
    /// The installed server certificate (`tls`), when the server serves TLS.
    pub tls: Option<PathBuf>,
}

/// The name of the pg_ident map that lets the pod's own OS user in as the superuser.
pub const IDENT_MAP: &str = "dbop";

/// `pg_hba.conf`, first match wins: peer on the local socket (mapped to the superuser) and
/// replication connections for dbop's replication role, which nothing can override; then the
/// Database's own rules (`extra`: network rules, `spec.postgresql.pgHba`), which can narrow
/// what follows; then SCRAM for every other network client. With `tls`, dbop's network rules
/// are `hostssl`: a client without TLS matches none of them and is refused (the Database's
/// rules may still admit one: `spec.tls.allowPlaintext` adds plain `host` rules there).
pub fn pg_hba(extra: &str, tls: bool) -> String {
    let network = if tls { "hostssl" } else { "host" };
    let mut text = format!(
        "# Written by dbop-instance at every start and reload: edits here are lost.\n\
         # The local socket is inside the pod only: peer authentication, mapped to the superuser\n\
         # (replication too: a base backup taken in the pod streams over it).\n\
         local all all peer map={IDENT_MAP}\n\
         local replication all peer map={IDENT_MAP}\n"
    );
    text.push_str(&crate::replication::config::hba_lines(network));
    text.push_str("# The Database's rules (spec.postgresql.pgHba): network rules only.\n");
    for line in extra.lines() {
        let rule = line.trim_start();
        // The operator's schema allows network rules only; a local rule here would come after
        // dbop's own anyway, but is dropped so the file says what applies.
        if !rule.is_empty() && !rule.starts_with('#') && !rule.starts_with("local") {
            text.push_str(rule);
            text.push('\n');
        }
    }
    text.push_str(&format!(
        "# Network clients: SCRAM only.\n\
         {network} all all 0.0.0.0/0 scram-sha-256\n\
         {network} all all ::/0 scram-sha-256\n",
    ));
    text
}

/// The line of `postgresql.conf` that includes the Database's parameters file.
pub fn parameters_include(file: &Path) -> String {
    format!(
        "include_if_exists = {}",
        crate::replication::config::conf_value(&file.display().to_string())
    )
}

/// `postgresql.conf` with the include of the parameters file last, or `None` when it already
/// is: a line appended after it (by the replication setup) is moved below it again, so the
/// Database's parameters win over initdb's and come after any other include.
pub fn with_parameters_include(postgresql_conf: &str, file: &Path) -> Option<String> {
    let line = parameters_include(file);
    let comment = "# Added by dbop-instance: the Database's parameters (spec.postgresql).";
    let last = postgresql_conf.lines().rev().find(|l| !l.trim().is_empty());
    if last.is_some_and(|l| l.trim() == line) {
        return None;
    }
    let mut text: String = postgresql_conf
        .lines()
        .filter(|l| l.trim() != line && l.trim() != comment)
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(comment);
    text.push('\n');
    text.push_str(&line);
    text.push('\n');
    Some(text)
}

/// `pg_ident.conf`: any OS user of the pod may connect over the local socket as the superuser
/// (the socket directory is private to the pod).
pub fn pg_ident(superuser: &str) -> String {
    format!(
        "# Written by dbop-instance at every start: edits here are lost.\n\
         {IDENT_MAP} /^.*$ \"{superuser}\"\n"
    )
}

/// Why a superuser name cannot be used.
pub fn check_role_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!(
            "the username must have 1 to 63 bytes, it has {}",
            name.len()
        ));
    }
    if name.chars().any(|c| c == '"' || c.is_control()) {
        return Err("the username must not contain a double quote or a control character".into());
    }
    Ok(())
}

/// The server's arguments (after the `postgres` executable).
pub fn server_args(m: &Managed) -> Vec<String> {
    let file = |name: &str| m.pgdata.join(name).display().to_string();
    let mut args = vec!["-D".to_string(), m.pgdata.display().to_string()];
    let settings = [
        ("listen_addresses", m.listen_addresses.clone()),
        ("port", m.port.to_string()),
        (
            "unix_socket_directories",
            m.socket_dir.display().to_string(),
        ),
        ("hba_file", file("pg_hba.conf")),
        ("ident_file", file("pg_ident.conf")),
        ("password_encryption", "scram-sha-256".to_string()),
    ];
    let replication = crate::replication::config::server_settings();
    let tls = m
        .tls
        .as_deref()
        .map(crate::tls::settings)
        .unwrap_or_default();
    for (key, value) in settings.into_iter().chain(replication).chain(tls) {
        args.push("-c".into());
        args.push(format!("{key}={value}"));
    }
    args
}

/// The `initdb` arguments; the password is read by initdb from `password_file`.
pub fn initdb_args(
    target: &Path,
    superuser: &str,
    password_file: &Path,
    major: u32,
) -> Vec<String> {
    let mut args = vec![
        format!("--pgdata={}", target.display()),
        format!("--username={superuser}"),
        format!("--pwfile={}", password_file.display()),
        "--auth-local=peer".into(),
        "--auth-host=scram-sha-256".into(),
        "--encoding=UTF8".into(),
        "--locale=C.UTF-8".into(),
        "--data-checksums".into(),
    ];
    if major >= 14 {
        // Its "start the server with pg_ctl …" hint names the scratch directory: misleading.
        args.push("--no-instructions".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managed() -> Managed {
        Managed {
            pgdata: "/var/lib/postgresql/data/pgdata".into(),
            listen_addresses: "*".into(),
            port: 5432,
            socket_dir: "/var/run/postgresql".into(),
            superuser: "app".into(),
            tls: None,
        }
    }

    #[test]
    fn hba_is_scram_for_the_network_and_peer_locally() {
        let hba = pg_hba("", false);
        let rules: Vec<&str> = hba.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            rules,
            [
                "local all all peer map=dbop",
                "local replication all peer map=dbop",
                "host replication dbop_replication 0.0.0.0/0 scram-sha-256",
                "host replication dbop_replication ::/0 scram-sha-256",
                "host all all 0.0.0.0/0 scram-sha-256",
                "host all all ::/0 scram-sha-256",
            ]
        );
        assert!(!hba.contains("trust") && !hba.contains("md5"));
        assert!(pg_ident("app").ends_with("dbop /^.*$ \"app\"\n"));
    }

    #[test]
    fn the_databases_rules_come_after_dbops_own_and_before_the_catch_all() {
        let extra =
            "# spec.postgresql.pgHba\nhost all all 10.0.0.0/8 reject\nlocal all all trust\n";
        let hba = pg_hba(extra, false);
        let rules: Vec<&str> = hba.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rules[0], "local all all peer map=dbop");
        assert_eq!(rules[1], "local replication all peer map=dbop");
        assert!(rules[2].starts_with("host replication dbop_replication"));
        assert_eq!(rules[4], "host all all 10.0.0.0/8 reject");
        assert_eq!(rules[5], "host all all 0.0.0.0/0 scram-sha-256");
        assert!(!hba.contains("trust"), "{hba}");
    }

    #[test]
    fn with_tls_only_encrypted_network_connections_match_dbops_rules() {
        let hba = pg_hba("host all all 10.0.0.0/8 scram-sha-256\n", true);
        let rules: Vec<&str> = hba.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            rules,
            [
                "local all all peer map=dbop",
                "local replication all peer map=dbop",
                "hostssl replication dbop_replication 0.0.0.0/0 scram-sha-256",
                "hostssl replication dbop_replication ::/0 scram-sha-256",
                "host all all 10.0.0.0/8 scram-sha-256",
                "hostssl all all 0.0.0.0/0 scram-sha-256",
                "hostssl all all ::/0 scram-sha-256",
            ]
        );
        let mut m = managed();
        assert!(!server_args(&m).join(" ").contains("ssl"));
        m.tls = Some("/run/pg/tls".into());
        let args = server_args(&m).join(" ");
        assert!(args.contains("-c ssl=on"), "{args}");
        assert!(
            args.contains("-c ssl_cert_file=/run/pg/tls/tls.crt"),
            "{args}"
        );
    }

    #[test]
    fn the_parameters_include_is_last_once() {
        let file = Path::new("/etc/dbop/config/postgresql.conf");
        let line = "include_if_exists = '/etc/dbop/config/postgresql.conf'";
        let added = with_parameters_include("max_connections = 100", file).unwrap();
        assert!(added.starts_with("max_connections = 100\n#"), "{added}");
        assert!(added.ends_with(&format!("{line}\n")));
        assert_eq!(with_parameters_include(&added, file), None);
        // Something appended after it (the replication include): moved back to the end.
        let later = format!("{added}include_if_exists = 'dbop-replication.conf'\n");
        let moved = with_parameters_include(&later, file).unwrap();
        assert!(moved.ends_with(&format!("{line}\n")), "{moved}");
        assert_eq!(moved.matches(line).count(), 1);
        assert!(moved.contains("'dbop-replication.conf'"));
    }

    #[test]
    fn server_args_override_listen_port_socket_and_auth_files() {
        let args = server_args(&managed()).join(" ");
        for want in [
            "-D /var/lib/postgresql/data/pgdata",
            "-c listen_addresses=*",
            "-c port=5432",
            "-c unix_socket_directories=/var/run/postgresql",
            "-c hba_file=/var/lib/postgresql/data/pgdata/pg_hba.conf",
            "-c ident_file=/var/lib/postgresql/data/pgdata/pg_ident.conf",
            "-c password_encryption=scram-sha-256",
            "-c wal_level=replica",
            "-c wal_log_hints=on",
        ] {
            assert!(args.contains(want), "{want} missing from {args}");
        }
    }

    #[test]
    fn initdb_uses_checksums_utf8_scram_and_a_password_file() {
        let args = initdb_args(Path::new("/d/new"), "app", Path::new("/creds/password"), 15);
        for want in [
            "--pgdata=/d/new",
            "--username=app",
            "--pwfile=/creds/password",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--data-checksums",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
    }

    #[test]
    fn role_names() {
        assert!(check_role_name("app").is_ok());
        assert!(check_role_name("App User").is_ok());
        assert!(check_role_name("").is_err());
        assert!(check_role_name("a\"b").is_err());
        assert!(check_role_name("a\nb").is_err());
        assert!(check_role_name(&"x".repeat(64)).is_err());
    }
}
