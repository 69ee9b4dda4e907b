//! Row counts read from pg_dump's custom-format archive while it streams through the agent, so
//! the server does not count every table a second time. Pure and incremental: bytes in (in
//! pieces of any size), per-table counts out; no I/O, std only (the fuzz target compiles this
//! file on its own), and no input makes it panic: a stream it cannot read is an error.
//!
//! The archive, as pg_dump writes it to a pipe (pg_backup_archiver.c, pg_backup_custom.c):
//! a header (`PGDMP`, version 1.12–1.16, integer and offset sizes, format 1 = custom,
//! compression, creation time, names), then the table of contents (one entry per object:
//! dump id, tag, desc, definition, COPY statement, namespace, …), then one data block per
//! entry with data: type 1 (table data) or 3 (large objects), the dump id, and
//! length-prefixed chunks ending with a zero length. Integers are a sign byte and `intSize`
//! little-endian bytes; strings an integer length (negative = NULL) and the bytes.
//!
//! Uncompressed (`--compress=0`), a table's chunks are its `COPY … TO stdout` text, in which
//! every row ends with exactly one newline (newlines inside values are escaped), followed by
//! the terminator line `\.` and two empty lines that pg_dump adds. So rows = newlines − 3,
//! and the block must end with that terminator.
//!
//! Tables counted: every `TABLE DATA` entry whose table has a `TABLE` entry of its own, which
//! leaves out extension members (their configuration tables' data is dumped, their definition
//! is not) — the same set as `pg::ROW_COUNT_SQL`, named as it names them (`%I.%I`): the
//! identifiers exactly as pg_dump quoted them in the entry's COPY statement, which uses the
//! same rule (`fmtId`, `quote_identifier`), checked against the entry's namespace and tag.

mod table_name;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

pub use table_name::copy_target;

/// Why the stream could not be read; the agent then counts rows in the snapshot instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pg_dump archive: {}", self.0)
    }
}

impl std::error::Error for FormatError {}

fn bad<T>(detail: impl Into<String>) -> Result<T, FormatError> {
    Err(FormatError(detail.into()))
}

/// The largest single TOC entry buffered (a function's definition can be long).
const MAX_ENTRY_BYTES: usize = 32 << 20;
const MAGIC: &[u8] = b"PGDMP";
const FORMAT_CUSTOM: u8 = 1;
const BLK_DATA: u8 = 1;
const BLK_BLOBS: u8 = 3;
const OLDEST_MINOR: u8 = 12;
const NEWEST_MINOR: u8 = 16;
/// What pg_dump writes after a table's rows.
const TERMINATOR: &[u8; 5] = b"\\.\n\n\n";

/// Counts rows per table from a custom-format archive fed in pieces.
#[derive(Debug, Default)]
pub struct RowCounter {
    /// Header and TOC bytes not parsed yet.
    pending: Vec<u8>,
    header: Option<Header>,
    /// TOC entries still to read, once the header is read.
    entries_left: Option<u64>,
    toc: Toc,
    /// Set when the TOC is complete: the data blocks follow.
    data: Option<Data>,
    failed: Option<FormatError>,
    /// Counts the `TABLE DATA` entries of tables the archive does not define too (a part of a
    /// dump in parallel streams, whose caller picks the tables that count).
    every_table: bool,
    /// Set when the input is one table's rows in `COPY` text (a slice), not an archive.
    lines: Option<Lines>,
}

/// The rows of a slice: one per line.
#[derive(Debug)]
struct Lines {
    table: String,
    rows: u64,
    last: Option<u8>,
}

#[derive(Debug, Clone, Copy)]
struct Header {
    minor: u8,
    int_size: usize,
    off_size: usize,
}

/// What the TOC said, as far as counting goes.
#[derive(Debug, Default)]
struct Toc {
    /// `(namespace, tag)` of every `TABLE` entry.
    tables: HashSet<(Vec<u8>, Vec<u8>)>,
    /// `TABLE DATA` entries with data.
    table_data: Vec<Entry>,
    /// Every entry with data, so a block for an id the TOC does not list is an error.
    with_data: HashSet<i64>,
}

/// The data section's state.
#[derive(Debug)]
struct Data {
    header: Header,
    /// Counted tables: dump id → index into `names`/`counts`.
    index: HashMap<i64, usize>,
    names: Vec<String>,
    counts: Vec<Option<u64>>,
    with_data: HashSet<i64>,
    field: Field,
    at: At,
    /// The counted table's block in progress.
    block: Block,
}

