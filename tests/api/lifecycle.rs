//! Data lifecycle: export and import (`GET /api/v1/export`, `hourglass
//! export`, `hourglass import`) against real processes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, all_values, assert_invariants, base_time, eventually, gate, journal_settings, reading,
    rfc3339, settings_with, spawn_app_with,
};

/// Runs the `hourglass` binary's `args` against the service at `url`.
async fn cli(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--config", "config/default.toml"])
        .args(args)
        .env("HOURGLASS_URL", url)
        .env("HOURGLASS__MQTT__ENABLED", "false")
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("the hourglass binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `(sensor, metric, ts) → value` of NDJSON or CSV export rows.
fn rows(body: &str, csv: bool) -> BTreeMap<(String, String, i64), f64> {
    let ts = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .expect("an RFC 3339 ts")
            .unix_timestamp()
    };
    let mut out = BTreeMap::new();
    for (i, line) in body.lines().enumerate() {
        let (key, value) = if csv {
            if i == 0 {
                assert_eq!(line, "sensor,metric,ts,value");
                continue;
            }
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 4, "{line}");
            (
                (f[0].to_owned(), f[1].to_owned(), ts(f[2])),
                f[3].parse::<f64>().expect("a number"),
            )
        } else {
            let v: Value = serde_json::from_str(line).expect("one JSON object per line");
            (
                (
                    v["sensor"].as_str().expect("sensor").to_owned(),
                    v["metric"].as_str().expect("metric").to_owned(),
                    ts(v["ts"].as_str().expect("ts")),
                ),
                v["value"].as_f64().expect("value"),
            )
        };
        assert!(
            out.insert(key, value).is_none(),
            "each reading once: {line}"
        );
    }
    out
}

/// Readings of three sensors and two metrics over two hours, with values
/// whose text is delicate (shortest round trip, exponents, subnormals).
fn workload(t0: i64) -> BTreeMap<(String, String, i64), f64> {
    let delicate = [0.1 + 0.2, 1e300, -5e-324, 21.5, -273.15, 1.0 / 3.0];
    let mut data = BTreeMap::new();
    for (k, sensor) in ["line-a", "line-b", "yard.1"].iter().enumerate() {
        for (m, metric) in ["temp", "power_w"].iter().enumerate() {
            for i in 0..120_i64 {
                let ts = t0 + i * 61 + k as i64 * 7 + m as i64;
                let value = if i % 10 == 0 {
                    delicate[(i as usize / 10) % delicate.len()]
                } else {
                    (i * (k as i64 + 1)) as f64 * 0.25 - 7.0
                };
                data.insert(((*sensor).to_owned(), (*metric).to_owned(), ts), value);
            }
        }
    }
    data
}

