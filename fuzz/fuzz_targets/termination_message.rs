//! The operator's reading of a backup Job's termination message
//! (`dbop_contract::parse_termination_message`) on arbitrary text — a log tail under
//! `FallbackToLogsOnError`, a truncated or hostile line — and the agent's writing of it
//! (`to_summary_line`): no panic; a summary line fits the 4 KiB limit and reads back.
#![no_main]

use dbop_contract::result::MAX_SUMMARY_BYTES;
use dbop_contract::{BackupResult, Outcome, parse_termination_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(result) = parse_termination_message(&text) {
        check_summary(&result);
    }
    // The same text as the agent's own message, of either outcome.
    for outcome in [Outcome::Succeeded, Outcome::Failed] {
        check_summary(&BackupResult {
            outcome,
            message: Some(text.to_string()),
            backup_id: Some(text.chars().take(64).collect()),
            ..BackupResult::default()
        });
    }
});

fn check_summary(result: &BackupResult) {
    let line = result.to_summary_line();
    assert!(line.len() <= MAX_SUMMARY_BYTES, "{} bytes", line.len());
    let back = parse_termination_message(&line).expect("a summary line reads back");
    assert_eq!(back.outcome, result.outcome);
    assert_eq!(back.operation, result.operation);
}