/// Where in the data section the next byte belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    BlockType,
    BlockId {
        kind: u8,
    },
    /// A chunk length in a table block (`table` = the counted table, if any).
    ChunkLen {
        table: Option<usize>,
        lo: bool,
    },
    Chunk {
        table: Option<usize>,
        lo: bool,
        left: u64,
    },
    /// A large object's OID (0 ends the block).
    LoOid,
}

/// A fixed-size field (integer, at most 9 bytes) that may arrive split across pieces.
#[derive(Debug, Default)]
struct Field {
    bytes: [u8; 9],
    len: usize,
}

/// A counted table's block in progress.
#[derive(Debug, Default, Clone, Copy)]
struct Block {
    newlines: u64,
    bytes: u64,
    tail: [u8; 6],
}

impl RowCounter {
    pub fn new() -> RowCounter {
        RowCounter::default()
    }

    /// A counter for an archive without the tables' definitions (`--data-only`, or only the
    /// data and post-data sections): every `TABLE DATA` entry is counted, extension members'
    /// too; the caller keeps the tables that count.
    pub fn every_table() -> RowCounter {
        RowCounter {
            every_table: true,
            ..RowCounter::default()
        }
    }

    /// A counter for one table's rows in `COPY` text (a slice of `table`, named as `%I.%I`):
    /// a row per line.
    pub fn copy_lines(table: &str) -> RowCounter {
        RowCounter {
            lines: Some(Lines {
                table: table.to_string(),
                rows: 0,
                last: None,
            }),
            ..RowCounter::default()
        }
    }

    /// Reads the next piece of the archive. After an error every later call returns it again.
    pub fn feed(&mut self, input: &[u8]) -> Result<(), FormatError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let outcome = self.feed_inner(input);
        if let Err(e) = &outcome {
            self.failed = Some(e.clone());
        }
        outcome
    }

    /// The counts, once the whole archive was fed: `schema.table` (quoted like `%I.%I`) → rows.
    pub fn finish(self) -> Result<BTreeMap<String, u64>, FormatError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if let Some(lines) = self.lines {
            if lines.last.is_some_and(|b| b != b'\n') {
                return bad("the rows end inside a line");
            }
            return Ok(BTreeMap::from([(lines.table, lines.rows)]));
        }
        let Some(data) = self.data else {
            return bad("the stream ended inside the header or table of contents");
        };
        if data.at != At::BlockType || data.field.len != 0 {
            return bad("the stream ended inside a data block");
        }
        let mut out = BTreeMap::new();
        for (name, count) in data.names.into_iter().zip(data.counts) {
            let Some(rows) = count else {
                return bad(format!("no data block for table {name}"));
            };
            out.insert(name, rows);
        }
        Ok(out)
    }

    fn feed_inner(&mut self, input: &[u8]) -> Result<(), FormatError> {
        if let Some(lines) = &mut self.lines {
            lines.rows += count_newlines(input);
            lines.last = input.last().copied().or(lines.last);
            return Ok(());
        }
        if let Some(data) = &mut self.data {
            return data.feed(input);
        }
        self.pending.extend_from_slice(input);
        let used = self.read_prelude()?;
        if self.data.is_some() {
            let rest = std::mem::take(&mut self.pending);
            if let Some(data) = &mut self.data {
                return data.feed(&rest[used..]);
            }
        }
        self.pending.drain(..used);
        if self.pending.len() > MAX_ENTRY_BYTES {
            return bad(format!(
                "a header or TOC entry longer than {MAX_ENTRY_BYTES} bytes"
            ));
        }
        Ok(())
    }

    /// Parses what it can of the header and TOC in `pending`; returns the bytes used.
    fn read_prelude(&mut self) -> Result<usize, FormatError> {
        let mut pos = 0;
        let header = match self.header {
            Some(h) => h,
            None => {
                let mut c = Cursor::new(&self.pending, 4);
                let Some((header, entries)) = read_header(&mut c).or_more()? else {
                    return Ok(0);
                };
                pos = c.pos;
                self.header = Some(header);
                self.entries_left = Some(entries);
                header
            }
        };
        while let Some(left) = self.entries_left.filter(|n| *n > 0) {
            let mut c = Cursor::new(&self.pending[pos..], header.int_size);
            let Some(entry) = read_entry(&mut c, header).or_more()? else {
                return Ok(pos);
            };
            pos += c.pos;
            self.toc.add(entry);
            self.entries_left = Some(left - 1);
        }
        self.data = Some(Data::new(
            header,
            std::mem::take(&mut self.toc),
            self.every_table,
        )?);
        Ok(pos)
    }
}

