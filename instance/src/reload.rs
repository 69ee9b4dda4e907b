//! The Database's own server configuration, mounted from its ConfigMap (`--config-dir`): the
//! parameters file the server includes and the extra `pg_hba.conf` rules; and its certificate
//! (`--tls-dir`, installed by `tls`). At start they are put in place (`prepare`); while the
//! server runs, `Reloader` looks at them every few seconds and, when the kubelet has updated
//! them, rewrites `pg_hba.conf` (or installs the renewed certificate) and sends the server
//! SIGHUP.
//! PostgreSQL applies what a reload can change; a parameter that needs a restart is applied
//! when the operator rolls the pod (it logs "cannot be changed without restarting" meanwhile).
//!
//! `changed` is the decision (pure); the rest reads and writes files and sends the signal.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dbop_contract::instance::{HBA_FILE, PARAMETERS_FILE};

use crate::config;
use crate::process;
use crate::run::Fatal;
use crate::shutdown::Signal;
use crate::tls;

/// How often the mounted files are read (the kubelet updates them within about a minute).
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What the mounted files hold (None: missing or unreadable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mounted {
    pub parameters: Option<String>,
    pub hba: Option<String>,
    /// The certificate's files (`tls::read`), with `--tls-dir`.
    pub tls: Option<Vec<Vec<u8>>>,
}

/// Whether the server must reload: the files differ from what it last read.
pub fn changed(last: &Mounted, now: &Mounted) -> bool {
    last != now
}

/// Reads both files of `dir`, and the certificate's of `tls_dir`.
pub fn read(dir: &Path, tls_dir: Option<&Path>) -> Mounted {
    let text = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    Mounted {
        parameters: text(PARAMETERS_FILE),
        hba: text(HBA_FILE),
        tls: tls_dir.and_then(tls::read),
    }
}

fn write_hba(pgdata: &Path, mounted: &Mounted) -> Result<(), Fatal> {
    let text = config::pg_hba(
        mounted.hba.as_deref().unwrap_or_default(),
        mounted.tls.is_some(),
    );
    std::fs::write(pgdata.join("pg_hba.conf"), text)
        .map_err(|e| Fatal(format!("cannot write pg_hba.conf: {e}")))
}

/// Before the server starts: `pg_hba.conf` with the Database's rules, and the include of its
/// parameters last in `postgresql.conf`. `tls` is the certificate `tls::prepare` installed.
/// Returns what was read, for `Reloader`.
pub fn prepare(
    pgdata: &Path,
    config_dir: &Path,
    tls: Option<Vec<Vec<u8>>>,
) -> Result<Mounted, Fatal> {
    let mounted = Mounted {
        tls,
        ..read(config_dir, None)
    };
    write_hba(pgdata, &mounted)?;
    let path = pgdata.join("postgresql.conf");
    let conf = std::fs::read_to_string(&path)
        .map_err(|e| Fatal(format!("cannot read postgresql.conf: {e}")))?;
    if let Some(text) = config::with_parameters_include(&conf, &config_dir.join(PARAMETERS_FILE)) {
        std::fs::write(&path, text)
            .map_err(|e| Fatal(format!("cannot write postgresql.conf: {e}")))?;
    }
    Ok(mounted)
}

/// Reloads the running server when the mounted configuration changes.
pub struct Reloader {
    pgdata: PathBuf,
    config_dir: PathBuf,
    /// The mounted certificate and where it is installed, with `--tls-dir`.
    tls: Option<(PathBuf, PathBuf)>,
    last: Mounted,
    checked: Instant,
}

impl Reloader {
    pub fn new(
        pgdata: &Path,
        config_dir: &Path,
        tls: Option<(PathBuf, PathBuf)>,
        last: Mounted,
    ) -> Self {
        Self {
            pgdata: pgdata.to_path_buf(),
            config_dir: config_dir.to_path_buf(),
            tls,
            last,
            checked: Instant::now(),
        }
    }

    /// Called at every poll of the running server `pid`.
    pub fn tick(&mut self, pid: u32) {
        if self.checked.elapsed() < CHECK_EVERY {
            return;
        }
        self.checked = Instant::now();
        let mounted = self.tls.as_ref().map(|(mounted, _)| mounted.as_path());
        let mut now = read(&self.config_dir, mounted);
        if now.tls.is_none() {
            // Being rewritten by the kubelet (or never there): the installed one stays.
            now.tls = self.last.tls.clone();
        }
        if !changed(&self.last, &now) {
            return;
        }
        if let (Some((_, installed)), Some(files)) = (&self.tls, &now.tls)
            && now.tls != self.last.tls
        {
            if let Err(Fatal(message)) = tls::install(installed, files) {
                eprintln!("dbop-instance: the renewed certificate is not installed: {message}");
                return;
            }
            eprintln!("dbop-instance: the server certificate changed: installed");
        }
        if let Err(Fatal(message)) = write_hba(&self.pgdata, &now) {
            // Tried again at the next check: `last` is unchanged.
            eprintln!("dbop-instance: the configuration is not reloaded: {message}");
            return;
        }
        eprintln!(
            "dbop-instance: the Database's configuration changed: reloading the server (SIGHUP)"
        );
        process::send(pid, Signal::Hup);
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_either_file_reloads_and_nothing_else_does() {
        let base = Mounted {
            parameters: Some("work_mem = '4MB'\n".into()),
            hba: Some("# none\n".into()),
            tls: None,
        };
        assert!(!changed(&base, &base.clone()));
        let params = Mounted {
            parameters: Some("work_mem = '8MB'\n".into()),
            ..base.clone()
        };
        assert!(changed(&base, &params));
        let hba = Mounted {
            hba: Some("host all all 10.0.0.0/8 reject\n".into()),
            ..base.clone()
        };
        assert!(changed(&base, &hba));
        assert!(changed(&base, &Mounted::default()));
        let renewed = Mounted {
            tls: Some(vec![b"new".to_vec()]),
            ..base.clone()
        };
        assert!(changed(&base, &renewed));
    }

    #[test]
    fn prepare_writes_the_rules_and_includes_the_parameters() {
        let pgdata = tempfile::tempdir().unwrap();
        let config_dir = tempfile::tempdir().unwrap();
        std::fs::write(
            pgdata.path().join("postgresql.conf"),
            "max_connections = 100\n",
        )
        .unwrap();
        std::fs::write(
            config_dir.path().join(HBA_FILE),
            "host all all 10.0.0.0/8 reject\n",
        )
        .unwrap();
        let mounted = prepare(pgdata.path(), config_dir.path(), None).unwrap();
        assert_eq!(mounted, read(config_dir.path(), None));
        let hba = std::fs::read_to_string(pgdata.path().join("pg_hba.conf")).unwrap();
        assert!(hba.contains("\nhost all all 10.0.0.0/8 reject\n"), "{hba}");
        let conf = std::fs::read_to_string(pgdata.path().join("postgresql.conf")).unwrap();
        let include = config::parameters_include(&config_dir.path().join(PARAMETERS_FILE));
        assert!(conf.ends_with(&format!("{include}\n")), "{conf}");
        // A second start changes nothing.
        prepare(pgdata.path(), config_dir.path(), None).unwrap();
        let again = std::fs::read_to_string(pgdata.path().join("postgresql.conf")).unwrap();
        assert_eq!(again, conf);
    }
}