/// Posts `data` in requests of 500, each sent again on a 503 as a client
/// would (a store that did not confirm in time under load; retrying is
/// safe: a reading written again at its second changes nothing).
async fn post_all(app: &TestApp, data: &BTreeMap<(String, String, i64), f64>) {
    let body: Vec<Value> = data
        .iter()
        .map(|((s, m, ts), v)| reading(s, m, *ts, *v))
        .collect();
    for chunk in body.chunks(500) {
        let mut attempts = 0;
        loop {
            let r = app.post_readings(&json!(chunk)).await;
            if r.status() == 503 && attempts < 10 {
                attempts += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            assert_eq!(r.status(), 200, "{:?}", r.text().await);
            break;
        }
    }
}

fn gunzip(bytes: &[u8]) -> String {
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_string(&mut text)
        .expect("gzip");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_imports_back_unchanged_and_importing_twice_changes_nothing() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let source = spawn_app_with(settings_with(g)).await;
        let t0 = base_time();
        let data = workload(t0);
        post_all(&source, &data).await;
        let (from, to) = (rfc3339(t0 - 3600), rfc3339(t0 + 3 * 3600));
        let range = format!("from={from}&to={to}");

        // NDJSON: every reading once, exactly.
        let r = source.get(&format!("/api/v1/export?{range}")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["content-type"].to_str().ok(),
            Some("application/x-ndjson")
        );
        let ndjson = r.text().await.expect("a body");
        assert_eq!(rows(&ndjson, false), data, "{g:?}: the NDJSON export");

        // A selection: a sensor glob and one metric, within a narrower range.
        let (f, t) = (t0 + 600, t0 + 3600);
        let r = source
            .get(&format!(
                "/api/v1/export?sensor=line-*&metric=temp&from={}&to={}",
                rfc3339(f),
                rfc3339(t)
            ))
            .await;
        let want: BTreeMap<_, _> = data
            .iter()
            .filter(|((s, m, ts), _)| s.starts_with("line-") && m == "temp" && (f..t).contains(ts))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert!(!want.is_empty());
        assert_eq!(rows(&r.text().await.expect("a body"), false), want);

        // CSV, gzipped by the service when the client accepts it.
        let r = source
            .client
            .get(format!(
                "{}/api/v1/export?{range}&format=csv",
                source.address
            ))
            .header("accept-encoding", "gzip")
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-encoding"].to_str().ok(), Some("gzip"));
        let csv = gunzip(&r.bytes().await.expect("a body"));
        assert_eq!(rows(&csv, true), data, "{g:?}: the CSV export");

        // The step series: each sensor's points with readings, as the series route answers them.
        let r = source
            .get(&format!("/api/v1/export?{range}&metric=temp&step=1h"))
            .await;
        let body = r.text().await.expect("a body");
        for sensor in ["line-a", "line-b", "yard.1"] {
            let series = source
                .get_json(&format!(
                    "/api/v1/sensors/{sensor}/series?metric=temp&{range}&step=1h"
                ))
                .await;
            let want: Vec<Value> = series["points"]
                .as_array()
                .expect("points")
                .iter()
                .filter(|p| p["count"].as_u64() != Some(0))
                .cloned()
                .collect();
            let got: Vec<Value> = body
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
                .filter(|v| v["sensor"] == sensor)
                .map(|mut v| {
                    let o = v.as_object_mut().expect("an object");
                    assert_eq!(o.remove("metric"), Some(json!("temp")));
                    o.remove("sensor");
                    v
                })
                .collect();
            assert!(!want.is_empty());
            assert_eq!(got, want, "{g:?}: the step export of {sensor}");
        }

        // `hourglass export --gzip` into a file, imported into another database.
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("export.ndjson.gz");
        let path = file.to_str().expect("UTF-8");
        let out = cli(
            &source.address,
            &["export", "--from", &from, "--to", &to, "--gzip", "-o", path],
        )
        .await;
        assert!(out.status.success(), "{}", text(&out));
        let bytes = std::fs::read(&file).expect("the export file");
        assert_eq!(rows(&gunzip(&bytes), false), data);

        let target = spawn_app_with(settings_with(g)).await;
        let out = cli(&target.address, &["import", "--quiet", path]).await;
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("{} readings stored", data.len())),
            "{}",
            text(&out)
        );
        let before = target.buckets().await;
        assert_invariants(&before, g);
        assert_eq!(all_values(&before, g), data, "{g:?}: imported unchanged");
        assert_eq!(all_values(&source.buckets().await, g), data);
        let avg = format!("/api/v1/sensors/yard.1/average?metric=power_w&{range}");
        assert_eq!(target.get_json(&avg).await, source.get_json(&avg).await);

        // Twice: the checkpoint says it is done; from the start again, the
        // same values land on the same seconds.
        let out = cli(&target.address, &["import", "--quiet", path]).await;
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("(1 already imported)"),
            "{}",
            text(&out)
        );
        let out = cli(&target.address, &["import", "--quiet", "--restart", path]).await;
        assert!(out.status.success(), "{}", text(&out));
        let after = target.buckets().await;
        assert_eq!(all_values(&after, g), data);
        let counts = |docs: &[mongodb::bson::Document]| {
            docs.iter()
                .map(|d| d.get("count").cloned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            counts(&after),
            counts(&before),
            "{g:?}: nothing counted twice"
        );
        target.stop().await.expect("stops");
        source.stop().await.expect("stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_protocol_csv_and_ndjson_files_import_with_labels_and_bad_lines_go_to_the_rejects() {
    let mut settings = settings_with(Granularity::Minute);
    // Shorter than the command's (`config/default.toml`): a line only the
    // service refuses, whose reason must reach the rejects all the same.
    settings.ingest.max_age = std::time::Duration::from_secs(3 * 86_400);
    let app = spawn_app_with(settings).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let t0 = base_time();
    // Line protocol, gzipped, with a tag that becomes a label.
    let lp = dir.path().join("weather.lp.gz");
    let mut lines = String::new();
    lines.push_str("# a comment line\n");
    for i in 0..50_i64 {
        lines.push_str(&format!(
            "weather,sensor=roof,site=berlin temp={}.5,hum={}i {}\n",
            i,
            40 + i,
            (t0 + i * 10) * 1_000_000_000
        ));
    }
    lines.push_str("weather,sensor=roof temp=1 \n"); // no timestamp: refused (line 52)
    lines.push_str("weather,sensor=roof temp=oops 1\n"); // line 53
    // Sent as it is and refused by the service (no sensor tag): the import
    // finds it with the service's decoder, and the good line after it is
    // stored once.
    lines.push_str(&format!(
        "weather,site=roof temp=2 {}\n",
        (t0 + 500) * 1_000_000_000
    )); // line 54
    lines.push_str(&format!(
        "weather,sensor=roof temp=99.5 {}\n",
        (t0 + 500) * 1_000_000_000
    ));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, lines.as_bytes()).expect("compressed");
    std::fs::write(&lp, gz.finish().expect("finished")).expect("written");
    // CSV with mapped columns, epoch seconds, an ignored column and bad rows.
    let csv = dir.path().join("meters.csv");
    let mut rows = String::from("time,device,kwh,note\n");
    for i in 0..40_i64 {
        rows.push_str(&format!("{},meter-{},{}.25,ok\n", t0 + i, i % 4, i));
    }
    rows.push_str(&format!("{},meter 9,1,bad id\n", t0)); // line 42
    rows.push_str(&format!("{},meter-1,many,bad value\n", t0 + 1)); // line 43
    // A sensor the line-protocol file labelled: the import leaves its labels.
    rows.push_str(&format!("{},roof,7.5,ok\n", t0 + 2));
    std::fs::write(&csv, rows).expect("written");
    // NDJSON, sent as it is: the service refuses the batch, the import
    // finds the bad lines with the service's decoder and sends the rest.
    let ndjson = dir.path().join("tank.ndjson");
    let mut readings = String::new();
    for n in 1..=33_i64 {
        readings.push_str(&match n {
            10 => format!(r#"{{"sensor":"tank","metric":"level","value":{n}}}"#),
            20 => format!(
                r#"{{"sensor":"tank","metric":"level","ts":{},"value":"x"}}"#,
                t0 * 1000
            ),
            25 => "oops".to_owned(),
            _ => format!(
                r#"{{"sensor":"tank","metric":"level","ts":{},"value":{n}}}"#,
                (t0 + n) * 1000
            ),
        });
        readings.push('\n');
    }
    // Line 34: older than the service keeps, not than the command's settings.
    readings.push_str(&format!(
        r#"{{"sensor":"tank","metric":"level","ts":{},"value":34}}"#,
        (t0 - 3 * 86_400) * 1000
    ));
    readings.push('\n');
    std::fs::write(&ndjson, readings).expect("written");

    let out = cli(
        &app.address,
        &[
            "import",
            "--quiet",
            "--column",
            "ts=time",
            "--column",
            "sensor=device",
            "--column",
            "value=kwh",
            "--ignore",
            "note",
            "--ts-unit",
            "s",
            lp.to_str().expect("UTF-8"),
            csv.to_str().expect("UTF-8"),
            ndjson.to_str().expect("UTF-8"),
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("172 readings stored, 9 lines refused"),
        "{}",
        text(&out)
    );
    let values = all_values(&app.buckets().await, Granularity::Minute);
    assert_eq!(values.len(), 172);
    assert_eq!(
        values.get(&("roof".into(), "weather_temp".into(), t0 + 500)),
        Some(&99.5)
    );
    assert_eq!(
        values.get(&("tank".into(), "level".into(), t0 + 33)),
        Some(&33.0)
    );
    assert_eq!(
        values.get(&("roof".into(), "value".into(), t0 + 2)),
        Some(&7.5)
    );
    assert_eq!(
        values.get(&("roof".into(), "weather_hum".into(), t0 + 490)),
        Some(&89.0)
    );
    assert_eq!(
        values.get(&("meter-3".into(), "value".into(), t0 + 39)),
        Some(&39.25)
    );
    let roof = app.get_json("/api/v1/sensors?prefix=roof").await;
    assert_eq!(roof["sensors"][0]["labels"]["site"], "berlin", "{roof}");
    let rejected = |name: &str| {
        std::fs::read_to_string(dir.path().join(format!("{name}.rejects"))).expect("a rejects file")
    };
    let lp_rejects = rejected("weather.lp.gz");
    let at: Vec<&str> = lp_rejects
        .lines()
        .map(|l| l.split(": ").next().expect("a location"))
        .collect();
    assert_eq!(
        at,
        [
            format!("{}:52", lp.display()),
            format!("{}:53", lp.display()),
            format!("{}:54", lp.display())
        ]
    );
    assert!(lp_rejects.contains("sensor"), "{lp_rejects}");
    let csv_rejects = rejected("meters.csv");
    assert!(
        csv_rejects.contains(":42: ") && csv_rejects.contains("meter 9"),
        "{csv_rejects}"
    );
    assert!(
        csv_rejects.contains(":43: ") && csv_rejects.contains("many"),
        "{csv_rejects}"
    );
    let ndjson_rejects = rejected("tank.ndjson");
    let lines: Vec<&str> = ndjson_rejects.lines().collect();
    assert_eq!(lines.len(), 4, "{ndjson_rejects}");
    for (line, (n, why)) in lines.iter().zip([
        (10, "ts is required"),
        (20, "expected f64"),
        (25, "one reading object"),
        (34, "ts is more than 3days in the past"),
    ]) {
        assert!(
            line.starts_with(&format!("{}:{n}: ", ndjson.display())) && line.contains(why),
            "{ndjson_rejects}"
        );
    }
    app.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_with_unknown_columns_or_an_export_without_a_range_is_refused_and_changes_nothing()
 {
    let app = spawn_app_with(settings_with(Granularity::Minute)).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let good = dir.path().join("good.csv");
    std::fs::write(
        &good,
        format!("sensor,ts,value\ns1,{},1\n", base_time() * 1000),
    )
    .expect("written");
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        format!("sensor,ts,value,colour\ns1,{},1,red\n", base_time() * 1000),
    )
    .expect("written");
    // The good file comes first: nothing is stored, as the bad one is
    // found before anything is sent.
    let out = cli(
        &app.address,
        &[
            "import",
            "--quiet",
            good.to_str().expect("UTF-8"),
            bad.to_str().expect("UTF-8"),
        ],
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out).contains("\"colour\""), "{}", text(&out));
    assert!(app.buckets().await.is_empty());
    assert!(!Path::new(&format!("{}.import-checkpoint", good.display())).exists());

    let t = base_time();
    for (query, why) in [
        (format!("to={}", rfc3339(t)), "from is required"),
        (
            format!("from={}&to={}&format=xml", rfc3339(t - 60), rfc3339(t)),
            "neither ndjson nor csv",
        ),
        (
            format!("from={}&to={}&colour=red", rfc3339(t - 60), rfc3339(t)),
            "unknown parameter",
        ),
    ] {
        let r = app.get(&format!("/api/v1/export?{query}")).await;
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.expect("JSON");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(why)),
            "{query}: {body}"
        );
    }
    app.stop().await.expect("stops");
}

