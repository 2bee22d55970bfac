//! Sparkplug B edge nodes simulated with pysparkplug (`tests/sparkplug/edge.py`)
//! against Mosquitto: Hourglass as the host application.

use std::time::Duration;

use hourglass::Granularity;
use hourglass::Settings;
use serde_json::{Value, json};

use crate::broker::Broker;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;
use crate::python::{last_json, python};

const WAIT: Duration = Duration::from_secs(90);
/// Where unusable messages go by default (`mqtt.dead_letter_topic`): the
/// tests enable Sparkplug alone, as a newcomer does.
const DEAD: &str = "hourglass/dead-letters";

fn edge_command(broker: &Broker, scenario: &str, args: &Value) -> tokio::process::Command {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sparkplug/edge.py");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script)
        .arg("127.0.0.1")
        .arg(broker.port.to_string())
        .arg(scenario)
        .arg(args.to_string());
    cmd
}

async fn edge(broker: &Broker, scenario: &str, args: Value) -> Value {
    let out = edge_command(broker, scenario, &args)
        .output()
        .await
        .expect("the edge script runs (make test installs pysparkplug)");
    last_json("the edge script", &out)
}

fn sparkplug_settings(broker: &Broker) -> Settings {
    let mut s = mqtt_settings(broker);
    assert_eq!(s.mqtt.dead_letter_topic, DEAD, "the default");
    s.mqtt.sparkplug.enabled = true;
    s.mqtt.sparkplug.reorder_timeout = Duration::from_millis(500);
    s.mqtt.sparkplug.rebirth_cooldown = Duration::from_secs(600);
    s.mqtt.sparkplug.primary_host_id = Some("hourglass-test".into());
    s.mqtt.sparkplug.property_labels = true;
    s
}

/// What the script published that must be stored, as the buckets hold it.
fn model(expected: &[Value]) -> std::collections::BTreeMap<(String, String, i64), f64> {
    expected
        .iter()
        .map(|e| {
            (
                (
                    e[0].as_str().expect("sensor").to_owned(),
                    e[1].as_str().expect("metric").to_owned(),
                    e[2].as_i64().expect("ts"),
                ),
                e[3].as_f64().expect("value"),
            )
        })
        .collect()
}

