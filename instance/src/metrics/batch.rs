//! A batch of named SQL statements for one psql session, and the split of psql's output back
//! into each statement's rows.
//!
//! Every statement's rows start with its name (a literal first column) and every statement
//! that succeeded is followed by a marker row `#ok|<name>`: a statement that failed or was
//! cut off (timeout, psql killed) has no marker, and its rows, if any, are thrown away by
//! the caller. psql prints NUL after every field and every record (`-z -0`), and PostgreSQL
//! text cannot hold NUL, so any label value (a database name, a custom query's column) comes
//! back intact; the column count of each statement tells records apart.
//!
//! Pure: text in, text out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The first field of a statement's success marker.
pub const OK: &str = "#ok";

/// psql's arguments for a batch: unaligned, tuples only, NUL-separated, quiet, no psqlrc.
pub const PSQL_ARGS: [&str; 6] = [
    "--no-psqlrc",
    "--no-align",
    "--tuples-only",
    "--quiet",
    "--field-separator-zero",
    "--record-separator-zero",
];

/// One statement: `sql` is a single `SELECT` (no trailing `;`) whose first column is the
/// literal `name` and which returns `columns` columns in all (the name included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub name: String,
    pub sql: String,
    pub columns: usize,
}

/// The batch as a psql script (its standard input): `statement_timeout` for each statement,
/// then each statement followed by its marker, printed only when psql's `ERROR` is false.
/// The statements are dbop's own (psql meta-commands are interpreted here: never pass user
/// SQL through this).
pub fn script(statements: &[Statement], timeout: Duration) -> String {
    let mut out = format!("SET statement_timeout = {};\n", timeout.as_millis().max(1));
    for s in statements {
        out.push_str(&s.sql);
        out.push_str(";\n\\if :ERROR\n\\else\n");
        out.push_str(&marker_sql(&s.name));
        out.push_str(";\n\\endif\n");
    }
    out
}

/// The marker statement of `name`.
pub fn marker_sql(name: &str) -> String {
    format!("SELECT '{OK}', {}", literal(name))
}

/// `text` as an SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `name` as an SQL identifier (double-quoted).
pub fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Each statement's rows (without the name column), and the statements that succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub rows: BTreeMap<String, Vec<Vec<String>>>,
    pub ok: BTreeSet<String>,
}

impl Split {
    /// The rows of `name` when it succeeded; `None` when it failed or never ran.
    pub fn of(&self, name: &str) -> Option<&[Vec<String>]> {
        self.ok
            .contains(name)
            .then(|| self.rows.get(name).map(Vec::as_slice).unwrap_or(&[]))
    }
}

/// Splits psql's output of a batch of `statements`. A truncated last record (psql killed) is
/// dropped; a record of an unknown statement ends the split there (what follows cannot be
/// told apart), and so does anything that is not NUL-terminated.
pub fn split(output: &str, statements: &[Statement]) -> Split {
    let mut out = Split::default();
    let mut fields: Vec<&str> = output.split('\0').collect();
    // Every field is NUL-terminated: what follows the last NUL is a truncated field.
    fields.pop();
    let mut i = 0;
    while i < fields.len() {
        let tag = fields[i];
        let columns = if tag == OK {
            2
        } else {
            match statements.iter().find(|s| s.name == tag) {
                Some(s) => s.columns.max(1),
                None => break,
            }
        };
        if i + columns > fields.len() {
            break;
        }
        let record = &fields[i + 1..i + columns];
        if tag == OK {
            out.ok.insert(record[0].to_string());
        } else {
            out.rows
                .entry(tag.to_string())
                .or_default()
                .push(record.iter().map(|f| f.to_string()).collect());
        }
        i += columns;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements() -> Vec<Statement> {
        vec![
            Statement {
                name: "a".into(),
                sql: "SELECT 'a', datname FROM pg_database".into(),
                columns: 2,
            },
            Statement {
                name: "b".into(),
                sql: "SELECT 'b', 1, 2".into(),
                columns: 3,
            },
            Statement {
                name: "c".into(),
                sql: "SELECT 'c', 1 WHERE false".into(),
                columns: 2,
            },
        ]
    }

    #[test]
    fn script_sets_the_timeout_and_marks_each_statement() {
        let s = script(&statements()[..1], Duration::from_millis(1500));
        assert_eq!(
            s,
            "SET statement_timeout = 1500;\n\
             SELECT 'a', datname FROM pg_database;\n\\if :ERROR\n\\else\n\
             SELECT '#ok', 'a';\n\\endif\n"
        );
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn splits_rows_and_markers() {
        type Case = (
            &'static str,
            Vec<(&'static str, Vec<Vec<&'static str>>)>,
            Vec<&'static str>,
        );
        let table: Vec<Case> = vec![
            // a succeeded with two rows (one name holds a line feed and a '|'), b failed,
            // c succeeded with no row.
            (
                "a\0postgres\0a\0we|ird\nname\0#ok\0a\0#ok\0c\0",
                vec![("a", vec![vec!["postgres"], vec!["we|ird\nname"]])],
                vec!["a", "c"],
            ),
            // Cut off in b's row: b has no marker, the partial record is dropped.
            (
                "a\0x\0#ok\0a\0b\x001\0",
                vec![("a", vec![vec!["x"]])],
                vec!["a"],
            ),
            // b's rows but no marker: they are there, but `of` says it failed.
            ("b\x001\x002\0", vec![("b", vec![vec!["1", "2"]])], vec![]),
            // An unknown tag ends the split.
            ("a\0x\0zz\0#ok\0a\0", vec![("a", vec![vec!["x"]])], vec![]),
            ("", vec![], vec![]),
            ("garbage without NUL", vec![], vec![]),
        ];
        for (output, rows, ok) in table {
            let got = split(output, &statements());
            let want_rows: BTreeMap<String, Vec<Vec<String>>> = rows
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        v.into_iter()
                            .map(|r| r.into_iter().map(String::from).collect())
                            .collect(),
                    )
                })
                .collect();
            assert_eq!(got.rows, want_rows, "{output:?}");
            assert_eq!(
                got.ok,
                ok.into_iter().map(String::from).collect::<BTreeSet<_>>(),
                "{output:?}"
            );
        }
        let got = split("b\x001\x002\0#ok\0c\0", &statements());
        assert_eq!(got.of("b"), None);
        assert_eq!(got.of("c"), Some(&[][..]));
        assert_eq!(got.of("a"), None);
    }
}
