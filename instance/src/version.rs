//! `dbop-instance server-version`: the version the image's `postgres` binary reports, checked
//! against the one expected. dbop's upgrade preflight runs it in the target image before any
//! serving pod changes. Parsing and the comparison are pure; `check` does the I/O.

use std::path::Path;
use std::process::Command;

use crate::run::{bin_dir, report};

/// The `MAJOR.MINOR` in `postgres --version` output such as
/// `postgres (PostgreSQL) 15.20 (Debian 15.20-1.pgdg120+1)`.
pub fn parse(output: &str) -> Option<String> {
    let rest = output.split("(PostgreSQL)").nth(1)?;
    let word = rest.split_whitespace().next()?;
    let mut parts = word.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some(format!("{major}.{minor}"))
}

/// Whether `found` is the `expected` `MAJOR.MINOR` (numerically: `16.04` is `16.4`).
pub fn matches(found: &str, expected: &str) -> bool {
    let numbers = |v: &str| -> Option<(u32, u32)> {
        let (a, b) = v.split_once('.')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    };
    numbers(found).is_some() && numbers(found) == numbers(expected)
}

/// Runs the check; returns the exit code. The termination message is the version found (or
/// why there is none), so dbop can say what the image holds.
pub fn check(major: u32, expected: &str, termination_log: &Path) -> i32 {
    let bin = match bin_dir(major) {
        Ok(bin) => bin,
        Err(fatal) => {
            report(termination_log, &fatal.0);
            return 1;
        }
    };
    let output = match Command::new(bin.join("postgres")).arg("--version").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).to_string(),
        Err(e) => {
            report(
                termination_log,
                &format!("cannot run postgres --version: {e}"),
            );
            return 1;
        }
    };
    match parse(&output) {
        Some(found) if matches(&found, expected) => {
            report(termination_log, &found);
            0
        }
        Some(found) => {
            report(termination_log, &found);
            2
        }
        None => {
            let text = output.trim();
            report(
                termination_log,
                &format!("unreadable postgres --version output: {text:?}"),
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_real_outputs() {
        let table = [
            (
                "postgres (PostgreSQL) 15.20 (Debian 15.20-1.pgdg120+1)\n",
                Some("15.20"),
            ),
            ("postgres (PostgreSQL) 16.4\n", Some("16.4")),
            ("postgres (PostgreSQL) 17.0 (Homebrew)", Some("17.0")),
            ("postgres (PostgreSQL) 18beta1", None),
            ("something else", None),
        ];
        for (output, want) in table {
            assert_eq!(parse(output).as_deref(), want, "{output}");
        }
        assert!(matches("16.4", "16.04"));
        assert!(!matches("15.18", "15.20"));
        assert!(!matches("x", "x"));
    }
}
