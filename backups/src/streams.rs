//! How one database's dump is split into parallel streams that all read the same exported
//! snapshot. Pure: the tables' query, the plan, each stream's command and the objects' names.
//!
//! With `jobs` = N > 1 and at least two tables with data (or one large enough to slice), the
//! dump becomes these streams, restored in this order:
//! 1. `Pre`: the pre-data section (types, tables, functions, large objects' entries);
//! 2. `Data`: `--data-only` streams for their share of the largest tables, and `Slice`s: a
//!    table well over one stream's fair share cut into page ranges (`slices`), each range's
//!    rows by the agent's own `COPY` in the snapshot (pg_dump cannot split a table);
//! 3. `Rest`: the data and post-data sections with the data of those tables left out: every
//!    other table's rows, large objects' contents, sequences' values, then indexes,
//!    constraints, triggers, materialized views' refreshes.
//!
//! The tables and slices are shared out largest first, each to the least loaded of N lanes
//! (the first lane, which ends with `Rest`, starts with the load of the tables it always keeps
//! and of the large objects); a lane runs its streams one after another, the lanes and `Pre`
//! at once. Only the [`MAX_SPLIT`] largest tables are shared out: pg_dump looks each named
//! table up one query at a time, and small tables gain nothing from a stream of their own.

use crate::slices::{self, PageRange};

/// The most tables named on pg_dump command lines.
pub const MAX_SPLIT: usize = 256;

/// A table whose rows pg_dump dumps, with its size on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub schema: String,
    pub name: String,
    pub bytes: u64,
    /// Its name in the manifest's row counts (`%I.%I`).
    pub counted_as: String,
    /// Its heap's pages when the dump asked (`pg_relation_size`): what its slices divide.
    pub pages: u64,
    /// Its stored columns, in order (what a slice copies).
    pub columns: Vec<String>,
}

/// One stream of a database's dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stream {
    /// The whole dump in one stream (today's single object).
    Whole,
    Pre,
    /// The rows of these tables (patterns, see [`pattern`]).
    Data(Vec<String>),
    /// The rows of one range of a table's pages, in `COPY` text.
    Slice(Table, PageRange),
    /// Data and post-data, without the rows of these tables.
    Rest(Vec<String>),
}

/// A dump's streams in restore order, and the lanes that run them: each lane the indexes of
/// its streams, run one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub streams: Vec<Stream>,
    pub lanes: Vec<Vec<usize>>,
}

/// What produces a stream: pg_dump with these arguments (after the format and snapshot
/// options), or a psql session running this script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Producer {
    PgDump(Vec<String>),
    Copy(String),
}

