//! Hostile input on every surface of the real binary: PromQL and the
//! Prometheus listings, the JSON query routes, every ingest format over
//! HTTP, MQTT and Sparkplug payloads, DELETE and export parameters, the
//! console's routes and import files. Each is refused with a clear 4xx (or
//! 503 and Retry-After for a timeout), the process lives after every one,
//! nothing is stored, and its memory stays bounded.

use std::time::Duration;

use mongodb::bson::doc;
use serde_json::Value;

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;

/// Peak resident memory the debug binary may reach over the whole corpus
/// (120 MiB measured here).
const MAX_PEAK_RSS_MIB: u64 = 256;

enum Request {
    Get(String),
    Form(String, String),
    Post(String, &'static str, Vec<u8>),
    Put(String, &'static str, Vec<u8>),
    Delete(String),
    /// Headers announcing a body of this many bytes, then 64 KiB of it: the
    /// answer may come before the rest (and the connection close with it).
    Oversized(String, usize),
}

struct Case {
    name: String,
    request: Request,
    /// 503 with Retry-After (a timeout), not a 4xx.
    timeout: bool,
}

fn get(name: impl Into<String>, path: impl Into<String>) -> Case {
    Case {
        name: name.into(),
        request: Request::Get(path.into()),
        timeout: false,
    }
}

/// A form POST, as Grafana sends PromQL.
fn form(name: impl Into<String>, path: &str, pairs: &[(&str, &str)]) -> Case {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    Case {
        name: name.into(),
        request: Request::Form(path.into(), body),
        timeout: false,
    }
}

fn post(name: impl Into<String>, path: &str, ct: &'static str, body: impl Into<Vec<u8>>) -> Case {
    Case {
        name: name.into(),
        request: Request::Post(path.into(), ct, body.into()),
        timeout: false,
    }
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn nested(open: &str, inner: &str, close: &str, n: usize) -> String {
    format!("{}{inner}{}", open.repeat(n), close.repeat(n))
}

/// PromQL texts that are too long, too deep, too large or wrong.
fn promql() -> Vec<Case> {
    let mut sub = String::from("temp");
    for _ in 0..2000 {
        sub = format!("max_over_time(({sub})[5m:1m])");
    }
    let alternation = (0..20_000)
        .map(|i| format!("s{i}"))
        .collect::<Vec<_>>()
        .join("|");
    let many_args = format!(
        "label_join(temp, \"x\", \",\", {})",
        vec!["\"a\""; 2100].join(", ")
    );
    let queries: Vec<(&str, String)> = vec![
        ("a 3 000-term sum", vec!["temp"; 3000].join("+")),
        ("a 600-term sum within the length", vec!["t"; 600].join("+")),
        ("5 000 nested parentheses", nested("(", "temp", ")", 5000)),
        ("abs nested 3 000 deep", nested("abs(", "temp", ")", 3000)),
        ("abs nested 300 deep", nested("abs(", "t", ")", 300)),
        ("subqueries nested 2 000 deep", sub),
        (
            "a 1 MiB query",
            format!("temp{{a=\"{}\"}}", "x".repeat(1 << 20)),
        ),
        (
            "a 20 000-way regex alternation",
            format!("temp{{sensor=~\"{alternation}\"}}"),
        ),
        ("2 100 arguments", many_args),
        (
            "aggregations nested 400 deep",
            nested("sum by (a) (", "t", ")", 400),
        ),
        ("negations nested 400 deep", nested("-(", "t", ")", 400)),
        (
            "a subquery of 34 million steps",
            "max_over_time(temp[400d:1s])".into(),
        ),
        ("a range past max_range", "rate(temp[1000d])".into()),
        ("a range no duration holds", "rate(temp[1e300])".into()),
        ("an offset no duration holds", "temp offset -Inf".into()),
        ("an invalid regex", r#"temp{sensor=~"("}"#.into()),
        (
            "a regex nested 300 deep",
            format!("temp{{sensor=~\"{}\"}}", nested("(", "a", ")", 300)),
        ),
        (
            "a regex that compiles too large",
            r#"temp{sensor=~"(((a{100}){100}){100})"}"#.into(),
        ),
        (
            "label_replace with an invalid regex",
            r#"label_replace(temp, "a", "$1", "sensor", "(")"#.into(),
        ),
        (
            "label_replace with a regex too large",
            r#"label_replace(temp, "a", "$1", "sensor", "(((a{100}){100}){100})")"#.into(),
        ),
        ("unbalanced parentheses", "sum(temp".into()),
        ("a NUL byte", "temp\u{0}".into()),
        ("an empty query", String::new()),
        ("an unknown function", "frobnicate(temp)".into()),
        ("a bare range vector", "temp[5m]".into()),
        ("a string answer", "\"abc\"".into()),
        ("a comment only", "# nothing".into()),
    ];
    let mut cases: Vec<Case> = queries
        .into_iter()
        .map(|(name, q)| {
            form(
                format!("PromQL: {name}"),
                "/prometheus/api/v1/query",
                &[("query", &q), ("time", "1700000000")],
            )
        })
        .collect();
    // Within every limit, but a million windows of a million points each:
    // cut off at its timeout.
    let mut bomb = form(
        "PromQL: a million windows of a million points",
        "/prometheus/api/v1/query",
        &[
            (
                "query",
                "max_over_time(max_over_time(vector(1)[12d:1s])[12d:1s])",
            ),
            ("timeout", "2s"),
        ],
    );
    bomb.timeout = true;
    cases.push(bomb);
    cases.push(get(
        "PromQL: invalid UTF-8",
        "/prometheus/api/v1/query?query=temp%FF%FE",
    ));
    for (name, params) in [
        ("a zero step", "start=0&end=100&step=0"),
        ("a negative step", "start=0&end=100&step=-5"),
        ("a billion points", "start=0&end=1000000000&step=1"),
        ("end before start", "start=100&end=0&step=1"),
        ("a NaN start", "start=NaN&end=100&step=1"),
        ("a start of 1e300", "start=1e300&end=1e301&step=1e299"),
        ("a garbage step", "start=0&end=100&step=%24gt"),
        ("a garbage timeout", "start=0&end=100&step=1&timeout=soon"),
    ] {
        cases.push(get(
            format!("PromQL range: {name}"),
            format!("/prometheus/api/v1/query_range?query=temp&{params}"),
        ));
    }
    // The Prometheus listings: their match[] selectors are parsed too.
    for (name, m) in [
        ("a deep match[]", nested("(", "temp", ")", 5000)),
        (
            "a long match[]",
            format!("temp{{a=\"{}\"}}", "x".repeat(40_000)),
        ),
        ("an expression as match[]", "sum(temp)".into()),
        ("an invalid match[] regex", r#"{sensor=~"(("}"#.into()),
    ] {
        cases.push(form(
            format!("Prometheus series: {name}"),
            "/prometheus/api/v1/series",
            &[("match[]", &m)],
        ));
        cases.push(get(
            format!("Prometheus label values: {name}"),
            format!("/prometheus/api/v1/label/sensor/values?match[]={}", enc(&m)),
        ));
    }
    cases.push(get(
        "Prometheus labels: a limit that is not a number",
        "/prometheus/api/v1/labels?limit=-1",
    ));
    cases.push(get(
        "Prometheus series: no match[]",
        "/prometheus/api/v1/series",
    ));
    cases
}

/// The JSON API's query routes, DELETE and export.
fn json_routes() -> Vec<Case> {
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

/// Every ingest format over HTTP, each refused whole.
fn ingest() -> Vec<Case> {
    let t = base_time();
    let ns = |s: i64| (s * 1_000_000_000).to_string();
    let deep_json = nested("[", "", "]", 100_000);
    let mut cases = vec![
        post(
            "JSON nested 100 000 deep",
            "/api/v1/readings",
            "application/json",
            deep_json.clone(),
        ),
        post(
            "JSON: an operator as value",
            "/api/v1/readings",
            "application/json",
            format!(
                r#"{{"sensor":"s1","ts":"{}","value":{{"$gt":1}}}}"#,
                rfc3339(t)
            ),
        ),
        post(
            "NDJSON with one line of 100 000 brackets",
            "/api/v1/readings",
            "application/x-ndjson",
            format!("{{\"sensor\":\"s1\",\"value\":1}}\n{deep_json}\n"),
        ),
        post(
            "CSV with an unclosed quote",
            "/api/v1/readings",
            "text/csv",
            format!("sensor,ts,value\n\"s1,{},1\n", t * 1000),
        ),
        post(
            "CSV with 100 000 columns",
            "/api/v1/readings",
            "text/csv",
            format!(
                "sensor,ts,value{}\ns1,{},1\n",
                ",x".repeat(100_000),
                t * 1000
            ),
        ),
        post(
            "CSV with a binary header",
            "/api/v1/readings",
            "text/csv",
            vec![0xff, 0xfe, 0x00, b'\n', b'1'],
        ),
        post(
            "CSV with a NaN value",
            "/api/v1/readings",
            "text/csv",
            format!("sensor,ts,value\ns1,{},NaN\n", t * 1000),
        ),
        post(
            "line protocol with a NaN field",
            "/write?precision=s",
            "text/plain",
            format!("temp,sensor=s1 value=NaN {t}\n"),
        ),
        post(
            "line protocol with 10 000 tags",
            "/api/v2/write?org=o&bucket=b",
            "text/plain",
            format!(
                "temp,sensor=s1{} value=1 {}\n",
                (0..10_000).map(|i| format!(",t{i}=v")).collect::<String>(),
                ns(t)
            ),
        ),
        post(
            "line protocol with 100 000 fields",
            "/write",
            "text/plain",
            format!(
                "temp,sensor=s1 {} {}\n",
                (0..100_000)
                    .map(|i| format!("f{i}=1"))
                    .collect::<Vec<_>>()
                    .join(","),
                ns(t)
            ),
        ),
        post(
            "line protocol with an escape at the end",
            "/write",
            "text/plain",
            "temp,sensor=s1\\".to_string(),
        ),
        post(
            "line protocol with an unclosed string",
            "/write",
            "text/plain",
            format!("temp,sensor=s1 note=\"open value=1 {}\n", ns(t)),
        ),
        post(
            "line protocol with a timestamp of 10^30",
            "/write",
            "text/plain",
            "temp,sensor=s1 value=1 1000000000000000000000000000000\n".to_string(),
        ),
        post(
            "line protocol with a sensor of 10 000 characters",
            "/write",
            "text/plain",
            format!("temp,sensor={} value=1 {}\n", "a".repeat(10_000), ns(t)),
        ),
        Case {
            name: "a body of 16 MiB, over the limit".into(),
            request: Request::Oversized("/api/v1/readings".into(), 16 << 20),
            timeout: false,
        },
        Case {
            name: "line protocol of 1 GiB, over the limit".into(),
            request: Request::Oversized("/write".into(), 1 << 30),
            timeout: false,
        },
        post("a gzip bomb", "/write", "text/plain", Vec::new()),
    ];
    // The gzip bomb: 64 MiB of spaces in about 64 KiB, sent as gzip.
    if let Some(bomb) = cases.last_mut() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![b' '; 64 << 20]).expect("compressed");
        bomb.request = Request::Post("/write#gzip".into(), "text/plain", gz.finish().expect("gz"));
    }
    cases
}

/// MQTT messages (readings, line protocol, Sparkplug B), each dead-lettered.
fn messages() -> Vec<(&'static str, String, Vec<u8>)> {
    // Sparkplug: a metric holding a template holding a metric … 5 000 deep.
    let mut metric: Vec<u8> = Vec::new();
    for _ in 0..5000 {
        let mut template = vec![0x12]; // Template.metrics (2), length-delimited
        varint(&mut template, metric.len());
        template.extend_from_slice(&metric);
        let mut m = vec![0x92, 0x01]; // Metric.template_value (18)
        varint(&mut m, template.len());
        m.extend_from_slice(&template);
        metric = m;
    }
    let mut deep_payload = vec![0x12]; // Payload.metrics (2)
    varint(&mut deep_payload, metric.len());
    deep_payload.extend_from_slice(&metric);
    vec![
        (
            "MQTT: not a number",
            "sensors/s1/temp".into(),
            b"warm".to_vec(),
        ),
        ("MQTT: NaN", "sensors/s1/temp".into(), b"NaN".to_vec()),
        ("MQTT: 1e400", "sensors/s1/temp".into(), b"1e400".to_vec()),
        (
            "MQTT: an operator as value",
            "sensors/s1/temp".into(),
            br#"{"value":{"$gt":1}}"#.to_vec(),
        ),
        (
            "MQTT: JSON nested 100 000 deep",
            "sensors/s1".into(),
            nested("[", "", "]", 100_000).into_bytes(),
        ),
        (
            "MQTT: invalid UTF-8",
            "sensors/s1/temp".into(),
            vec![0xff, 0xfe, 0xfd],
        ),
        (
            "MQTT: a payload over the limit",
            "sensors/s1/temp".into(),
            vec![b'1'; 950 * 1024],
        ),
        (
            "MQTT: an operator as sensor",
            "sensors/$gt/temp".into(),
            b"1".to_vec(),
        ),
        (
            "MQTT: a sensor of 300 characters",
            format!("sensors/{}/temp", "a".repeat(300)),
            b"1".to_vec(),
        ),
        (
            "MQTT: line protocol with 10 000 tags",
            "telegraf/host/cpu".into(),
            format!(
                "temp,sensor=s1{} value=1\n",
                (0..10_000).map(|i| format!(",t{i}=v")).collect::<String>()
            )
            .into_bytes(),
        ),
        (
            "MQTT: line protocol that is not",
            "telegraf/host/cpu".into(),
            b"\\\\\\ ,,, === \n".to_vec(),
        ),
        (
            "Sparkplug: garbage",
            "spBv1.0/plant/NDATA/edge-1".into(),
            vec![0xff; 64],
        ),
        (
            "Sparkplug: a truncated payload",
            "spBv1.0/plant/NBIRTH/edge-1".into(),
            vec![0x12, 0x40, 0x0a, 0x01],
        ),
        (
            "Sparkplug: templates nested 5 000 deep",
            "spBv1.0/plant/NBIRTH/edge-1".into(),
            deep_payload,
        ),
        (
            "Sparkplug: data before any birth",
            "spBv1.0/plant/DDATA/edge-2/dev".into(),
            // metrics { name: "t", datatype: 10 (Double), double_value: 1 }
            vec![
                0x12, 0x0e, 0x0a, 0x01, b't', 0x20, 0x0a, 0x69, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f,
            ],
        ),
        (
            "Sparkplug: an unknown message type",
            "spBv1.0/plant/NFOO/edge-1".into(),
            vec![0x08, 0x01],
        ),
    ]
}

fn varint(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Import files: each refused line by line or whole, nothing stored.
fn import_files(dir: &std::path::Path) -> Vec<(&'static str, std::path::PathBuf)> {
    let write = |name: &str, body: Vec<u8>| {
        let path = dir.join(name);
        std::fs::write(&path, body).expect("written");
        path
    };
    vec![
        (
            "import: a binary file as CSV",
            write("binary.csv", (0..=255u8).cycle().take(1 << 16).collect()),
        ),
        (
            "import: CSV rows that are all wrong",
            write(
                "wrong.csv",
                b"sensor,ts,value\n$gt,yesterday,x\n,,\ns1,1,NaN\n".to_vec(),
            ),
        ),
        (
            "import: NDJSON lines nested 50 000 deep",
            write(
                "deep.ndjson",
                format!(
                    "{}\n{}\n",
                    nested("[", "", "]", 50_000),
                    nested("{\"a\":", "1", "}", 50_000)
                )
                .into_bytes(),
            ),
        ),
        (
            // 64 MiB of one line in 64 KiB: read whole, it was held whole.
            "import: a gzipped NDJSON line of 64 MiB without a line end",
            write("endless.ndjson.gz", {
                use std::io::Write;
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                let chunk = vec![b'x'; 1 << 20];
                for _ in 0..64 {
                    gz.write_all(&chunk).expect("compressed");
                }
                gz.finish().expect("compressed")
            }),
        ),
        (
            "import: line protocol with a 1 MiB measurement",
            write(
                "long.lp",
                format!("{} value=1\n", "m".repeat(1 << 20)).into_bytes(),
            ),
        ),
    ]
}

/// What came back: the status, whether it says when to retry, the body.
struct Answer {
    status: u16,
    retry_after: bool,
    body: String,
}

async fn send(client: &reqwest::Client, address: &str, request: &Request) -> Answer {
    if let Request::Oversized(path, len) = request {
        return oversized(address, path, *len).await;
    }
    let r = match request {
        Request::Get(path) => client.get(format!("{address}{path}")),
        Request::Form(path, body) => client
            .post(format!("{address}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.clone()),
        Request::Post(path, ct, body) => match path.strip_suffix("#gzip") {
            Some(path) => client
                .post(format!("{address}{path}"))
                .header("content-type", *ct)
                .header("content-encoding", "gzip")
                .body(body.clone()),
            None => client
                .post(format!("{address}{path}"))
                .header("content-type", *ct)
                .body(body.clone()),
        },
        Request::Put(path, ct, body) => client
            .put(format!("{address}{path}"))
            .header("content-type", *ct)
            .body(body.clone()),
        Request::Delete(path) => client.delete(format!("{address}{path}")),
        Request::Oversized(..) => unreachable!("sent above"),
    };
    let r = r.send().await.expect("the request is answered");
    Answer {
        status: r.status().as_u16(),
        retry_after: r.headers().contains_key("retry-after"),
        body: r.text().await.unwrap_or_default(),
    }
}

/// Announces `len` bytes of JSON, sends 64 KiB, and reads the answer.
async fn oversized(address: &str, path: &str, len: usize) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .expect("connects");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("headers sent");
    // The server may answer and close before taking all of this.
    let _ = stream.write_all(&vec![b' '; 64 * 1024]).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status,
        retry_after: headers.to_ascii_lowercase().contains("retry-after:"),
        body: body.to_owned(),
    }
}

/// VmHWM of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM")
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_on_every_surface_is_refused_and_the_service_lives_on() {
    let db = Database::start().await;
    let broker = Broker::start().await;
    let mut settings = db.settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.journal.enabled = true;
    settings.journal.dir = journal_dir();
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let mut child = spawn_binary(
        &settings,
        &[
            ("HOURGLASS__MQTT__SPARKPLUG__ENABLED", "true"),
            // 900 KiB: under the broker's max_packet_size (1 MiB) by less
            // than the 64 KiB the client allows for headers, so a payload
            // over it reaches Hourglass's own check.
            ("HOURGLASS__MQTT__MAX_PAYLOAD_BYTES", "921600"),
            // Timeouts are tried with the server holding a find for 3 s.
            ("HOURGLASS__QUERY__TIMEOUT", "2s"),
        ],
        &log,
    );
    let address = binary_address(&log).await;
    let pid = child.id();
    let client = reqwest::Client::new();
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead-letters")).await;
    let mut dead_letters = watcher.messages();
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    let alive = |child: &mut std::process::Child, after: &str| {
        assert!(
            child.try_wait().expect("waitable").is_none(),
            "the service died after {after}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let mut tried = 0;

    let mut cases = promql();
    cases.extend(json_routes());
    cases.extend(ingest());
    for case in &cases {
        let Answer {
            status,
            retry_after,
            body: full,
        } = send(&client, &address, &case.request).await;
        let body: String = full.chars().take(300).collect();
        if case.timeout {
            assert!(
                status == 503 && retry_after,
                "{}: {status} {body}",
                case.name
            );
        } else {
            assert!(
                (400..500).contains(&status),
                "{}: {status} {body}",
                case.name
            );
        }
        assert!(!body.trim().is_empty(), "{}: an empty answer", case.name);
        for internal in ["panicked", "src/", "mongodb://", "backtrace"] {
            assert!(
                !full.contains(internal),
                "{}: leaks {internal:?}: {body}",
                case.name
            );
        }
        alive(&mut child, &case.name);
        assert_eq!(
            client
                .get(format!("{address}/health/live"))
                .send()
                .await
                .expect("live")
                .status(),
            200,
            "{}",
            case.name
        );
        tried += 1;
    }

    // Queries slower than their timeout: the registry's find is held by the
    // server for 3 s; PromQL allows 500 ms, the JSON API query.timeout (2 s).
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 3000 },
    })
    .await;
    let slow = form(
        "PromQL: a query past its timeout",
        "/prometheus/api/v1/query",
        &[("query", "temp"), ("timeout", "500ms")],
    );
    let r = send(&client, &address, &slow.request).await;
    assert!(
        r.status == 503 && r.retry_after,
        "{}: {}",
        slow.name,
        r.status
    );
    let r = send(
        &client,
        &address,
        &get(
            "JSON: an average past its timeout",
            format!(
                "/api/v1/average?metric=temp&from={}&to={}",
                rfc3339(base_time()),
                rfc3339(base_time() + 60)
            ),
        )
        .request,
    )
    .await;
    assert!(
        r.status == 503 && r.retry_after,
        "a group average past its timeout: {}",
        r.status
    );
    db.fail_point(doc! { "mode": "off" }).await;
    alive(&mut child, "the timeouts");
    tried += 2;

    // MQTT and Sparkplug: each message is dead-lettered with its topic.
    let mut publisher = Publisher::connect(&broker, "hostile").await;
    for (name, topic, payload) in messages() {
        publisher.publish(&topic, payload).await;
        let letter = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let (_, body) = dead_letters.recv().await.expect("the watcher runs");
                let v: Value = serde_json::from_slice(&body).expect("a JSON dead letter");
                if v["topic"] == topic.as_str() {
                    return v;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: no dead letter"));
        assert!(
            letter["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{name}: {letter}"
        );
        alive(&mut child, name);
        tried += 1;
    }

    // Import files, through the command-line client.
    let files = tempfile::tempdir().expect("a temporary directory");
    for (name, path) in import_files(files.path()) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .current_dir(files.path())
            .args(["import", "--quiet"])
            .arg(&path)
            .env("HOURGLASS_URL", &address)
            .output()
            .await
            .expect("the import runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success() || text.contains(" 0 readings stored"),
            "{name}: {text}"
        );
        if name.contains("without a line end") {
            assert!(text.contains("longer than 1048576 bytes"), "{name}: {text}");
        }
        alive(&mut child, name);
        tried += 1;
    }

    assert!(tried >= 60, "at least 60 hostile inputs, not {tried}");
    let peak = peak_rss_mib(pid);
    assert!(
        peak < MAX_PEAK_RSS_MIB,
        "peak memory {peak} MiB, over {MAX_PEAK_RSS_MIB}"
    );
    // Nothing refused reached storage (a write is journaled first: the
    // journal holds nothing either).
    let hourglass = mongodb::Client::with_uri_str(db.uri())
        .await
        .expect("a client")
        .database(&settings.mongodb.database);
    for collection in ["buckets", "rollups", "sensors"] {
        let n = hourglass
            .collection::<mongodb::bson::Document>(collection)
            .count_documents(doc! {})
            .await
            .expect("counted");
        assert_eq!(n, 0, "{collection} holds what hostile input sent");
    }
    let received = metric(&address, "hourglass_journal_appended_bytes_total").await;
    assert_eq!(received, 0.0, "nothing was journaled");
    eprintln!("{tried} hostile inputs refused; peak memory {peak} MiB");
    assert!(terminate(&mut child).success(), "a clean stop");
}
