//! What Grafana asks: the provisioned dashboard's queries, and a new
//! sensor's journaled readings seen by an instant selector at once.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

use super::{four_hours_ago, hourglass_with, samples, url_encode};

/// Every query of the provisioned Grafana dashboard parses and is answered.
#[tokio::test]
async fn the_provisioned_dashboard_queries_are_answered() {
    let base = four_hours_ago();
    let data = samples(base, 1800, 5);
    let app = hourglass_with(&data).await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/grafana/dashboards/sensors.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("json");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
            crate::helpers::fuzz_seed("promql", target["expr"].as_str().unwrap_or_default());
        }
    }
    assert!(queries.len() >= 3, "{queries:?}");
    // Its panels use the provisioned Hourglass data source, which points at
    // the service's /prometheus.
    let sources: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config/grafana/provisioning/datasources/prometheus.yml"),
        )
        .expect("the data sources"),
    )
    .expect("yaml");
    let hourglass = sources["datasources"]
        .as_sequence()
        .expect("a list")
        .iter()
        .find(|d| d["uid"].as_str() == Some("hourglass"))
        .expect("the Hourglass data source");
    assert_eq!(hourglass["type"].as_str(), Some("prometheus"));
    assert_eq!(
        hourglass["url"].as_str(),
        Some("http://hourglass:8080/prometheus")
    );
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert_eq!(
            panel["datasource"]["uid"], "hourglass",
            "{}",
            panel["title"]
        );
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or_default();
        assert!(q.starts_with("label_values("), "{q}");
        let label = q.trim_start_matches("label_values(").trim_end_matches(')');
        let body = app
            .get_json(&format!("/prometheus/api/v1/label/{label}/values"))
            .await;
        assert!(!body["data"].as_array().expect("values").is_empty(), "{q}");
    }
    for q in queries {
        // Grafana's variables, as Grafana would fill them in.
        let q = q
            .replace("$metric", "temp")
            .replace("$sensor", "s-a")
            .replace("$__interval", "1m")
            .replace("$__rate_interval", "1m")
            .replace("$__range", "30m");
        let path = format!(
            "/prometheus/api/v1/query_range?query={}&start={}&end={}&step=60",
            url_encode(&q),
            base,
            base + 1800
        );
        let body = app.get_json(&path).await;
        assert_eq!(body["status"], "success", "{q}: {body}");
        assert!(
            !body["data"]["result"]
                .as_array()
                .expect("result")
                .is_empty(),
            "{q}: {body}"
        );
    }
    app.stop().await.expect("stops");
}

/// Grafana's "current value": a bare selector at now, over readings held in
/// the journal and not yet stored, from a sensor seen for the first time.
#[tokio::test]
async fn an_instant_bare_selector_sees_journaled_readings_of_a_new_sensor() {
    let mut s = journal_settings();
    s.ingest.max_age = Duration::from_secs(86_400);
    // Held well past the test: nothing of it is stored while it asks.
    s.batcher.hold_grace = Duration::from_secs(600);
    s.batcher.max_hold = Duration::from_secs(600);
    s.buckets.rollup_after = Duration::from_secs(660);
    let app = spawn_app_with(s).await;
    let now = jiff::Timestamp::now().as_second();
    let body = json!([
        reading("fresh-1", "temp", now - 100, 6.0),
        reading("fresh-1", "temp", now - 40, 7.0),
    ]);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    for query in ["temp", "last_over_time(temp[5m])"] {
        let got = app
            .get_json(&format!(
                "/prometheus/api/v1/query?query={}&time={now}",
                url_encode(query)
            ))
            .await;
        assert_eq!(got["data"]["result"][0]["value"][1], "7", "{query}: {got}");
        assert_eq!(
            got["data"]["result"][0]["metric"]["sensor"], "fresh-1",
            "{query}"
        );
    }
    let end = now - now.rem_euclid(60) + 60;
    let got = app
        .get_json(&format!(
            "/prometheus/api/v1/query_range?query=temp&start={}&end={end}&step=60",
            end - 600
        ))
        .await;
    let values = got["data"]["result"][0]["values"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        values.iter().any(|v| v[1] == "7"),
        "a range query sees them too: {got}"
    );
    app.stop().await.expect("stops");
}
