//! dbop's own metrics of PostgreSQL: the statements of one scrape (one psql session over the
//! local socket) and the metric families made from their rows.
//!
//! Pure: the SQL for a major version, and parsers of the rows (`batch::split`'s output) into
//! families. A statement that failed, or whose rows do not parse, yields no family at all
//! (never a stale or partial value) and is reported back by name, for the error counter.

use std::collections::BTreeMap;

use crate::metrics::batch::{Split, Statement};
use crate::metrics::exposition::{Family, Kind};
use crate::replication::status::{self, Lsn, Status};

/// Every built-in statement's name (the `query` label of the error counter).
pub const NAMES: [&str; 9] = [
    "settings",
    "activity",
    "databases",
    "transactions",
    "locks",
    "checkpoints",
    "status",
    "replication",
    "archiver",
];

/// The client backends (not the scraper's own connection).
const CLIENTS: &str = "backend_type = 'client backend' AND pid <> pg_backend_pid()";
/// The same, for `pg_stat_activity a` (the first column is qualified by the caller).
const A_CLIENTS: &str = "backend_type = 'client backend' AND a.pid <> pg_backend_pid()";

/// The built-in statements for a server of `major`: the databases' and the sessions', then
/// the server's own.
pub fn statements(major: u32) -> Vec<Statement> {
    let mut all = database_statements();
    all.extend(server_statements(major));
    all
}

fn st(name: &str, columns: usize, sql: String) -> Statement {
    Statement {
        name: name.to_string(),
        sql,
        columns,
    }
}

/// The settings, the sessions by database and state, the databases, the oldest transactions
/// and the waiting locks.
fn database_statements() -> Vec<Statement> {
    vec![
        st(
            "settings",
            3,
            "SELECT 'settings', current_setting('max_connections'), \
             current_setting('autovacuum_freeze_max_age')"
                .into(),
        ),
        st(
            "activity",
            4,
            // Every (database, state), zeros included: the family is there when nobody is
            // connected too.
            format!(
                "SELECT 'activity', d.datname, s.state, count(a.pid) FROM pg_database d \
                 CROSS JOIN (VALUES ('active'), ('idle'), ('idle in transaction'), \
                   ('idle in transaction (aborted)'), ('fastpath function call'), \
                   ('disabled')) AS s (state) \
                 LEFT JOIN pg_stat_activity a \
                   ON a.datid = d.oid AND a.state = s.state AND a.{A_CLIENTS} \
                 WHERE NOT d.datistemplate GROUP BY 2, 3"
            ),
        ),
        st(
            "databases",
            7,
            "SELECT 'databases', d.datname, pg_database_size(d.oid), age(d.datfrozenxid), \
             s.xact_commit, s.xact_rollback, d.datallowconn AND NOT d.datistemplate \
             FROM pg_database d LEFT JOIN pg_stat_database s ON s.datid = d.oid"
                .into(),
        ),
        st(
            "transactions",
            3,
            format!(
                "SELECT 'transactions', \
                 coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0), \
                 coalesce(max(extract(epoch FROM clock_timestamp() - state_change)) \
                   FILTER (WHERE state IN ('idle in transaction', \
                                           'idle in transaction (aborted)')), 0) \
                 FROM pg_stat_activity WHERE {CLIENTS} AND xact_start IS NOT NULL"
            ),
        ),
        st(
            "locks",
            3,
            "SELECT 'locks', d.datname, count(l.pid) FROM pg_database d \
             LEFT JOIN (pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid) \
               ON a.datid = d.oid AND NOT l.granted \
             WHERE NOT d.datistemplate GROUP BY d.datname"
                .into(),
        ),
    ]
}

