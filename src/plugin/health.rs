//! The health figures `kubectl dbop status` shows for each database pod, read from the pod's
//! own metrics endpoint (`spec.monitoring`, port 9187): whether PostgreSQL answers, its role,
//! connections used, the data volume's free space, the oldest transaction-id age (wraparound),
//! the longest open transaction, and replication lag.
//!
//! Pure: a scrape's text in, figures and the screen's table out.

use std::collections::BTreeMap;

use super::text::{size, table};

/// PostgreSQL stops accepting writes when a database's transaction-id age reaches this.
const WRAPAROUND: f64 = 2_147_483_647.0;

/// One pod's figures (None: the scrape did not have it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    pub up: Option<bool>,
    pub in_recovery: Option<bool>,
    pub connections: Option<f64>,
    pub max_connections: Option<f64>,
    /// (size, free) in bytes.
    pub volume: Option<(f64, f64)>,
    /// The database with the oldest transaction-id age, and that age.
    pub oldest_xid: Option<(String, f64)>,
    pub longest_transaction_seconds: Option<f64>,
    /// The largest replay lag of a standby streaming from this pod, in bytes.
    pub standby_lag: Option<f64>,
    /// What this standby received but has not replayed, in bytes.
    pub replay_lag: Option<f64>,
}

/// A pod and its figures, or why they could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct PodHealth {
    pub pod: String,
    pub figures: Result<Figures, String>,
}

/// One sample: its name, labels and value.
fn parse_line(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let Some((name, labels)) = series.split_once('{') else {
        return Some((series, BTreeMap::new(), value));
    };
    let labels = labels.strip_suffix('}')?;
    let mut out = BTreeMap::new();
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some((name, out, value))
}

/// The figures of one scrape of a database pod's `/metrics`.
pub fn figures(text: &str) -> Figures {
    let mut f = Figures::default();
    let mut connections = 0.0;
    let mut any_connection = false;
    let (mut size, mut free) = (None, None);
    for (name, labels, value) in text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse_line)
    {
        match name {
            "dbop_pg_up" => f.up = Some(value == 1.0),
            "dbop_pg_in_recovery" => f.in_recovery = Some(value == 1.0),
            "dbop_pg_connections" => {
                connections += value;
                any_connection = true;
            }
            "dbop_pg_max_connections" => f.max_connections = Some(value),
            "dbop_pg_data_volume_size_bytes" => size = Some(value),
            "dbop_pg_data_volume_free_bytes" => free = Some(value),
            "dbop_pg_database_xid_age" => {
                let datname = labels.get("datname").cloned().unwrap_or_default();
                if f.oldest_xid.as_ref().is_none_or(|(_, age)| value > *age) {
                    f.oldest_xid = Some((datname, value));
                }
            }
            "dbop_pg_longest_transaction_seconds" => f.longest_transaction_seconds = Some(value),
            "dbop_pg_replication_lag_bytes"
                if labels.get("position").map(String::as_str) == Some("replayed") =>
            {
                f.standby_lag = Some(f.standby_lag.unwrap_or(0.0).max(value));
            }
            "dbop_pg_standby_replay_lag_bytes" => f.replay_lag = Some(value),
            _ => {}
        }
    }
    f.connections = any_connection.then_some(connections);
    f.volume = size.zip(free);
    f
}

/// The `Health` section: one row per pod.
pub fn health_section(pods: &[PodHealth]) -> String {
    if pods.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = pods.iter().map(row).collect();
    "Health (from each pod's metrics):\n".to_string()
        + &table(
            &[
                "POD",
                "ROLE",
                "POSTGRES",
                "CONNECTIONS",
                "VOLUME FREE",
                "OLDEST XID AGE",
                "LONGEST TX",
                "LAG",
            ],
            &rows,
        )
}

