//! A streaming reader of the tar archives `pg_basebackup -Ft` writes (ustar: regular files,
//! directories, symbolic links; names of at most 255 bytes with the ustar prefix): bytes are
//! pushed in pieces of any size and a `Visitor` is told of each entry and its data. The base
//! backup reads `backup_label` and `backup_manifest` out of the stream on its way to S3
//! (`Capture`); the restore writes the entries into the data directory (`base_store`).
//!
//! Pure: no file system. Anything else (pax or GNU long-name headers, a bad header checksum,
//! an absolute or `..` path, data after the end of the archive) is refused with a message.

/// What one entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// One archive entry's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative, `/`-separated, no `.`/`..` components, no trailing `/`.
    pub path: String,
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    /// A symbolic link's target.
    pub link: String,
}

/// Told of each entry, then of its data in pieces (regular files only).
pub trait Visitor {
    fn entry(&mut self, entry: &Entry) -> Result<(), String>;
    fn data(&mut self, data: &[u8]) -> Result<(), String>;
}

const BLOCK: usize = 512;

/// The push parser.
#[derive(Debug, Default)]
pub struct Parser {
    block: Vec<u8>,
    remaining: u64,
    padding: u64,
    zero_blocks: u8,
    entries: u64,
}

fn field(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    &b[..end]
}

/// An octal number field, or base-256 when its first byte has the high bit set (large sizes).
fn number(b: &[u8]) -> Result<u64, String> {
    if b.first().is_some_and(|c| c & 0x80 != 0) {
        let mut n: u64 = u64::from(b[0] & 0x7f);
        for c in &b[1..] {
            n = n
                .checked_mul(256)
                .and_then(|n| n.checked_add(u64::from(*c)))
                .ok_or("a number field overflows")?;
        }
        return Ok(n);
    }
    let text = String::from_utf8_lossy(field(b));
    let text = text.trim_matches([' ', '\0']);
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| format!("bad octal field {text:?}"))
}

/// A name relative to the archive's root, checked: no absolute path, no `..`.
fn clean_path(raw: &str) -> Result<String, String> {
    let parts: Vec<&str> = raw
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if raw.starts_with('/') || parts.contains(&"..") || parts.is_empty() {
        return Err(format!(
            "the archive holds an entry named {raw:?} (absolute, '..' or empty)"
        ));
    }
    Ok(parts.join("/"))
}

/// Parses one non-zero header block.
pub fn parse_header(h: &[u8]) -> Result<Entry, String> {
    if h.len() != BLOCK {
        return Err("a header block must have 512 bytes".into());
    }
    let stored = number(&h[148..156])?;
    let sum: u64 = h
        .iter()
        .enumerate()
        .map(|(i, b)| u64::from(if (148..156).contains(&i) { b' ' } else { *b }))
        .sum();
    if stored != sum {
        return Err(format!(
            "a header's checksum is {stored}, its bytes sum to {sum} (not a tar archive, or corrupted)"
        ));
    }
    let name = String::from_utf8_lossy(field(&h[..100])).to_string();
    let prefix = if &h[257..262] == b"ustar" {
        String::from_utf8_lossy(field(&h[345..500])).to_string()
    } else {
        String::new()
    };
    let full = if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    };
    let kind = match h[156] {
        b'0' | 0 => Kind::File,
        b'5' => Kind::Dir,
        b'2' => Kind::Symlink,
        t => {
            return Err(format!(
                "entry {full:?} has tar type {:?}, which a base backup does not use",
                t as char
            ));
        }
    };
    let size = number(&h[124..136])?;
    Ok(Entry {
        path: clean_path(&full)?,
        kind,
        mode: u32::try_from(number(&h[100..108])?).unwrap_or(0) & 0o7777,
        size: if kind == Kind::File { size } else { 0 },
        link: String::from_utf8_lossy(field(&h[157..257])).to_string(),
    })
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Entries seen so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Takes the next bytes of the archive.
    pub fn feed(&mut self, mut data: &[u8], v: &mut impl Visitor) -> Result<(), String> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = data
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                v.data(&data[..n])?;
                self.remaining -= n as u64;
                data = &data[n..];
            } else if self.padding > 0 {
                let n = data.len().min(self.padding as usize);
                self.padding -= n as u64;
                data = &data[n..];
            } else {
                let n = data.len().min(BLOCK - self.block.len());
                self.block.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.block.len() == BLOCK {
                    let block = std::mem::take(&mut self.block);
                    self.header(&block, v)?;
                }
            }
        }
        Ok(())
    }

    fn header(&mut self, block: &[u8], v: &mut impl Visitor) -> Result<(), String> {
        let zero = block.iter().all(|b| *b == 0);
        if self.zero_blocks > 0 {
            // After the end-of-archive marker only zero padding may follow.
            return if zero {
                self.zero_blocks = self.zero_blocks.saturating_add(1);
                Ok(())
            } else {
                Err("data after the end of the archive".into())
            };
        }
        if zero {
            self.zero_blocks = 1;
            return Ok(());
        }
        let entry = parse_header(block)?;
        v.entry(&entry)?;
        self.entries += 1;
        self.remaining = entry.size;
        self.padding = (BLOCK as u64 - entry.size % BLOCK as u64) % BLOCK as u64;
        Ok(())
    }

    /// The end of the bytes: the archive must have ended there (no entry cut short).
    pub fn finish(&self) -> Result<(), String> {
        if self.remaining > 0 || self.padding > 0 || !self.block.is_empty() {
            return Err("the archive is truncated (it ends inside an entry)".into());
        }
        if self.zero_blocks == 0 {
            return Err("the archive is truncated (no end-of-archive marker)".into());
        }
        Ok(())
    }
}