/// The checkpoints, the instance's status, its standbys and its archiver.
fn server_statements(major: u32) -> Vec<Statement> {
    let checkpoints = if major >= 17 {
        "SELECT 'checkpoints', num_timed, num_requested FROM pg_stat_checkpointer"
    } else {
        "SELECT 'checkpoints', checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter"
    };
    let status_fields = status::STATUS_QUERY
        .strip_prefix("SELECT ")
        .expect("the status query is a SELECT");
    // No row on a standby or with archiving off: the archive families are then absent.
    let archiver_fields = status::ARCHIVER_QUERY
        .strip_prefix("SELECT ")
        .expect("the archiver query is a SELECT");
    vec![
        st("checkpoints", 3, checkpoints.into()),
        st("status", 9, format!("SELECT 'status', {status_fields}")),
        st(
            "replication",
            6,
            "SELECT 'replication', coalesce(application_name, ''), coalesce(state, ''), \
             CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() \
                  ELSE pg_current_wal_lsn() END, flush_lsn, replay_lsn \
             FROM pg_stat_replication"
                .into(),
        ),
        st(
            "archiver",
            9,
            format!("SELECT 'archiver', {archiver_fields} AND NOT pg_is_in_recovery()"),
        ),
    ]
}

/// The families of one scrape's built-in statements, and the names of those that failed.
pub fn families(split: &Split) -> (Vec<Family>, Vec<&'static str>) {
    let mut out = vec![Family::single(
        "dbop_pg_up",
        "1 when the instance manager could query the server in this scrape, else 0.",
        Kind::Gauge,
        if split.ok.is_empty() { 0.0 } else { 1.0 },
    )];
    let mut failed = Vec::new();
    for name in NAMES {
        let parsed = split.of(name).ok_or_else(String::new).and_then(|rows| {
            let parse = match name {
                "settings" => settings,
                "activity" => activity,
                "databases" => databases,
                "transactions" => transactions,
                "locks" => locks,
                "checkpoints" => checkpoints,
                "status" => server_status,
                "replication" => replication,
                "archiver" => archiver,
                _ => unreachable!("every name has a parser"),
            };
            parse(rows)
        });
        match parsed {
            Ok(families) => out.extend(families),
            Err(_) => failed.push(name),
        }
    }
    (out, failed)
}

type Rows = [Vec<String>];

fn number(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .map_err(|_| format!("{text:?} is not a number"))
}

fn one(rows: &Rows) -> Result<&[String], String> {
    match rows {
        [row] => Ok(row),
        _ => Err(format!("{} rows where one was expected", rows.len())),
    }
}

fn settings(rows: &Rows) -> Result<Vec<Family>, String> {
    let row = one(rows)?;
    Ok(vec![
        Family::single(
            "dbop_pg_max_connections",
            "The server's max_connections.",
            Kind::Gauge,
            number(&row[0])?,
        ),
        Family::single(
            "dbop_pg_autovacuum_freeze_max_age",
            "The server's autovacuum_freeze_max_age: the transaction id age at which \
             autovacuum vacuums a database against wraparound.",
            Kind::Gauge,
            number(&row[1])?,
        ),
    ])
}

fn activity(rows: &Rows) -> Result<Vec<Family>, String> {
    let mut f = Family::new(
        "dbop_pg_connections",
        "Client connections by database and state (pg_stat_activity), the scraper's own \
         excluded; 0 for a state no connection is in.",
        Kind::Gauge,
    );
    for row in rows {
        f = f.with(
            &[("datname", &row[0]), ("state", &row[1])],
            number(&row[2])?,
        );
    }
    Ok(vec![f])
}

fn databases(rows: &Rows) -> Result<Vec<Family>, String> {
    let mut size = Family::new(
        "dbop_pg_database_size_bytes",
        "Disk space used by the database (pg_database_size).",
        Kind::Gauge,
    );
    let mut age = Family::new(
        "dbop_pg_database_xid_age",
        "Transactions since the database's oldest unfrozen transaction id (age(datfrozenxid)); \
         PostgreSQL stops taking writes before 2^31 (wraparound).",
        Kind::Gauge,
    );
    let mut commits = Family::new(
        "dbop_pg_transactions_committed_total",
        "Transactions committed in the database (pg_stat_database.xact_commit).",
        Kind::Counter,
    );
    let mut rollbacks = Family::new(
        "dbop_pg_transactions_rolled_back_total",
        "Transactions rolled back in the database (pg_stat_database.xact_rollback).",
        Kind::Counter,
    );
    for row in rows {
        let db: &[(&str, &str)] = &[("datname", &row[0])];
        size = size.with(db, number(&row[1])?);
        age = age.with(db, number(&row[2])?);
        // A database without statistics (template0: no one connects) has no counters.
        if !row[3].is_empty() {
            commits = commits.with(db, number(&row[3])?);
            rollbacks = rollbacks.with(db, number(&row[4])?);
        }
    }
    Ok(vec![size, age, commits, rollbacks])
}

