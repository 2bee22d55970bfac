//! Alert rules as operators write them, evaluated by a real `vmalert` against
//! Hourglass' Prometheus API, its notifications received by a stand-in
//! Alertmanager: a sensor gone silent and a temperature above a threshold.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{eventually, free_port, reading, spawn_app_with, terminate, test_settings};

const RULES: &str = r#"
groups:
  - name: sensors
    interval: 1s
    rules:
      - alert: SensorSilent
        expr: absent_over_time(temp{sensor="quiet"}[10m])
      - alert: ChattySensorSilent
        expr: absent_over_time(temp{sensor="chatty"}[10m])
      - alert: FleetSensorSilent
        expr: count_over_time(temp[1h]) unless count_over_time(temp[10m])
      - alert: TempHigh
        expr: temp > 30
        for: 2s
      - alert: TempHighEveryReading5m
        expr: min_over_time(temp[5m]) > 30
"#;

struct Vmalert {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Vmalert {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

fn vmalert_bin() -> PathBuf {
    std::env::var_os("VMALERT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/vmalert"))
}

/// Alerts as vmalert's Alertmanager client posts them, recorded.
type Received = Arc<Mutex<Vec<Value>>>;

async fn alertmanager() -> (String, Received) {
    let received: Received = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().fallback(move |body: axum::body::Bytes| {
        let sink = sink.clone();
        async move {
            if let Ok(Value::Array(alerts)) = serde_json::from_slice::<Value>(&body) {
                sink.lock().expect("not poisoned").extend(alerts);
            }
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the stand-in Alertmanager");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn start_vmalert(datasource: &str, notifier: &str) -> Vmalert {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, RULES).expect("write rules");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("vmalert.log")).expect("log");
    let child = Command::new(vmalert_bin())
        .arg(format!("-rule={}", rules.display()))
        .arg(format!("-datasource.url={datasource}"))
        .arg(format!("-notifier.url={notifier}"))
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        .arg("-evaluationInterval=1s")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("vmalert starts; `make test` installs it");
    Vmalert {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    }
}

/// `(alertname, sensor)` of every alert vmalert reports in `state`.
async fn alerts_in(
    client: &reqwest::Client,
    vmalert: &Vmalert,
    state: &str,
) -> Vec<(String, String)> {
    let Ok(r) = client
        .get(format!("{}/api/v1/alerts", vmalert.url))
        .send()
        .await
    else {
        return Vec::new();
    };
    let Ok(body) = r.json::<Value>().await else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = body["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == state)
        .map(|a| {
            (
                a["labels"]["alertname"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                a["labels"]["sensor"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn pair(alert: &str, sensor: &str) -> (String, String) {
    (alert.to_owned(), sensor.to_owned())
}

#[tokio::test]
async fn vmalert_fires_silent_sensor_and_threshold_alerts_from_hourglass_data() {
    let mut s = test_settings();
    s.ingest.max_age = Duration::from_secs(86_400);
    let app = spawn_app_with(s).await;
    let now = jiff::Timestamp::now().as_second();
    let mut body = Vec::new();
    // "quiet" last reported 15 minutes ago; "chatty" every 20 s until now.
    for k in 0..20 {
        body.push(reading("quiet", "temp", now - 1800 - 7 + k * 45, 21.0));
    }
    for k in 0..60 {
        body.push(reading(
            "chatty",
            "temp",
            now - 1190 + k * 20,
            20.0 + (k % 3) as f64,
        ));
    }
    // "hot" above 30 for the last 6 minutes; "cooled" was hot, now below.
    for k in 0..24 {
        body.push(reading(
            "hot",
            "temp",
            now - 360 + k * 15,
            31.0 + (k % 4) as f64,
        ));
        let cooled = if k < 22 { 35.0 } else { 25.0 };
        body.push(reading("cooled", "temp", now - 360 + k * 15, cooled));
    }
    let r = app.post_readings(&Value::Array(body)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());

    let (notifier, received) = alertmanager().await;
    let vmalert = start_vmalert(&format!("{}/prometheus", app.address), &notifier);
    let client = crate::helpers::http_client();
    let want = vec![
        pair("FleetSensorSilent", "quiet"),
        pair("SensorSilent", "quiet"),
        pair("TempHigh", "hot"),
        pair("TempHighEveryReading5m", "hot"),
    ];
    eventually(Duration::from_secs(90), "the alerts fire", || {
        let (client, vmalert, want) = (&client, &vmalert, &want);
        async move { alerts_in(client, vmalert, "firing").await == *want }
    })
    .await;
    // Nothing else is pending or firing: the chatty sensor is not silent and
    // the cooled one is below the threshold now.
    assert!(alerts_in(&client, &vmalert, "pending").await.is_empty());
    let want = &want;
    eventually(Duration::from_secs(60), "the notifications arrive", || {
        let received = received.clone();
        async move {
            let got = received.lock().expect("not poisoned");
            want.iter().all(|(alert, sensor)| {
                got.iter().any(|a| {
                    a["labels"]["alertname"] == alert.as_str()
                        && a["labels"]["sensor"] == sensor.as_str()
                })
            })
        }
    })
    .await;
    drop(vmalert);
    app.stop().await.expect("stops");
}