/// Keeps the contents of the named files (each at most `limit` bytes) and counts the rest.
#[derive(Debug)]
pub struct Capture {
    names: Vec<String>,
    limit: usize,
    current: Option<usize>,
    /// The captured files, in the order of `names`.
    pub files: Vec<Option<Vec<u8>>>,
    pub file_count: u64,
}

impl Capture {
    pub fn new(names: &[&str], limit: usize) -> Capture {
        Capture {
            names: names.iter().map(|n| n.to_string()).collect(),
            limit,
            current: None,
            files: vec![None; names.len()],
            file_count: 0,
        }
    }
}

impl Visitor for Capture {
    fn entry(&mut self, entry: &Entry) -> Result<(), String> {
        self.current = None;
        if entry.kind != Kind::File {
            return Ok(());
        }
        self.file_count += 1;
        if let Some(i) = self.names.iter().position(|n| *n == entry.path) {
            if entry.size > self.limit as u64 {
                return Err(format!(
                    "{} has {} bytes, more than the {} expected",
                    entry.path, entry.size, self.limit
                ));
            }
            self.files[i] = Some(Vec::with_capacity(entry.size as usize));
            self.current = Some(i);
        }
        Ok(())
    }

    fn data(&mut self, data: &[u8]) -> Result<(), String> {
        if let Some(buf) = self.current.and_then(|i| self.files[i].as_mut()) {
            buf.extend_from_slice(data);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ustar header as PostgreSQL writes one.
    pub(crate) fn header(name: &str, kind: u8, size: u64, link: &str) -> Vec<u8> {
        let mut h = vec![0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000600");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    /// An archive of `(name, contents)` files and one directory, with its end marker.
    pub(crate) fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = header("global/", b'5', 0, "");
        for (name, data) in files {
            out.extend(header(name, b'0', data.len() as u64, ""));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        out.extend(vec![0u8; 2 * BLOCK]);
        out
    }

    #[test]
    fn captures_named_files_whatever_the_piece_size() {
        let label = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n".to_vec();
        let big = vec![7u8; 1500];
        let tar = archive(&[
            ("backup_label", &label),
            ("base/1/1259", &big),
            ("backup_manifest", b"{}"),
        ]);
        for piece in [1, 7, 511, 512, 513, 4096, tar.len()] {
            let mut p = Parser::new();
            let mut c = Capture::new(&["backup_label", "backup_manifest"], 1 << 20);
            for chunk in tar.chunks(piece) {
                p.feed(chunk, &mut c).unwrap();
            }
            p.finish().unwrap();
            assert_eq!(c.files[0].as_deref(), Some(label.as_slice()), "{piece}");
            assert_eq!(c.files[1].as_deref(), Some(b"{}".as_slice()));
            assert_eq!((c.file_count, p.entries()), (3, 4));
        }
    }

    #[test]
    fn refuses_truncation_corruption_and_escaping_paths() {
        let tar = archive(&[("a", b"hello")]);
        let run = |bytes: &[u8]| -> Result<(), String> {
            let mut p = Parser::new();
            let mut c = Capture::new(&[], 10);
            p.feed(bytes, &mut c)?;
            p.finish()
        };
        run(&tar).unwrap();
        assert!(run(&tar[..BLOCK + 3]).unwrap_err().contains("truncated"));
        assert!(run(&tar[..2 * BLOCK]).unwrap_err().contains("truncated"));
        let mut bad = tar.clone();
        bad[BLOCK + 3] ^= 1;
        assert!(run(&bad).unwrap_err().contains("checksum"));
        let mut after = tar.clone();
        after.extend(header("b", b'0', 0, ""));
        assert!(run(&after).unwrap_err().contains("after the end"));
        for name in ["/etc/passwd", "base/../../x", ".."] {
            let e = parse_header(&header(name, b'0', 0, "")).unwrap_err();
            assert!(e.contains("absolute"), "{name}: {e}");
        }
        let e = parse_header(&header("x", b'x', 0, "")).unwrap_err();
        assert!(e.contains("tar type"), "{e}");
        let l = parse_header(&header("pg_tblspc/16384", b'2', 0, "/srv/ts")).unwrap();
        assert_eq!((l.kind, l.link.as_str()), (Kind::Symlink, "/srv/ts"));
        let d = parse_header(&header("./pg_wal/", b'5', 0, "")).unwrap();
        assert_eq!((d.kind, d.path.as_str()), (Kind::Dir, "pg_wal"));
    }

    #[test]
    fn reads_large_sizes_in_base_256_and_refuses_a_too_large_capture() {
        let mut f = [0u8; 12];
        f[0] = 0x80;
        f[7] = 2; // 2 << 32
        assert_eq!(number(&f).unwrap(), 2 << 32);
        assert_eq!(number(b"00000000012\0").unwrap(), 10);
        let mut c = Capture::new(&["backup_manifest"], 1);
        let e = c
            .entry(&parse_header(&header("backup_manifest", b'0', 2, "")).unwrap())
            .unwrap_err();
        assert!(e.contains("more than"), "{e}");
    }
}
