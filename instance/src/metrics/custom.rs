//! User-defined metrics: queries from a file (YAML, or JSON, which YAML reads too; the
//! operator mounts a ConfigMap there), each with its name, help, SQL, metric type, label
//! columns and value columns, and optionally its database and timeout.
//!
//! ```yaml
//! queries:
//!   - name: orders            # metrics dbop_pg_custom_orders_<value column>
//!     help: Orders by status.
//!     sql: SELECT status, count(*) AS pending FROM orders GROUP BY status
//!     type: gauge             # or counter
//!     labels: [status]
//!     values: [pending]
//!     database: app           # default postgres
//!     timeout_seconds: 2      # default 2, at most 30
//! ```
//!
//! Pure: the file's text to validated queries, each query's psql arguments, and its rows to
//! metric families. The SQL runs read-only, as the superuser, wrapped in
//! `SELECT <labels>, <values> FROM (<sql>)`: it must be one `SELECT` (or `WITH … SELECT`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use crate::metrics::batch::{self, Statement};
use crate::metrics::exposition::{self, Family, Kind};

/// The metric name prefix of custom queries (so no custom metric can shadow a built-in one).
pub const PREFIX: &str = "dbop_pg_custom_";
/// The timeout of a query that names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest timeout a query may name.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// The most queries a file may hold (each is one connection per scrape).
pub const MAX_QUERIES: usize = 32;
/// The `query` label of the error counter when the file itself cannot be used.
pub const FILE_ERROR: &str = "custom_queries_file";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    queries: Vec<Raw>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: String,
    help: String,
    sql: String,
    #[serde(rename = "type", default = "gauge")]
    kind: String,
    #[serde(default)]
    labels: Vec<String>,
    values: Vec<String>,
    #[serde(default)]
    database: Option<String>,
    #[serde(default)]
    timeout_seconds: Option<f64>,
}

fn gauge() -> String {
    "gauge".into()
}

/// One validated query.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    pub name: String,
    pub help: String,
    pub sql: String,
    pub kind: Kind,
    pub labels: Vec<String>,
    pub values: Vec<String>,
    pub database: String,
    pub timeout: Duration,
}

/// Parses and validates the file; any invalid query makes the whole file invalid (the error
/// says which and why), so a typo never silently drops a metric.
pub fn parse(text: &str) -> Result<Vec<Query>, String> {
    let file: File = serde_norway::from_str(text).map_err(|e| format!("not valid: {e}"))?;
    if file.queries.len() > MAX_QUERIES {
        return Err(format!(
            "{} queries, at most {MAX_QUERIES} are allowed",
            file.queries.len()
        ));
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::new();
    for raw in file.queries {
        let name = raw.name.clone();
        let q = validate(raw).map_err(|why| format!("query {name:?}: {why}"))?;
        if !names.insert(q.name.clone()) {
            return Err(format!("query {name:?} is defined twice"));
        }
        out.push(q);
    }
    Ok(out)
}

fn validate(raw: Raw) -> Result<Query, String> {
    let simple = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    if !simple(&raw.name) {
        return Err("the name must be lowercase letters, digits and _ (not first a digit)".into());
    }
    let reserved = [
        crate::metrics::builtin::TABLES,
        crate::metrics::collect::VOLUME,
        FILE_ERROR,
    ];
    if crate::metrics::builtin::NAMES.contains(&raw.name.as_str())
        || reserved.contains(&raw.name.as_str())
    {
        return Err("the name is one of dbop's own queries".into());
    }
    let kind = match raw.kind.as_str() {
        "gauge" => Kind::Gauge,
        "counter" => Kind::Counter,
        other => return Err(format!("type {other:?}: gauge or counter")),
    };
    if raw.values.is_empty() {
        return Err("no value columns".into());
    }
    let mut columns = BTreeSet::new();
    for c in raw.labels.iter().chain(&raw.values) {
        if !exposition::valid_label_name(c) {
            return Err(format!(
                "column {c:?} cannot be a label or metric name part"
            ));
        }
        if !columns.insert(c) {
            return Err(format!("column {c:?} is named twice"));
        }
    }
    if raw.sql.trim().is_empty() || raw.sql.contains('\0') || raw.help.contains('\0') {
        return Err("the SQL is empty or holds a NUL".into());
    }
    let database = raw.database.unwrap_or_else(|| "postgres".into());
    if database.is_empty() || database.contains('\0') || database.len() > 63 {
        return Err("the database name must have 1 to 63 bytes".into());
    }
    let timeout = match raw.timeout_seconds {
        None => DEFAULT_TIMEOUT,
        Some(s) if s > 0.0 && s <= MAX_TIMEOUT.as_secs_f64() => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(format!(
                "timeout_seconds {s}: more than 0, at most {}",
                MAX_TIMEOUT.as_secs()
            ));
        }
    };
    Ok(Query {
        name: raw.name,
        help: raw.help,
        sql: raw.sql.trim().trim_end_matches(';').trim_end().to_string(),
        kind,
        labels: raw.labels,
        values: raw.values,
        database,
        timeout,
    })
}