/// One thing to share out: a table's rows, or one slice of a table.
enum Item<'a> {
    Table(&'a Table),
    Slice(&'a Table, PageRange),
}

/// The streams of a dump with `jobs` workers over `tables`, `other_bytes` (large objects) going
/// with `Rest`; only tables larger than `split_above` may be sliced (`None`: none). One stream,
/// `Whole`, when there is nothing to share out.
pub fn plan(tables: &[Table], jobs: usize, other_bytes: u64, split_above: Option<u64>) -> Plan {
    let whole = Plan {
        streams: vec![Stream::Whole],
        lanes: vec![vec![0]],
    };
    let mut by_size: Vec<&Table> = tables.iter().collect();
    by_size.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    let (shared, kept) = by_size.split_at(by_size.len().min(MAX_SPLIT));
    let total = tables
        .iter()
        .map(|t| t.bytes)
        .fold(other_bytes, u64::saturating_add);
    // What to share out, with its size: a table, or its slices in page order.
    let mut items: Vec<(u64, Item)> = Vec::new();
    for table in shared {
        let may_split = split_above.is_some_and(|above| table.bytes > above);
        let count = match may_split && !table.columns.is_empty() {
            false => 1,
            true => slices::slice_count(table.bytes, table.pages, total, jobs),
        };
        if count < 2 {
            items.push((table.bytes, Item::Table(table)));
            continue;
        }
        let each = table.bytes / count as u64;
        for range in slices::page_ranges(table.pages, count) {
            items.push((each, Item::Slice(table, range)));
        }
    }
    let bins = jobs.min(items.len());
    if bins < 2 {
        return whole;
    }
    let kept_load = kept
        .iter()
        .map(|t| t.bytes)
        .fold(other_bytes, u64::saturating_add);
    let lane_of = lanes_of(&items, bins, kept_load);
    let mut tables_of: Vec<Vec<String>> = vec![Vec::new(); bins];
    let mut left_out: Vec<String> = Vec::new();
    let mut slices = Vec::new();
    for ((_, item), lane) in items.into_iter().zip(lane_of) {
        match item {
            Item::Table(t) => tables_of[lane].push(pattern(&t.schema, &t.name)),
            Item::Slice(t, range) => {
                let p = pattern(&t.schema, &t.name);
                if !left_out.contains(&p) {
                    left_out.push(p);
                }
                slices.push((lane, Stream::Slice(t.clone(), range)));
            }
        }
    }
    left_out.extend(tables_of[1..].iter().flatten().cloned());
    if left_out.is_empty() {
        return whole;
    }
    // Restore order: the schema, the data streams, every table's slices in page order (so a
    // restore in one transaction keeps the rows' order), the rest.
    let mut streams = vec![Stream::Pre];
    let mut lanes: Vec<Vec<usize>> = vec![Vec::new(); bins];
    for (lane, tables) in tables_of.into_iter().enumerate().skip(1) {
        if !tables.is_empty() {
            lanes[lane].push(streams.len());
            streams.push(Stream::Data(tables));
        }
    }
    for (lane, slice) in slices {
        lanes[lane].push(streams.len());
        streams.push(slice);
    }
    lanes[0].push(streams.len());
    streams.push(Stream::Rest(left_out));
    lanes.retain(|lane| !lane.is_empty());
    lanes.insert(0, vec![0]);
    Plan { streams, lanes }
}

/// The lane of each item: largest first, each to the least loaded of `bins` lanes, the first
/// starting with `first_load` (what the rest always carries).
fn lanes_of(items: &[(u64, Item)], bins: usize, first_load: u64) -> Vec<usize> {
    let mut loads = vec![0u64; bins];
    loads[0] = first_load;
    let mut by_load: Vec<usize> = (0..items.len()).collect();
    by_load.sort_by_key(|&i| std::cmp::Reverse(items[i].0));
    let mut lane_of = vec![0; items.len()];
    for i in by_load {
        let lightest = (0..bins).min_by_key(|&b| (loads[b], b)).unwrap_or(0);
        loads[lightest] = loads[lightest].saturating_add(items[i].0);
        lane_of[i] = lightest;
    }
    lane_of
}

/// Ordinary tables and partitions with rows pg_dump dumps (not the catalogs', temporary
/// tables or extensions' own), with their sizes, their heaps' pages in the snapshot's
/// transaction (every row the snapshot sees is on one of them) and their stored columns
/// (generated ones are computed again on restore), names as JSON (they may hold newlines);
/// then the size of the large objects.
pub const TABLES_SQL: &str = "SELECT json_build_array(n.nspname, c.relname, pg_table_size(c.oid), \
       format('%I.%I', n.nspname, c.relname), \
       pg_relation_size(c.oid) / current_setting('block_size')::bigint, \
       (SELECT coalesce(json_agg(a.attname ORDER BY a.attnum), '[]') FROM pg_attribute a \
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
          AND a.attgenerated = ''))::text \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relkind = 'r' AND c.relpersistence <> 't' \
       AND n.nspname <> 'information_schema' AND n.nspname !~ '^pg_' \
       AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass \
                       AND d.objid = c.oid AND d.deptype = 'e');\n\
     SELECT pg_table_size('pg_largeobject');";

/// The tables and the large objects' size from the lines [`TABLES_SQL`] printed.
pub fn parse_tables(lines: &[String]) -> Result<(Vec<Table>, u64), String> {
    let Some((large_objects, tables)) = lines.split_last() else {
        return Err("no table sizes".into());
    };
    let tables = tables
        .iter()
        .map(|line| {
            serde_json::from_str::<(String, String, u64, String, u64, Vec<String>)>(line)
                .map(|(schema, name, bytes, counted_as, pages, columns)| Table {
                    schema,
                    name,
                    bytes,
                    counted_as,
                    pages,
                    columns,
                })
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<Table>, String>>()?;
    let large_objects = large_objects
        .trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())?;
    Ok((tables, large_objects))
}

/// What a slice of a table without stored columns runs: an error.
const NO_COLUMNS: &str =
    "DO $$BEGIN RAISE EXCEPTION 'a slice of a table without stored columns'; END$$";

/// A pg_dump pattern that matches exactly this table: both names in double quotes (inside
/// which pattern characters are literal), embedded quotes doubled.
pub fn pattern(schema: &str, name: &str) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    format!("{}.{}", quote(schema), quote(name))
}

