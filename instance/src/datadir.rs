//! What to do with the data directory at start: initialise it, run it, or refuse it.
//!
//! Pure: the caller lists the directory and reads `PG_VERSION`; this module only decides.

/// What the data directory holds, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The directory does not exist.
    Missing,
    /// The directory exists and has no entries.
    Empty,
    /// The directory has entries; `pg_version` is the content of its `PG_VERSION` file, if any.
    Populated { pg_version: Option<String> },
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Run `initdb` (into a scratch directory, renamed into place when complete).
    InitDb,
    /// Start the server on the existing data.
    Run,
    /// Do not start: the message says why and what to do.
    Refuse(String),
}

/// Decides how to start a server of major version `major` on the observed data directory.
pub fn decide(observed: &Observed, major: u32) -> Start {
    match observed {
        Observed::Missing | Observed::Empty => Start::InitDb,
        Observed::Populated { pg_version: None } => Start::Refuse(
            "the data directory is not empty and has no PG_VERSION file: it is not a \
             PostgreSQL data directory; dbop does not initialise over foreign files"
                .into(),
        ),
        Observed::Populated {
            pg_version: Some(text),
        } => match text.trim().parse::<u32>() {
            Ok(found) if found == major => Start::Run,
            Ok(found) => Start::Refuse(format!(
                "the data directory belongs to PostgreSQL {found}, this image runs PostgreSQL \
                 {major}: a major upgrade needs a new Database restored from a backup; set \
                 spec.version back to a {found}.x release to start the server again"
            )),
            Err(_) => Start::Refuse(format!(
                "the data directory's PG_VERSION file is unreadable ({:?}): the data directory \
                 is damaged",
                text.trim()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn populated(v: Option<&str>) -> Observed {
        Observed::Populated {
            pg_version: v.map(str::to_string),
        }
    }

    #[test]
    fn decisions() {
        let cases: Vec<(Observed, Start)> = vec![
            (Observed::Missing, Start::InitDb),
            (Observed::Empty, Start::InitDb),
            (populated(Some("15\n")), Start::Run),
            (populated(Some("15")), Start::Run),
        ];
        for (observed, want) in cases {
            assert_eq!(decide(&observed, 15), want, "{observed:?}");
        }
    }

    #[test]
    fn refusals_say_why() {
        let cases = [
            (populated(Some("16\n")), "belongs to PostgreSQL 16"),
            (populated(Some("14")), "this image runs PostgreSQL 15"),
            (populated(None), "no PG_VERSION"),
            (populated(Some("fifteen")), "unreadable"),
        ];
        for (observed, needle) in cases {
            match decide(&observed, 15) {
                Start::Refuse(message) => assert!(message.contains(needle), "{message}"),
                other => panic!("{observed:?} gave {other:?}"),
            }
        }
    }
}
