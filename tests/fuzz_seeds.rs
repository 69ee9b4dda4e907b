//! The fuzz targets' inputs on the stable toolchain: the checked-in seeds (`fuzz/seeds/`, which
//! include every input a fuzz run found a fault with) and the local corpus a `make fuzz` left,
//! through the same checks as the `termination_message` and `units` targets (the manifest's are
//! in `backups/tests/fuzz_seeds.rs`). So a fixed fault stays fixed under `make test`, which needs
//! no nightly.

use std::path::{Path, PathBuf};

use dbop::resources::quantity;
use dbop_contract::result::MAX_SUMMARY_BYTES;
use dbop_contract::units::{format_duration, parse_duration, parse_size};
use dbop_contract::{BackupResult, Outcome, parse_termination_message};

/// The inputs of one target: its seeds (at least `min` of them) and its local corpus, if any.
fn inputs(target: &str, min: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let read = |dir: PathBuf| -> Vec<(PathBuf, Vec<u8>)> {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return vec![];
        };
        entries
            .map(|e| e.expect("a readable entry").path())
            .map(|p| (p.clone(), std::fs::read(&p).expect("a readable input")))
            .collect()
    };
    let seeds = read(root.join("seeds").join(target));
    assert!(
        seeds.len() >= min,
        "fuzz/seeds/{target} has {} inputs",
        seeds.len()
    );
    let mut all = seeds;
    all.extend(read(root.join("corpus").join(target)));
    all
}

fn check_summary(result: &BackupResult) {
    let line = result.to_summary_line();
    assert!(line.len() <= MAX_SUMMARY_BYTES, "{} bytes", line.len());
    let back = parse_termination_message(&line).expect("a summary line reads back");
    assert_eq!(back.outcome, result.outcome);
    assert_eq!(back.operation, result.operation);
}

#[test]
fn termination_message_inputs_replay() {
    let inputs = inputs("termination_message", 5);
    let mut read = 0;
    for (_, data) in &inputs {
        let text = String::from_utf8_lossy(data);
        if let Some(result) = parse_termination_message(&text) {
            read += 1;
            check_summary(&result);
        }
        for outcome in [Outcome::Succeeded, Outcome::Failed] {
            check_summary(&BackupResult {
                outcome,
                message: Some(text.to_string()),
                backup_id: Some(text.chars().take(64).collect()),
                ..BackupResult::default()
            });
        }
    }
    println!(
        "{} termination-message inputs replayed, {read} read as a result",
        inputs.len()
    );
    assert!(read >= 3, "the seeds hold results that must read");
}

#[test]
fn duration_and_size_inputs_replay() {
    let inputs = inputs("units", 10);
    for (path, data) in &inputs {
        let Ok(text) = std::str::from_utf8(data) else {
            continue;
        };
        match parse_duration(text) {
            Ok(d) => {
                let formatted = format_duration(d);
                assert_eq!(parse_duration(&formatted), Ok(d), "{path:?}: {formatted}");
            }
            Err(message) => assert!(!message.is_empty(), "{path:?}"),
        }
        if let Err(message) = parse_size(text) {
            assert!(!message.is_empty(), "{path:?}");
        }
        let _ = quantity::bytes(text);
    }
    println!("{} duration/size inputs replayed", inputs.len());
}