fn transactions(rows: &Rows) -> Result<Vec<Family>, String> {
    let row = one(rows)?;
    Ok(vec![
        Family::single(
            "dbop_pg_longest_transaction_seconds",
            "Age of the oldest open transaction of a client connection, 0 when none is open.",
            Kind::Gauge,
            number(&row[0])?,
        ),
        Family::single(
            "dbop_pg_longest_idle_in_transaction_seconds",
            "Longest time a client connection has been idle inside an open transaction, 0 when \
             none is.",
            Kind::Gauge,
            number(&row[1])?,
        ),
    ])
}

fn locks(rows: &Rows) -> Result<Vec<Family>, String> {
    let mut f = Family::new(
        "dbop_pg_locks_waiting",
        "Locks waited for (not granted, pg_locks) by sessions of the database.",
        Kind::Gauge,
    );
    for row in rows {
        f = f.with(&[("datname", &row[0])], number(&row[1])?);
    }
    Ok(vec![f])
}

fn checkpoints(rows: &Rows) -> Result<Vec<Family>, String> {
    let row = one(rows)?;
    Ok(vec![
        Family::new(
            "dbop_pg_checkpoints_total",
            "Checkpoints since the statistics were reset: timed (checkpoint_timeout) or \
             requested (WAL volume, CHECKPOINT, shutdown).",
            Kind::Counter,
        )
        .with(&[("kind", "timed")], number(&row[0])?)
        .with(&[("kind", "requested")], number(&row[1])?),
    ])
}

fn server_status(rows: &Rows) -> Result<Vec<Family>, String> {
    // The status query's own row as `psql -At -F '|'` prints it, for its own parser.
    let status = status::parse_status(&one(rows)?.join("|"))?;
    let mut out = vec![Family::single(
        "dbop_pg_in_recovery",
        "1 when the server is a standby (pg_is_in_recovery()), 0 on a primary.",
        Kind::Gauge,
        f64::from(u8::from(matches!(status, Status::Standby { .. }))),
    )];
    match status {
        Status::Primary { current, .. } => out.push(Family::single(
            "dbop_pg_wal_bytes_total",
            "WAL written since the cluster was made: pg_current_wal_lsn() in bytes (primary \
             only).",
            Kind::Counter,
            current.0 as f64,
        )),
        Status::Standby {
            received: Some(received),
            replayed: Some(replayed),
            ..
        } => out.push(Family::single(
            "dbop_pg_standby_replay_lag_bytes",
            "WAL this standby received but has not replayed yet, in bytes (standby only).",
            Kind::Gauge,
            status::lag_bytes(received, replayed) as f64,
        )),
        Status::Standby { .. } => {}
    }
    Ok(out)
}

fn replication(rows: &Rows) -> Result<Vec<Family>, String> {
    let lsn =
        |s: &str| -> Result<Option<Lsn>, String> { (!s.is_empty()).then(|| s.parse()).transpose() };
    // One series per standby and position: pg_basebackup's sender or a reconnecting standby
    // can show twice; the larger lag is kept.
    let mut lag: BTreeMap<(String, &str), u64> = BTreeMap::new();
    for row in rows {
        let Some(current) = lsn(&row[2])? else {
            continue;
        };
        for (position, at) in [("flushed", &row[3]), ("replayed", &row[4])] {
            if let Some(at) = lsn(at)? {
                let bytes = status::lag_bytes(current, at);
                let entry = lag.entry((row[0].clone(), position)).or_default();
                *entry = (*entry).max(bytes);
            }
        }
    }
    let mut f = Family::new(
        "dbop_pg_replication_lag_bytes",
        "WAL bytes between this server's position and what the standby (its application_name) \
         has flushed or replayed (pg_stat_replication; present while standbys are connected).",
        Kind::Gauge,
    );
    for ((standby, position), bytes) in lag {
        f = f.with(
            &[("standby", &standby), ("position", position)],
            bytes as f64,
        );
    }
    Ok(vec![f])
}

