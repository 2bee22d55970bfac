//! A corpus of bad input: each gets a clear 4xx with a JSON error, and the
//! database stays empty.

use serde_json::Value;

use crate::helpers::*;

struct Case {
    name: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
    query: &'static str,
    status: u16,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>, status: u16) -> Case {
    Case {
        name,
        content_type: "application/json",
        body: body.into(),
        query: "",
        status,
    }
}

fn one(field_json: &str) -> Vec<u8> {
    format!(
        r#"{{"sensor":"s1","ts":"{}",{field_json}}}"#,
        rfc3339(base_time())
    )
    .into_bytes()
}

fn with_sensor(sensor_json: &str) -> Vec<u8> {
    format!(r#"{{"sensor":{sensor_json},"value":1}}"#).into_bytes()
}

fn with_ts(ts_json: &str) -> Vec<u8> {
    format!(r#"{{"sensor":"s1","ts":{ts_json},"value":1}}"#).into_bytes()
}

fn corpus(max_readings: usize, max_body: usize) -> Vec<Case> {
    let t = base_time();
    let valid = format!(r#"{{"sensor":"s1","ts":"{}","value":1}}"#, rfc3339(t));
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let too_many = format!("[{}]", vec![valid.as_str(); max_readings + 1].join(","));
    let too_big = format!(r#"[{{"sensor":"{}","value":1}}]"#, "a".repeat(max_body));
    let mut cases = vec![
        // Not JSON, or not readings.
        case("an empty body", "", 400),
        case("whitespace only", "  \n\t ", 400),
        case("an unclosed object", "{", 400),
        case(
            "a truncated array",
            format!("[{valid},{valid}").into_bytes(),
            400,
        ),
        case("a trailing comma", format!("[{valid},]").into_bytes(), 400),
        case("two documents", format!("{valid}{valid}").into_bytes(), 400),
        case("null", "null", 400),
        case("a bare number", "42", 400),
        case("a bare string", r#""reading""#, 400),
        case("true", "true", 400),
        case("an array of numbers", "[1,2,3]", 400),
        case(
            "an array of arrays",
            format!("[[{valid}]]").into_bytes(),
            400,
        ),
        case("deep nesting", deep.into_bytes(), 400),
        case("invalid UTF-8", vec![b'[', 0xff, 0xfe, b']'], 400),
        case(
            "a byte-order mark",
            format!("\u{feff}{valid}").into_bytes(),
            400,
        ),
        case(
            "a NUL byte outside strings",
            format!("{valid}\0").into_bytes(),
            400,
        ),
        // Values.
        case("a string value", one(r#""value":"63""#), 400),
        case("an operator as value", one(r#""value":{"$gt":1}"#), 400),
        case("an array value", one(r#""value":[1]"#), 400),
        case("a null value", one(r#""value":null"#), 400),
        case("a boolean value", one(r#""value":true"#), 400),
        case("NaN", one(r#""value":NaN"#), 400),
        case("Infinity", one(r#""value":Infinity"#), 400),
        case("1e400", one(r#""value":1e400"#), 400),
        case("-1e400", one(r#""value":-1e400"#), 400),
        case(
            "a missing value",
            format!(r#"{{"sensor":"s1","ts":"{}"}}"#, rfc3339(t)).into_bytes(),
            400,
        ),
        case("a duplicated field", one(r#""value":1,"value":2"#), 400),
        case("an unknown field", one(r#""value":1,"unit":"C""#), 400),
        case(
            "an operator field",
            one(r#""value":1,"$set":{"count":0}"#),
            400,
        ),
        // Names.
        case("a $ sensor", with_sensor(r#""$gt""#), 400),
        case(
            "an operator object as sensor",
            with_sensor(r#"{"$ne":null}"#),
            400,
        ),
        case("a numeric sensor", with_sensor("17"), 400),
        case("an empty sensor", with_sensor(r#""""#), 400),
        case(
            "a sensor of 129 characters",
            with_sensor(&format!("{:?}", "a".repeat(129))),
            400,
        ),
        case("a NUL in the sensor", with_sensor(r#""a\u0000b""#), 400),
        case("a space in the sensor", with_sensor(r#""a b""#), 400),
        case("a slash in the sensor", with_sensor(r#""a/b""#), 400),
        case(
            "a unicode hyphen look-alike",
            with_sensor("\"truck\u{2010}17\""),
            400,
        ),
        case(
            "a zero-width space",
            with_sensor("\"truck\u{200b}17\""),
            400,
        ),
        case(
            "a right-to-left override",
            with_sensor("\"truck\u{202e}71\""),
            400,
        ),
        case("a fullwidth letter", with_sensor("\"\u{ff54}ruck\""), 400),
        case(
            "a dotted metric",
            r#"{"sensor":"s1","metric":"a.b","value":1}"#,
            400,
        ),
        case(
            "a $ metric",
            r#"{"sensor":"s1","metric":"$inc","value":1}"#,
            400,
        ),
        case(
            "a metric of 65 characters",
            format!(
                r#"{{"sensor":"s1","metric":"{}","value":1}}"#,
                "m".repeat(65)
            )
            .into_bytes(),
            400,
        ),
        case("a missing sensor", r#"{"value":1}"#, 400),
        // Timestamps.
        case(
            "a timestamp in an hour",
            // From the real clock: `t` is hour-aligned, so t + 2d + 1h can be
            // only minutes ahead.
            with_ts(&format!(
                "{:?}",
                rfc3339(time::OffsetDateTime::now_utc().unix_timestamp() + 3600)
            )),
            400,
        ),
        case(
            "a timestamp 31 days old",
            with_ts(&format!("{}", (t + 2 * 86_400 - 31 * 86_400) * 1000)),
            400,
        ),
        case("the year 10000", with_ts(r#""10000-01-01T00:00:00Z""#), 400),
        case("year zero", with_ts(r#""0000-01-01T00:00:00Z""#), 400),
        case("i64::MAX milliseconds", with_ts(&i64::MAX.to_string()), 400),
        case("i64::MIN milliseconds", with_ts(&i64::MIN.to_string()), 400),
        case("beyond u64", with_ts("99999999999999999999999"), 400),
        case("fractional milliseconds", with_ts("1.5e12"), 400),
        case(
            "a date without a zone",
            with_ts(r#""2013-10-16T22:07:38""#),
            400,
        ),
        case("words as a timestamp", with_ts(r#""yesterday""#), 400),
        case("an object as timestamp", with_ts(r#"{"$date":1}"#), 400),
        // Sizes.
        case("too many readings", too_many.into_bytes(), 413),
        case("a body over the limit", too_big.into_bytes(), 413),
        // One bad reading among good ones.
        case(
            "one bad reading among good ones",
            format!(r#"[{valid},{{"sensor":"s1","value":"x"}},{valid}]"#).into_bytes(),
            400,
        ),
    ];
    for (name, ct) in [
        ("a text/plain body", "text/plain"),
        ("no content type", ""),
        ("application/jsonp", "application/jsonp"),
        ("a form body", "application/x-www-form-urlencoded"),
    ] {
        cases.push(Case {
            name,
            content_type: ct,
            body: valid.clone().into_bytes(),
            query: "",
            status: 415,
        });
    }
    cases.push(Case {
        name: "async=maybe",
        content_type: "application/json",
        body: valid.clone().into_bytes(),
        query: "?async=maybe",
        status: 400,
    });
    cases.push(Case {
        name: "an unknown query parameter",
        content_type: "application/json",
        body: valid.into_bytes(),
        query: "?upsert=false",
        status: 400,
    });
    cases
}

#[tokio::test]
async fn every_bad_input_gets_a_clear_4xx_and_changes_nothing() {
    let mut settings = test_settings();
    settings.ingest.max_readings_per_request = 100;
    settings.http.max_body_bytes = 64 * 1024;
    let app = spawn_app_with(settings).await;
    let cases = corpus(100, 64 * 1024);
    assert!(
        cases.len() >= 40,
        "a corpus of at least 40, not {}",
        cases.len()
    );
    for c in cases {
        let r = app.post_raw(c.content_type, c.body, c.query).await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, c.status, "{}: {body}", c.name);
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{}: a JSON error, got {body}",
            c.name
        );
    }
    // Give any (wrongly) accepted reading a chance to be flushed before looking.
    tokio::time::sleep(app.settings.batcher.flush_interval * 4).await;
    assert!(
        app.buckets().await.is_empty(),
        "bad input changed the database"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn bad_query_parameters_get_400_and_never_reach_storage_as_operators() {
    let app = spawn_app().await;
    let t = base_time();
    let (from, to) = (rfc3339(t), rfc3339(t + 3600));
    let paths = [
        format!("/api/v1/sensors/%24gt/average?from={from}&to={to}"),
        format!("/api/v1/sensors/a%00b/average?from={from}&to={to}"),
        format!(
            "/api/v1/sensors/{}/average?from={from}&to={to}",
            "a".repeat(129)
        ),
        format!("/api/v1/sensors/s1/average?from={from}&to={to}&metric=%24where"),
        format!("/api/v1/sensors/s1/average?from=1e3&to={to}"),
        format!("/api/v1/sensors/s1/average?from={from}&to=99999999999999999999"),
        format!("/api/v1/sensors/s1/average?from[$gt]=0&to={to}"),
        format!("/api/v1/sensors/s1/series?from={from}&to={to}&step=-5m"),
        format!("/api/v1/sensors/s1/series?from={from}&to={to}&step=99999999999999d"),
        format!("/api/v1/sensors/s1/series?from={from}&to={to}&step=1m&step=5m"),
    ];
    for path in paths {
        let r = app.get(&path).await;
        assert_eq!(r.status(), 400, "{path}");
        let body: Value = r.json().await.expect("a JSON error");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    app.stop().await.expect("clean stop");
}
