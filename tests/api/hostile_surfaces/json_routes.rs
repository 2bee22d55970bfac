//! The JSON query routes, DELETE and export: parameters out of bounds or
//! wrong.

use super::cases::{Case, Request, get, nested};
use crate::helpers::{base_time, rfc3339};

/// The JSON API's query routes, DELETE and export.
pub fn cases() -> Vec<Case> {
    let t = base_time();
    let (from, to) = (rfc3339(t), rfc3339(t + 3600));
    let range = format!("from={from}&to={to}");
    let long_glob = "*".repeat(5000);
    let mut cases = vec![
        get(
            "a glob of 5 000 stars",
            format!("/api/v1/average?metric=temp&sensor={long_glob}&{range}"),
        ),
        get(
            "a glob of 2 000 alternating stars",
            format!(
                "/api/v1/series?metric=temp&sensor={}&{range}&step=1h",
                "*a".repeat(2000)
            ),
        ),
        get(
            "an operator as glob",
            format!("/api/v1/average?metric=temp&sensor=%24where&{range}"),
        ),
        get(
            "a label filter without a value",
            format!("/api/v1/average?metric=temp&label.site=&{range}"),
        ),
        get(
            "a label filter with an operator name",
            format!("/api/v1/average?metric=temp&label.%24gt=1&{range}"),
        ),
        get(
            "a label name of 10 000 characters",
            format!(
                "/api/v1/average?metric=temp&label.{}=1&{range}",
                "a".repeat(10_000)
            ),
        ),
        get(
            "group_by an unknown field",
            format!("/api/v1/average?metric=temp&group_by=metric&{range}"),
        ),
        get(
            "a time zone path",
            format!(
                "/api/v1/sensors/s1/series?metric=temp&{range}&step=1d&tz=../../../../etc/passwd"
            ),
        ),
        get(
            "a time zone of 10 000 characters",
            format!(
                "/api/v1/sensors/s1/series?metric=temp&{range}&step=1d&tz={}",
                "A".repeat(10_000)
            ),
        ),
        get(
            "one-second steps over 400 days",
            format!(
                "/api/v1/sensors/s1/series?metric=temp&from={}&to={to}&step=1s",
                rfc3339(t - 400 * 86_400 + 3600)
            ),
        ),
        get(
            "a step of 10^20 days",
            format!("/api/v1/sensors/s1/series?metric=temp&{range}&step=100000000000000000000d"),
        ),
        get(
            "a step of an unknown unit",
            format!("/api/v1/sensors/s1/series?metric=temp&{range}&step=1h30x"),
        ),
        get(
            "a range of 1 000 years",
            format!("/api/v1/sensors/s1/average?metric=temp&from=1000-01-01T00:00:00Z&to={to}"),
        ),
        get(
            "a sensor of 10 000 characters",
            format!(
                "/api/v1/sensors/{}/average?metric=temp&{range}",
                "a".repeat(10_000)
            ),
        ),
        get(
            "a percent-encoded NUL in the sensor",
            "/api/v1/sensors/a%00b/latest?metric=temp",
        ),
        get(
            "20 001 instants",
            format!(
                "/api/v1/sensors/s1/at?metric=temp&ts={}",
                vec!["1"; 20_001].join(",")
            ),
        ),
        get(
            "instants every second for 400 days",
            "/api/v1/sensors/s1/at?metric=temp&from=0&to=34560000000&every=1s",
        ),
        get(
            "instants 10 000 years apart",
            "/api/v1/sensors/s1/at?metric=temp&ts=-62135596800000,253402214400000&method=linear",
        ),
        get(
            "an instant that is not one",
            format!("/api/v1/sensors/s1/at?metric=temp&ts={from},,{to}&staleness=0s"),
        ),
        get(
            "a listing cursor that is an operator",
            "/api/v1/sensors?after=%7B%22%24gt%22%3A1%7D&limit=abc",
        ),
        get(
            "a listing limit of 10^30",
            "/api/v1/sensors?limit=1000000000000000000000000000000",
        ),
        get(
            "dead letters with a bad limit",
            "/api/v1/dead_letters?limit=-5",
        ),
        get(
            "export in XML",
            format!("/api/v1/export?{range}&format=xml"),
        ),
        get(
            "export of a glob of 5 000 stars",
            format!("/api/v1/export?{range}&sensor={long_glob}"),
        ),
        get(
            "export with a zero step",
            format!("/api/v1/export?{range}&step=0m"),
        ),
        get("export without a range", "/api/v1/export?sensor=s1"),
        Case {
            name: "DELETE without a range".into(),
            request: Request::Delete("/api/v1/readings?sensor=s1".into()),
            timeout: false,
        },
        Case {
            name: "DELETE of a glob of 5 000 stars".into(),
            request: Request::Delete(format!("/api/v1/readings?{range}&sensor={long_glob}")),
            timeout: false,
        },
        Case {
            name: "DELETE with from after to".into(),
            request: Request::Delete(format!("/api/v1/readings?sensor=s1&from={to}&to={from}")),
            timeout: false,
        },
        Case {
            name: "DELETE with dry_run=maybe".into(),
            request: Request::Delete(format!("/api/v1/readings?sensor=s1&{range}&dry_run=maybe")),
            timeout: false,
        },
        Case {
            name: "labels of an operator".into(),
            request: Request::Put(
                "/api/v1/sensors/s1/labels".into(),
                "application/json",
                br#"{"$set":{"a":"b"}}"#.to_vec(),
            ),
            timeout: false,
        },
        Case {
            name: "labels nested 100 000 deep".into(),
            request: Request::Put(
                "/api/v1/sensors/s1/labels".into(),
                "application/json",
                nested("{\"a\":", "1", "}", 100_000).into_bytes(),
            ),
            timeout: false,
        },
    ];
    // Console routes: nothing but the page and its files.
    for path in [
        "/console/../../../../etc/passwd",
        "/console/%2e%2e/%2e%2e/etc/passwd",
        "/console/app.js/..%2f..%2fCargo.toml",
        "/console/%00",
        "/console/",
    ] {
        cases.push(get(format!("console: {path}"), path));
    }
    cases
}