/// A step of the structured parse: more bytes are needed, or they are wrong.
enum Step {
    More,
    Bad(String),
}

type Parsed<T> = Result<T, Step>;

trait OrMore<T> {
    /// `Ok(None)` when more bytes are needed.
    fn or_more(self) -> Result<Option<T>, FormatError>;
}

impl<T> OrMore<T> for Parsed<T> {
    fn or_more(self) -> Result<Option<T>, FormatError> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Step::More) => Ok(None),
            Err(Step::Bad(m)) => bad(m),
        }
    }
}

/// Reads archive fields from a byte slice.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    int_size: usize,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8], int_size: usize) -> Cursor<'a> {
        Cursor {
            data,
            pos: 0,
            int_size,
        }
    }

    fn bytes(&mut self, n: usize) -> Parsed<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Step::More)?;
        let out = self.data.get(self.pos..end).ok_or(Step::More)?;
        self.pos = end;
        Ok(out)
    }

    fn byte(&mut self) -> Parsed<u8> {
        Ok(self.bytes(1)?[0])
    }

    fn int(&mut self) -> Parsed<i64> {
        let raw = self.bytes(1 + self.int_size)?;
        decode_int(raw).map_err(|e| Step::Bad(e.0))
    }

    /// A string; `None` for NULL.
    fn string(&mut self) -> Parsed<Option<&'a [u8]>> {
        let len = self.int()?;
        if len < 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| Step::Bad("a string too long".into()))?;
        if len > MAX_ENTRY_BYTES {
            return Err(Step::Bad(format!("a string of {len} bytes")));
        }
        self.bytes(len).map(Some)
    }

    fn owned(&mut self) -> Parsed<Vec<u8>> {
        Ok(self.string()?.unwrap_or_default().to_vec())
    }
}

/// A sign byte and little-endian magnitude (`raw.len()` − 1 ≤ 8 bytes).
fn decode_int(raw: &[u8]) -> Result<i64, FormatError> {
    let Some((&sign, magnitude)) = raw.split_first() else {
        return bad("an empty integer");
    };
    let mut v: u64 = 0;
    for (i, b) in magnitude.iter().enumerate().take(8) {
        v |= u64::from(*b) << (8 * i);
    }
    let Ok(v) = i64::try_from(v) else {
        return bad("an integer out of range");
    };
    Ok(if sign == 0 { v } else { -v })
}

/// The header up to the TOC's entry count.
fn read_header(c: &mut Cursor) -> Parsed<(Header, u64)> {
    if c.bytes(MAGIC.len())? != MAGIC {
        return Err(Step::Bad(
            "no PGDMP magic: not a custom-format archive".into(),
        ));
    }
    let (major, minor, _rev) = (c.byte()?, c.byte()?, c.byte()?);
    if major != 1 || !(OLDEST_MINOR..=NEWEST_MINOR).contains(&minor) {
        return Err(Step::Bad(format!(
            "archive version {major}.{minor} is not one this agent reads (1.{OLDEST_MINOR}–1.{NEWEST_MINOR})"
        )));
    }
    let (int_size, off_size) = (usize::from(c.byte()?), usize::from(c.byte()?));
    if !(1..=8).contains(&int_size) || !(1..=8).contains(&off_size) {
        return Err(Step::Bad(format!(
            "integer size {int_size} or offset size {off_size} outside 1–8"
        )));
    }
    c.int_size = int_size;
    let format = c.byte()?;
    if format != FORMAT_CUSTOM {
        return Err(Step::Bad(format!(
            "archive format {format}, not custom (1)"
        )));
    }
    let compression = if minor >= 15 {
        i64::from(c.byte()?)
    } else {
        c.int()?
    };
    if compression != 0 {
        return Err(Step::Bad(format!(
            "the data is compressed ({compression}); rows are counted only in uncompressed archives"
        )));
    }
    for _ in 0..7 {
        c.int()?; // creation time: sec, min, hour, mday, mon, year, isdst
    }
    for _ in 0..3 {
        c.string()?; // database name, server version, pg_dump version
    }
    let entries = u64::try_from(c.int()?)
        .map_err(|_| Step::Bad("a negative number of TOC entries".into()))?;
    let header = Header {
        minor,
        int_size,
        off_size,
    };
    Ok((header, entries))
}