/// A large CSV file with bad rows: the import runs through a gate that
/// answers only about half of its requests (the rest reach the service, but
/// their answers are held), is SIGKILLed once it waits at the gate with a
/// checkpoint written, then run again; every good row is stored once, every
/// bad row reported once, and the summary counts each reading once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_killed_halfway_resumes_and_stores_every_line_once() {
    const ROWS: i64 = 1_000_000;
    const SENSORS: i64 = 500;
    let mut settings = journal_settings();
    settings.buckets.granularity = Granularity::Hour;
    let app = spawn_app_with(settings).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("fleet.csv");
    let t0 = base_time();
    let mut body = String::with_capacity(40 * ROWS as usize);
    body.push_str("sensor,ts,value\n");
    let mut bad_lines = BTreeSet::new();
    for i in 0..ROWS {
        let line = i + 2;
        if i % 99_991 == 7 {
            body.push_str("sensor-x,not-a-time,1\n");
            bad_lines.insert(line);
            continue;
        }
        // Row i: sensor i % SENSORS, second i / SENSORS (one per sensor and second).
        body.push_str(&format!(
            "s{},{},{}\n",
            i % SENSORS,
            (t0 + i / SENSORS) * 1000,
            i % 1000
        ));
    }
    std::fs::write(&file, body).expect("written");
    let good = ROWS as u64 - bad_lines.len() as u64;
    let path = file.to_str().expect("UTF-8");
    let checkpoint = dir.path().join("fleet.csv.import-checkpoint");

    // 10 000 rows a request (the import's default batch): half the file's
    // requests are answered, the others stay unanswered until the kill.
    const BATCH: u64 = 10_000;
    let gate = gate(&app.address, (ROWS as u64 / 2 / BATCH) as usize).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--config", "config/default.toml", "import", "--quiet", path])
        .args(["--batch", &BATCH.to_string()])
        .env("HOURGLASS_URL", &gate.address)
        .env("HOURGLASS__MQTT__ENABLED", "false")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the import starts");
    eventually(
        Duration::from_secs(600),
        "a checkpoint written, and the import held at the gate",
        || {
            let records = std::fs::read_to_string(&checkpoint)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["records"].as_u64())
                .unwrap_or(0);
            let held = gate.held.load(std::sync::atomic::Ordering::SeqCst);
            async move { records > 0 && held > 0 }
        },
    )
    .await;
    // Nothing more can be answered: the import cannot have finished.
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("reaped");
    assert!(!status.success(), "killed before it finished");
    drop(gate);

    let out = cli(&app.address, &["import", "--quiet", path]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{good} readings stored, {} lines refused",
            bad_lines.len()
        )),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("resumed after"), "{}", text(&out));
    let rejects = std::fs::read_to_string(dir.path().join("fleet.csv.rejects")).expect("rejects");
    let reported: Vec<i64> = rejects
        .lines()
        .map(|l| {
            l.strip_prefix(&format!("{path}:"))
                .and_then(|l| l.split(':').next())
                .and_then(|n| n.parse().ok())
                .expect("file:line")
        })
        .collect();
    assert_eq!(reported, bad_lines.iter().copied().collect::<Vec<_>>());

    // Acknowledged is journaled: wait until all is stored, then compare.
    let buckets = app
        .db
        .collection::<mongodb::bson::Document>(&app.settings.mongodb.collection);
    eventually(Duration::from_secs(600), "every reading stored", || {
        let buckets = buckets.clone();
        async move {
            use futures_util::TryStreamExt;
            let total: i64 = buckets
                .find(mongodb::bson::doc! {})
                .projection(mongodb::bson::doc! { "count": 1 })
                .await
                .expect("find")
                .try_collect::<Vec<_>>()
                .await
                .expect("buckets")
                .iter()
                .map(|d| match d.get("count") {
                    Some(mongodb::bson::Bson::Int32(n)) => i64::from(*n),
                    Some(mongodb::bson::Bson::Int64(n)) => *n,
                    Some(mongodb::bson::Bson::Double(n)) => *n as i64,
                    _ => 0,
                })
                .sum();
            total == good as i64
        }
    })
    .await;
    let docs = app.buckets().await;
    assert_invariants(&docs, Granularity::Hour);
    let values = all_values(&docs, Granularity::Hour);
    assert_eq!(values.len() as u64, good);
    for i in (0..ROWS).filter(|i| !bad_lines.contains(&(i + 2))) {
        let key = (
            format!("s{}", i % SENSORS),
            "value".to_owned(),
            t0 + i / SENSORS,
        );
        assert_eq!(values.get(&key), Some(&((i % 1000) as f64)), "row {i}");
    }
    app.stop().await.expect("stops");
}

