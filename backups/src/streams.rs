//! How one database's dump is split into parallel pg_dump streams that all read the same
//! exported snapshot. Pure: the plan, pg_dump's arguments and the objects' names.
//!
//! With `jobs` = N > 1 and at least two tables with data, the dump becomes N + 1 streams,
//! restored in this order in one transaction:
//! 1. `Pre`: the pre-data section (types, tables, functions, large objects' entries);
//! 2. `Data`: N − 1 streams of `--data-only` for their share of the largest tables;
//! 3. `Rest`: the data and post-data sections with the data of those tables left out: every
//!    other table's rows, large objects' contents, sequences' values, then indexes,
//!    constraints, triggers, materialized views' refreshes.
//!
//! The tables are shared out largest first, each to the least loaded stream (`Rest` starts
//! with the load of the tables it always keeps and of the large objects). Only the
//! [`MAX_SPLIT`] largest tables are shared out: pg_dump looks each named table up one query at
//! a time, and small tables gain nothing from a stream of their own.

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
}

/// One pg_dump stream of a database's dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stream {
    /// The whole dump in one stream (today's single object).
    Whole,
    Pre,
    /// The rows of these tables (patterns, see [`pattern`]).
    Data(Vec<String>),
    /// Data and post-data, without the rows of these tables.
    Rest(Vec<String>),
}

/// The streams of a dump with `jobs` workers over `tables`, `other_bytes` (large objects) going
/// with `Rest`. One stream, `Whole`, when there is nothing to share out.
pub fn plan(tables: &[Table], jobs: usize, other_bytes: u64) -> Vec<Stream> {
    let mut by_size: Vec<&Table> = tables.iter().collect();
    by_size.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    let bins = jobs.min(by_size.len().min(MAX_SPLIT));
    if bins < 2 {
        return vec![Stream::Whole];
    }
    let (shared, kept) = by_size.split_at(by_size.len().min(MAX_SPLIT));
    let mut loads = vec![0u64; bins];
    loads[0] = kept
        .iter()
        .map(|t| t.bytes)
        .fold(other_bytes, u64::saturating_add);
    let mut shares: Vec<Vec<String>> = vec![Vec::new(); bins];
    for table in shared {
        let lightest = (0..bins).min_by_key(|&i| (loads[i], i)).unwrap_or(0);
        loads[lightest] = loads[lightest].saturating_add(table.bytes);
        shares[lightest].push(pattern(&table.schema, &table.name));
    }
    let split: Vec<String> = shares[1..].iter().flatten().cloned().collect();
    if split.is_empty() {
        return vec![Stream::Whole];
    }
    let mut streams = vec![Stream::Pre];
    streams.extend(
        shares
            .into_iter()
            .skip(1)
            .filter(|s| !s.is_empty())
            .map(Stream::Data),
    );
    streams.push(Stream::Rest(split));
    streams
}

/// A pg_dump pattern that matches exactly this table: both names in double quotes (inside
/// which pattern characters are literal), embedded quotes doubled.
pub fn pattern(schema: &str, name: &str) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    format!("{}.{}", quote(schema), quote(name))
}

impl Stream {
    /// pg_dump's arguments for this stream, after the format and snapshot options.
    pub fn pg_dump_args(&self) -> Vec<String> {
        match self {
            Stream::Whole => vec![],
            Stream::Pre => vec!["--section=pre-data".into()],
            Stream::Data(tables) => std::iter::once("--data-only".to_string())
                .chain(tables.iter().map(|t| format!("--table={t}")))
                .collect(),
            Stream::Rest(tables) => ["--section=data", "--section=post-data"]
                .into_iter()
                .map(String::from)
                .chain(tables.iter().map(|t| format!("--exclude-table-data={t}")))
                .collect(),
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
            Stream::Rest(_) => format!("{stem}.rest{extension}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, bytes: u64) -> Table {
        Table {
            schema: "public".into(),
            name: name.into(),
            bytes,
            counted_as: format!("public.{name}"),
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
        assert_eq!(plan(&[table("a", 9), table("b", 1)], 1, 0), [Stream::Whole]);
        assert_eq!(plan(&[table("a", 9)], 4, 0), [Stream::Whole]);
        assert_eq!(plan(&[], 4, 0), [Stream::Whole]);
    }

    #[test]
    fn largest_first_to_the_lightest() {
        let tables = [
            table("big", 100),
            table("mid", 60),
            table("small", 40),
            table("tiny", 1),
        ];
        let streams = plan(&tables, 2, 0);
        // big → Rest (the first on a tie), mid → Data, small → Data (60 < 100), tiny → Rest
        // (100 = 100).
        let shared = vec![pattern("public", "mid"), pattern("public", "small")];
        assert_eq!(streams.first(), Some(&Stream::Pre));
        assert_eq!(data_of(&streams), std::slice::from_ref(&shared));
        assert_eq!(streams.last(), Some(&Stream::Rest(shared)));
        // Large objects weigh on Rest: the big table goes to a data stream.
        let streams = plan(&tables, 2, 1_000);
        assert_eq!(data_of(&streams)[0][0], pattern("public", "big"));
    }

    #[test]
    fn every_shared_table_is_left_out_of_rest_exactly_once() {
        let tables: Vec<Table> = (0..1_000u64)
            .map(|i| table(&format!("t{i}"), i * 7 % 101))
            .collect();
        let streams = plan(&tables, 4, 0);
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
            Stream::Data(vec![pattern("s", "t")]).pg_dump_args(),
            ["--data-only", r#"--table="s"."t""#]
        );
        assert_eq!(
            Stream::Rest(vec![pattern("s", "t")]).pg_dump_args(),
            [
                "--section=data",
                "--section=post-data",
                r#"--exclude-table-data="s"."t""#
            ]
        );
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
    }
}
