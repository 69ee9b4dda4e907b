//! The backup agent's manifest parser (`backups/src/manifest.rs`) on arbitrary bytes, as read back
//! from object storage before a restore or verify: no panic, and what it accepts survives a
//! round trip through `to_json`.
//!
//! The module is compiled from its source file rather than through the `dbop-backup` crate, so
//! the fuzz build does not instrument the whole AWS SDK the agent links; it only needs the
//! contract's `result` module at the path the manifest names it by.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod result {
    pub use dbop_contract::result::*;
}

#[path = "../../backups/src/manifest.rs"]
#[allow(dead_code)]
mod manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = manifest::Manifest::parse(data) {
        let again = manifest::Manifest::parse(&m.to_json()).expect("a parsed manifest re-parses");
        assert_eq!(again, m);
        let mut result = dbop_contract::BackupResult::default();
        m.fill_result(&mut result);
    }
});