/// `hourglass import` and `export` as a client on another machine runs
/// them: outside the checkout, no configuration file, no MongoDB settings,
/// only `HOURGLASS_URL`.
#[tokio::test]
async fn import_and_export_need_only_the_service_url() {
    let app = crate::helpers::spawn_app().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let t = base_time();
    let file = dir.path().join("few.ndjson");
    std::fs::write(
        &file,
        format!(
            "{}\n{}\n",
            reading("c1", "temp", t, 1.5),
            reading("c1", "temp", t + 1, 2.5)
        ),
    )
    .expect("written");
    let run = |args: Vec<String>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"));
        cmd.current_dir(dir.path())
            .args(args)
            .env("HOURGLASS_URL", &app.address)
            .env_remove("HOURGLASS__MONGODB__URI")
            .env_remove("MONGODB_URI")
            .env_remove("RUST_LOG");
        async move { cmd.output().await.expect("the hourglass binary runs") }
    };
    let out = run(vec![
        "import".into(),
        "--quiet".into(),
        file.display().to_string(),
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2 readings stored"), "{}", text(&out));
    let out = run(vec![
        "export".into(),
        "--from".into(),
        rfc3339(t),
        "--to".into(),
        rfc3339(t + 60),
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let exported = rows(&String::from_utf8_lossy(&out.stdout), false);
    assert_eq!(exported.len(), 2, "{}", text(&out));
    app.stop().await.expect("stops");
}

fn delete_path(query: &str) -> String {
    format!("/api/v1/readings?{query}")
}

async fn delete(app: &TestApp, query: &str) -> reqwest::Response {
    app.client
        .delete(format!("{}{}", app.address, delete_path(query)))
        .send()
        .await
        .expect("sent")
}

/// Readings of `sensors` × `metrics` every 7 s over three ended hours.
fn fleet(t0: i64, sensors: &[&str], metrics: &[&str]) -> BTreeMap<(String, String, i64), f64> {
    let mut data = BTreeMap::new();
    for (k, s) in sensors.iter().enumerate() {
        for (j, m) in metrics.iter().enumerate() {
            for i in 0..(3 * 3600 / 7) {
                let ts = t0 + i * 7 + k as i64;
                data.insert(
                    ((*s).to_owned(), (*m).to_owned(), ts),
                    ((i * 13 + j as i64 * 5) % 97) as f64 * 0.5 - 11.0,
                );
            }
        }
    }
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_partial_and_whole_buckets_keeps_every_rollup_slot_and_average_exact() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let app = spawn_app_with(settings_with(g)).await;
        let t0 = base_time() - 4 * 3600;
        let mut data = fleet(t0, &["d1", "d2"], &["temp", "hum"]);
        post_all(&app, &data).await;
        crate::engine::assert_rollups_match_buckets(&app, g).await;

        // From the middle of one bucket to the middle of another, over
        // whole buckets (and, with hour buckets, a whole hour).
        let (from, to) = (t0 + 1234, t0 + 2 * 3600 + 1801);
        let gone = |s: &str, m: &str, ts: i64| s == "d1" && m == "temp" && (from..to).contains(&ts);
        let want = data.keys().filter(|(s, m, ts)| gone(s, m, *ts)).count() as u64;
        let query = format!(
            "sensor=d1&metric=temp&from={}&to={}",
            rfc3339(from),
            rfc3339(to)
        );
        let before = app.buckets().await;
        let dry: Value = delete(&app, &format!("{query}&dry_run=true"))
            .await
            .json()
            .await
            .expect("JSON");
        assert_eq!(dry["readings"].as_u64(), Some(want), "{g:?}: {dry}");
        assert_eq!(dry["dry_run"], true);
        assert_eq!(
            app.buckets().await,
            before,
            "{g:?}: a dry run changes nothing"
        );

        let r = delete(&app, &query).await;
        assert_eq!(r.status(), 200);
        let done: Value = r.json().await.expect("JSON");
        assert_eq!(done["readings"].as_u64(), Some(want), "{g:?}: {done}");
        assert!(done["buckets_deleted"].as_u64() > Some(0), "{g:?}: {done}");
        assert!(done["buckets_edited"].as_u64() >= Some(1), "{g:?}: {done}");
        assert_eq!(done["sensors"], 1);
        data.retain(|(s, m, ts), _| !gone(s, m, *ts));

        // Exact at once (the hours are marked late: buckets are read) …
        let model = |s: &str, m: &str| -> BTreeMap<i64, f64> {
            data.iter()
                .filter(|((ds, dm, _), _)| ds == s && dm == m)
                .map(|((_, _, ts), v)| (*ts, *v))
                .collect()
        };
        for (s, m) in [("d1", "temp"), ("d1", "hum"), ("d2", "temp")] {
            for (f, t) in [
                (t0 - 3600, t0 + 5 * 3600),
                (from - 61, to + 59),
                (t0, t0 + 86_400),
            ] {
                let got = app.get_json(&crate::engine::average_path(s, m, f, t)).await;
                crate::engine::assert_aggregates(
                    &got,
                    crate::helpers::expected(&model(s, m), f, t),
                    &format!("{g:?} {s} {m} {f}..{t}"),
                );
            }
        }
        let docs = app.buckets().await;
        assert_invariants(&docs, g);
        assert_eq!(
            all_values(&docs, g),
            data,
            "{g:?}: the buckets hold what is left"
        );
        // … and once rolled up again, every rollup slot equals its buckets.
        crate::engine::assert_rollups_match_buckets(&app, g).await;

        // Again: nothing left to delete.
        let again: Value = delete(&app, &query).await.json().await.expect("JSON");
        assert_eq!(again["readings"], 0, "{g:?}: {again}");

        // A whole series: its metric leaves the registry; the sensor stays.
        let all = format!(
            "sensor=d2&metric=hum&from={}&to={}",
            rfc3339(t0 - 86_400),
            rfc3339(t0 + 86_400)
        );
        let done: Value = delete(&app, &all).await.json().await.expect("JSON");
        assert_eq!(done["series_emptied"], 1, "{g:?}: {done}");
        data.retain(|(s, m, _), _| !(s == "d2" && m == "hum"));
        assert_eq!(all_values(&app.buckets().await, g), data);
        let listed = app.get_json("/api/v1/sensors?prefix=d2").await;
        assert_eq!(listed["sensors"][0]["metrics"], json!(["temp"]), "{listed}");
        crate::engine::assert_rollups_match_buckets(&app, g).await;
        app.stop().await.expect("stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_without_a_range_or_selector_is_refused_and_deletes_nothing() {
    let app = spawn_app_with(settings_with(Granularity::Minute)).await;
    let t0 = base_time();
    let data = fleet(t0, &["d1"], &["temp"]);
    post_all(&app, &data).await;
    let before = app.buckets().await;
    let (from, to) = (rfc3339(t0), rfc3339(t0 + 3600));
    for (query, why) in [
        (format!("from={from}&to={to}"), "sensor="),
        (format!("sensor=d1&to={to}"), "from= and to="),
        (format!("sensor=d1&from={to}&to={from}"), "before"),
        (
            format!("sensor=d1&from={from}&to={to}&dry_run=maybe"),
            "dry_run",
        ),
        (
            format!("sensor=d1&from={from}&to={to}&colour=red"),
            "unknown parameter",
        ),
    ] {
        let r = delete(&app, &query).await;
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.expect("JSON");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(why)),
            "{query}: {body}"
        );
    }
    assert_eq!(app.buckets().await, before);
    // `hourglass delete` from a shell: the same route, counted the same way.
    let out = cli(
        &app.address,
        &[
            "delete",
            "--sensor",
            "d1",
            "--from",
            &from,
            "--to",
            &to,
            "--dry-run",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let want = data.keys().filter(|k| k.2 < t0 + 3600).count();
    assert!(
        text(&out).contains(&format!("Would delete {want} readings of 1 sensors")),
        "{}",
        text(&out)
    );
    let out = cli(&app.address, &["delete", "--from", &from, "--to", &to]).await;
    assert!(!out.status.success(), "no selector");
    assert!(text(&out).contains("sensor="), "{}", text(&out));
    assert_eq!(app.buckets().await, before);
    app.stop().await.expect("stops");
}

/// The open hour so far, `(start, now)`, at least two minutes into it
/// (waiting if need be): readings in it are held, not stored, for a while.
async fn open_hour() -> (i64, i64) {
    let mut now = time::OffsetDateTime::now_utc().unix_timestamp();
    if now.rem_euclid(3600) < 120 {
        tokio::time::sleep(Duration::from_secs((121 - now.rem_euclid(3600)) as u64)).await;
        now = time::OffsetDateTime::now_utc().unix_timestamp();
    }
    (now - now.rem_euclid(3600), now)
}

/// Writes into the range go on while the delete runs: each reading
/// acknowledged before the delete was sent is gone, each acknowledged
/// after its answer is kept; readings held unstored by the journal and
/// batcher when it ran (this hour's, with hour buckets) never reach a bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_writes_keeps_what_was_acknowledged_after_it_and_drops_what_was_held() {
    let g = Granularity::Hour;
    let mut settings = journal_settings();
    settings.buckets.granularity = g;
    let app = spawn_app_with(settings).await;
    // The open hour's journaled readings are held (batcher.max_hold) until
    // the delete has run.
    let (from, to) = open_hour().await;
    let old: BTreeMap<(String, String, i64), f64> = (from..to)
        .step_by(7)
        .map(|ts| (("r1".to_owned(), "temp".to_owned(), ts), (ts % 91) as f64))
        .collect();
    // Stored at once (?wait=stored), then overwritten by readings held.
    let body: Vec<Value> = old
        .iter()
        .map(|((s, m, ts), v)| reading(s, m, *ts, *v))
        .collect();
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&body).expect("JSON"),
            "?wait=stored",
        )
        .await;
    assert_eq!(r.status(), 200);
    let held: BTreeMap<_, _> = old.iter().map(|(k, v)| (k.clone(), v + 1000.0)).collect();
    post_all(&app, &held).await;

    // A writer of new seconds in the range, all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, url) = (
            app.client.clone(),
            format!("{}/api/v1/readings", app.address),
        );
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut log = Vec::new();
            for i in 0..3000_i64 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                // Seconds the first rounds left empty (theirs are 7 apart).
                let ts = from + (i / 6) * 7 + 1 + i % 6;
                if ts >= to {
                    break;
                }
                let sent = std::time::Instant::now();
                let r = client
                    .post(&url)
                    .json(&json!([reading("r1", "temp", ts, i as f64)]))
                    .send()
                    .await
                    .expect("sent");
                assert_eq!(r.status(), 200);
                log.push((ts, i as f64, sent, std::time::Instant::now()));
            }
            log
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The second round is still held (the flush after the first is seconds away).
    let stored = all_values(&app.buckets().await, g);
    assert_eq!(
        stored, old,
        "the second round is still unstored when the delete runs"
    );
    let sent = std::time::Instant::now();
    let r = delete(
        &app,
        &format!("sensor=r1&from={}&to={}", rfc3339(from), rfc3339(to)),
    )
    .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let answered = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let log = writer.await.expect("the writer ends");
    assert!(
        log.iter().any(|w| w.2 > answered),
        "some writes came after the answer"
    );
    // Answers leave the held readings out at once (they are all ≥ 1000,
    // the writer's are its request numbers).
    let avg = app
        .get_json(&crate::engine::average_path("r1", "temp", from, to))
        .await;
    assert!(avg["max"].as_f64().is_none_or(|m| m < 1000.0), "{avg}");
    assert!(avg["count"].as_u64() <= Some(log.len() as u64), "{avg}");
    assert!(
        log.iter().any(|w| w.3 < sent),
        "some writes came before the delete"
    );
    let (db, collection) = (app.db.clone(), app.settings.mongodb.collection.clone());
    app.stop().await.expect("drains");

    // What the journal and batcher held is gone with the rest of the range.
    let docs: Vec<mongodb::bson::Document> = {
        use futures_util::TryStreamExt;
        db.collection::<mongodb::bson::Document>(&collection)
            .find(mongodb::bson::doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("buckets")
    };
    let values = all_values(&docs, g);
    for k in old.keys() {
        assert!(
            !values.contains_key(k),
            "{k:?} was deleted, yet {:?} is stored",
            values.get(k)
        );
    }
    for &(ts, v, sent_at, acked_at) in &log {
        let key = ("r1".to_owned(), "temp".to_owned(), ts);
        if sent_at > answered {
            assert_eq!(
                values.get(&key),
                Some(&v),
                "{ts} acknowledged after the delete"
            );
        } else if acked_at < sent {
            assert_eq!(
                values.get(&key),
                None,
                "{ts} acknowledged before the delete"
            );
        }
    }
}

