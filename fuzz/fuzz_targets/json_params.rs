//! The JSON API's query strings (group routes: sensor globs, label filters,
//! metric, grouping, time zone, step, instants), read as the routes read
//! them, the glob matched against sensor ids: never a panic, and a glob
//! matches only ids it could match.
#![no_main]

use hourglass::pure::check_group_params;
use libfuzzer_sys::fuzz_target;

const IDS: [&str; 6] = [
    "s1",
    "hall-2.07",
    "a:b_c-d",
    "truck-17",
    "truck-17.gps",
    "x",
];

fuzz_target!(|raw: &str| {
    if let Ok(n) = check_group_params(raw, &IDS) {
        assert!(n <= IDS.len());
    }
});