impl Stream {
    /// What produces this stream in the snapshot `snapshot` of a database in `encoding`.
    pub fn producer(&self, snapshot: &str, encoding: &str) -> Producer {
        let pg_dump = |args: Vec<String>| Producer::PgDump(args);
        match self {
            Stream::Whole => pg_dump(vec![]),
            Stream::Pre => pg_dump(vec!["--section=pre-data".into()]),
            Stream::Data(tables) => pg_dump(
                std::iter::once("--data-only".to_string())
                    .chain(tables.iter().map(|t| format!("--table={t}")))
                    .collect(),
            ),
            Stream::Rest(tables) => pg_dump(
                ["--section=data", "--section=post-data"]
                    .into_iter()
                    .map(String::from)
                    .chain(tables.iter().map(|t| format!("--exclude-table-data={t}")))
                    .collect(),
            ),
            Stream::Slice(t, range) => {
                // `plan` slices only tables with stored columns; were one without planned, its
                // dump fails rather than store an empty slice.
                let copy = slices::copy_out(&t.schema, &t.name, &t.columns, *range)
                    .unwrap_or_else(|| NO_COLUMNS.to_string());
                Producer::Copy(slices::session_script(snapshot, encoding, &copy))
            }
        }
    }

    /// The stored object's file name for the `index`th stream of the dump stored as `file`:
    /// the first keeps the name, the others insert what they hold before the extension.
    pub fn file_name(&self, index: usize, file: &str) -> String {
        let (stem, extension) = match file.find('.') {
            Some(dot) => file.split_at(dot),
            None => (file, ""),
        };
        match self {
            Stream::Whole | Stream::Pre => file.to_string(),
            Stream::Data(_) => format!("{stem}.data-{index}{extension}"),
            Stream::Slice(..) => format!(
                "{stem}.slice-{index}{}",
                extension.replacen(".pgc", ".copy", 1)
            ),
            Stream::Rest(_) => format!("{stem}.rest{extension}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any table may be sliced.
    const SPLIT: Option<u64> = Some(0);

    fn table(name: &str, bytes: u64) -> Table {
        Table {
            schema: "public".into(),
            name: name.into(),
            bytes,
            counted_as: format!("public.{name}"),
            pages: bytes / 8192,
            columns: vec![],
        }
    }

    fn sliceable(name: &str, bytes: u64) -> Table {
        Table {
            columns: vec!["id".into()],
            ..table(name, bytes)
        }
    }

    fn args(stream: &Stream) -> Vec<String> {
        match stream.producer("snap", "UTF8") {
            Producer::PgDump(args) => args,
            Producer::Copy(script) => vec![script],
        }
    }

    fn data_of(streams: &[Stream]) -> Vec<Vec<String>> {
        streams
            .iter()
            .filter_map(|s| match s {
                Stream::Data(t) => Some(t.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn nothing_to_share_is_one_stream() {
        let whole = Plan {
            streams: vec![Stream::Whole],
            lanes: vec![vec![0]],
        };
        assert_eq!(plan(&[table("a", 9), table("b", 1)], 1, 0, SPLIT), whole);
        assert_eq!(plan(&[table("a", 9)], 4, 0, SPLIT), whole);
        assert_eq!(plan(&[], 4, 0, SPLIT), whole);
        // One table too small to slice (under a page per slice), or without stored columns.
        assert_eq!(plan(&[sliceable("a", 9)], 4, 0, SPLIT), whole);
        assert_eq!(plan(&[table("a", 1 << 30)], 4, 0, SPLIT), whole);
    }

    #[test]
    fn largest_first_to_the_lightest() {
        let tables = [
            table("big", 100),
            table("mid", 60),
            table("small", 40),
            table("tiny", 1),
        ];
        let streams = plan(&tables, 2, 0, SPLIT).streams;
        // big → Rest (the first on a tie), mid → Data, small → Data (60 < 100), tiny → Rest
        // (100 = 100).
        let shared = vec![pattern("public", "mid"), pattern("public", "small")];
        assert_eq!(streams.first(), Some(&Stream::Pre));
        assert_eq!(data_of(&streams), std::slice::from_ref(&shared));
        assert_eq!(streams.last(), Some(&Stream::Rest(shared)));
        // Large objects weigh on Rest: the big table goes to a data stream.
        let streams = plan(&tables, 2, 1_000, SPLIT).streams;
        assert_eq!(data_of(&streams)[0][0], pattern("public", "big"));
    }

    #[test]
    fn every_shared_table_is_left_out_of_rest_exactly_once() {
        let tables: Vec<Table> = (0..1_000u64)
            .map(|i| table(&format!("t{i}"), i * 7 % 101))
            .collect();
        let streams = plan(&tables, 4, 0, SPLIT).streams;
        assert_eq!(streams.len(), 5);
        let mut shared: Vec<String> = data_of(&streams).concat();
        let Some(Stream::Rest(left_out)) = streams.last() else {
            panic!("no rest stream")
        };
        shared.sort();
        let mut left_out = left_out.clone();
        left_out.sort();
        assert_eq!(shared, left_out);
        assert!(
            left_out.len() <= MAX_SPLIT,
            "only the largest are shared out"
        );
    }

    #[test]
    fn hostile_names_match_only_themselves() {
        assert_eq!(pattern("Odd \"S\".x", "a*b?"), r#""Odd ""S"".x"."a*b?""#);
        assert_eq!(
            args(&Stream::Data(vec![pattern("s", "t")])),
            ["--data-only", r#"--table="s"."t""#]
        );
        assert_eq!(
            args(&Stream::Rest(vec![pattern("s", "t")])),
            [
                "--section=data",
                "--section=post-data",
                r#"--exclude-table-data="s"."t""#
            ]
        );
    }

    #[test]
    fn a_table_well_over_its_share_is_sliced_and_left_out_of_rest() {
        // 2 streams over 1,000 MB: the 900 MB table is cut in two slices, one per lane; the
        // small tables go where the load is lightest.
        let mb = 1 << 20;
        let tables = [
            sliceable("big", 900 * mb),
            sliceable("a", 60 * mb),
            table("b", 40 * mb),
        ];
        let plan = plan(&tables, 2, 0, SPLIT);
        let slices: Vec<&Stream> = plan
            .streams
            .iter()
            .filter(|s| matches!(s, Stream::Slice(..)))
            .collect();
        assert_eq!(slices.len(), 2, "{plan:?}");
        let Some(Stream::Rest(left_out)) = plan.streams.last() else {
            panic!("no rest stream: {plan:?}")
        };
        assert_eq!(left_out.iter().filter(|p| p.contains("big")).count(), 1);
        // Every stream is in exactly one lane; Pre runs alone, Rest ends the first lane.
        let mut laned: Vec<usize> = plan.lanes.concat();
        laned.sort();
        assert_eq!(laned, (0..plan.streams.len()).collect::<Vec<_>>());
        assert_eq!(plan.lanes[0], [0]);
        assert_eq!(plan.lanes[1].last(), Some(&(plan.streams.len() - 1)));
        // The slices are restored in page order, whichever lane dumps them.
        let froms: Vec<Option<u64>> = (slices.iter())
            .map(|s| match s {
                Stream::Slice(_, range) => range.from_page,
                _ => None,
            })
            .collect();
        assert_eq!(froms[0], None);
        assert!(froms[1].is_some() && froms[1] > froms[0]);
        assert_eq!(plan.lanes.len(), 3, "Pre and one lane per stream: {plan:?}");
        // Not when the table is under the size slicing starts at, nor on old servers.
        for split_above in [Some(900 * mb), None] {
            let unsplit = super::plan(&tables, 2, 0, split_above);
            let sliced = unsplit.streams.iter();
            assert!(
                !sliced.clone().any(|s| matches!(s, Stream::Slice(..))),
                "{unsplit:?}"
            );
        }
        // A slice's script reads its pages in the snapshot.
        let script = args(slices[1]).concat();
        assert!(
            script.contains("SET TRANSACTION SNAPSHOT 'snap'"),
            "{script}"
        );
        assert!(
            script.contains(r#"FROM ONLY "public"."big" WHERE ctid >= "#),
            "{script}"
        );
    }

    #[test]
    fn a_slice_without_columns_fails_rather_than_dump_nothing() {
        let whole = PageRange {
            from_page: None,
            to_page: None,
        };
        let script = args(&Stream::Slice(table("t", 1), whole)).concat();
        assert!(script.contains("RAISE EXCEPTION"), "{script}");
        assert!(!script.contains("COPY"), "{script}");
    }

    #[test]
    fn file_names() {
        let f = "db-001-6162.pgc.zst";
        assert_eq!(Stream::Pre.file_name(0, f), f);
        assert_eq!(
            Stream::Data(vec![]).file_name(2, f),
            "db-001-6162.data-2.pgc.zst"
        );
        assert_eq!(
            Stream::Rest(vec![]).file_name(3, f),
            "db-001-6162.rest.pgc.zst"
        );
        let slice = Stream::Slice(
            table("t", 1),
            PageRange {
                from_page: None,
                to_page: None,
            },
        );
        assert_eq!(slice.file_name(4, f), "db-001-6162.slice-4.copy.zst");
    }
}
