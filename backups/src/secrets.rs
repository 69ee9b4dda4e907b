//! Secrets from files: the database user and password (`--user-file`, `--password-file`) and
//! the S3 static key (`--s3-*-file`), as a Kubernetes Secret volume provides them. The password
//! goes into a pgpass file of the agent's own (mode 0600, in a private directory under the
//! scratch `TMPDIR`, removed at exit) that `PGPASSFILE` names for psql, pg_dump and
//! pg_restore: never into an environment variable, an argument or a message.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Reads a secret file named by `flag`; the error names the flag and the path, never content.
pub fn read(flag: &str, path: &Path) -> Result<String> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::io(format!("cannot read {flag} {}", path.display()), e))?;
    String::from_utf8(bytes).map_err(|_| {
        Error::Usage(format!(
            "{flag} {}: the file is not UTF-8 text",
            path.display()
        ))
    })
}

/// One pgpass line matching every host, port, database and user, with the password's `\` and
/// `:` escaped as libpq reads them. A line break cannot be written in a pgpass file: refused.
pub fn pgpass_line(password: &str) -> std::result::Result<String, String> {
    if password.contains(['\n', '\r']) {
        return Err("the password contains a line break, which a pgpass file cannot hold".into());
    }
    let escaped = password.replace('\\', "\\\\").replace(':', "\\:");
    Ok(format!("*:*:*:*:{escaped}\n"))
}

/// The agent's private directory holding its pgpass file; removed when dropped.
#[derive(Debug)]
pub struct PgpassDir(PathBuf);

impl PgpassDir {
    pub fn file(&self) -> PathBuf {
        self.0.join("pgpass")
    }
}

impl Drop for PgpassDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the pgpass file of `password` in a new private directory under `scratch`.
pub fn write_pgpass(scratch: &Path, password: &str) -> Result<PgpassDir> {
    let line = pgpass_line(password).map_err(|e| Error::Usage(format!("--password-file: {e}")))?;
    let dir = scratch.join(format!("dbop-backup-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let dir = PgpassDir(dir);
    let path = dir.file();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
    f.write_all(line.as_bytes())
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    Ok(dir)
}

/// Applies `--user-file` and `--password-file` to the process's libpq environment (PGUSER,
/// PGDATABASE when unset, PGPASSFILE; PGPASSWORD is removed so the file is what counts).
/// Must run before any thread starts (it sets environment variables).
pub fn setup_pg(
    user_file: Option<&Path>,
    password_file: Option<&Path>,
) -> Result<Option<PgpassDir>> {
    // A missing user file leaves PGUSER to libpq, as an absent optional Secret key did (a
    // user's credentials Secret may hold only a password).
    if let Some(path) = user_file.filter(|p| p.exists()) {
        let user = read("--user-file", path)?;
        let user = user.trim_end_matches(['\n', '\r']).to_string();
        if user.is_empty() {
            return Err(Error::Usage(format!(
                "--user-file {} is empty",
                path.display()
            )));
        }
        let database_unset = std::env::var_os("PGDATABASE").is_none_or(|d| d.is_empty());
        // SAFETY: called from `main` before the runtime or any other thread exists.
        unsafe {
            std::env::set_var("PGUSER", &user);
            if database_unset {
                std::env::set_var("PGDATABASE", &user);
            }
        }
    }
    let Some(path) = password_file else {
        return Ok(None);
    };
    let password = read("--password-file", path)?;
    let dir = write_pgpass(&std::env::temp_dir(), &password)?;
    // SAFETY: as above.
    unsafe {
        std::env::set_var("PGPASSFILE", dir.file());
        std::env::remove_var("PGPASSWORD");
    }
    Ok(Some(dir))
}

/// A static S3 key read from its files.
#[derive(Clone)]
pub struct StaticKey {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StaticKey(redacted)")
    }
}

/// The static key of the `--s3-*-file` flags, if given (surrounding whitespace removed: a key
/// has none).
pub fn static_key(
    access_key_id: Option<&Path>,
    secret_access_key: Option<&Path>,
    session_token: Option<&Path>,
) -> Result<Option<StaticKey>> {
    let (Some(id), Some(secret)) = (access_key_id, secret_access_key) else {
        return Ok(None);
    };
    let read_trimmed = |flag: &str, p: &Path| read(flag, p).map(|s| s.trim().to_string());
    Ok(Some(StaticKey {
        access_key_id: read_trimmed("--s3-access-key-id-file", id)?,
        secret_access_key: read_trimmed("--s3-secret-access-key-file", secret)?,
        session_token: session_token
            .map(|p| read_trimmed("--s3-session-token-file", p))
            .transpose()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn pgpass_escapes_what_libpq_reads_as_separators() {
        let cases = [
            ("plain", "*:*:*:*:plain\n"),
            ("a:b", "*:*:*:*:a\\:b\n"),
            ("a\\b", "*:*:*:*:a\\\\b\n"),
            ("\\:", "*:*:*:*:\\\\\\:\n"),
            ("*", "*:*:*:*:*\n"),
        ];
        for (password, want) in cases {
            assert_eq!(pgpass_line(password).unwrap(), want, "{password}");
        }
        let e = pgpass_line("a\nb").unwrap_err();
        assert!(!e.contains("a\nb"), "{e}");
    }

    #[test]
    fn the_pgpass_file_is_private_and_removed() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = write_pgpass(scratch.path(), "s:e\\cret").unwrap();
        let file = dir.file();
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "*:*:*:*:s\\:e\\\\cret\n"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        drop(dir);
        assert!(!file.exists());
    }

    #[test]
    fn a_static_key_is_read_from_its_files_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, value: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, value).unwrap();
            p
        };
        let (id, secret, token) = (
            file("id", "AKIA1\n"),
            file("secret", " s3cr3t "),
            file("token", "tok"),
        );
        let k = static_key(Some(&id), Some(&secret), Some(&token))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                k.access_key_id.as_str(),
                k.secret_access_key.as_str(),
                k.session_token.as_deref()
            ),
            ("AKIA1", "s3cr3t", Some("tok"))
        );
        assert!(static_key(None, Some(&secret), None).unwrap().is_none());
        let e = static_key(Some(&id), Some(&dir.path().join("nope")), None).unwrap_err();
        assert!(e.to_string().contains("--s3-secret-access-key-file"), "{e}");
    }

    #[test]
    fn errors_name_the_file_never_its_content() {
        let scratch = tempfile::tempdir().unwrap();
        let p = scratch.path().join("missing");
        let e = read("--password-file", &p).unwrap_err().to_string();
        assert!(
            e.contains("--password-file") && e.contains("missing"),
            "{e}"
        );
        let bin = scratch.path().join("bin");
        std::fs::write(&bin, [0xff, 0xfe, b's']).unwrap();
        assert!(read("--password-file", &bin).is_err());
        assert!(
            format!(
                "{:?}",
                StaticKey {
                    access_key_id: "AKIA".into(),
                    secret_access_key: "sekrit".into(),
                    session_token: None,
                }
            )
            .contains("redacted")
        );
    }
}
