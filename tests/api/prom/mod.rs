//! The Prometheus-compatible API against Prometheus itself: the same samples
//! loaded into a real Prometheus (`promtool tsdb create-blocks-from
//! openmetrics`) and written to Hourglass, then many generated queries sent
//! to both and every value and timestamp compared. Plus `promtool` against
//! Hourglass, the listings Grafana uses, and the provisioned dashboard.
//!
//! Prometheus 2.42 (Debian's) includes a window's left end, Prometheus 3
//! and Hourglass do not: samples never fall on a whole or half minute and
//! every window starts on one (subqueries, whose inner times are whole
//! minutes, are evaluated at half minutes), so that one difference never
//! shows. Edges are tested against a brute-force model in the unit tests.

mod grafana;
mod limits;
mod oracle;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

pub(super) const SENSORS: [(&str, &str, &str); 3] =
    [("s-a", "x", "t1"), ("s-b", "x", "t2"), ("s-c", "y", "t1")];

/// `energy` is a counter (with resets); the others are gauges.
pub(super) const METRICS: [&str; 3] = ["temp", "hum", "energy"];

/// The samples' start: a whole minute four hours back (windows start on
/// whole minutes, samples never fall on one).
pub(super) fn four_hours_ago() -> i64 {
    let now = jiff::Timestamp::now().as_second();
    now - now.rem_euclid(60) - 4 * 3600
}

/// `(sensor, metric, ts, value)`: every 20–60 s with a gap of some
/// minutes, never on a whole or half minute, values multiples of 1/8 (sums
/// are exact in any order). The counter climbs from over a thousand and
/// sometimes resets to a lower value (so Prometheus 2's and 3's zero-point
/// rules, which differ, never come into play).
pub(super) fn samples(
    base: i64,
    seconds: i64,
    seed: u64,
) -> Vec<(&'static str, &'static str, i64, f64)> {
    let mut g = Gen(seed);
    let mut out = Vec::new();
    for (sensor, _, _) in SENSORS {
        for metric in METRICS {
            let mut ts = base + 1 + g.below(29) as i64;
            let mut counter = 1000.0 + g.below(8000) as f64 / 8.0;
            let gap = base + 600 + 60 * g.below(150) as i64;
            while ts < base + seconds {
                if ts % 30 != 0 && !(gap..gap + 420).contains(&ts) {
                    let v = if metric == "energy" {
                        counter += g.below(40) as f64 / 8.0;
                        if g.below(40) == 0 {
                            counter = 1000.0 + g.below(800) as f64 / 8.0;
                        }
                        counter
                    } else {
                        (g.below(1601) as f64 - 800.0) / 8.0
                    };
                    out.push((sensor, metric, ts, v));
                }
                ts += 20 + g.below(41) as i64;
            }
        }
    }
    out.sort_by_key(|&(s, m, ts, _)| (ts, s, m));
    out
}

/// A private Prometheus holding exactly `samples`, stopped on drop.
pub(super) struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

pub(crate) fn binary(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase());
    std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/usr/bin/{name}")))
}

pub(super) fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} could not start ({e}); `make test` installs it"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` off the test's runtime thread: the service under test answers
/// on that thread while the command waits for it.
pub(super) async fn run_off_thread(mut cmd: Command, what: &'static str) -> String {
    tokio::task::spawn_blocking(move || run(&mut cmd, what))
        .await
        .expect("the command's thread")
}

pub(super) async fn prometheus_with(samples: &[(&str, &str, i64, f64)]) -> Prometheus {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut text = String::new();
    for m in METRICS {
        text.push_str(&format!("# TYPE {m} gauge\n"));
        for &(sensor, metric, ts, v) in samples.iter().filter(|s| s.1 == m) {
            let (_, site, kind) = SENSORS.iter().find(|s| s.0 == sensor).expect("known");
            text.push_str(&format!(
                "{metric}{{sensor=\"{sensor}\",site=\"{site}\",type=\"{kind}\"}} {v} {ts}\n"
            ));
        }
    }
    text.push_str("# EOF\n");
    let input = dir.path().join("samples.om");
    std::fs::write(&input, text).expect("write samples");
    let data = dir.path().join("data");
    run(
        Command::new(binary("promtool"))
            .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
            .arg(&input)
            .arg(&data),
        "promtool tsdb create-blocks-from openmetrics",
    );
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global: {}\n").expect("write config");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let child = Command::new(binary("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=3650d")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts; `make test` installs it");
    let url = format!("http://127.0.0.1:{port}");
    let client = crate::helpers::http_client();
    eventually(Duration::from_secs(60), "Prometheus is ready", || {
        let r = client.get(format!("{url}/-/ready")).send();
        async move { r.await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    Prometheus {
        child,
        url,
        _dir: dir,
    }
}

/// Hourglass with the same samples, flushed and registered with labels.
pub(super) async fn hourglass_with(samples: &[(&str, &str, i64, f64)]) -> TestApp {
    let mut s = test_settings();
    s.ingest.max_age = Duration::from_secs(2 * 86_400);
    let app = spawn_app_with(s).await;
    // Some seconds first written with another value: the later write wins.
    let overwritten: Vec<Value> = samples
        .iter()
        .step_by(17)
        .map(|&(sensor, metric, ts, v)| reading(sensor, metric, ts, v + 500.0))
        .collect();
    let r = app.post_readings(&Value::Array(overwritten)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    for chunk in samples.chunks(500) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|&(sensor, metric, ts, v)| reading(sensor, metric, ts, v))
            .collect();
        let r = app.post_readings(&Value::Array(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    for (sensor, site, kind) in SENSORS {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
            .json(&json!({"site": site, "type": kind}))
            .send()
            .await
            .expect("PUT labels");
        assert!(
            r.status().is_success(),
            "{}",
            r.text().await.unwrap_or_default()
        );
    }
    eventually(
        Duration::from_secs(60),
        "every series is registered",
        || {
            let get = app.get_json("/prometheus/api/v1/series?match[]={__name__=~\".%2B\"}");
            async move {
                let body = get.await;
                if std::env::var_os("TEST_LOG").is_some() {
                    eprintln!("{body}");
                }
                body["data"]
                    .as_array()
                    .is_some_and(|a| a.len() == SENSORS.len() * METRICS.len())
            }
        },
    )
    .await;
    app
}

pub(super) async fn get(client: &reqwest::Client, url: &str, query: &[(&str, String)]) -> Value {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in query {
        form.append_pair(k, v);
        if *k == "query" {
            crate::helpers::fuzz_seed("promql", v);
        }
    }
    client
        .get(format!("{url}?{}", form.finish()))
        .send()
        .await
        .expect("a request")
        .json()
        .await
        .expect("a JSON body")
}

pub(super) fn url_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
