//! A fingerprint of a database's content, for suites that must show two databases hold the same
//! data (a restore, an upgrade, a failover): one line per table of every user schema, with its
//! owner, its grants, its row count and the md5 of its rows in a fixed order. Equal fingerprints
//! mean equal tables, owners and grants.
//!
//! One query, no per-table round trips: each table is read with `query_to_xml`. Leaf tables
//! only (a partitioned parent's rows are its partitions'); no system, TOAST or temporary schemas.

use std::time::Duration;

use crate::TestBed;

/// The fingerprint query: one line per table, sorted by name.
pub const FINGERPRINT_SQL: &str = r#"SELECT coalesce(string_agg(line, E'\n' ORDER BY line), '(no tables)') FROM (
  SELECT format('%I.%I owner=%s acl=%s rows=%s md5=%s', n.nspname, c.relname,
                pg_get_userbyid(c.relowner), coalesce(c.relacl::text, '-'),
                (xpath('/row/n/text()', x))[1]::text, (xpath('/row/h/text()', x))[1]::text) AS line
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  CROSS JOIN LATERAL query_to_xml(
    format('SELECT count(*) AS n, md5(coalesce(string_agg(t::text, %L ORDER BY t::text), %L)) AS h FROM ONLY %I.%I t',
           '|', '', n.nspname, c.relname),
    false, true, '') AS x
  WHERE c.relkind = 'r' AND c.relpersistence <> 't'
    AND n.nspname NOT IN ('pg_catalog', 'information_schema')
    AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp\_%'
) t"#;

impl TestBed {
    /// The fingerprint of `dbname`, read with psql in a [`TestBed::psql_client`] pod (retried
    /// within `timeout` while the Service or the server is not reachable yet).
    pub async fn fingerprint_all(
        &self,
        ns: &str,
        pod: &str,
        dbname: &str,
        timeout: Duration,
    ) -> String {
        self.psql_until_ok(ns, pod, dbname, FINGERPRINT_SQL, timeout)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dbop_contract::test_support::Pg;

    /// The query sees every schema, and a changed row, owner or grant changes the fingerprint.
    #[test]
    fn equal_content_equal_fingerprints_and_any_change_shows() {
        let pg = Pg::start();
        pg.psql("postgres", "CREATE ROLE reader");
        let setup = "CREATE SCHEMA \"Other\";
             CREATE TABLE public.a (id int, v text); INSERT INTO a VALUES (1, 'x'), (2, NULL);
             CREATE TABLE \"Other\".\"B\" (j jsonb); INSERT INTO \"Other\".\"B\" VALUES ('{\"k\": 1}');
             CREATE TABLE public.empty (id int);
             CREATE TABLE p (k int) PARTITION BY RANGE (k);
             CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (10); INSERT INTO p VALUES (3);
             GRANT SELECT ON a TO reader;";
        for db in ["one", "two"] {
            pg.create_db(db);
            pg.psql(db, setup);
        }
        let print = |db: &str| pg.psql(db, FINGERPRINT_SQL);
        let one = print("one");
        assert_eq!(one.lines().count(), 4, "{one}");
        assert!(one.contains("\"Other\".\"B\" owner=dbop"), "{one}");
        assert!(
            one.contains("public.p1 ") && !one.contains("public.p "),
            "{one}"
        );
        assert!(one.contains("reader=r/dbop"), "{one}");
        assert_eq!(print("two"), one);
        for change in [
            "UPDATE a SET v = 'y' WHERE id = 1",
            "INSERT INTO empty VALUES (1)",
            "ALTER TABLE \"Other\".\"B\" OWNER TO reader",
            "REVOKE SELECT ON a FROM reader",
        ] {
            pg.psql("two", change);
            let two = print("two");
            assert_ne!(two, one, "{change} went unnoticed");
            // Back to equal for the next change.
            pg.psql("postgres", "DROP DATABASE two");
            pg.create_db("two");
            pg.psql("two", setup);
        }
    }
}