impl Query {
    /// The metric of value column `column`.
    pub fn metric(&self, column: &str) -> String {
        format!("{PREFIX}{}_{column}", self.name)
    }

    /// The wrapped statement: the name, the label columns as text, the value columns.
    pub fn statement(&self) -> Statement {
        let mut columns = vec![batch::literal(&self.name)];
        columns.extend(
            self.labels
                .iter()
                .map(|c| format!("{}::text", batch::identifier(c))),
        );
        columns.extend(self.values.iter().map(|c| batch::identifier(c)));
        Statement {
            name: self.name.clone(),
            sql: format!(
                "SELECT {} FROM (\n{}\n) AS dbop_custom_query",
                columns.join(", "),
                self.sql
            ),
            columns: 1 + self.labels.len() + self.values.len(),
        }
    }

    /// psql's `--command` arguments, run with `ON_ERROR_STOP`: the timeout, read-only, the
    /// query, then its marker (reached only when the query succeeded). Each is sent to the
    /// server as it is: psql interprets no meta-command in them.
    pub fn commands(&self) -> Vec<String> {
        vec![
            format!(
                "SET statement_timeout = {}",
                self.timeout.as_millis().max(1)
            ),
            "SET default_transaction_read_only = on".into(),
            self.statement().sql,
            batch::marker_sql(&self.name),
        ]
    }

