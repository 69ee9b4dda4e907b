//! Slices of one large table: pg_dump cannot split a table, so a table well over one stream's
//! fair share of a dump would be the long pole of a parallel dump. Such a table is dumped
//! instead by the agent's own `COPY (SELECT … WHERE ctid …) TO STDOUT`, one slice per range of
//! its pages, each in a session that imported the dump's exported snapshot, so the slices
//! together are the table as one transaction sees it. Pure: how many slices, the page bounds,
//! and the statements.
//!
//! The bounds come from the heap's size when the dump asked (`streams::TABLES_SQL`, in the
//! snapshot's transaction): the first slice has no start and the last no end, so a row on a
//! page added since is in the last slice, never lost, and the slices never overlap (each page
//! belongs to exactly one range). PostgreSQL 14 and later read a `ctid` range with a TID range
//! scan (only those pages); older servers would read the whole table per slice, so slicing is
//! for 14 and later.

/// The pages of one slice: `[from_page, to_page)`, `None` for no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRange {
    pub from_page: Option<u64>,
    pub to_page: Option<u64>,
}

/// How many slices a table of `bytes`, in a dump of `total` bytes with `jobs` streams, is cut
/// into: 1 (not sliced) unless it is over one and a half streams' fair share and has at least a
/// page per slice; otherwise as many as fair shares it holds, at most `jobs`.
pub fn slice_count(bytes: u64, pages: u64, total: u64, jobs: usize) -> usize {
    if jobs < 2 || total == 0 {
        return 1;
    }
    let share = total.div_ceil(jobs as u64).max(1);
    if bytes.saturating_mul(2) <= share.saturating_mul(3) {
        return 1;
    }
    let count = usize::try_from(bytes.div_ceil(share)).unwrap_or(usize::MAX);
    count
        .min(jobs)
        .min(usize::try_from(pages).unwrap_or(usize::MAX))
        .max(1)
}

/// `count` ranges of about equal pages over a heap of `pages` pages; the first unbounded below,
/// the last unbounded above.
pub fn page_ranges(pages: u64, count: usize) -> Vec<PageRange> {
    let count = count.max(1) as u64;
    let cut = |i: u64| pages.saturating_mul(i) / count;
    (0..count)
        .map(|i| PageRange {
            from_page: (i > 0).then(|| cut(i)),
            to_page: (i + 1 < count).then(|| cut(i + 1)),
        })
        .collect()
}

