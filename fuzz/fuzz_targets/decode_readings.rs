//! HTTP bodies: never a panic; whatever is accepted obeys every rule.
#![no_main]

use hourglass::pure::decode_readings;
use hourglass_fuzz::{MAX_READINGS, assert_accepted, context};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(readings) = decode_readings(data, &context()) {
        assert!(readings.len() <= MAX_READINGS);
        readings.iter().for_each(assert_accepted);
    }
});