/// `(name, expireAfterSeconds, partial filter)` of each TTL index of `collection`.
async fn ttl_indexes(app: &TestApp, collection: &str) -> Vec<(String, i64, Option<String>)> {
    use futures_util::TryStreamExt;
    let mut out: Vec<(String, i64, Option<String>)> = app
        .db
        .collection::<mongodb::bson::Document>(collection)
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect::<Vec<_>>()
        .await
        .expect("indexes")
        .into_iter()
        .filter_map(|i| {
            let o = i.options?;
            let ttl = o.expire_after?;
            Some((
                o.name?,
                ttl.as_secs() as i64,
                o.partial_filter_expression.map(|p| p.to_string()),
            ))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_per_level_keeps_its_indexes_in_line_and_answers_old_ranges_coarse_and_flagged() {
    const DAY: i64 = 86_400;
    let g = Granularity::Minute;
    let mut writer = settings_with(g);
    writer.ingest.max_age = Duration::from_secs(30 * DAY as u64);
    let a = spawn_app_with(writer.clone()).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let old = now - now.rem_euclid(3600) - 5 * DAY;
    let mut model: BTreeMap<i64, f64> = BTreeMap::new();
    let mut data = BTreeMap::new();
    for i in 0..(3 * 3600 / 13) {
        let ts = old + i * 13;
        let v = ((i * 7) % 41) as f64 - 3.5;
        model.insert(ts, v);
        data.insert(("old-1".to_owned(), "temp".to_owned(), ts), v);
    }
    post_all(&a, &data).await;
    crate::engine::assert_rollups_match_buckets(&a, g).await;
    assert!(
        ttl_indexes(&a, &writer.mongodb.rollup_collection)
            .await
            .is_empty()
    );
    a.stop().await.expect("stops");

    // Buckets (and hour documents) for 3 days, day documents for 30, then 60.
    let mut kept = writer.clone();
    kept.ingest.max_age = Duration::from_secs(2 * DAY as u64);
    kept.retention.buckets = hourglass::Keep::For(Duration::from_secs(3 * DAY as u64));
    kept.retention.day = hourglass::Keep::For(Duration::from_secs(30 * DAY as u64));
    kept.retention.days30 = hourglass::Keep::Off;
    let b = spawn_app_with(kept.clone()).await;
    let rollups = kept.mongodb.rollup_collection.clone();
    assert_eq!(
        ttl_indexes(&b, &rollups).await,
        vec![
            (
                "start_ttl_day".to_owned(),
                31 * DAY,
                Some(r#"{ "period": "day" }"#.to_owned())
            ),
            (
                "start_ttl_hour".to_owned(),
                3 * DAY + 3600,
                Some(r#"{ "period": "hour" }"#.to_owned())
            ),
        ]
    );
    assert_eq!(
        ttl_indexes(&b, &kept.mongodb.collection).await,
        vec![("start_ttl".to_owned(), 3 * DAY, None)]
    );
    b.stop().await.expect("stops");
    kept.retention.day = hourglass::Keep::For(Duration::from_secs(60 * DAY as u64));
    let c = spawn_app_with(kept.clone()).await;
    assert_eq!(
        ttl_indexes(&c, &rollups).await[0],
        (
            "start_ttl_day".to_owned(),
            61 * DAY,
            Some(r#"{ "period": "day" }"#.to_owned())
        ),
        "changed in place"
    );

    // What the TTL indexes delete in time: the old buckets and hour documents.
    let db = &c.db;
    db.collection::<mongodb::bson::Document>(&kept.mongodb.collection)
        .delete_many(mongodb::bson::doc! { "sensor": "old-1" })
        .await
        .expect("deleted");
    db.collection::<mongodb::bson::Document>(&rollups)
        .delete_many(mongodb::bson::doc! { "sensor": "old-1", "period": "hour" })
        .await
        .expect("deleted");

    // An average over old readings: whole hours, flagged, exact over them.
    let (from, to) = (old + 1234, old + 2 * 3600 + 100);
    let got = c
        .get_json(&crate::engine::average_path("old-1", "temp", from, to))
        .await;
    let (wide_from, wide_to) = (old, old + 3 * 3600);
    assert_eq!(got["coarse"]["from"], rfc3339(wide_from), "{got}");
    assert_eq!(got["coarse"]["to"], rfc3339(wide_to), "{got}");
    assert_eq!(got["coarse"]["resolution"], "1h", "{got}");
    crate::engine::assert_aggregates(
        &got,
        crate::helpers::expected(&model, wide_from, wide_to),
        "coarse average",
    );
    // A series: minutes are refused there, hours answer and are flagged.
    let series = |step: &str| {
        format!(
            "/api/v1/sensors/old-1/series?metric=temp&from={}&to={}&step={step}",
            rfc3339(from),
            rfc3339(to)
        )
    };
    let r = c.get(&series("1m")).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("JSON");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("1h")),
        "{body}"
    );
    let got = c.get_json(&series("1h")).await;
    assert_eq!(got["coarse"]["resolution"], "1h", "{got}");
    for (i, p) in got["points"].as_array().expect("points").iter().enumerate() {
        let h = wide_from + i as i64 * 3600;
        assert_eq!(
            p["count"].as_u64(),
            Some(crate::helpers::expected(&model, h, h + 3600).0),
            "{p}"
        );
    }
    // Recent ranges are exact and not flagged.
    let recent = c
        .get_json(&crate::engine::average_path(
            "old-1",
            "temp",
            now - 3600,
            now,
        ))
        .await;
    assert!(recent.get("coarse").is_none(), "{recent}");
    // The Prometheus API warns.
    let warned = c
        .get_json(&format!(
            "/prometheus/api/v1/query?query=count_over_time(temp[1h])&time={}",
            old + 3600
        ))
        .await;
    assert!(
        warned["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("retention.buckets")),
        "{warned}"
    );
    let quiet = c
        .get_json("/prometheus/api/v1/query?query=count_over_time(temp[1h])")
        .await;
    assert!(quiet.get("warnings").is_none(), "{quiet}");
    c.stop().await.expect("stops");
}

/// Two instances on one database: readings another instance holds in its
/// journal and batcher when the delete runs never reach a bucket, and it
/// keeps what it acknowledges after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_one_instance_covers_what_another_instance_holds() {
    let g = Granularity::Hour;
    let mut settings = journal_settings();
    settings.buckets.granularity = g;
    let a = spawn_app_with(settings.clone()).await;
    let mut other = settings.clone();
    other.journal.dir = crate::helpers::journal_dir();
    let b = spawn_app_with(other).await;
    let (from, to) = open_hour().await;
    let held: BTreeMap<(String, String, i64), f64> = (from..to)
        .step_by(5)
        .map(|ts| (("x1".to_owned(), "temp".to_owned(), ts), (ts % 17) as f64))
        .collect();
    // Acknowledged by B (journaled), held there: this hour is open.
    post_all(&b, &held).await;
    assert!(a.buckets().await.is_empty(), "B still holds what it took");
    let r = delete(
        &a,
        &format!("sensor=x1&from={}&to={}", rfc3339(from), rfc3339(to)),
    )
    .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // After the answer, B takes a new reading in the range: it stays.
    let after = (("x1".to_owned(), "temp".to_owned(), from + 1), 42.0);
    post_all(&b, &BTreeMap::from([after.clone()])).await;
    let (db, collection) = (a.db.clone(), a.settings.mongodb.collection.clone());
    b.stop().await.expect("B drains");
    a.stop().await.expect("A stops");
    let docs: Vec<mongodb::bson::Document> = {
        use futures_util::TryStreamExt;
        db.collection::<mongodb::bson::Document>(&collection)
            .find(mongodb::bson::doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("buckets")
    };
    assert_eq!(
        all_values(&docs, g),
        BTreeMap::from([after]),
        "only what B acknowledged after the delete is stored"
    );
}
