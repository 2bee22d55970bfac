//! Timestamp parsing and the window check, at any value.
#![no_main]

use std::time::Duration;

use hourglass::Granularity;
use hourglass::pure::{TimeWindow, parse_timestamp_ms, parse_timestamp_str};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: (&str, i64, i64, u64, u64)| {
    let (text, ms, now, age, future) = data;
    let window = TimeWindow {
        max_age: Duration::from_secs(age),
        max_future: Duration::from_secs(future),
    };
    for ts in [parse_timestamp_str(text).ok(), Some(parse_timestamp_ms(ms))]
        .into_iter()
        .flatten()
    {
        if let Ok(accepted) = window.check(ts, now) {
            assert_eq!(accepted, ts);
        }
        for g in [Granularity::Minute, Granularity::Hour] {
            let start = g.bucket_start(ts);
            assert!(start <= ts && i64::from(g.offset(ts)) < g.seconds());
        }
    }
});
