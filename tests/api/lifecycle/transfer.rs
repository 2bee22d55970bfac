//! Export and import (`GET /api/v1/export`, `hourglass export`,
//! `hourglass import`) against real processes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::helpers::{
    all_values, assert_invariants, base_time, eventually, gate, journal_settings, reading, rfc3339,
    settings_with, spawn_app_with,
};

use super::common::{cli, post_all, text};

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

/// A TLS-terminating proxy in front of `target` (a reverse proxy as
/// operators run one), on `port`, with `cert` and `key`.
const TLS_PROXY: &str = r#"
import asyncio, ssl, sys
cert, key, port, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)

async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()

async def handle(r, w):
    tr, tw = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(r, tw), pipe(tr, w))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=ctx)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"#;

/// The command-line clients take an `https://` URL: an instance behind a
/// TLS proxy, its certificate checked against the roots the system (here
/// `SSL_CERT_FILE`) trusts, and refused when they do not trust it.
#[tokio::test]
async fn the_command_line_clients_reach_an_instance_behind_a_tls_proxy() {
    let app = crate::helpers::spawn_app().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    // A private CA and the proxy's certificate, signed by it.
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (ca, cert, key) = (path("ca.pem"), path("cert.pem"), path("key.pem"));
    std::fs::write(
        path("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("written");
    let other = path("other-ca.pem");
    for args in [
        format!(
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout {} -out {ca}",
            path("ca.key")
        ),
        format!(
            "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other-ca -keyout {} -out {other}",
            path("other-ca.key")
        ),
        format!(
            "req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout {key} -out {}",
            path("leaf.csr")
        ),
        format!(
            "x509 -req -in {} -CA {ca} -CAkey {} -CAcreateserial -days 1 -extfile {} -out {cert}",
            path("leaf.csr"),
            path("ca.key"),
            path("ext.cnf")
        ),
    ] {
        let made = std::process::Command::new("openssl")
            .args(args.split(' '))
            .output()
            .expect("openssl runs");
        assert!(made.status.success(), "openssl {args}: {}", text(&made));
    }
    let port = crate::helpers::free_port();
    let target = app.address.rsplit(':').next().expect("a port").to_owned();
    let mut proxy = std::process::Command::new("python3")
        .arg("-c")
        .arg(TLS_PROXY)
        .arg(&cert)
        .arg(&key)
        .arg(port.to_string())
        .arg(&target)
        .spawn()
        .expect("python3 runs");
    crate::helpers::listening(port, "the TLS proxy listens").await;
    let t = base_time();
    let file = dir.path().join("few.ndjson");
    std::fs::write(
        &file,
        format!(
            "{}\n{}\n",
            reading("tls", "temp", t, 1.5),
            reading("tls", "temp", t + 1, 2.5)
        ),
    )
    .expect("written");
    let url = format!("https://localhost:{port}");
    let run = |args: Vec<String>, trusted: bool| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"));
        cmd.current_dir(dir.path())
            .args(args)
            .env("HOURGLASS_URL", &url)
            // Only this file's roots: the system's do not know the proxy.
            .env("SSL_CERT_DIR", dir.path().join("no-roots"))
            .env_remove("RUST_LOG");
        if trusted {
            cmd.env("SSL_CERT_FILE", &ca);
        } else {
            cmd.env("SSL_CERT_FILE", &other);
        }
        async move { cmd.output().await.expect("the hourglass binary runs") }
    };
    let import = vec![
        "import".into(),
        "--quiet".into(),
        file.display().to_string(),
    ];
    let out = run(import.clone(), false).await;
    assert!(!out.status.success(), "an untrusted certificate is refused");
    assert!(text(&out).contains("certificate"), "{}", text(&out));
    assert!(app.buckets().await.is_empty(), "and nothing was sent");
    let out = run(import, true).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2 readings stored"), "{}", text(&out));
    let export = vec![
        "export".into(),
        "--from".into(),
        rfc3339(t),
        "--to".into(),
        rfc3339(t + 60),
    ];
    let out = run(export, true).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rows(&String::from_utf8_lossy(&out.stdout), false).len(), 2);
    let _ = proxy.kill();
    let _ = proxy.wait();
    app.stop().await.expect("stops");
}
