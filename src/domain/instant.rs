//! RFC 3339 text to and from epoch time, with `jiff` (the one date-time
//! crate; it also does the time zones and calendar steps of queries).
//!
//! jiff parses the wider Temporal grammar (no seconds, a space for `T`,
//! offsets without a colon or with seconds, bracketed time zones); readings
//! and API parameters take RFC 3339 only, so its shape is checked first.

use jiff::Timestamp;

/// Whether `s` has RFC 3339's `date-time` shape: `YYYY-MM-DD`, `T` (or
/// `t`), `hh:mm:ss`, an optional fraction of 1 to 9 digits, then `Z` (or
/// `z`) or `±hh:mm`. The values' ranges are jiff's to check.
fn rfc3339_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let head = digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && b.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(b.get(10), Some(b'T' | b't'))
        && digits(11..13)
        && b.get(13) == Some(&b':')
        && digits(14..16)
        && b.get(16) == Some(&b':')
        && digits(17..19);
    if !head {
        return false;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let n = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
        if !(1..=9).contains(&n) {
            return false;
        }
        i += 1 + n;
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
}

/// An RFC 3339 timestamp, or `None` if `s` is not one.
pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    if !rfc3339_shaped(s) {
        return None;
    }
    s.parse::<Timestamp>().ok()
}

/// An RFC 3339 timestamp in whole epoch seconds, rounding down.
pub fn rfc3339_secs(s: &str) -> Option<i64> {
    let t = parse_rfc3339(s)?;
    i64::try_from(t.as_nanosecond().div_euclid(1_000_000_000)).ok()
}

/// An RFC 3339 timestamp in whole epoch milliseconds, rounding down.
pub fn rfc3339_ms(s: &str) -> Option<i64> {
    let t = parse_rfc3339(s)?;
    i64::try_from(t.as_nanosecond().div_euclid(1_000_000)).ok()
}

/// Epoch milliseconds as RFC 3339 in UTC (`…Z`, a fraction only when not
/// whole seconds); `None` outside the years 0000 to 9999.
pub fn format_ms(ms: i64) -> Option<String> {
    let t = Timestamp::from_millisecond(ms).ok()?;
    (t.as_second() >= YEAR_ZERO).then(|| t.to_string())
}

/// Epoch seconds as RFC 3339 in UTC; `None` outside the years 0000 to 9999.
pub fn format_secs(secs: i64) -> Option<String> {
    let t = Timestamp::from_second(secs).ok()?;
    (secs >= YEAR_ZERO).then(|| t.to_string())
}

/// 0000-01-01T00:00:00Z: RFC 3339 has no years before it.
const YEAR_ZERO: i64 = -62_167_219_200;
/// The last whole second the date-time library holds (late on 9999-12-30:
/// it keeps slack for offsets within the year 9999), in milliseconds.
const LAST_MS: i64 = 253_402_207_200_000;

/// `ms` if it lies in the years 0000 to 9999, the instants an answer can
/// write: every instant a request gives passes here, so no arithmetic on
/// it (minutes, hours, a range's seconds in milliseconds) overflows.
pub fn representable_ms(ms: i64) -> Option<i64> {
    (YEAR_ZERO.saturating_mul(1000)..=LAST_MS)
        .contains(&ms)
        .then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_read_to_the_millisecond_in_any_offset() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("1970-01-01t00:00:01.5z"), Some(1500));
        assert_eq!(rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(rfc3339_ms("1969-12-31T23:59:59.9999Z"), Some(-1));
        assert_eq!(rfc3339_secs("1969-12-31T23:59:59.5Z"), Some(-1));
        assert_eq!(
            rfc3339_ms("2026-12-05T10:11:12.123456789-05:30"),
            Some(1_796_485_272_123)
        );
    }

    #[test]
    fn what_jiff_takes_beyond_rfc3339_is_refused() {
        for text in [
            "2026-12-05T10:11Z",
            "2026-12-05 10:11:12Z",
            "2026-12-05T10:11:12",
            "2026-12-05T10:11:12+0530",
            "2026-12-05T10:11:12+05:30:00",
            "2026-12-05T10:11:12Z[Europe/Paris]",
            "2026-12-05T10:11:12.Z",
            "2026-12-05T10:11:12.1234567890Z",
            "+002026-12-05T10:11:12Z",
            "20261205T101112Z",
            "2026-13-05T10:11:12Z",
            "2026-12-05T24:11:12Z",
            "",
        ] {
            assert_eq!(parse_rfc3339(text), None, "{text}");
        }
    }

    #[test]
    fn formatting_gives_utc_and_a_fraction_only_when_there_is_one() {
        assert_eq!(format_ms(0).as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(format_ms(1500).as_deref(), Some("1970-01-01T00:00:01.5Z"));
        assert_eq!(format_secs(-1).as_deref(), Some("1969-12-31T23:59:59Z"));
        assert_eq!(format_secs(YEAR_ZERO - 1), None);
        assert_eq!(format_ms(i64::MAX), None);
        assert_eq!(representable_ms(-9_223_372_036_854_775_000), None);
        let last = LAST_MS;
        assert_eq!(last, Timestamp::MAX.as_second() * 1000);
        assert_eq!(representable_ms(last), Some(last));
        assert!(format_ms(last).is_some());
        assert_eq!(representable_ms(last + 1), None);
        assert!(format_ms(YEAR_ZERO * 1000).is_some());
    }

    proptest::proptest! {
        #[test]
        fn what_is_formatted_reads_back(ms in -62_167_219_200_000_i64..253_402_300_800_000) {
            let text = format_ms(ms).expect("within the years");
            proptest::prop_assert_eq!(rfc3339_ms(&text), Some(ms));
        }
    }
}
