//! The backup agent's archive row counter (`backups/src/archive/`) on arbitrary bytes, as pg_dump
//! (or anything else) might write them: no panic, and the outcome (counts or error) does not
//! depend on how the bytes are cut into pieces (one byte at a time, a few, or all at once).
//!
//! The module is std-only and compiled from its source files, so the fuzz build does not
//! instrument the whole agent.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../backups/src/archive/mod.rs"]
#[allow(dead_code)]
mod archive;

fn count(data: &[u8], piece: usize) -> Result<std::collections::BTreeMap<String, u64>, archive::FormatError> {
    let mut counter = archive::RowCounter::new();
    for p in data.chunks(piece.max(1)) {
        if counter.feed(p).is_err() {
            break;
        }
    }
    counter.finish()
}

fuzz_target!(|data: &[u8]| {
    let whole = count(data, data.len());
    for piece in [1, 3, 64] {
        assert_eq!(count(data, piece), whole, "in pieces of {piece}");
    }
});
