//! Line-protocol bodies: never a panic; every line is either taken or
//! refused with its number; whatever is taken obeys every rule; and the
//! parser agrees with itself on a line cut out of the body.
#![no_main]

use bumpalo::Bump;
use hourglass::pure::{Line, Lines, Precision, decode_line_protocol, parse_line};
use hourglass_fuzz::{MAX_READINGS, assert_accepted, context};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ctx = context();
    let tags = ["sensor".to_owned(), "host".to_owned()];
    let lines = Lines::new(data).count();
    let arena = Bump::new();
    for precision in [Precision::Nanoseconds, Precision::Seconds, Precision::Hours] {
        let Ok(d) = decode_line_protocol(data, precision, &ctx, &tags, &arena) else {
            continue;
        };
        assert_eq!(d.lines + d.refused, lines);
        let readings = d.readings();
        assert!(readings.len() <= MAX_READINGS);
        let mut last = 0;
        for e in &d.errors {
            assert!(e.line > last && !e.reason.is_empty());
            last = e.line;
        }
        for r in &readings {
            assert_accepted(r);
            // Line protocol's own separators never reach a sensor's name.
            assert!(!r.sensor.as_str().contains([' ', ',']));
        }
        for set in &d.labels {
            assert!(
                set.labels()
                    .iter()
                    .all(|(k, v)| !k.is_empty() && !v.is_empty())
            );
            // Only sensors with a reading taken carry labels.
            assert!(readings.iter().any(|r| r.sensor == *set.sensor()));
        }
    }
    // A line parses the same alone as within its body.
    let mut a = Line::default();
    for (_, bytes) in Lines::new(data) {
        let alone = bytes.to_vec();
        let mut b = Line::default();
        let first = parse_line(bytes, &mut a).map(|()| (a.fields.len(), a.tags.len(), a.timestamp));
        let second =
            parse_line(&alone, &mut b).map(|()| (b.fields.len(), b.tags.len(), b.timestamp));
        assert_eq!(first, second);
    }
});
