//! Where and how the agent's own replication connection goes, read from the same libpq
//! variables pg_basebackup would read (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
//! `PGPASSFILE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGCHANNELBINDING`,
//! `PGTARGETSESSIONATTRS`, `PGCONNECT_TIMEOUT`, `PGAPPNAME`), and the password's line in a
//! pgpass file. A setting this client does not implement as libpq does is `Unsupported`, and
//! the caller leaves the connection to pg_basebackup: the two never disagree about where a
//! backup comes from or how the server is verified.
//!
//! Pure: the environment and the files' existence come in as functions.

use std::path::PathBuf;
use std::time::Duration;

/// libpq's default Unix socket directory in the PostgreSQL images.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
const DEFAULT_PORT: u16 = 5432;

/// Variables that change nothing about a physical replication connection (no database, no
/// SQL session settings are used), or that this client honours below.
const HARMLESS: [&str; 8] = [
    "PGDATABASE",
    "PGCLIENTENCODING",
    "PGTZ",
    "PGDATESTYLE",
    "PGGEQO",
    "PGDATA",
    "PGSYSCONFDIR",
    "PGLOCALEDIR",
];

/// The variables this client reads.
const HONOURED: [&str; 13] = [
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGCHANNELBINDING",
    "PGTARGETSESSIONATTRS",
    "PGCONNECT_TIMEOUT",
    "PGAPPNAME",
];

/// Why the agent leaves a connection to libpq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

/// Where one attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp {
        host: String,
        port: u16,
    },
    /// A Unix socket: `<dir>/.s.PGSQL.<port>` (never TLS, as with libpq).
    Unix {
        dir: String,
        port: u16,
    },
}

impl Address {
    /// The host as pgpass and messages name it.
    pub fn host(&self) -> &str {
        match self {
            Address::Tcp { host, .. } => host,
            Address::Unix { dir, .. } => dir,
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Address::Tcp { port, .. } | Address::Unix { port, .. } => *port,
        }
    }

    pub fn socket_path(&self) -> Option<PathBuf> {
        match self {
            Address::Unix { dir, port } => {
                Some(PathBuf::from(dir).join(format!(".s.PGSQL.{port}")))
            }
            Address::Tcp { .. } => None,
        }
    }
}

/// `PGSSLMODE`, the modes this client implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// TLS when the server offers it, unverified (libpq's `prefer` without a root certificate).
    Prefer,
    /// TLS, unverified (libpq's `require` without a root certificate).
    Require,
    /// TLS, the chain checked against `PGSSLROOTCERT` and the host name against the certificate.
    VerifyFull,
}

/// `PGCHANNELBINDING`: whether SCRAM binds the password exchange to the TLS session (the
/// server's certificate, `tls-server-end-point`), so that a relay which terminates TLS with
/// another certificate cannot pass the exchange on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelBinding {
    Disable,
    /// Bound when the server offers SCRAM-SHA-256-PLUS over TLS (libpq's default).
    Prefer,
    /// Bound, or no connection: no password sent without it, no server that lets the client in
    /// without it.
    Require,
}

/// `PGTARGETSESSIONATTRS`, the values this client implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSession {
    Any,
    /// A standby when one answers, else any server (two passes over the hosts, as libpq).
    PreferStandby,
}

/// Everything the connection needs, but the password (read when a host is tried).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub addresses: Vec<Address>,
    pub user: String,
    pub ssl_mode: SslMode,
    pub root_cert: Option<PathBuf>,
    /// The client certificate and its key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub channel_binding: ChannelBinding,
    pub target: TargetSession,
    pub connect_timeout: Option<Duration>,
    pub application_name: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// Reads the settings from `var` (the environment) the way libpq would, or says which setting
