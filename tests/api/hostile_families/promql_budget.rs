//! PromQL: one memory budget per query, regexes counted and bounded, and
//! instants checked where they enter. Through the binary under an
//! address-space cap: an allocation past it would kill the process.

use serde_json::Value;

use super::live;
use crate::helpers::*;

/// The binary's address space: the issue's line reached 3 GB before it died.
const CAP_MIB: u64 = 2048;

async fn range_query(
    client: &reqwest::Client,
    address: &str,
    query: &str,
    (start, end, step): (&str, &str, &str),
) -> (u16, Value) {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("query", query)
        .append_pair("start", start)
        .append_pair("end", end)
        .append_pair("step", step)
        .finish();
    let r = client
        .post(format!("{address}/prometheus/api/v1/query_range"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("an answer");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

fn count_values_chain(terms: usize) -> String {
    (0..terms)
        .map(|i| format!("count_values(\"a{i}\",vector(time()))"))
        .collect::<Vec<_>>()
        .join(" ^ ")
}

#[tokio::test]
async fn queries_that_read_nothing_but_build_gigabytes_stop_at_the_querys_memory_budget() {
    let settings = test_settings();
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let mut child = spawn_binary_capped(
        CAP_MIB,
        &settings,
        &[("HOURGLASS__QUERY__MAX_MEMORY_PER_QUERY", "268435456")],
        &log,
    );
    let address = binary_address(&log).await;
    let client = http_client();
    let window = ("1000000000", "1000003161", "1");
    // The issue's 1 KB line (30 terms) and its 105-byte relative (3).
    for terms in [30, 3] {
        let query = count_values_chain(terms);
        let (status, body) = range_query(&client, &address, &query, window).await;
        assert_eq!(status, 422, "{terms} terms: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("query.max_memory_per_query")),
            "{terms} terms: {body}"
        );
        live(&client, &address, &format!("{terms} count_values")).await;
    }
    // Relatives: a subquery's windows over a series per value, and vector
    // matching of two such.
    for query in [
        "max_over_time(count_values(\"v\",vector(time()))[1h:1s])".to_owned(),
        "count_values(\"a\",vector(time())) * on() group_left count_values(\"b\",vector(time()))"
            .to_owned(),
    ] {
        let (status, body) = range_query(&client, &address, &query, window).await;
        assert!(status == 422 || status == 400, "{query}: {status} {body}");
        live(&client, &address, &query).await;
    }
    // One term over 1 000 s fits, its answer written out included (over
    // the 3 162 s window it would not: 170 MB held, three times that to
    // write), and its answer is right: a series per second, each 1 at its
    // own step.
    let shorter = ("1000000000", "1000001000", "1");
    let (status, body) = range_query(&client, &address, &count_values_chain(1), shorter).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["result"].as_array().map(Vec::len), Some(1001));
    assert_eq!(metric(&address, "hourglass_query_memory_bytes").await, 0.0);
    assert!(terminate(&mut child).success());
}

#[tokio::test]
async fn function_regexes_count_with_the_matchers_and_compile_within_a_bound() {
    let app = spawn_app().await;
    let client = http_client();
    let instant = |query: String| {
        let client = client.clone();
        let address = app.address.clone();
        async move {
            let r = client
                .post(format!("{address}/prometheus/api/v1/query"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(
                    url::form_urlencoded::Serializer::new(String::new())
                        .append_pair("query", &query)
                        .finish(),
                )
                .send()
                .await
                .expect("an answer");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("JSON"))
        }
    };
    // The issue's 6 KB query: 150 nested label_replace of \w{0,200}.
    let nested = (0..150).fold("vector(1)".to_owned(), |inner, _| {
        format!(r#"label_replace({inner},"a","x","a","\\w{{0,200}}")"#)
    });
    let (a, b) = tokio::join!(instant(nested.clone()), instant(nested));
    for (status, body) in [a, b] {
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("query.max_regex_matchers")),
            "{body}"
        );
    }
    // Within the count, an expression that compiles past the bound is
    // refused, not compiled for seconds.
    let (status, body) =
        instant(r#"label_replace(vector(1),"a","x","a","\\w{0,200}\\w{0,200}")"#.to_owned()).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("compiles to more than")),
        "{body}"
    );
    // And an ordinary one answers.
    let (status, body) =
        instant(r#"label_replace(vector(1),"room","$1","sensor","(.*)-\\d+")"#.to_owned()).await;
    assert_eq!(status, 200, "{body}");
    live(&client, &app.address, "the regexes").await;
}

#[tokio::test]
async fn instants_past_the_representable_years_are_a_400_on_every_route() {
    let app = spawn_app().await;
    let far = "-9223372036854775000";
    for path in [
        format!("/api/v1/sensors/s/average?metric=t&from={far}&to=1000"),
        format!("/api/v1/sensors/s/series?metric=t&from={far}&to=1000&step=1m"),
        format!("/api/v1/export?from={far}&to=1000"),
        format!("/prometheus/api/v1/query?query=1&time={far}"),
        "/prometheus/api/v1/query_range?query=1&start=-9223372036854775&end=0&step=60".to_owned(),
    ] {
        let r = app.get(&path).await;
        assert_eq!(
            r.status(),
            400,
            "{path}: {}",
            r.text().await.unwrap_or_default()
        );
    }
}

#[tokio::test]
async fn a_group_answer_past_the_querys_memory_is_refused_before_it_is_read() {
    let mut settings = test_settings();
    settings.query.max_memory_per_query = 1 << 20;
    let app = spawn_app_with(settings).await;
    let t = base_time();
    let readings: Vec<Value> = ["g1", "g2", "g3"]
        .iter()
        .map(|s| reading(s, "temp", t, 20.0))
        .collect();
    let r = app.post_readings(&Value::Array(readings)).await;
    assert_eq!(r.status(), 200);
    let (from, to) = (rfc3339(t - 300_000), rfc3339(t + 299_940));
    // 3 groups of 10 000 points: past 1 MiB.
    let path = |step: &str| {
        format!(
            "/api/v1/series?sensor=g*&metric=temp&group_by=sensor&from={from}&to={to}&step={step}"
        )
    };
    let r = app.get(&path("1m")).await;
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("query.max_memory_per_query"), "{body}");
    let r = app.get(&path("1d")).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}