    /// The families of the query's rows (`batch::Split::of`). A value that is not a number
    /// (NULL leaves its sample out; `t`/`f` are 1/0) or two rows with the same labels fail
    /// the whole query.
    pub fn families(&self, rows: &[Vec<String>]) -> Result<Vec<Family>, String> {
        let mut seen = BTreeSet::new();
        let mut families: Vec<Family> = self
            .values
            .iter()
            .map(|v| Family::new(&self.metric(v), &self.help, self.kind))
            .collect();
        for row in rows {
            let (labels, values) = row.split_at(self.labels.len());
            if !seen.insert(labels.to_vec()) {
                return Err(format!("two rows with the labels {labels:?}"));
            }
            let labels: Vec<(&str, &str)> = self
                .labels
                .iter()
                .map(String::as_str)
                .zip(labels.iter().map(String::as_str))
                .collect();
            for (family, text) in families.iter_mut().zip(values) {
                let value = match text.as_str() {
                    "" => continue,
                    "t" => 1.0,
                    "f" => 0.0,
                    n => n
                        .parse::<f64>()
                        .map_err(|_| format!("{} is {n:?}, not a number", family.name))?,
                };
                family.samples.push(exposition::Sample::new(&labels, value));
            }
        }
        Ok(families)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition::render;

    const FILE: &str = "
queries:
  - name: orders
    help: Orders by status.
    sql: |
      SELECT status, count(*) AS pending, sum(total) AS amount FROM orders GROUP BY status;
    labels: [status]
    values: [pending, amount]
    database: app
    timeout_seconds: 0.5
  - name: slow
    help: Sleeps.
    type: counter
    sql: SELECT 1 AS one
    values: [one]
";

    #[test]
    fn parses_yaml_and_json() {
        let qs = parse(FILE).unwrap();
        assert_eq!(qs.len(), 2);
        assert_eq!(qs[0].database, "app");
        assert_eq!(qs[0].timeout, Duration::from_millis(500));
        assert_eq!(qs[0].kind, Kind::Gauge);
        assert!(qs[0].sql.ends_with("GROUP BY status"), "{}", qs[0].sql);
        assert_eq!(qs[1].database, "postgres");
        assert_eq!(qs[1].timeout, DEFAULT_TIMEOUT);
        assert_eq!(qs[1].kind, Kind::Counter);
        let json = r#"{"queries": [{"name": "x", "help": "h", "sql": "SELECT 1 AS v",
                       "values": ["v"]}]}"#;
        assert_eq!(parse(json).unwrap()[0].metric("v"), "dbop_pg_custom_x_v");
        assert_eq!(parse("").unwrap(), vec![]);
        assert_eq!(parse("queries: []").unwrap(), vec![]);
    }

    #[test]
    fn refuses_what_cannot_be_exported() {
        let one =
            |fields: &str| format!("queries:\n  - {{help: h, sql: SELECT 1 AS v, {fields}}}\n");
        let table = [
            (one("name: Bad, values: [v]"), "lowercase"),
            (one("name: 9a, values: [v]"), "lowercase"),
            (one("name: locks, values: [v]"), "dbop's own"),
            (one("name: a, values: []"), "no value columns"),
            (one("name: a, values: [v], labels: [v]"), "named twice"),
            (one("name: a, values: [v-1]"), "cannot be a label"),
            (
                one("name: a, values: [v], labels: [__x]"),
                "cannot be a label",
            ),
            (
                one("name: a, values: [v], type: histogram"),
                "gauge or counter",
            ),
            (
                one("name: a, values: [v], timeout_seconds: 0"),
                "timeout_seconds",
            ),
            (
                one("name: a, values: [v], timeout_seconds: 31"),
                "timeout_seconds",
            ),
            (one("name: a, values: [v], database: ''"), "database"),
            (one("name: a, values: [v], colour: red"), "unknown field"),
            (one("values: [v]"), "missing field `name`"),
            (
                "queries: [{name: a, help: h, sql: ' ', values: [v]}]".into(),
                "SQL is empty",
            ),
            (
                "queries: [{name: a, help: h, sql: S, values: [v]}, \
                 {name: a, help: h, sql: S, values: [v]}]"
                    .into(),
                "defined twice",
            ),
            ("queries: {}".into(), "not valid"),
        ];
        for (text, why) in table {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn wraps_the_sql_read_only_with_its_timeout() {
        let q = &parse(FILE).unwrap()[0];
        let c = q.commands();
        assert_eq!(c[0], "SET statement_timeout = 500");
        assert_eq!(c[1], "SET default_transaction_read_only = on");
        assert_eq!(
            c[2],
            "SELECT 'orders', \"status\"::text, \"pending\", \"amount\" FROM (\n\
             SELECT status, count(*) AS pending, sum(total) AS amount FROM orders GROUP BY status\n\
             ) AS dbop_custom_query"
        );
        assert_eq!(c[3], "SELECT '#ok', 'orders'");
        assert_eq!(q.statement().columns, 4);
    }

    #[test]
    fn rows_to_families() {
        let q = &parse(FILE).unwrap()[0];
        let rows = |r: &[&[&str]]| -> Vec<Vec<String>> {
            r.iter()
                .map(|row| row.iter().map(|f| f.to_string()).collect())
                .collect()
        };
        let text = render(
            &q.families(&rows(&[
                &["new", "3", "12.5"],
                &["a\"b", "1", ""],
                &["x", "t", "f"],
            ]))
            .unwrap(),
        );
        assert_eq!(
            text,
            "# HELP dbop_pg_custom_orders_pending Orders by status.\n\
             # TYPE dbop_pg_custom_orders_pending gauge\n\
             dbop_pg_custom_orders_pending{status=\"new\"} 3\n\
             dbop_pg_custom_orders_pending{status=\"a\\\"b\"} 1\n\
             dbop_pg_custom_orders_pending{status=\"x\"} 1\n\
             # HELP dbop_pg_custom_orders_amount Orders by status.\n\
             # TYPE dbop_pg_custom_orders_amount gauge\n\
             dbop_pg_custom_orders_amount{status=\"new\"} 12.5\n\
             dbop_pg_custom_orders_amount{status=\"x\"} 0\n"
        );
        assert!(
            q.families(&rows(&[&["a", "1", "2"], &["a", "3", "4"]]))
                .is_err()
        );
        assert!(q.families(&rows(&[&["a", "many", "2"]])).is_err());
        assert_eq!(render(&q.families(&[]).unwrap()), "");
    }
}