/// this client leaves to libpq. `exists` tells whether a file is there (libpq's defaults under
/// `~/.postgresql/` change what `require` and a client certificate mean).
pub fn from_env(
    var: &dyn Fn(&str) -> Option<String>,
    vars: &[String],
    exists: &dyn Fn(&str) -> bool,
) -> Result<Settings, Unsupported> {
    // libpq's variables are PG followed by a letter; images set PG_MAJOR, PG_VERSION and the
    // like for themselves.
    let libpq_var = |v: &str| v.starts_with("PG") && !v.starts_with("PG_");
    if let Some(other) = vars.iter().find(|v| {
        libpq_var(v) && !HONOURED.contains(&v.as_str()) && !HARMLESS.contains(&v.as_str())
    }) {
        return Err(Unsupported(format!("{other} is set")));
    }
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    let user = set("PGUSER").ok_or_else(|| Unsupported("PGUSER is not set".into()))?;
    let home = set("HOME").unwrap_or_default();
    let default_file = |name: &str| format!("{home}/.postgresql/{name}");
    let root_cert = set("PGSSLROOTCERT");
    let ssl_mode = ssl_mode(
        set("PGSSLMODE").as_deref(),
        root_cert.is_some() || exists(&default_file("root.crt")),
    )?;
    let client_cert = match (set("PGSSLCERT"), set("PGSSLKEY")) {
        (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
        (None, None) if exists(&default_file("postgresql.crt")) => {
            return Err(Unsupported("a client certificate in ~/.postgresql".into()));
        }
        (None, None) => None,
        _ => {
            return Err(Unsupported(
                "only one of PGSSLCERT and PGSSLKEY is set".into(),
            ));
        }
    };
    if ssl_mode == SslMode::VerifyFull && root_cert.is_none() {
        return Err(Unsupported(
            "verify-full with the default root certificate file".into(),
        ));
    }
    Ok(Settings {
        addresses: addresses(set("PGHOST").as_deref(), set("PGPORT").as_deref())?,
        user,
        ssl_mode,
        root_cert: root_cert.map(PathBuf::from),
        client_cert,
        channel_binding: channel_binding(set("PGCHANNELBINDING").as_deref())?,
        target: target(set("PGTARGETSESSIONATTRS").as_deref())?,
        connect_timeout: connect_timeout(set("PGCONNECT_TIMEOUT").as_deref())?,
        application_name: set("PGAPPNAME"),
        password_file: set("PGPASSFILE")
            .or_else(|| (!home.is_empty()).then(|| format!("{home}/.pgpass")))
            .map(PathBuf::from),
    })
}

/// The mode, refused where libpq would verify with a root certificate this client does not
/// take into account (`prefer` and `require` become `verify-ca` when one exists).
fn ssl_mode(mode: Option<&str>, root_cert: bool) -> Result<SslMode, Unsupported> {
    match mode.unwrap_or("prefer") {
        "disable" => Ok(SslMode::Disable),
        "prefer" | "require" if root_cert => Err(Unsupported(
            "a root certificate with sslmode prefer or require (libpq then verifies the chain)"
                .into(),
        )),
        "prefer" => Ok(SslMode::Prefer),
        "require" => Ok(SslMode::Require),
        "verify-full" => Ok(SslMode::VerifyFull),
        other => Err(Unsupported(format!("sslmode {other}"))),
    }
}

fn channel_binding(value: Option<&str>) -> Result<ChannelBinding, Unsupported> {
    match value.unwrap_or("prefer") {
        "disable" => Ok(ChannelBinding::Disable),
        "prefer" => Ok(ChannelBinding::Prefer),
        "require" => Ok(ChannelBinding::Require),
        other => Err(Unsupported(format!("channel_binding {other}"))),
    }
}

fn target(value: Option<&str>) -> Result<TargetSession, Unsupported> {
    match value.unwrap_or("any") {
        "any" => Ok(TargetSession::Any),
        "prefer-standby" => Ok(TargetSession::PreferStandby),
        other => Err(Unsupported(format!("target_session_attrs {other}"))),
    }
}

/// libpq's `connect_timeout`: whole seconds, 0 or none is no limit, 1 counts as 2.
fn connect_timeout(value: Option<&str>) -> Result<Option<Duration>, Unsupported> {
    let Some(v) = value else { return Ok(None) };
    let secs: u64 = v
        .trim()
        .parse()
        .map_err(|_| Unsupported(format!("connect_timeout {v}")))?;
    Ok((secs > 0).then(|| Duration::from_secs(secs.max(2))))
}

/// `PGHOST` × `PGPORT`: one port for all hosts or one per host; a host starting with `/` is a
/// socket directory; no host is the default socket directory.
fn addresses(hosts: Option<&str>, ports: Option<&str>) -> Result<Vec<Address>, Unsupported> {
    let hosts: Vec<&str> = hosts.unwrap_or(DEFAULT_SOCKET_DIR).split(',').collect();
    let ports: Vec<u16> = match ports {
        None => vec![DEFAULT_PORT],
        Some(p) => p
            .split(',')
            .map(|p| match p.trim() {
                "" => Ok(DEFAULT_PORT),
                p => p.parse().map_err(|_| Unsupported(format!("port {p}"))),
            })
            .collect::<Result<_, _>>()?,
    };
    if ports.len() != 1 && ports.len() != hosts.len() {
        return Err(Unsupported(format!(
            "{} hosts and {} ports",
            hosts.len(),
            ports.len()
        )));
    }
    let mut out = Vec::with_capacity(hosts.len());
    for (i, host) in hosts.iter().enumerate() {
        let port = ports[if ports.len() == 1 { 0 } else { i }];
        let host = match host.trim() {
            "" => DEFAULT_SOCKET_DIR,
            h => h,
        };
        out.push(if host.starts_with('/') {
            Address::Unix {
                dir: host.to_string(),
                port,
            }
        } else if host.starts_with('@') {
            return Err(Unsupported("an abstract Unix socket".into()));
        } else {
            Address::Tcp {
                host: host.to_string(),
                port,
            }
        });
    }
    Ok(out)
}

/// The password of the first pgpass line that matches, as libpq reads the file: fields
/// `host:port:database:user:password`, `*` matches anything, `\` escapes `:` and `\`, a
/// physical replication connection's database is `replication`, a socket's host `localhost`.
pub fn pgpass_password(text: &str, address: &Address, user: &str) -> Option<String> {
    let host = match address {
        Address::Unix { .. } => "localhost",
        Address::Tcp { host, .. } => host.as_str(),
    };
    let port = address.port().to_string();
    let wanted = [host, port.as_str(), "replication", user];
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let fields = pgpass_fields(line);
            let [h, p, d, u, pw] = fields.as_slice() else {
                return None;
            };
            [h, p, d, u]
                .iter()
                .zip(wanted)
                .all(|(f, w)| f.as_str() == "*" || f.as_str() == w)
                .then(|| pw.clone())
        })
}