/// An identifier in double quotes, embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The statement that dumps one slice of `schema.table`'s `columns` (`None` for a table
/// without stored columns, which is never sliced: `COPY` takes no empty column list).
pub fn copy_out(schema: &str, table: &str, columns: &[String], range: PageRange) -> Option<String> {
    if columns.is_empty() {
        return None;
    }
    let columns: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    let conditions: Vec<String> = [
        range.from_page.map(|p| format!("ctid >= '({p},0)'::tid")),
        range.to_page.map(|p| format!("ctid < '({p},0)'::tid")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    Some(format!(
        "COPY (SELECT {} FROM ONLY {}.{}{filter}) TO STDOUT",
        columns.join(", "),
        quote_ident(schema),
        quote_ident(table)
    ))
}

/// The statement a restore runs before feeding a slice's rows (then `\.` on a line of its own).
pub fn copy_in(schema: &str, table: &str, columns: &[String]) -> Option<String> {
    if columns.is_empty() {
        return None;
    }
    let columns: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    Some(format!(
        "COPY {}.{} ({}) FROM STDIN;",
        quote_ident(schema),
        quote_ident(table),
        columns.join(", ")
    ))
}

/// The script of a slice's session: the dump's snapshot, the database's own encoding (the
/// restore says the same), the settings pg_dump dumps under (so the text of dates, intervals
/// and floats reads back the same), the copy.
pub fn session_script(snapshot: &str, encoding: &str, copy: &str) -> String {
    format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY;\n\
         SET TRANSACTION SNAPSHOT {};\n\
         SET client_encoding = {};\n\
         SET DateStyle = ISO; SET IntervalStyle = postgres; SET extra_float_digits = 3;\n\
         SET row_security = off;\n\
         {copy};\n\
         COMMIT;\n",
        literal(snapshot),
        literal(encoding)
    )
}

/// What a restore writes before a slice's rows (which end with `\.` on a line of its own).
pub fn restore_header(encoding: &str, copy_in: &str) -> String {
    format!("SET client_encoding = {};\n{copy_in}\n", literal(encoding))
}

/// A string literal, quotes doubled.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_table_well_over_its_share_is_sliced() {
        // 2 streams over 100 bytes: a share is 50; 75 is the most a table may hold unsliced.
        assert_eq!(slice_count(75, 1_000, 100, 2), 1);
        assert_eq!(slice_count(76, 1_000, 100, 2), 2);
        // One table that is nearly all of the dump: as many slices as streams, no more.
        assert_eq!(slice_count(990, 1_000, 1_000, 4), 4);
        assert_eq!(slice_count(990, 1_000, 1_000, 16), 16);
        // One stream, an empty dump, or fewer pages than slices.
        assert_eq!(slice_count(990, 1_000, 1_000, 1), 1);
        assert_eq!(slice_count(0, 0, 0, 4), 1);
        assert_eq!(slice_count(990, 2, 1_000, 4), 2);
        assert_eq!(slice_count(990, 0, 1_000, 4), 1);
    }

    #[test]
    fn ranges_cover_every_page_once_and_the_ends_are_open() {
        for (pages, count) in [(10, 3), (1, 1), (7, 7), (1_000_003, 4), (0, 2)] {
            let ranges = page_ranges(pages, count);
            assert_eq!(ranges.len(), count);
            assert_eq!(ranges[0].from_page, None);
            assert_eq!(ranges[count - 1].to_page, None);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].to_page, pair[1].from_page, "{ranges:?}");
            }
            // A page past the estimate falls in the last range only.
            let far = pages + 100;
            let holding: Vec<&PageRange> = ranges
                .iter()
                .filter(|r| {
                    r.from_page.is_none_or(|f| far >= f) && r.to_page.is_none_or(|t| far < t)
                })
                .collect();
            assert_eq!(holding, [&ranges[count - 1]]);
        }
        assert_eq!(
            page_ranges(10, 3),
            [
                PageRange {
                    from_page: None,
                    to_page: Some(3)
                },
                PageRange {
                    from_page: Some(3),
                    to_page: Some(6)
                },
                PageRange {
                    from_page: Some(6),
                    to_page: None
                },
            ]
        );
    }

    #[test]
    fn statements_quote_hostile_names_and_bound_the_pages() {
        let columns = vec!["id".to_string(), "we\"ird col".to_string()];
        let range = PageRange {
            from_page: Some(3),
            to_page: Some(6),
        };
        assert_eq!(
            copy_out("Sp ace", "T\"b", &columns, range).unwrap(),
            r#"COPY (SELECT "id", "we""ird col" FROM ONLY "Sp ace"."T""b" WHERE ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid) TO STDOUT"#
        );
        let whole = PageRange {
            from_page: None,
            to_page: None,
        };
        assert_eq!(
            copy_out("s", "t", &columns[..1], whole).unwrap(),
            r#"COPY (SELECT "id" FROM ONLY "s"."t") TO STDOUT"#
        );
        assert_eq!(
            copy_in("Sp ace", "T\"b", &columns).unwrap(),
            r#"COPY "Sp ace"."T""b" ("id", "we""ird col") FROM STDIN;"#
        );
        assert_eq!(copy_out("s", "t", &[], whole), None);
        assert_eq!(copy_in("s", "t", &[]), None);
        let script = session_script("0000-1'", "UTF8", "COPY x TO STDOUT");
        assert!(script.contains("SNAPSHOT '0000-1'''"), "{script}");
        assert!(script.contains("client_encoding = 'UTF8'"), "{script}");
        assert_eq!(
            restore_header("LATIN1", "COPY t FROM STDIN;"),
            "SET client_encoding = 'LATIN1';\nCOPY t FROM STDIN;\n"
        );
    }
}