/// The fields of one TOC entry that counting needs.
#[derive(Debug)]
struct Entry {
    dump_id: i64,
    had_dumper: bool,
    tag: Vec<u8>,
    desc: Vec<u8>,
    copy_stmt: Vec<u8>,
    namespace: Vec<u8>,
}

fn read_entry(c: &mut Cursor, h: Header) -> Parsed<Entry> {
    let dump_id = c.int()?;
    let had_dumper = c.int()? != 0;
    c.string()?; // table OID
    c.string()?; // OID
    let tag = c.owned()?;
    let desc = c.owned()?;
    c.int()?; // section
    c.string()?; // definition
    c.string()?; // drop statement
    let copy_stmt = c.owned()?;
    let namespace = c.owned()?;
    c.string()?; // tablespace
    if h.minor >= 14 {
        c.string()?; // table access method
    }
    if h.minor >= 16 {
        c.int()?; // relkind
    }
    c.string()?; // owner
    c.string()?; // "false" (WITH OIDS)
    while c.string()?.is_some() {} // dependencies, ended by NULL
    let flag = c.byte()?; // data offset: flag and offSize bytes
    if !(1..=3).contains(&flag) {
        return Err(Step::Bad(format!("entry {dump_id}: offset flag {flag}")));
    }
    c.bytes(h.off_size)?;
    Ok(Entry {
        dump_id,
        had_dumper,
        tag,
        desc,
        copy_stmt,
        namespace,
    })
}

impl Toc {
    fn add(&mut self, e: Entry) {
        if e.had_dumper {
            self.with_data.insert(e.dump_id);
        }
        match e.desc.as_slice() {
            b"TABLE" => {
                self.tables.insert((e.namespace, e.tag));
            }
            b"TABLE DATA" if e.had_dumper => self.table_data.push(e),
            _ => {}
        }
    }
}

impl Data {
    fn new(header: Header, toc: Toc, every_table: bool) -> Result<Data, FormatError> {
        let mut data = Data {
            header,
            index: HashMap::new(),
            names: Vec::new(),
            counts: Vec::new(),
            with_data: toc.with_data,
            field: Field::default(),
            at: At::BlockType,
            block: Block::default(),
        };
        for e in toc.table_data {
            if !every_table && !toc.tables.contains(&(e.namespace.clone(), e.tag.clone())) {
                continue; // an extension member's configuration table
            }
            let (id, name) = (e.dump_id, copy_target(&e.copy_stmt, &e.namespace, &e.tag)?);
            if data.names.contains(&name) {
                return bad(format!("two data entries for table {name}"));
            }
            data.index.insert(id, data.names.len());
            data.names.push(name);
            data.counts.push(None);
        }
        Ok(data)
    }

    fn feed(&mut self, mut input: &[u8]) -> Result<(), FormatError> {
        while !input.is_empty() {
            self.step(&mut input)?;
        }
        Ok(())
    }

    /// Consumes one field, or as much of a chunk as `input` holds.
    fn step(&mut self, input: &mut &[u8]) -> Result<(), FormatError> {
        match self.at {
            At::Chunk { table, lo, left } => {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                let (chunk, rest) = input.split_at(n);
                *input = rest;
                if table.is_some() {
                    self.block.add(chunk);
                }
                let left = left - n as u64;
                self.at = if left == 0 {
                    At::ChunkLen { table, lo }
                } else {
                    At::Chunk { table, lo, left }
                };
            }
            At::BlockType => {
                if let Some(kind) = self.field.take(input, 1) {
                    self.at = At::BlockId { kind: kind[0] };
                }
            }
            At::BlockId { kind } => {
                if let Some(id) = self.take_int(input)? {
                    self.at = self.open(kind, id)?;
                }
            }
            At::LoOid => {
                if let Some(oid) = self.take_int(input)? {
                    self.at = match oid {
                        0 => At::BlockType,
                        _ => At::ChunkLen {
                            table: None,
                            lo: true,
                        },
                    };
                }
            }
            At::ChunkLen { table, lo } => {
                if let Some(len) = self.take_int(input)? {
                    self.at = self.after_length(table, lo, len)?;
                }
            }
        }
        Ok(())
    }