fn row(p: &PodHealth) -> Vec<String> {
    let f = match &p.figures {
        Ok(f) => f,
        Err(why) => {
            return vec![
                p.pod.clone(),
                "-".into(),
                format!("metrics unavailable: {why}"),
            ];
        }
    };
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let role = match f.in_recovery {
        Some(true) => "standby",
        Some(false) => "primary",
        None => "-",
    };
    let postgres = match f.up {
        Some(true) => "up",
        Some(false) => "DOWN",
        None => "-",
    };
    let connections = f.connections.map(|c| match f.max_connections {
        Some(max) => format!("{c:.0}/{max:.0}"),
        None => format!("{c:.0}"),
    });
    let volume = f.volume.map(|(size_bytes, free)| {
        let percent = if size_bytes > 0.0 {
            100.0 * free / size_bytes
        } else {
            0.0
        };
        format!(
            "{} of {} ({percent:.0}%)",
            size(Some(free as i64)),
            size(Some(size_bytes as i64))
        )
    });
    let xid = f.oldest_xid.as_ref().map(|(datname, age)| {
        format!(
            "{} ({datname}, {:.1}% of the limit)",
            count(*age),
            100.0 * age / WRAPAROUND
        )
    });
    let longest = f.longest_transaction_seconds.map(duration);
    let lag = f
        .standby_lag
        .or(f.replay_lag)
        .map(|bytes| size(Some(bytes as i64)));
    vec![
        p.pod.clone(),
        role.into(),
        postgres.into(),
        or_dash(connections),
        or_dash(volume),
        or_dash(xid),
        or_dash(longest),
        or_dash(lag),
    ]
}

/// `1.2M`, `35k`, `812`.
fn count(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.1}G", n / 1e9),
        n if n >= 1e6 => format!("{:.1}M", n / 1e6),
        n if n >= 1e3 => format!("{:.0}k", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// `0s`, `45s`, `12m`, `3h`.
fn duration(seconds: f64) -> String {
    match seconds as i64 {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: &str = "# HELP dbop_pg_up 1 when the server answered.\n\
        # TYPE dbop_pg_up gauge\n\
        dbop_pg_up 1\n\
        dbop_pg_max_connections 100\n\
        dbop_pg_connections{datname=\"app\",state=\"active\"} 3\n\
        dbop_pg_connections{datname=\"app\",state=\"idle\"} 2\n\
        dbop_pg_database_xid_age{datname=\"template0\"} 1200\n\
        dbop_pg_database_xid_age{datname=\"app\"} 1500000\n\
        dbop_pg_longest_transaction_seconds 750.5\n\
        dbop_pg_in_recovery 0\n\
        dbop_pg_replication_lag_bytes{standby=\"orders-1\",position=\"flushed\"} 99999\n\
        dbop_pg_replication_lag_bytes{standby=\"orders-1\",position=\"replayed\"} 2048\n\
        dbop_pg_data_volume_size_bytes 1073741824\n\
        dbop_pg_data_volume_free_bytes 805306368\n";

    #[test]
    fn a_scrape_gives_the_figures() {
        let f = figures(PRIMARY);
        assert_eq!(f.up, Some(true));
        assert_eq!(f.in_recovery, Some(false));
        assert_eq!((f.connections, f.max_connections), (Some(5.0), Some(100.0)));
        assert_eq!(f.volume, Some((1073741824.0, 805306368.0)));
        assert_eq!(f.oldest_xid, Some(("app".into(), 1500000.0)));
        assert_eq!(f.longest_transaction_seconds, Some(750.5));
        assert_eq!(f.standby_lag, Some(2048.0));
        // Nothing known from an empty or foreign text.
        assert_eq!(figures(""), Figures::default());
        assert_eq!(figures("garbage\nx{y=\"z\" 1\n"), Figures::default());
    }

    #[test]
    fn labels_with_escapes_parse() {
        let (name, labels, value) =
            parse_line(r#"dbop_pg_custom_x{a="q\"uote",b="back\\slash"} 2.5"#).unwrap();
        assert_eq!((name, value), ("dbop_pg_custom_x", 2.5));
        assert_eq!(labels["a"], "q\"uote");
        assert_eq!(labels["b"], "back\\slash");
    }

    #[test]
    fn the_section_has_a_row_per_pod_and_says_when_metrics_are_unavailable() {
        let screen = health_section(&[
            PodHealth {
                pod: "orders-0".into(),
                figures: Ok(figures(PRIMARY)),
            },
            PodHealth {
                pod: "orders-1".into(),
                figures: Err("spec.monitoring.enabled is false".into()),
            },
        ]);
        let lines: Vec<&str> = screen.lines().collect();
        assert_eq!(lines[0], "Health (from each pod's metrics):");
        assert!(lines[1].trim_start().starts_with("POD"), "{screen}");
        let primary = lines[2];
        for part in [
            "orders-0",
            "primary",
            "up",
            "5/100",
            "768.0 MiB of 1.0 GiB (75%)",
            "1.5M (app, 0.1% of the limit)",
            "12m",
            "2.0 KiB",
        ] {
            assert!(primary.contains(part), "{part:?} in {primary:?}");
        }
        assert!(
            lines[3].contains("orders-1")
                && lines[3].contains("metrics unavailable: spec.monitoring.enabled is false"),
            "{screen}"
        );
        assert_eq!(health_section(&[]), "");
    }
}
