//! The table a `TABLE DATA` entry's `COPY` statement names, as pg_dump quoted it, checked
//! against the entry's namespace and tag. Pure, std only, like the rest of `archive`.

use super::{FormatError, bad};

/// `COPY schema.table (…) FROM stdin;` → `schema.table` as written, checked against the
/// entry's namespace and tag.
pub fn copy_target(copy_stmt: &[u8], namespace: &[u8], tag: &[u8]) -> Result<String, FormatError> {
    let Some(rest) = copy_stmt.strip_prefix(b"COPY ") else {
        return bad("a table's data is not a COPY");
    };
    let schema = identifier(rest)?;
    let Some(rest) = schema.rest.strip_prefix(b".") else {
        return bad("a COPY statement without a schema");
    };
    let table = identifier(rest)?;
    if !table.rest.starts_with(b" ") {
        return bad("a COPY statement that does not end its table name");
    }
    if schema.value != namespace || table.value != tag {
        return bad("a COPY statement naming another table than its entry");
    }
    let mut name = schema.written.to_vec();
    name.push(b'.');
    name.extend_from_slice(table.written);
    String::from_utf8(name).map_err(|_| FormatError("a table name that is not UTF-8".into()))
}

/// An identifier at the start of a statement.
struct Ident<'a> {
    /// As written (quoted or not).
    written: &'a [u8],
    value: Vec<u8>,
    /// What follows it.
    rest: &'a [u8],
}

/// The identifier at the start of `s`, quoted (`""` is a quote) or not.
fn identifier(s: &[u8]) -> Result<Ident<'_>, FormatError> {
    if s.first() == Some(&b'"') {
        let mut value = Vec::new();
        let mut i = 1;
        loop {
            match (s.get(i), s.get(i + 1)) {
                (Some(b'"'), Some(b'"')) => {
                    value.push(b'"');
                    i += 2;
                }
                (Some(b'"'), _) => {
                    let (written, rest) = s.split_at(i + 1);
                    return Ok(Ident {
                        written,
                        value,
                        rest,
                    });
                }
                (Some(b), _) => {
                    value.push(*b);
                    i += 1;
                }
                (None, _) => return bad("an unterminated quoted identifier"),
            }
        }
    }
    let end = s
        .iter()
        .position(|b| *b == b'.' || *b == b' ')
        .unwrap_or(s.len());
    if end == 0 {
        return bad("an empty identifier");
    }
    let (written, rest) = s.split_at(end);
    Ok(Ident {
        written,
        value: written.to_vec(),
        rest,
    })
}
