//! Slices of one table read back whole (`slices`), on a real server: the tables' query
//! (`streams::TABLES_SQL`) finds the stored columns and the pages; the rows of every slice
//! together are the table's rows, each once, even when rows were added past the pages counted
//! and others deleted; a bounded slice reads only its pages (a TID range scan).

mod common;

use common::*;
use dbop_backup::slices::{PageRange, copy_out, page_ranges};
use dbop_backup::streams::{TABLES_SQL, Table, parse_tables};

const TABLE: &str = r#"
CREATE SCHEMA "Sp ace";
CREATE TABLE "Sp ace"."T""b" (id int PRIMARY KEY, gone int, "we""ird col" text,
  doubled int GENERATED ALWAYS AS (id * 2) STORED);
ALTER TABLE "Sp ace"."T""b" DROP COLUMN gone;
INSERT INTO "Sp ace"."T""b" (id, "we""ird col")
  SELECT i, repeat(E'a\tb\\c\n', i % 7) FROM generate_series(1, 20000) i;
"#;

/// Rows added after the pages were counted, and holes left by deleted ones.
const LATER: &str = r#"
INSERT INTO "Sp ace"."T""b" (id, "we""ird col")
  SELECT i, 'after the count' FROM generate_series(20001, 26000) i;
DELETE FROM "Sp ace"."T""b" WHERE id % 5 = 0 AND id < 10000;
"#;

fn sorted_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn the_table(pg: &Pg) -> Table {
    let lines: Vec<String> = pg
        .psql("app", TABLES_SQL)
        .lines()
        .map(String::from)
        .collect();
    let (tables, large_objects) = parse_tables(&lines).unwrap();
    assert_eq!(large_objects, 0);
    let [table] = tables.as_slice() else {
        panic!("one table expected: {tables:?}")
    };
    table.clone()
}

#[test]
fn slices_of_a_table_are_its_rows_each_once() {
    let pg = Pg::start();
    pg.create_db("app");
    pg.psql("app", TABLE);
    let table = the_table(&pg);
    assert_eq!(
        (table.schema.as_str(), table.name.as_str()),
        ("Sp ace", "T\"b")
    );
    assert_eq!(table.counted_as, r#""Sp ace"."T""b""#);
    assert_eq!(table.columns, ["id", "we\"ird col"], "stored columns only");
    let pages = table.pages;
    pg.psql("app", LATER);
    let real_pages: u64 = pg
        .psql(
            "app",
            r#"SELECT pg_relation_size('"Sp ace"."T""b"') / 8192"#,
        )
        .parse()
        .unwrap();
    assert!(
        pages > 10 && pages < real_pages,
        "rows should be past the pages counted ({pages} of {real_pages})"
    );

    let copy = |range| copy_out(&table.schema, &table.name, &table.columns, range).unwrap();
    let everything = pg.psql(
        "app",
        &copy(PageRange {
            from_page: None,
            to_page: None,
        }),
    );
    let rows: usize = pg
        .psql("app", r#"SELECT count(*) FROM "Sp ace"."T""b""#)
        .parse()
        .unwrap();
    assert_eq!(everything.lines().count(), rows);

    for count in [2, 3, 7] {
        let mut sliced = String::new();
        for range in page_ranges(pages, count) {
            let statement = copy(range);
            let out = pg.psql("app", &statement);
            if !out.is_empty() {
                sliced.push_str(&out);
                sliced.push('\n');
            }
            if range.from_page.is_some() || range.to_page.is_some() {
                let select = statement
                    .trim_start_matches("COPY (")
                    .trim_end_matches(") TO STDOUT");
                let plan = pg.psql("app", &format!("EXPLAIN {select}"));
                assert!(plan.contains("Tid Range Scan"), "{plan}");
            }
        }
        assert_eq!(
            sorted_lines(&sliced),
            sorted_lines(&everything),
            "{count} slices"
        );
    }
}
