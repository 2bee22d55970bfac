//! CSV bodies (POST /api/v1/readings as text/csv, and import files): never
//! a panic; whatever is accepted obeys every rule.
#![no_main]

use hourglass::pure::{CsvFormat, decode_csv};
use hourglass_fuzz::{MAX_READINGS, assert_accepted, context};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ctx = context();
    let formats = [
        CsvFormat::default(),
        CsvFormat {
            mapping: vec![
                ("sensor".into(), "device".into()),
                ("value".into(), "v".into()),
            ],
            ignore: vec!["note".into()],
            ..CsvFormat::default()
        },
    ];
    for format in &formats {
        if let Ok(readings) = decode_csv(data, format, &ctx) {
            assert!(readings.len() <= MAX_READINGS);
            readings.iter().for_each(assert_accepted);
        }
    }
});
