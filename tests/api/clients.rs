//! The book's client examples (docs/examples, shown in
//! docs/src/sending/clients.md), run as a user runs them: Python from the
//! stack's venv, JavaScript with Node.js, against a real instance and a real
//! Mosquitto. What an example says it sent must be exactly what the export
//! then holds, sensor, metric, second and value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::auth::{DASHBOARD, TRUCK, secured};
use crate::broker::Broker;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;
use crate::python::{python, stdout_of};

/// `(sensor, metric, second) → value`.
type Readings = BTreeMap<(String, String, i64), f64>;

/// How long readings published over MQTT may take to be stored.
const WAIT: Duration = Duration::from_secs(90);
/// An example still running after this is hung (each takes a second or so).
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn example(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/examples")
        .join(path)
}

/// A Python example, run by the interpreter with the stack's packages
/// (`requests`, `paho-mqtt`).
fn python_example(script: &str) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(example(script));
    cmd
}

/// A JavaScript example that needs no package, run where it is.
fn node_example(script: &str) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(example(script));
    cmd
}

/// A JavaScript example that imports packages: a copy of it in `dir`, beside
/// a link to the packages `ensure_js_clients` installed, because an ES
/// module finds its imports from its own directory (NODE_PATH is for
/// `require` only).
fn node_example_with_packages(script: &str, dir: &Path) -> Command {
    let installed = std::env::var_os("HOURGLASS_TEST_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".stack/node/node_modules"));
    assert!(
        installed.join("mqtt/package.json").is_file(),
        "the `mqtt` npm package is not installed in {}: scripts/stack.sh installs it \
         (`source scripts/stack.sh && ensure_js_clients`; `make test` does)",
        installed.display()
    );
    let copy = dir.join(Path::new(script).file_name().expect("a file name"));
    std::fs::copy(example(script), &copy).expect("the example copied");
    std::os::unix::fs::symlink(&installed, dir.join("node_modules")).expect("the packages linked");
    let mut cmd = Command::new("node");
    cmd.arg(copy);
    cmd
}

/// Runs an example with only the settings the test gives it (none from the
/// test's own environment, such as the stack's `MQTT_URL`).
async fn run(what: &str, mut cmd: Command, env: &[(&str, &str)]) -> Output {
    for name in [
        "HOURGLASS_URL",
        "HOURGLASS_TOKEN",
        "HOURGLASS_SENSOR",
        "MQTT_URL",
    ] {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(RUN_LIMIT, cmd.output()).await {
        Ok(out) => out.unwrap_or_else(|e| {
            panic!(
                "{what} could not start ({e}): `make test` installs Python's packages and Node.js"
            )
        }),
        Err(_) => panic!("{what} did not end within {RUN_LIMIT:?}"),
    }
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// The second of an RFC 3339 `ts`.
fn second(ts: &Value) -> i64 {
    let ts: jiff::Timestamp = ts
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("an RFC 3339 ts: {ts}"));
    ts.as_second()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The readings an example printed: `sent {reading}` (the JSON API) or
/// `published {topic} {payload}` (MQTT, `sensors/{sensor}/{metric}`).
fn printed(stdout: &str) -> Readings {
    let mut readings = Readings::new();
    for line in stdout.lines() {
        let (sensor, metric, reading) = if let Some(sent) = line.strip_prefix("sent ") {
            let reading = json(sent);
            let name = |k: &str| reading[k].as_str().expect("a name").to_owned();
            (name("sensor"), name("metric"), reading)
        } else if let Some(published) = line.strip_prefix("published ") {
            let (topic, payload) = published.split_once(' ').expect("a topic and a payload");
            let Some(("sensors", rest)) = topic.split_once('/') else {
                panic!("a topic under sensors/: {line}");
            };
            let (sensor, metric) = rest.split_once('/').expect("sensors/{sensor}/{metric}");
            (sensor.to_owned(), metric.to_owned(), json(payload))
        } else {
            continue;
        };
        let value = reading["value"].as_f64().expect("a number");
        let key = (sensor, metric, second(&reading["ts"]));
        assert!(
            readings.insert(key, value).is_none(),
            "one value a second: {line}"
        );
    }
    readings
}

/// The JSON an example printed after `label `.
fn printed_answer(stdout: &str, label: &str) -> Value {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{label} ")))
        .unwrap_or_else(|| panic!("the example printed no {label}: {stdout}"));
    json(line)
}

/// Runs an example that must succeed: what it printed, and the readings
/// among it, each of `sensor`, stamped while it ran.
async fn sent_by(
    what: &str,
    cmd: Command,
    env: &[(&str, &str)],
    sensor: &str,
) -> (String, Readings) {
    let started = now();
    let out = run(what, cmd, env).await;
    let stdout = stdout_of(what, &out);
    let sent = printed(&stdout);
    assert!(
        sent.len() >= 2,
        "{what} printed the readings it sent: {stdout}"
    );
    let ended = now();
    for (s, _, ts) in sent.keys() {
        assert_eq!(s, sensor, "{what} writes the sensor it was given");
        assert!(
            (started - 60..=ended).contains(ts),
            "{what} stamps its readings now: {ts} not in {started}..={ended}"
        );
    }
    (stdout, sent)
}

/// Every reading the export holds, over the day before now and the hour
/// after it.
async fn exported(app: &TestApp, token: Option<&str>) -> Readings {
    let url = format!(
        "{}/api/v1/export?from={}&to={}",
        app.address,
        (now() - 86_400) * 1000,
        (now() + 3600) * 1000
    );
    let mut request = app.client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.expect("the export answers");
    let status = answer.status();
    let text = answer.text().await.expect("the export's body");
    assert_eq!(status, 200, "the export: {text}");
    text.lines()
        .map(|line| {
            let r = json(line);
            let name = |k: &str| r[k].as_str().expect("a name").to_owned();
            (
                (name("sensor"), name("metric"), second(&r["ts"])),
                r["value"].as_f64().expect("a number"),
            )
        })
        .collect()
}

/// Waits until the export holds exactly `want`; shows both when it does not.
async fn stored_exactly(app: &TestApp, token: Option<&str>, want: &Readings) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = exported(app, token).await;
        if got == *want || tokio::time::Instant::now() > deadline {
            assert_eq!(&got, want, "stored (left) is what the example sent (right)");
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The JSON example's own queries saw exactly its readings.
fn queried_back(stdout: &str, sent: &Readings) {
    let sum: f64 = sent.values().sum();
    let average = printed_answer(stdout, "average");
    assert_eq!(
        average["count"].as_u64(),
        Some(sent.len() as u64),
        "{average}"
    );
    let got = average["sum"].as_f64().expect("a sum");
    assert!(
        (got - sum).abs() < 1e-9,
        "the average's sum {got}, sent {sum}"
    );
    let series = printed_answer(stdout, "series");
    let points = series["points"].as_array().expect("points");
    let counted: u64 = points.iter().filter_map(|p| p["count"].as_u64()).sum();
    assert_eq!(counted, sent.len() as u64, "{series}");
}

#[tokio::test]
async fn the_python_json_example_stores_and_reads_back_its_readings() {
    // Auth on: the example must send its token (a device token for
    // truck-17 and truck-17.*, with ingest and query).
    let app = spawn_app_with(secured()).await;
    let mut cmd = python_example("python/send_and_query.py");
    cmd.arg("truck-17.py");
    let env = [
        ("HOURGLASS_URL", app.address.as_str()),
        ("HOURGLASS_TOKEN", TRUCK),
    ];
    let (stdout, sent) = sent_by("send_and_query.py", cmd, &env, "truck-17.py").await;
    queried_back(&stdout, &sent);
    stored_exactly(&app, Some(DASHBOARD), &sent).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_javascript_json_example_stores_and_reads_back_its_readings() {
    let app = spawn_app_with(secured()).await;
    let env = [
        ("HOURGLASS_URL", app.address.as_str()),
        ("HOURGLASS_TOKEN", TRUCK),
        ("HOURGLASS_SENSOR", "truck-17.js"),
    ];
    let cmd = node_example("javascript/send_and_query.mjs");
    let (stdout, sent) = sent_by("send_and_query.mjs", cmd, &env, "truck-17.js").await;
    queried_back(&stdout, &sent);
    stored_exactly(&app, Some(DASHBOARD), &sent).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_python_mqtt_example_publishes_readings_that_are_stored() {
    let broker = Broker::start().await;
    let app = spawn_app_with(mqtt_settings(&broker)).await;
    subscribed(&app).await;
    let mut cmd = python_example("python/mqtt_publish.py");
    cmd.arg("py-mqtt-1");
    let url = broker.url();
    let env = [("MQTT_URL", url.as_str())];
    let (_, sent) = sent_by("mqtt_publish.py", cmd, &env, "py-mqtt-1").await;
    stored_exactly(&app, None, &sent).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_javascript_mqtt_example_publishes_readings_that_are_stored() {
    let broker = Broker::start().await;
    let app = spawn_app_with(mqtt_settings(&broker)).await;
    subscribed(&app).await;
    let dir = tempfile::tempdir().expect("a scratch directory");
    let cmd = node_example_with_packages("javascript/mqtt_publish.mjs", dir.path());
    let url = broker.url();
    let env = [
        ("MQTT_URL", url.as_str()),
        ("HOURGLASS_SENSOR", "js-mqtt-1"),
    ];
    let (_, sent) = sent_by("mqtt_publish.mjs", cmd, &env, "js-mqtt-1").await;
    stored_exactly(&app, None, &sent).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_examples_exit_non_zero_when_refused_or_unreachable() {
    // No token while auth is on: a 401, which the JSON examples report.
    let app = spawn_app_with(secured()).await;
    let env = [
        ("HOURGLASS_URL", app.address.as_str()),
        ("HOURGLASS_SENSOR", "truck-17"),
    ];
    for (what, cmd) in [
        (
            "send_and_query.py",
            python_example("python/send_and_query.py"),
        ),
        (
            "send_and_query.mjs",
            node_example("javascript/send_and_query.mjs"),
        ),
    ] {
        let out = run(what, cmd, &env).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} exits non-zero on a 401");
        assert!(stderr.contains("401"), "{what} says why: {stderr}");
    }
    stored_exactly(&app, Some(DASHBOARD), &Readings::new()).await;
    app.stop().await.expect("clean stop");

    // No broker where MQTT_URL points.
    let url = format!("mqtt://127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().expect("a scratch directory");
    for (what, cmd) in [
        ("mqtt_publish.py", python_example("python/mqtt_publish.py")),
        (
            "mqtt_publish.mjs",
            node_example_with_packages("javascript/mqtt_publish.mjs", dir.path()),
        ),
    ] {
        let out = run(what, cmd, &[("MQTT_URL", url.as_str())]).await;
        assert!(
            !out.status.success(),
            "{what} exits non-zero without a broker: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
