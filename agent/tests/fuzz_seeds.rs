//! The `manifest` fuzz target's inputs on the stable toolchain: the checked-in seeds
//! (`fuzz/seeds/manifest`, which include every input a fuzz run found a fault with) and the local
//! corpus a `make fuzz` left, through the same check: no panic, and an accepted manifest
//! survives a round trip. So a fixed fault stays fixed under `make test`.

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