/// One pgpass line's fields, unescaped; the password is the rest of the line.
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.trim_end_matches('\r').chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.push(chars.next().unwrap_or('\\')),
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn read(vars: &[(&str, &str)], files: &[&str]) -> Result<Settings, Unsupported> {
        let map: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let names: Vec<String> = map.keys().cloned().collect();
        let files: Vec<String> = files.iter().map(|f| f.to_string()).collect();
        from_env(&|k| map.get(k).cloned(), &names, &|f| {
            files.iter().any(|x| x == f)
        })
    }

    #[test]
    fn the_operator_s_backup_job_environment_is_read_as_libpq_reads_it() {
        let s = read(
            &[
                ("PGHOST", "db-1.db-hl.shop.svc,db-rw.shop.svc"),
                ("PGPORT", "5432"),
                ("PGUSER", "postgres"),
                ("PGDATABASE", "postgres"),
                ("PGPASSFILE", "/tmp/x/pgpass"),
                ("PGSSLMODE", "verify-full"),
                ("PGSSLROOTCERT", "/ca/ca.crt"),
                ("PGSSLCERT", "/ca/tls.crt"),
                ("PGSSLKEY", "/ca/tls.key"),
                ("PGTARGETSESSIONATTRS", "prefer-standby"),
                ("PGCONNECT_TIMEOUT", "10"),
                ("PGAPPNAME", "dbop-backup"),
                ("HOME", "/home/x"),
                // The operand images' own variables, not libpq's.
                ("PG_MAJOR", "15"),
                ("PG_VERSION", "15.18"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            s.addresses,
            vec![
                Address::Tcp {
                    host: "db-1.db-hl.shop.svc".into(),
                    port: 5432
                },
                Address::Tcp {
                    host: "db-rw.shop.svc".into(),
                    port: 5432
                },
            ]
        );
        assert_eq!(s.ssl_mode, SslMode::VerifyFull);
        assert_eq!(s.target, TargetSession::PreferStandby);
        assert_eq!(s.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(
            s.client_cert,
            Some(("/ca/tls.crt".into(), "/ca/tls.key".into()))
        );
        assert_eq!(s.password_file, Some("/tmp/x/pgpass".into()));
        assert_eq!(s.channel_binding, ChannelBinding::Prefer, "libpq's default");
        let bound = |v| read(&[("PGUSER", "u"), ("PGCHANNELBINDING", v)], &[]);
        assert_eq!(
            bound("require").unwrap().channel_binding,
            ChannelBinding::Require
        );
        assert_eq!(
            bound("disable").unwrap().channel_binding,
            ChannelBinding::Disable
        );
        assert!(
            bound("sometimes").is_err(),
            "libpq says what is wrong with it"
        );
    }

    #[test]
    fn what_libpq_would_do_differently_is_left_to_it() {
        let base = [("PGUSER", "u"), ("HOME", "/h")];
        let with = |extra: (&str, &str)| {
            let mut v = base.to_vec();
            v.push(extra);
            read(&v, &[])
        };
        assert!(with(("PGSSLMODE", "verify-ca")).is_err());
        assert!(with(("PGSSLMODE", "allow")).is_err());
        assert!(with(("PGTARGETSESSIONATTRS", "read-write")).is_err());
        assert!(with(("PGSERVICE", "x")).is_err());
        assert!(with(("PGHOSTADDR", "10.0.0.1")).is_err());
        assert!(
            with(("PGSSLCERT", "/c")).is_err(),
            "a certificate without its key"
        );
        assert!(
            with(("PGSSLROOTCERT", "/ca")).is_err(),
            "prefer with a root: verify-ca in libpq"
        );
        assert!(read(&base, &["/h/.postgresql/root.crt"]).is_err());
        assert!(read(&base, &["/h/.postgresql/postgresql.crt"]).is_err());
        assert!(read(&[("HOME", "/h")], &[]).is_err(), "no PGUSER");
        assert!(
            with(("PGSSLMODE", "verify-full")).is_err(),
            "no PGSSLROOTCERT"
        );
        assert!(
            read(
                &[("PGUSER", "u"), ("PGHOST", "a,b,c"), ("PGPORT", "1,2")],
                &[]
            )
            .is_err()
        );
    }

    #[test]
    fn hosts_ports_and_sockets() {
        let s = read(
            &[
                ("PGUSER", "u"),
                ("PGHOST", "/run/pg,127.0.0.1"),
                ("PGPORT", "5433,"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            s.addresses,
            vec![
                Address::Unix {
                    dir: "/run/pg".into(),
                    port: 5433
                },
                Address::Tcp {
                    host: "127.0.0.1".into(),
                    port: 5432
                },
            ]
        );
        assert_eq!(
            s.addresses[0].socket_path(),
            Some(PathBuf::from("/run/pg/.s.PGSQL.5433"))
        );
        let d = read(&[("PGUSER", "u")], &[]).unwrap();
        assert_eq!(
            d.addresses,
            vec![Address::Unix {
                dir: DEFAULT_SOCKET_DIR.into(),
                port: 5432
            }]
        );
        assert_eq!(d.ssl_mode, SslMode::Prefer);
        assert_eq!(d.connect_timeout, None);
        let t = read(&[("PGUSER", "u"), ("PGCONNECT_TIMEOUT", "1")], &[]).unwrap();
        assert_eq!(
            t.connect_timeout,
            Some(Duration::from_secs(2)),
            "libpq's minimum"
        );
    }

    #[test]
    fn pgpass_lines_match_as_libpq_matches_them() {
        let tcp = Address::Tcp {
            host: "db".into(),
            port: 5432,
        };
        let sock = Address::Unix {
            dir: "/run".into(),
            port: 5432,
        };
        let text =
            "# comment\nother:*:*:*:no\ndb:5432:app:u:not-replication\n*:*:*:u:a\\:b\\\\c:d\n";
        assert_eq!(
            pgpass_password(text, &tcp, "u").as_deref(),
            Some("a:b\\c:d")
        );
        assert_eq!(pgpass_password(text, &tcp, "v"), None);
        assert_eq!(
            pgpass_password("localhost:*:replication:u:s\n", &sock, "u").as_deref(),
            Some("s")
        );
        assert_eq!(pgpass_password("db:5433:*:u:s\n", &tcp, "u"), None);
    }
}