    fn take_int(&mut self, input: &mut &[u8]) -> Result<Option<i64>, FormatError> {
        match self.field.take(input, 1 + self.header.int_size) {
            Some(raw) => decode_int(&raw[..1 + self.header.int_size]).map(Some),
            None => Ok(None),
        }
    }

    /// The state after a chunk length: a chunk, or the end of a table's data or an object's.
    fn after_length(
        &mut self,
        table: Option<usize>,
        lo: bool,
        len: i64,
    ) -> Result<At, FormatError> {
        Ok(match u64::try_from(len) {
            Err(_) => return bad(format!("a negative chunk length {len}")),
            Ok(0) if lo => At::LoOid,
            Ok(0) => {
                if let Some(t) = table {
                    self.close(t)?;
                }
                At::BlockType
            }
            Ok(left) => At::Chunk { table, lo, left },
        })
    }

    /// The state after a block's header.
    fn open(&mut self, kind: u8, id: i64) -> Result<At, FormatError> {
        if !self.with_data.remove(&id) {
            return bad(format!(
                "a data block for entry {id}, which the TOC does not list with data (or lists once)"
            ));
        }
        match kind {
            BLK_DATA => {
                let table = self.index.get(&id).copied();
                self.block = Block::default();
                Ok(At::ChunkLen { table, lo: false })
            }
            BLK_BLOBS => Ok(At::LoOid),
            other => bad(format!("an unknown data block type {other}")),
        }
    }

    /// A counted table's data ended: its rows, if it ends with the terminator.
    fn close(&mut self, t: usize) -> Result<(), FormatError> {
        let name = self.names.get(t).map(String::as_str).unwrap_or("?");
        let Some(rows) = self.block.rows() else {
            return bad(format!(
                "the data of table {name} does not end with pg_dump's COPY terminator"
            ));
        };
        if let Some(slot) = self.counts.get_mut(t) {
            *slot = Some(rows);
        }
        Ok(())
    }
}

impl Field {
    /// The next `n` (≤ 9) bytes, once they have all arrived.
    fn take(&mut self, input: &mut &[u8], n: usize) -> Option<[u8; 9]> {
        let n = n.min(self.bytes.len());
        let want = n.saturating_sub(self.len).min(input.len());
        let (head, rest) = input.split_at(want);
        self.bytes[self.len..self.len + want].copy_from_slice(head);
        self.len += want;
        *input = rest;
        if self.len < n {
            return None;
        }
        self.len = 0;
        Some(self.bytes)
    }
}

impl Block {
    fn add(&mut self, chunk: &[u8]) {
        self.newlines += count_newlines(chunk);
        self.bytes += chunk.len() as u64;
        let keep = chunk.len().min(self.tail.len());
        self.tail.rotate_left(keep);
        let at = self.tail.len() - keep;
        self.tail[at..].copy_from_slice(&chunk[chunk.len() - keep..]);
    }

    /// Rows = newlines before the terminator line, which must end the block on a line of its own.
    fn rows(&self) -> Option<u64> {
        let ends = self.bytes >= 5 && self.tail[1..] == TERMINATOR[..];
        let own_line = self.bytes == 5 || self.tail[0] == b'\n';
        (ends && own_line).then(|| self.newlines - 3)
    }
}

