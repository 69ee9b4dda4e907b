//! The duration and size parsers of the contract (`30d`, `1h30m`, `8MiB`), which read what users
//! write in `spec.backup` and what the operator passes the agent, and the operator's storage
//! quantity reader (`src/resources/quantity.rs`, `10Gi`, `1.5G`, `1e9`): no panic, no overflow,
//! and a parsed duration survives `format_duration`.
#![no_main]

use dbop_contract::units::{format_duration, parse_duration, parse_size};
use libfuzzer_sys::fuzz_target;

#[path = "../../src/resources/quantity.rs"]
mod quantity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(text) {
        let formatted = format_duration(d);
        assert_eq!(
            parse_duration(&formatted),
            Ok(d),
            "{text:?} -> {formatted:?}"
        );
    } else if let Err(message) = parse_duration(text) {
        assert!(!message.is_empty());
    }
    if let Err(message) = parse_size(text) {
        assert!(!message.is_empty());
    }
    let _ = quantity::bytes(text);
});
