//! The query API's parameters: from the query string and, for POST, the
//! form body (Grafana sends both kinds); times and durations as
//! Prometheus takes them.

use super::failure::Failure;

/// Parameters from the query string and, for POST, the form body (Grafana
/// sends both kinds).
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn new(raw: Option<&str>, body: &[u8]) -> Self {
        let mut pairs: Vec<(String, String)> =
            url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .into_owned()
                .collect();
        pairs.extend(url::form_urlencoded::parse(body).into_owned());
        Self(pairs)
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn required(&self, name: &str) -> Result<&str, Failure> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Failure::bad_data(format!("invalid parameter {name:?}: missing")))
    }
}

/// A timestamp: Unix seconds with a fraction, or RFC 3339; milliseconds.
pub fn parse_time(name: &str, s: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::bad_data(format!(
            "invalid parameter {name:?}: cannot parse {s:?} to a valid timestamp"
        ))
    };
    if let Some((int, frac)) = s.split_once('.').or(Some((s, "")))
        && !int.is_empty()
        && int
            .trim_start_matches('-')
            .bytes()
            .all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
    {
        let secs: i64 = int.parse().map_err(|_| bad())?;
        let mut ms: i64 = 0;
        for (i, b) in frac.bytes().take(3).enumerate() {
            ms += i64::from(b - b'0') * 10_i64.pow(2 - i as u32);
        }
        let ms = if int.starts_with('-') { -ms } else { ms };
        return secs
            .checked_mul(1000)
            .and_then(|x| x.checked_add(ms))
            .and_then(crate::domain::representable_ms)
            .ok_or_else(bad);
    }
    s.parse::<jiff::Timestamp>()
        .ok()
        .and_then(|t| crate::domain::representable_ms(t.as_millisecond()))
        .ok_or_else(bad)
}

/// A duration: seconds with a fraction, or Prometheus' `1h30m`; milliseconds.
pub fn parse_duration(name: &str, s: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::bad_data(format!(
            "invalid parameter {name:?}: cannot parse {s:?} to a valid duration"
        ))
    };
    if let Ok(secs) = s.parse::<f64>() {
        let ms = (secs * 1000.0).round();
        if !ms.is_finite() || ms.abs() > 1e15 {
            return Err(bad());
        }
        return Ok(ms as i64);
    }
    promql_parser::util::duration::parse_duration(s)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_prometheus_takes_them() {
        assert_eq!(parse_time("t", "1700000000").ok(), Some(1_700_000_000_000));
        assert_eq!(
            parse_time("t", "1700000000.5").ok(),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            parse_time("t", "1700000000.1239").ok(),
            Some(1_700_000_000_123)
        );
        assert_eq!(parse_time("t", "-1.5").ok(), Some(-1_500));
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20.25Z").ok(),
            Some(1_700_000_000_250)
        );
        assert!(parse_time("t", "yesterday").is_err());
        assert_eq!(parse_duration("s", "15").ok(), Some(15_000));
        assert_eq!(parse_duration("s", "0.5").ok(), Some(500));
        assert_eq!(parse_duration("s", "1h30m").ok(), Some(5_400_000));
        assert!(parse_duration("s", "soon").is_err());
    }
}