/// The newlines in `bytes`, counted in runs of 255 into one byte each, which the compiler turns
/// into vector code: counting into a `u64` per byte was 8 % of a dump's CPU time (the agent
/// reads every byte of the data to count rows).
fn count_newlines(bytes: &[u8]) -> u64 {
    bytes
        .chunks(255)
        .map(|run| u64::from(run.iter().map(|b| u8::from(*b == b'\n')).sum::<u8>()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Writes archives the way pg_dump does, for tests.
    struct Writer {
        out: Vec<u8>,
        minor: u8,
    }

    impl Writer {
        fn new(minor: u8, entries: usize) -> Writer {
            let mut w = Writer {
                out: b"PGDMP".to_vec(),
                minor,
            };
            w.out.extend_from_slice(&[1, minor, 0, 4, 8, FORMAT_CUSTOM]);
            if minor >= 15 {
                w.out.push(0);
            } else {
                w.int(0);
            }
            for v in [1, 2, 3, 4, 5, 125, 0] {
                w.int(v);
            }
            for s in ["app", "15.18", "15.18"] {
                w.string(Some(s.as_bytes()));
            }
            w.int(entries as i64);
            w
        }

        fn int(&mut self, v: i64) {
            self.out.push(u8::from(v < 0));
            self.out
                .extend_from_slice(&(v.unsigned_abs() as u32).to_le_bytes());
        }

        fn string(&mut self, s: Option<&[u8]>) {
            match s {
                Some(s) => {
                    self.int(s.len() as i64);
                    self.out.extend_from_slice(s);
                }
                None => self.int(-1),
            }
        }

        /// A TOC entry: (id, desc, namespace, tag, COPY statement, has data).
        fn entry(&mut self, id: i64, desc: &str, ns: &str, tag: &str, copy: &str, data: bool) {
            self.int(id);
            self.int(i64::from(data));
            for s in ["1259", "16384", tag, desc] {
                self.string(Some(s.as_bytes()));
            }
            self.int(2);
            for s in ["CREATE …;", "DROP …;", copy, ns, ""] {
                self.string(Some(s.as_bytes()));
            }
            if self.minor >= 14 {
                self.string(Some(b"heap"));
            }
            if self.minor >= 16 {
                self.int(i64::from(b'r'));
            }
            self.string(Some(b"postgres"));
            self.string(Some(b"false"));
            self.string(Some(b"7"));
            self.string(None);
            self.out.push(if data { 1 } else { 3 });
            self.out.extend_from_slice(&[0; 8]);
        }

        fn table(&mut self, id: i64, ns: &str, tag: &str, quoted: &str) {
            self.entry(id, "TABLE", ns, tag, "", false);
            let copy = format!("COPY {quoted} (a, b) FROM stdin;\n");
            self.entry(id + 1000, "TABLE DATA", ns, tag, &copy, true);
        }

        /// A table data block: `text` cut into chunks of `chunk` bytes, then the terminator.
        fn block(&mut self, id: i64, text: &[u8], chunk: usize) {
            self.out.push(BLK_DATA);
            self.int(id);
            let mut all = text.to_vec();
            all.extend_from_slice(TERMINATOR);
            for piece in all.chunks(chunk.max(1)) {
                self.int(piece.len() as i64);
                self.out.extend_from_slice(piece);
            }
            self.int(0);
        }

        fn blobs(&mut self, id: i64, objects: &[&[u8]]) {
            self.out.push(BLK_BLOBS);
            self.int(id);
            for (oid, body) in objects.iter().enumerate() {
                self.int(oid as i64 + 100);
                if !body.is_empty() {
                    self.int(body.len() as i64);
                    self.out.extend_from_slice(body);
                }
                self.int(0);
            }
            self.int(0);
        }
    }

    /// A row in COPY text: values escaped as PostgreSQL does, tab-separated, one newline.
    fn copy_row(values: &[String]) -> Vec<u8> {
        let escaped: Vec<String> = values
            .iter()
            .map(|v| {
                v.replace('\\', "\\\\")
                    .replace('\n', "\\n")
                    .replace('\r', "\\r")
                    .replace('\t', "\\t")
            })
            .collect();
        format!("{}\n", escaped.join("\t")).into_bytes()
    }

    fn count_in_pieces(archive: &[u8], piece: usize) -> Result<BTreeMap<String, u64>, FormatError> {
        let mut c = RowCounter::new();
        for p in archive.chunks(piece.max(1)) {
            if c.feed(p).is_err() {
                break;
            }
        }
        c.finish()
    }

    fn sample(minor: u8) -> Vec<u8> {
        let mut w = Writer::new(minor, 9);
        w.entry(1, "ENCODING", "", "ENCODING", "", false);
        w.table(10, "public", "t", "public.t");
        w.table(20, "Odd \"S", "select", "\"Odd \"\"S\".\"select\"");
        w.table(30, "public", "empty", "public.empty");
        // An extension's configuration table: data, but no TABLE entry of its own.
        w.entry(
            40,
            "TABLE DATA",
            "ext",
            "config",
            "COPY ext.config (a) FROM stdin;\n",
            true,
        );
        w.entry(50, "BLOBS", "", "BLOBS", "", true);
        w.block(1010, b"1\tx\\ny\n2\t\\\\.\n3\t\\N\n", 4);
        w.block(1020, b"a\\tb\tc\n", 100);
        w.block(1030, b"", 10);
        w.block(40, b"1\n2\n", 3);
        w.blobs(50, &[b"\\.\n\n\n\x00\xff", b""]);
        w.out
    }

    fn expected() -> BTreeMap<String, u64> {
        [
            ("public.t", 3),
            ("\"Odd \"\"S\".\"select\"", 1),
            ("public.empty", 0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn counts_rows_in_every_archive_version_and_any_piece_size() {
        for minor in OLDEST_MINOR..=NEWEST_MINOR {
            let archive = sample(minor);
            for piece in [1, 2, 3, 5, 7, 64, archive.len()] {
                assert_eq!(
                    count_in_pieces(&archive, piece),
                    Ok(expected()),
                    "1.{minor} in pieces of {piece}"
                );
            }
        }
    }

    #[test]
    fn a_table_without_columns_has_a_row_per_empty_line() {
        let mut w = Writer::new(14, 2);
        w.entry(1, "TABLE", "public", "e", "", false);
        w.entry(
            2,
            "TABLE DATA",
            "public",
            "e",
            "COPY public.e  FROM stdin;\n",
            true,
        );
        w.block(2, b"\n\n", 1);
        assert_eq!(
            count_in_pieces(&w.out, 3),
            Ok([("public.e".to_string(), 2)].into_iter().collect())
        );
    }

    #[test]
    fn an_archive_without_tables_has_no_counts() {
        let w = Writer::new(15, 0);
        assert_eq!(count_in_pieces(&w.out, 1), Ok(BTreeMap::new()));
    }

    /// An archive of table `public.t` (dump id 1) whose data entry (dump id 2) has `copy` as
    /// its COPY statement; its data block is the caller's to write.
    fn table_t_with_data(copy: &str) -> Writer {
        let mut w = Writer::new(14, 2);
        w.entry(1, "TABLE", "public", "t", "", false);
        w.entry(2, "TABLE DATA", "public", "t", copy, true);
        w
    }

    /// Each broken archive fails with a message naming what is wrong.
    #[test]
    fn malformed_archives_are_errors() {
        let good = sample(14);
        let unterminated = {
            let mut w = table_t_with_data("COPY public.t (a) FROM stdin;\n");
            w.out.push(BLK_DATA);
            w.int(2);
            w.int(2);
            w.out.extend_from_slice(b"1\n");
            w.int(0);
            w.out
        };
        let renamed = {
            let mut w = table_t_with_data("COPY public.u (a) FROM stdin;\n");
            w.block(2, b"", 1);
            w.out
        };
        let mut compressed = Writer::new(15, 0).out;
        compressed[11] = 1;
        let mut newer = good.clone();
        newer[6] = NEWEST_MINOR + 1;
        let mut other_block = good.clone();
        let first_block = good.len() - 5; // the BLOBS block's end marker, not a block type
        other_block.truncate(first_block);
        other_block.extend_from_slice(&[BLK_DATA, 0, 99, 0, 0, 0]);
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "ended inside the header"),
            ("not an archive", b"PGDMQ".to_vec(), "no PGDMP magic"),
            ("newer version", newer, "archive version 1.17"),
            ("compressed", compressed, "compressed"),
            (
                "truncated TOC",
                good[..200].to_vec(),
                "ended inside the header",
            ),
            (
                "truncated data",
                good[..good.len() - 1].to_vec(),
                "inside a data block",
            ),
            ("missing block", good[..good.len() - 60].to_vec(), ""),
            ("unknown block", other_block, ""),
            ("no terminator", unterminated, "COPY terminator"),
            ("other table", renamed, "another table"),
        ];
        for (what, archive, message) in cases {
            let err = count_in_pieces(&archive, 5).expect_err(what);
            assert!(err.to_string().contains(message), "{what}: {err}");
        }
    }

    #[test]
    fn copy_statements_name_tables_as_percent_i_does() {
        let ok = [
            ("COPY public.t (a) FROM stdin;\n", "public", "t", "public.t"),
            (
                "COPY \"A\".\"b.c\" (a) FROM stdin;\n",
                "A",
                "b.c",
                "\"A\".\"b.c\"",
            ),
            (
                "COPY s.\"x\"\"y\"  FROM stdin;\n",
                "s",
                "x\"y",
                "s.\"x\"\"y\"",
            ),
        ];
        for (stmt, ns, tag, want) in ok {
            assert_eq!(
                copy_target(stmt.as_bytes(), ns.as_bytes(), tag.as_bytes()).as_deref(),
                Ok(want)
            );
        }
        let bad = [
            ("INSERT INTO public.t", "public", "t"),
            ("COPY t (a) FROM stdin;", "public", "t"),
            ("COPY public.\"t (a)", "public", "t"),
            ("COPY public.", "public", ""),
            ("COPY public.t", "public", "t"),
        ];
        for (stmt, ns, tag) in bad {
            assert!(
                copy_target(stmt.as_bytes(), ns.as_bytes(), tag.as_bytes()).is_err(),
                "{stmt}"
            );
        }
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9 ]{0,12}",
            "[\\\\\\n\\r\\t.a]{0,8}",
            Just("\\.".to_string()),
            any::<String>(),
        ]
    }

    proptest! {
        /// Whatever the values and however pg_dump cut its chunks and the pipe its reads,
        /// the rows counted are the rows written.
        #[test]
        fn counts_equal_rows_written(
            tables in proptest::collection::vec(
                (proptest::collection::vec(proptest::collection::vec(value(), 1..4), 0..20), 1usize..50),
                0..5),
            minor in OLDEST_MINOR..=NEWEST_MINOR,
            piece in 1usize..300,
        ) {
            let mut w = Writer::new(minor, tables.len() * 2);
            for t in 0..tables.len() {
                w.table(t as i64 + 1, "public", &format!("t{t}"), &format!("public.t{t}"));
            }
            let mut want = BTreeMap::new();
            for (t, (rows, chunk)) in tables.iter().enumerate() {
                let text: Vec<u8> = rows.iter().flat_map(|r| copy_row(r)).collect();
                w.block(t as i64 + 1001, &text, *chunk);
                want.insert(format!("public.t{t}"), rows.len() as u64);
            }
            prop_assert_eq!(count_in_pieces(&w.out, piece), Ok(want));
        }

        /// The vectorised count is the plain one, over runs of newlines longer than a
        /// byte's range and over any length.
        #[test]
        fn newlines_are_counted_as_one_by_one(
            bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..2000),
        ) {
            let plain = bytes.iter().filter(|b| **b == b'\n').count() as u64;
            prop_assert_eq!(count_newlines(&bytes), plain);
            prop_assert_eq!(count_newlines(&vec![b'\n'; bytes.len()]), bytes.len() as u64);
        }

        /// A slice's rows in `COPY` text, in any pieces: a row per line, and a slice that ends
        /// inside a line is refused.
        #[test]
        fn a_slice_counts_its_lines(
            rows in proptest::collection::vec(proptest::collection::vec(value(), 1..4), 0..30),
            piece in 1usize..64,
        ) {
            let text: Vec<u8> = rows.iter().flat_map(|r| copy_row(r)).collect();
            let mut counter = RowCounter::copy_lines("s.t");
            for chunk in text.chunks(piece) {
                prop_assert!(counter.feed(chunk).is_ok());
            }
            let want = BTreeMap::from([("s.t".to_string(), rows.len() as u64)]);
            prop_assert_eq!(counter.finish(), Ok(want));
            // Cut inside the last line (unless that line is an empty row: then it is a row
            // fewer, which the manifest's count finds).
            let cut = &text[..text.len().saturating_sub(1)];
            if cut.last().is_some_and(|b| *b != b'\n') {
                let mut counter = RowCounter::copy_lines("s.t");
                prop_assert!(counter.feed(cut).is_ok());
                prop_assert!(counter.finish().is_err());
            }
        }

        /// Arbitrary bytes never panic, and the outcome does not depend on how they arrive.
        #[test]
        fn any_input_gives_the_same_outcome_in_any_pieces(
            data in proptest::collection::vec(any::<u8>(), 0..400),
            piece in 1usize..64,
        ) {
            prop_assert_eq!(count_in_pieces(&data, data.len()), count_in_pieces(&data, piece));
        }

        /// A valid archive with bytes flipped never panics; pieces do not change the outcome.
        #[test]
        fn corrupted_archives_never_panic(at in 0usize..2000, byte in any::<u8>(), piece in 1usize..64) {
            let mut archive = sample(16);
            let at = at % archive.len();
            archive[at] = byte;
            prop_assert_eq!(count_in_pieces(&archive, archive.len()), count_in_pieces(&archive, piece));
        }
    }
}
