//! Keeping the server's password equal to the mounted Secret's, and the SQL that does it.
//!
//! Pure: the caller reads the file and remembers a digest of the last password it applied.
//! The password is sent as a SCRAM-SHA-256 verifier computed here, so the plain text never
//! reaches the server (its logs, `pg_stat_statements`) nor any command line or environment.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The iteration count PostgreSQL uses by default.
pub const SCRAM_ITERATIONS: u32 = 4096;

/// A digest of a password, so that the manager need not keep the text to notice a change.
pub type Fingerprint = [u8; 32];

/// What the password file holds, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// No file (the Secret has no `password` key, or the volume is not there yet).
    Missing,
    /// The file's password (its first line, as `initdb --pwfile` reads it).
    Present(String),
}

/// What to do about the password now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sync {
    /// The server already has this password.
    Nothing,
    /// Set the server's password to the file's.
    Apply,
    /// The file cannot be used; the message says why (it never contains the password).
    Problem(String),
}

/// The password in a file's content: the first line, without its line ending.
pub fn from_file(content: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(content).map_err(|_| "the password is not UTF-8".to_string())?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// The fingerprint of a password.
pub fn fingerprint(password: &str) -> Fingerprint {
    Sha256::digest(password.as_bytes()).into()
}

/// Decides whether the password must be applied, given the last one applied.
pub fn decide(applied: Option<&Fingerprint>, read: &Read) -> Sync {
    match read {
        Read::Missing => Sync::Problem("the password file is missing".into()),
        Read::Present(p) if p.is_empty() => Sync::Problem("the password file is empty".into()),
        Read::Present(p) if !p.is_ascii() => Sync::Problem(
            "the password has non-ASCII characters: dbop sets only ASCII passwords (PostgreSQL \
             normalises other characters, which a client may not)"
                .into(),
        ),
        Read::Present(p) if applied == Some(&fingerprint(p)) => Sync::Nothing,
        Read::Present(_) => Sync::Apply,
    }
}

/// The SCRAM-SHA-256 verifier PostgreSQL stores for `password` with `salt` (RFC 5802/7677).
/// ASCII passwords only: SASLprep leaves them unchanged.
pub fn scram_verifier(password: &str, salt: &[u8], iterations: u32) -> String {
    let salted = pbkdf2_sha256(password.as_bytes(), salt, iterations);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key: [u8; 32] = Sha256::digest(client_key).into();
    let server_key = hmac(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    )
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block (32 bytes, what SCRAM-SHA-256 needs).
fn pbkdf2_sha256(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        out.iter_mut().zip(u.iter()).for_each(|(o, b)| *o ^= b);
    }
    out
}

/// A role or database name as a quoted SQL identifier (names are checked to hold no `"`).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A SQL string literal.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The statement that sets the superuser's password to a verifier.
pub fn alter_role_sql(role: &str, verifier: &str) -> String {
    format!(
        "ALTER ROLE {} PASSWORD {};\n",
        quote_ident(role),
        quote_literal(verifier)
    )
}

/// psql input that creates the application database when it does not exist.
pub fn ensure_database_sql(database: &str, owner: &str) -> String {
    format!(
        "SELECT format('CREATE DATABASE %I OWNER %I', {db}, {owner}) \
         WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = {db})\\gexec\n",
        db = quote_literal(database),
        owner = quote_literal(owner),
    )
}

/// What the primary asks once after its server started: a checkpoint. PostgreSQL 15's
/// checkpointer starts while the server is still starting and then sleeps for up to
/// `checkpoint_timeout` unless asked for a checkpoint; until it wakes it does not honour
/// `archive_timeout`, so a quiet primary's WAL would wait up to 5 minutes instead of
/// `archive_timeout` to be archived. After the server's own startup work the checkpoint has
/// little to write.
pub const WAKE_CHECKPOINTER_SQL: &str = "CHECKPOINT;\n";

/// The primary's sync: the password, the application database, and on the first sync since
/// the server started the checkpoint that wakes the checkpointer.
pub fn sync_sql(role: &str, verifier: &str, first: bool) -> String {
    let mut sql = alter_role_sql(role, verifier);
    sql.push_str(&ensure_database_sql(role, role));
    if first {
        sql.push_str(WAKE_CHECKPOINTER_SQL);
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sync_wakes_the_checkpointer_and_later_ones_do_not() {
        let first = sync_sql("app", "SCRAM", true);
        assert!(
            first.starts_with("ALTER ROLE \"app\" PASSWORD 'SCRAM';\n"),
            "{first}"
        );
        assert!(first.contains("CREATE DATABASE"), "{first}");
        assert!(first.ends_with("CHECKPOINT;\n"), "{first}");
        let later = sync_sql("app", "SCRAM", false);
        assert!(!later.contains("CHECKPOINT"), "{later}");
    }

    #[test]
    fn sync_decisions() {
        let old = fingerprint("old");
        let present = |p: &str| Read::Present(p.into());
        let cases = [
            (None, present("pw"), Sync::Apply),
            (Some(old), present("old"), Sync::Nothing),
            (Some(old), present("new"), Sync::Apply),
        ];
        for (applied, read, want) in cases {
            assert_eq!(decide(applied.as_ref(), &read), want, "{read:?}");
        }
        for read in [Read::Missing, present(""), present("pässword")] {
            match decide(Some(&old), &read) {
                Sync::Problem(m) => assert!(!m.contains("pässword")),
                other => panic!("{read:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn the_file_holds_its_first_line() {
        assert_eq!(from_file(b"s3cret\n").unwrap(), "s3cret");
        assert_eq!(from_file(b"s3cret\r\nrest").unwrap(), "s3cret");
        assert_eq!(from_file(b"s3cret").unwrap(), "s3cret");
        assert!(from_file(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn scram_verifier_matches_postgresql() {
        // RFC 7677 salt and password; expected keys computed independently (Python hashlib).
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        assert_eq!(
            scram_verifier("pencil", &salt, 4096),
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
             WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
             wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
        );
    }

    #[test]
    fn sql_is_quoted() {
        assert_eq!(
            alter_role_sql("app", "SCRAM-SHA-256$4096:a$b:c"),
            "ALTER ROLE \"app\" PASSWORD 'SCRAM-SHA-256$4096:a$b:c';\n"
        );
        let sql = ensure_database_sql("o'brien", "app");
        assert!(sql.contains("'o''brien'") && sql.ends_with("\\gexec\n"));
    }
}
