//! The `manifest` fuzz target's inputs on the stable toolchain: the checked-in seeds
//! (`fuzz/seeds/manifest`, which include every input a fuzz run found a fault with) and the local
//! corpus a `make fuzz` left, through the same check: no panic, and an accepted manifest
//! survives a round trip; and the `archive` target's the same way. So a fixed fault stays fixed
//! under `make test`.

use std::path::Path;

use dbop_backup::Manifest;

#[test]
fn manifest_inputs_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut inputs = vec![];
    for dir in ["seeds/manifest", "corpus/manifest"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a readable entry").path();
            inputs.push((
                path.clone(),
                std::fs::read(&path).expect("a readable input"),
            ));
        }
    }
    assert!(inputs.len() >= 5, "fuzz/seeds/manifest has too few inputs");
    let mut accepted = 0;
    for (path, data) in &inputs {
        match Manifest::parse(data) {
            Ok(m) => {
                accepted += 1;
                assert_eq!(Manifest::parse(&m.to_json()).as_ref(), Ok(&m), "{path:?}");
            }
            Err(message) => assert!(!message.is_empty(), "{path:?}"),
        }
    }
    println!(
        "{} manifest inputs replayed, {accepted} accepted",
        inputs.len()
    );
    assert!(accepted >= 1, "the valid seed must be accepted");
}

/// The `archive` fuzz target's inputs (real pg_dump archives and broken ones) through the same
/// check: no panic, and the outcome does not depend on how the bytes arrive. The valid
/// archives must be counted.
#[test]
fn archive_inputs_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut counted = 0;
    let mut inputs = 0;
    for dir in ["seeds/archive", "corpus/archive"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a readable entry").path();
            let data = std::fs::read(&path).expect("a readable input");
            let whole = count_archive(&data, data.len());
            for piece in [1, 3, 64] {
                assert_eq!(
                    count_archive(&data, piece),
                    whole,
                    "{path:?} in pieces of {piece}"
                );
            }
            inputs += 1;
            counted += usize::from(whole.is_ok());
        }
    }
    assert!(inputs >= 5, "fuzz/seeds/archive has too few inputs");
    assert!(counted >= 3, "the valid pg_dump archives must be counted");
}

fn count_archive(
    data: &[u8],
    piece: usize,
) -> Result<std::collections::BTreeMap<String, u64>, dbop_backup::archive::FormatError> {
    let mut counter = dbop_backup::archive::RowCounter::new();
    for p in data.chunks(piece.max(1)) {
        if counter.feed(p).is_err() {
            break;
        }
    }
    counter.finish()
}
