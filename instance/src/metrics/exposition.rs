//! Prometheus' text exposition format, version 0.0.4: metric families (name, HELP, TYPE,
//! samples with labels) and their rendering, with the escaping the format asks for.
//!
//! Pure: values in, text out. No I/O, no clock.

use std::fmt::Write;

/// The `Content-Type` of the rendered text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's TYPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// One sample: its labels (name, value) in order, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn new(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }
}

/// A metric family: every sample of one metric name.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub samples: Vec<Sample>,
}

impl Family {
    pub fn new(name: &str, help: &str, kind: Kind) -> Family {
        Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            samples: Vec::new(),
        }
    }

    /// A family of one unlabelled sample.
    pub fn single(name: &str, help: &str, kind: Kind, value: f64) -> Family {
        let mut f = Family::new(name, help, kind);
        f.samples.push(Sample::new(&[], value));
        f
    }

    pub fn with(mut self, labels: &[(&str, &str)], value: f64) -> Family {
        self.samples.push(Sample::new(labels, value));
        self
    }
}

/// The families with their samples gathered under the first of each name (several sources may
/// give one family: the per-table metrics of each database), in first-seen order.
pub fn merge(families: Vec<Family>) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for f in families {
        match out.iter_mut().find(|o| o.name == f.name) {
            Some(o) => o.samples.extend(f.samples),
            None => out.push(f),
        }
    }
    out
}

/// Whether `name` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__`,
/// which Prometheus reserves).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// HELP text: backslash and line feed escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A label value: backslash, double quote and line feed escaped.
fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value as the format writes it (`NaN`, `+Inf`, `-Inf`, else Rust's shortest
/// round-trip decimal, integers without a fraction).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// The exposition text of `families`, in the order given. A family without samples is left
/// out (absent, not empty: nothing stale and no HELP for nothing).
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.label());
        for s in &f.samples {
            out.push_str(&f.name);
            if !s.labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in s.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", format_value(s.value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_type_and_labelled_samples() {
        let families = [
            Family::new("dbop_pg_connections", "Client connections.", Kind::Gauge)
                .with(&[("database", "app"), ("state", "active")], 3.0)
                .with(&[("database", "a\"b\\c\nd"), ("state", "idle")], 0.0),
            Family::single("dbop_pg_up", "Up.\nTwo \\ lines", Kind::Gauge, 1.0),
            Family::new("dbop_pg_empty", "No samples: left out.", Kind::Counter),
            Family::single("dbop_pg_total", "A counter.", Kind::Counter, 12345678901.0),
        ];
        assert_eq!(
            render(&families),
            "# HELP dbop_pg_connections Client connections.\n\
             # TYPE dbop_pg_connections gauge\n\
             dbop_pg_connections{database=\"app\",state=\"active\"} 3\n\
             dbop_pg_connections{database=\"a\\\"b\\\\c\\nd\",state=\"idle\"} 0\n\
             # HELP dbop_pg_up Up.\\nTwo \\\\ lines\n\
             # TYPE dbop_pg_up gauge\n\
             dbop_pg_up 1\n\
             # HELP dbop_pg_total A counter.\n\
             # TYPE dbop_pg_total counter\n\
             dbop_pg_total 12345678901\n"
        );
        assert_eq!(render(&[]), "");
    }

    #[test]
    fn merges_families_of_one_name() {
        let merged = merge(vec![
            Family::new("a", "A.", Kind::Gauge).with(&[("db", "x")], 1.0),
            Family::single("b", "B.", Kind::Gauge, 2.0),
            Family::new("a", "A.", Kind::Gauge).with(&[("db", "y")], 3.0),
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].samples.len(), 2);
        assert_eq!(merged[0].samples[1], Sample::new(&[("db", "y")], 3.0));
        assert_eq!(merged[1].name, "b");
    }

    #[test]
    fn values() {
        let table = [
            (0.0, "0"),
            (1.5, "1.5"),
            (-2.0, "-2"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (0.001, "0.001"),
        ];
        for (v, want) in table {
            assert_eq!(format_value(v), want, "{v}");
        }
    }

    #[test]
    fn names() {
        for good in ["dbop_pg_up", "a", "_x", "a:b_c9"] {
            assert!(valid_metric_name(good), "{good}");
        }
        for bad in ["", "9a", "a-b", "a b", "é"] {
            assert!(!valid_metric_name(bad), "{bad}");
        }
        for good in ["database", "_x", "A9"] {
            assert!(valid_label_name(good), "{good}");
        }
        for bad in ["", "__name__", "a:b", "9a", "a-b"] {
            assert!(!valid_label_name(bad), "{bad}");
        }
    }
}