/// WAL archiving of a primary that archives (`pg_stat_archiver` and the files waiting): no
/// family without a row.
fn archiver(rows: &Rows) -> Result<Vec<Family>, String> {
    if rows.is_empty() {
        return Ok(vec![]);
    }
    // The archiver query's own row as `psql -At -F '|'` prints it, for its own parser.
    let Some(a) = status::parse_archiver(&one(rows)?.join("|"))? else {
        return Ok(vec![]);
    };
    let mut out = vec![
        Family::single(
            "dbop_pg_wal_archive_waiting_files",
            "WAL files waiting to be archived (.ready in pg_wal/archive_status): what a failing \
             or slow archive keeps on the volume (a primary that archives).",
            Kind::Gauge,
            a.waiting as f64,
        ),
        Family::single(
            "dbop_pg_wal_archive_failing",
            "1 when the last attempt to archive a WAL file failed, 0 when it succeeded \
             (pg_stat_archiver; a primary that archives).",
            Kind::Gauge,
            f64::from(u8::from(a.failing())),
        ),
        Family::single(
            "dbop_pg_wal_archived_files_total",
            "WAL files archived (pg_stat_archiver.archived_count).",
            Kind::Counter,
            a.archived_count as f64,
        ),
        Family::single(
            "dbop_pg_wal_archive_failures_total",
            "Failed attempts to archive a WAL file (pg_stat_archiver.failed_count).",
            Kind::Counter,
            a.failed_count as f64,
        ),
    ];
    if let Some(at) = a.last_archived_at {
        out.push(Family::single(
            "dbop_pg_wal_last_archived_timestamp_seconds",
            "When the last WAL file was archived (Unix time; absent before the first).",
            Kind::Gauge,
            at as f64,
        ));
    }
    Ok(out)
}

/// The statement of the per-table metrics, run in each database (`tables_databases`) in a
/// session of its own: its 10 largest tables by pages (`relpages`, no file is read).
pub const TABLES: &str = "tables";

pub fn tables_statement() -> Statement {
    Statement {
        name: TABLES.into(),
        sql: "SELECT 'tables', s.schemaname, s.relname, s.n_dead_tup, \
              extract(epoch FROM clock_timestamp() - s.last_autovacuum) \
              FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
              ORDER BY c.relpages DESC, s.relid LIMIT 10"
            .into(),
        columns: 5,
    }
}

/// The databases to run `tables_statement` in: those one can connect to, not templates (none
/// when the `databases` statement failed).
pub fn tables_databases(split: &Split) -> Vec<String> {
    split
        .of("databases")
        .unwrap_or(&[])
        .iter()
        .filter(|row| row.get(5).is_some_and(|c| c == "t"))
        .map(|row| row[0].clone())
        .collect()
}