#[tokio::test]
async fn sparkplug_edge_nodes_publish_unchanged_and_their_values_are_stored_exactly() {
    let broker = Broker::start().await;
    let settings = sparkplug_settings(&broker);
    let app = spawn_app_with(settings.clone()).await;
    subscribed(&app).await;
    let t0_ms = (base_time() + 120) * 1000 + 250;
    let seen = edge(
        &broker,
        "plant",
        json!({ "t0_ms": t0_ms, "dead_topic": DEAD }),
    )
    .await;
    let mut want = model(seen["expected"].as_array().expect("expected"));
    eventually(WAIT, "every Sparkplug value is stored", || async {
        all_values(&app.buckets().await, Granularity::Minute) == want
    })
    .await;
    assert_invariants(&app.buckets().await, Granularity::Minute);

    // Averages through the API: −1 and −128 of an Int8, exactly.
    let avg = app
        .get_json(&format!(
            "/api/v1/sensors/gw1/average?metric=Inputs__i8&from={}&to={}",
            t0_ms / 1000 * 1000,
            t0_ms / 1000 * 1000 + 60_000
        ))
        .await;
    assert_eq!(
        (&avg["count"], &avg["sum"], &avg["min"]),
        (&json!(2), &json!(-129.0), &json!(-128.0)),
        "{avg}"
    );

    // The primary host's STATE: online, retained.
    let state = seen["state"].as_array().expect("state");
    assert!(
        state.iter().any(|s| s["topic"] == "spBv1.0/STATE/hourglass-test"
            && s["payload"]["online"] == true),
        "{state:?}"
    );
    // One rebirth request for gw1's gap (the unknown alias came within the
    // cooldown), one for gw2 (data before any birth).
    assert_eq!(seen["gap_rebirths"], 1);
    let ncmd: Vec<&str> = seen["ncmd"]
        .as_array()
        .expect("ncmd")
        .iter()
        .map(|c| c["topic"].as_str().expect("topic"))
        .collect();
    assert_eq!(
        ncmd,
        vec!["spBv1.0/plant/NCMD/gw1", "spBv1.0/plant/NCMD/gw2"]
    );
    assert_eq!(
        seen["ncmd"][0]["metrics"],
        json!([["Node Control/Rebirth", true]])
    );
    assert_eq!(
        app.metric("hourglass_sparkplug_rebirth_requests_total{outcome=\"held\"}")
            .await,
        1.0
    );
    // Dead letters: the unknown alias and the unborn node, payloads intact.
    let dead = seen["dead"].as_array().expect("dead");
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("alias 999")),
        "{dead:?}"
    );
    assert!(
        dead[1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("before its NBIRTH")),
        "{dead:?}"
    );
    assert!(dead.iter().all(|d| d["payload_base64"].is_string()));
    // Skipped metrics are counted.
    assert_eq!(
        app.metric("hourglass_sparkplug_metrics_total{reason=\"null\"}")
            .await,
        1.0
    );
    assert_eq!(
        app.metric("hourglass_sparkplug_metrics_total{reason=\"transient\"}")
            .await,
        1.0
    );
    assert_eq!(
        app.metric("hourglass_sparkplug_metrics_total{reason=\"not_numeric\"}")
            .await,
        1.0
    );
    assert_eq!(
        app.metric("hourglass_sparkplug_stale_deaths_total").await,
        1.0
    );

    // Presence in the registry: gw1 online again (the stale death ignored),
    // its press offline, with the ids as labels.
    let presence = |body: &Value| {
        let labels = |s: &str| {
            body["sensors"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["sensor"] == s))
                .map(|x| x["labels"].clone())
                .unwrap_or_default()
        };
        (
            labels("gw1")["sparkplug_state"].clone(),
            labels("gw1")["group"].clone(),
            labels("gw1")["Location"].clone(),
            labels("gw1.press")["sparkplug_state"].clone(),
            labels("gw1.press")["device"].clone(),
            labels("gw1.press")["sparkplug_state_at"].is_string(),
        )
    };
    let want_presence = (
        json!("online"),
        json!("plant"),
        json!("Hall 3"),
        json!("offline"),
        json!("press"),
        true,
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let body = app.get_json("/api/v1/sensors?sensor=gw1*").await;
        if presence(&body) == want_presence {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "presence in the registry: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Hourglass stops; gw1 goes on by alias (QoS 1, kept by the broker).
    // The restarted service resolves the aliases from the births it kept,
    // without asking for a rebirth.
    app.stop().await.expect("clean stop");
    let late = edge(
        &broker,
        "offline",
        json!({ "t0_ms": t0_ms, "seq": seen["next_seq"] }),
    )
    .await;
    let app = spawn_app_with(settings).await;
    want.extend(model(late["expected"].as_array().expect("expected")));
    eventually(
        WAIT,
        "the values sent while it was down are stored",
        || async { all_values(&app.buckets().await, Granularity::Minute) == want },
    )
    .await;
    assert_eq!(
        app.metric("hourglass_sparkplug_rebirth_requests_total")
            .await,
        0.0,
        "no rebirth after a restart"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_sigkilled_host_restarts_mid_stream_losing_nothing_and_asking_no_rebirth() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.journal.enabled = true;
    let reader = spawn_app_with(test_settings()).await;
    let mut settings_of_reader = settings.clone();
    settings_of_reader.mongodb.database = reader.settings.mongodb.database.clone();
    let settings = settings_of_reader;
    // Sparkplug switched on alone starts, with the default dead-letter topic.
    let env = [("HOURGLASS__MQTT__SPARKPLUG__ENABLED", "true")];
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("first.log");
    let mut first = spawn_binary(&settings, &env, &log);
    let address = binary_address(&log).await;
    let client = crate::helpers::http_client();
    let ready = |address: String| {
        let client = client.clone();
        async move {
            client
                .get(format!("{address}/health/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    };
    eventually(WAIT, "the first instance subscribed", || {
        ready(address.clone())
    })
    .await;

    let t0_ms = (base_time() + 300) * 1000;
    let stream = edge_command(
        &broker,
        "stream",
        &json!({ "t0_ms": t0_ms, "n": 400, "rate": 100 }),
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("the edge script starts");
    // Mid-stream: once some readings are in, SIGKILL.
    let received = |address: String| {
        let client = client.clone();
        async move {
            let text = client
                .get(format!("{address}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .filter(|l| l.starts_with("hourglass_readings_received_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .reduce(|a, b| a + b)
        }
    };
    eventually(WAIT, "readings arrive", || {
        let r = received(address.clone());
        async move { r.await.is_some_and(|n| n >= 100.0) }
    })
    .await;
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");

    let log = logs.path().join("second.log");
    let mut second = spawn_binary(&settings, &env, &log);
    let address = binary_address(&log).await;
    let out = stream.wait_with_output().await.expect("the stream ends");
    let want = model(
        last_json("the edge script", &out)["expected"]
            .as_array()
            .expect("expected"),
    );
    eventually(WAIT, "every value of the stream is stored", || async {
        all_values(&reader.buckets().await, Granularity::Minute) == want
    })
    .await;
    assert_invariants(&reader.buckets().await, Granularity::Minute);
    let text = client
        .get(format!("{address}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        !text.lines().any(
            |l| l.starts_with("hourglass_sparkplug_rebirth_requests_total") && !l.ends_with(" 0")
        ),
        "the restarted host asked for no rebirth"
    );
    assert!(terminate(&mut second).success());
    reader.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_day_reported_by_exception_through_the_broker_weighs_by_time_as_the_model_does() {
    let broker = Broker::start().await;
    let app = spawn_app_with(sparkplug_settings(&broker)).await;
    subscribed(&app).await;
    // An hour before the day, so the day's first hours carry a value in.
    let day = base_time() - 86_400;
    let seen = edge(
        &broker,
        "exception",
        json!({ "t0_s": day - 3600, "seconds": 86_400 + 3600, "deadband": 2.0, "seed": 66 }),
    )
    .await;
    let expected = seen["expected"].as_array().expect("expected");
    let want = model(expected);
    eventually(
        WAIT,
        "every value published by exception is stored",
        || async { all_values(&app.buckets().await, Granularity::Minute) == want },
    )
    .await;
    app.late_rolled_up().await;
    let xs: Vec<(i64, f64)> = want.iter().map(|((_, _, t), v)| (*t, *v)).collect();
    // Bursts while the valve moves, and holds past an hour between them.
    assert!(xs.len() > 100, "{} values published", xs.len());
    assert!(xs.windows(2).any(|w| w[1].0 - w[0].0 > 3600));
    let range = format!("from={}&to={}", rfc3339(day), rfc3339(day + 86_400));
    for (staleness, seconds) in [("", 86_400), ("&staleness=1h", 3600)] {
        for (weighting, linear) in [("time", false), ("linear", true)] {
            let body = app
                .get_json(&format!(
                    "/api/v1/sensors/gw5/average?metric=valve&{range}&weighting={weighting}{staleness}"
                ))
                .await;
            let (held, integral) = crate::weighting::model(&xs, linear, seconds, day, day + 86_400);
            assert_eq!(
                body["held_seconds"],
                json!(held),
                "{weighting}{staleness}: {body}"
            );
            let want = integral / held as f64;
            let got = body["avg"].as_f64().expect("an average");
            assert!(
                (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
                "{want}: {weighting}{staleness}: {body}"
            );
        }
    }
    app.stop().await.expect("clean stop");
}

/// A plant with more edge nodes and devices than the host is set to keep:
/// the ones past the bounds are dead-lettered with the setting's name, never
/// asked to rebirth (that would flood them), and the rest is stored exactly.
#[tokio::test]
async fn edge_nodes_and_devices_past_the_hosts_bounds_are_dead_lettered_and_the_rest_stored() {
    let broker = Broker::start().await;
    let mut settings = sparkplug_settings(&broker);
    settings.mqtt.sparkplug.max_edge_nodes = 2;
    settings.mqtt.sparkplug.max_devices_per_node = 1;
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let t0_ms = (base_time() + 120) * 1000;
    let seen = edge(
        &broker,
        "crowd",
        json!({
            "t0_ms": t0_ms,
            "dead_topic": DEAD,
            "nodes": ["gwA", "gwB", "gwC", "gwD"],
            "devices": ["d1", "d2"],
            "dead": 5,
        }),
    )
    .await;
    let want: std::collections::BTreeMap<_, _> =
        model(seen["expected"].as_array().expect("expected"))
            .into_iter()
            .filter(|((sensor, _, _), _)| ["gwA", "gwB", "gwA.d1"].contains(&sensor.as_str()))
            .collect();
    assert_eq!(want.len(), 5, "{seen}");
    eventually(
        WAIT,
        "the nodes and device within bounds are stored",
        || async { all_values(&app.buckets().await, Granularity::Minute) == want },
    )
    .await;

    let reasons: Vec<&str> = seen["dead"]
        .as_array()
        .expect("dead")
        .iter()
        .map(|d| d["reason"].as_str().expect("a reason"))
        .collect();
    let count = |needle: &str| reasons.iter().filter(|r| r.contains(needle)).count();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    assert_eq!(count("mqtt.sparkplug.max_edge_nodes"), 2, "{reasons:?}");
    assert_eq!(count("before its NBIRTH"), 2, "{reasons:?}");
    assert_eq!(
        count("mqtt.sparkplug.max_devices_per_node"),
        1,
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .all(|r| !r.contains("gwA/") || r.contains("d2")),
        "{reasons:?}"
    );
    assert_eq!(
        seen["ncmd"],
        json!([]),
        "no rebirth asked of nodes past the bound"
    );
    assert_eq!(
        app.metric("hourglass_sparkplug_rebirth_requests_total{outcome=\"held\"}")
            .await,
        2.0
    );
    app.stop().await.expect("clean stop");
}
