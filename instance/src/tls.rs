//! The server's certificate: the mounted Secret's files (`tls.crt`, `tls.key`, `ca.crt`) put
//! where PostgreSQL accepts them, and the settings that point the server at them.
//!
//! PostgreSQL refuses a key file that its own user does not own with mode 0600 (or root with
//! 0640); a Secret volume gives root ownership and the pod's group, whatever the platform
//! chooses. So the manager copies the three files into a directory of its own (in the socket
//! directory's emptyDir, never on the data volume), mode 0600, each written beside and renamed
//! into place: a reload never reads half a key. The kubelet updates the mounted files when the
//! operator renews the certificate; `reload::Reloader` then copies them again and sends SIGHUP,
//! which makes new connections use the new certificate while open ones keep theirs.
//!
//! `settings` is pure; `read` and `install` do the I/O.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use dbop_contract::instance::{TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE};

use crate::run::Fatal;

/// The files, in the order they are read and installed.
pub const FILES: [&str; 3] = [TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE];

/// The directory (under the socket directory) the server reads its certificate from.
pub fn installed_dir(socket_dir: &Path) -> PathBuf {
    socket_dir.join("tls")
}

/// The server settings for TLS from `dir` (the installed copy): TLS 1.2 or later, the CA for
/// client certificates (`cert` rules in `spec.postgresql.pgHba`).
pub fn settings(dir: &Path) -> Vec<(&'static str, String)> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        ("ssl", "on".to_string()),
        ("ssl_cert_file", file(TLS_CERT_FILE)),
        ("ssl_key_file", file(TLS_KEY_FILE)),
        ("ssl_ca_file", file(TLS_CA_FILE)),
        ("ssl_min_protocol_version", "TLSv1.2".to_string()),
    ]
}

/// The three mounted files, as read (None: one is missing or empty; the kubelet writes them
/// together, so a partial read is retried at the next look).
pub fn read(mounted: &Path) -> Option<Vec<Vec<u8>>> {
    FILES
        .iter()
        .map(|name| {
            std::fs::read(mounted.join(name))
                .ok()
                .filter(|b| !b.is_empty())
        })
        .collect()
}

/// Writes `files` (as [`read`] returned them) into `dir`, mode 0600, each renamed into place.
pub fn install(dir: &Path, files: &[Vec<u8>]) -> Result<(), Fatal> {
    let fail = |what: &str, e: std::io::Error| {
        Fatal(format!(
            "cannot install the server certificate ({what}): {e}"
        ))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("directory", e))?;
    for (name, bytes) in FILES.iter().zip(files) {
        let target = dir.join(name);
        let scratch = dir.join(format!(".{name}.new"));
        let _ = std::fs::remove_file(&scratch);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&scratch)
            .map_err(|e| fail(name, e))?;
        file.write_all(bytes).map_err(|e| fail(name, e))?;
        file.sync_all().map_err(|e| fail(name, e))?;
        std::fs::rename(&scratch, &target).map_err(|e| fail(name, e))?;
    }
    Ok(())
}

/// At start, with `--tls-dir`: the certificate installed, or a clear fatal error (the server
/// would otherwise refuse to start on `ssl = on`, with a message about a file it cannot find).
pub fn prepare(mounted: &Path, socket_dir: &Path) -> Result<(PathBuf, Vec<Vec<u8>>), Fatal> {
    let files = read(mounted).ok_or_else(|| {
        Fatal(format!(
            "the server certificate is not mounted at {}: it needs {}, {} and {} (the Secret \
             <name>-server-tls, which dbop writes)",
            mounted.display(),
            TLS_CERT_FILE,
            TLS_KEY_FILE,
            TLS_CA_FILE
        ))
    })?;
    let dir = installed_dir(socket_dir);
    install(&dir, &files)?;
    Ok((dir, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn settings_point_at_the_installed_copy() {
        let s = settings(Path::new("/run/pg/tls"));
        assert!(s.contains(&("ssl", "on".into())));
        assert!(s.contains(&("ssl_key_file", "/run/pg/tls/tls.key".into())));
        assert!(s.contains(&("ssl_ca_file", "/run/pg/tls/ca.crt".into())));
        assert!(s.contains(&("ssl_min_protocol_version", "TLSv1.2".into())));
    }

    #[test]
    fn install_copies_the_files_private_and_replaces_them() {
        let mounted = tempfile::tempdir().unwrap();
        let socket = tempfile::tempdir().unwrap();
        assert!(read(mounted.path()).is_none());
        assert!(prepare(mounted.path(), socket.path()).is_err());
        for name in FILES {
            std::fs::write(mounted.path().join(name), format!("{name} v1")).unwrap();
        }
        let (dir, files) = prepare(mounted.path(), socket.path()).unwrap();
        assert_eq!(files, read(mounted.path()).unwrap());
        let key = dir.join(TLS_KEY_FILE);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "tls.key v1");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::write(mounted.path().join(TLS_KEY_FILE), "tls.key v2").unwrap();
        install(&dir, &read(mounted.path()).unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "tls.key v2");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 3, "no scratch file left behind");
        // An empty file (a write in progress) is not a certificate.
        std::fs::write(mounted.path().join(TLS_CA_FILE), "").unwrap();
        assert!(read(mounted.path()).is_none());
    }
}