/// The per-table families of `database` from `tables_statement`'s rows.
pub fn table_families(database: &str, rows: &Rows) -> Result<Vec<Family>, String> {
    let mut dead = Family::new(
        "dbop_pg_table_dead_tuples",
        "Dead row versions in the table (pg_stat_user_tables.n_dead_tup), for the 10 largest \
         tables of each database.",
        Kind::Gauge,
    );
    let mut vacuumed = Family::new(
        "dbop_pg_table_last_autovacuum_age_seconds",
        "Seconds since autovacuum last vacuumed the table (absent when it never did), for the \
         10 largest tables of each database.",
        Kind::Gauge,
    );
    for row in rows {
        let labels: &[(&str, &str)] = &[
            ("datname", database),
            ("schema", &row[0]),
            ("table", &row[1]),
        ];
        dead = dead.with(labels, number(&row[2])?);
        if !row[3].is_empty() {
            vacuumed = vacuumed.with(labels, number(&row[3])?);
        }
    }
    Ok(vec![dead, vacuumed])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::batch;
    use crate::metrics::exposition::render;

    fn output(records: &[&[&str]]) -> String {
        records
            .iter()
            .flat_map(|r| r.iter())
            .map(|f| format!("{f}\0"))
            .collect()
    }

    fn ok(name: &str) -> [&str; 2] {
        ["#ok", name]
    }

    #[test]
    fn statements_follow_the_major_and_name_their_columns() {
        let s15 = statements(15);
        let s17 = statements(17);
        assert_eq!(
            s15.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            NAMES
        );
        let sql = |s: &[Statement], n: &str| s.iter().find(|x| x.name == n).unwrap().sql.clone();
        assert!(sql(&s15, "checkpoints").contains("pg_stat_bgwriter"));
        assert!(sql(&s17, "checkpoints").contains("pg_stat_checkpointer"));
        for s in &s15 {
            assert!(
                s.sql.starts_with(&format!("SELECT '{}', ", s.name)),
                "{}",
                s.sql
            );
            assert!(!s.sql.contains(';') && !s.sql.contains('\\'), "{}", s.sql);
        }
    }

    #[test]
    fn a_primary_with_a_standby() {
        let out = output(&[
            &["settings", "100", "200000000"],
            &ok("settings"),
            &["activity", "app", "active", "2"],
            &["activity", "app", "idle in transaction", "1"],
            &["activity", "", "unknown", "1"],
            &ok("activity"),
            &["databases", "app", "7569967", "12", "40", "3", "t"],
            &["databases", "template0", "7528931", "15", "", "", "f"],
            &ok("databases"),
            &["transactions", "12.5", "3.25"],
            &ok("transactions"),
            &["locks", "app", "1"],
            &["locks", "postgres", "0"],
            &ok("locks"),
            &["checkpoints", "7", "2"],
            &ok("checkpoints"),
            &["status", "f", "1", "0/3000148", "", "", "", "", ""],
            &ok("status"),
            &[
                "replication",
                "db-1",
                "streaming",
                "0/3000148",
                "0/3000100",
                "0/3000000",
            ],
            // pg_basebackup's sender: nothing flushed yet.
            &[
                "replication",
                "pg_basebackup",
                "backup",
                "0/3000148",
                "",
                "",
            ],
            // The same standby twice (a reconnection): the larger lag wins.
            &[
                "replication",
                "db-1",
                "startup",
                "0/3000148",
                "0/2000000",
                "",
            ],
            &ok("replication"),
            // The last attempt (at 1764900100) failed after the last success.
            &[
                "archiver",
                "12",
                "00000001000000000000000B",
                "1764900000",
                "2",
                "00000001000000000000000C",
                "1764900100",
                "3",
                "on",
            ],
            &ok("archiver"),
        ]);
        let (families, failed) = families(&batch::split(&out, &statements(15)));
        assert!(failed.is_empty(), "{failed:?}");
        let text = render(&families);
        for want in [
            "dbop_pg_wal_archive_waiting_files 3\n",
            "dbop_pg_wal_archive_failing 1\n",
            "dbop_pg_wal_archived_files_total 12\n",
            "dbop_pg_wal_archive_failures_total 2\n",
            "dbop_pg_wal_last_archived_timestamp_seconds 1764900000\n",
            "dbop_pg_up 1\n",
            "dbop_pg_max_connections 100\n",
            "dbop_pg_autovacuum_freeze_max_age 200000000\n",
            "dbop_pg_connections{datname=\"app\",state=\"active\"} 2\n",
            "dbop_pg_connections{datname=\"app\",state=\"idle in transaction\"} 1\n",
            "dbop_pg_connections{datname=\"\",state=\"unknown\"} 1\n",
            "dbop_pg_database_size_bytes{datname=\"app\"} 7569967\n",
            "dbop_pg_database_xid_age{datname=\"template0\"} 15\n",
            "# TYPE dbop_pg_transactions_committed_total counter\n",
            "dbop_pg_transactions_committed_total{datname=\"app\"} 40\n",
            "dbop_pg_transactions_rolled_back_total{datname=\"app\"} 3\n",
            "dbop_pg_longest_transaction_seconds 12.5\n",
            "dbop_pg_longest_idle_in_transaction_seconds 3.25\n",
            "dbop_pg_locks_waiting{datname=\"app\"} 1\n",
            "dbop_pg_locks_waiting{datname=\"postgres\"} 0\n",
            "dbop_pg_checkpoints_total{kind=\"timed\"} 7\n",
            "dbop_pg_checkpoints_total{kind=\"requested\"} 2\n",
            "dbop_pg_in_recovery 0\n",
            "dbop_pg_wal_bytes_total 50331976\n",
            "dbop_pg_replication_lag_bytes{standby=\"db-1\",position=\"flushed\"} 16777544\n",
            "dbop_pg_replication_lag_bytes{standby=\"db-1\",position=\"replayed\"} 328\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from\n{text}");
        }
        assert!(!text.contains("template0\"} 0\n") && !text.contains("pg_basebackup"));
        assert!(!text.contains("committed_total{datname=\"template0\""));
        assert_eq!(
            text.matches("# TYPE").count(),
            text.matches("# HELP").count()
        );
    }

    #[test]
    fn tables_of_each_database() {
        let out = output(&[
            &["databases", "app", "1", "2", "3", "4", "t"],
            &["databases", "template1", "1", "2", "3", "4", "f"],
            &["databases", "other", "1", "2", "3", "4", "t"],
            &ok("databases"),
        ]);
        let split = batch::split(&out, &statements(15));
        assert_eq!(tables_databases(&split), ["app", "other"]);
        assert!(tables_databases(&batch::split("", &statements(15))).is_empty());
        let tables = output(&[
            &["tables", "public", "big", "1000", ""],
            &["tables", "app", "orders", "3", "42.5"],
            &ok("tables"),
        ]);
        let split = batch::split(&tables, &[tables_statement()]);
        let text = render(&table_families("app", split.of(TABLES).unwrap()).unwrap());
        assert_eq!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            [
                "dbop_pg_table_dead_tuples{datname=\"app\",schema=\"public\",table=\"big\"} 1000",
                "dbop_pg_table_dead_tuples{datname=\"app\",schema=\"app\",table=\"orders\"} 3",
                "dbop_pg_table_last_autovacuum_age_seconds{datname=\"app\",schema=\"app\",table=\"orders\"} 42.5",
            ]
        );
        assert!(
            table_families(
                "app",
                &[vec!["s".into(), "t".into(), "x".into(), "".into()]]
            )
            .is_err()
        );
    }

    #[test]
    fn a_standby() {
        let out = output(&[
            &[
                "status",
                "t",
                "",
                "",
                "0/5000148",
                "0/5000100",
                "2",
                "streaming|h:5432",
                "30",
            ],
            &ok("status"),
            &ok("replication"),
            // A standby archives nothing: no row, no archive family.
            &ok("archiver"),
        ]);
        let (families, failed) = families(&batch::split(&out, &statements(16)));
        let text = render(&families);
        assert!(text.contains("dbop_pg_in_recovery 1\n"), "{text}");
        assert!(!text.contains("dbop_pg_wal_archive"), "{text}");
        assert!(
            text.contains("dbop_pg_standby_replay_lag_bytes 72\n"),
            "{text}"
        );
        assert!(!text.contains("dbop_pg_wal_bytes_total"), "{text}");
        assert!(!text.contains("dbop_pg_replication_lag_bytes"), "{text}");
        assert_eq!(
            failed,
            [
                "settings",
                "activity",
                "databases",
                "transactions",
                "locks",
                "checkpoints"
            ]
        );
    }

    #[test]
    fn failures_and_bad_rows_leave_their_families_out() {
        let table: Vec<(String, Vec<&str>, Vec<&str>)> = vec![
            // Nothing at all (the server is down): up is 0, every statement failed.
            (String::new(), NAMES.to_vec(), vec!["dbop_pg_up 0\n"]),
            // A number that is not one, a second row where one is expected.
            (
                output(&[
                    &["settings", "lots", "1"],
                    &ok("settings"),
                    &["transactions", "1", "2"],
                    &["transactions", "1", "2"],
                    &ok("transactions"),
                    &["locks", "app", "1"],
                    &ok("locks"),
                ]),
                vec![
                    "settings",
                    "activity",
                    "databases",
                    "transactions",
                    "checkpoints",
                    "status",
                    "replication",
                    "archiver",
                ],
                vec![
                    "dbop_pg_up 1\n",
                    "dbop_pg_locks_waiting{datname=\"app\"} 1\n",
                ],
            ),
        ];
        for (out, want_failed, want_text) in table {
            let (families, failed) = families(&batch::split(&out, &statements(15)));
            assert_eq!(failed, want_failed, "{out:?}");
            let text = render(&families);
            for want in want_text {
                assert!(text.contains(want), "{want:?} missing from\n{text}");
            }
            assert!(
                !text.contains("max_connections") && !text.contains("longest"),
                "{text}"
            );
        }
    }
}
