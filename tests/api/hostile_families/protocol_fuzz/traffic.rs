//! Hostile-but-plausible traffic: HTTP requests on every route with bodies
//! of every format (sizes, nestings, encodings), and MQTT messages of every
//! topic form (readings, line protocol, Sparkplug births, data and deaths,
//! and topics no form has). No hostile request names a `good-*` sensor or
//! deletes beyond `h*`: what the good traffic stores must be there after.

use std::io::Write;

use prost::Message as _;
use srad_types::payload::metric::Value as MetricValue;
use srad_types::payload::{Metric, Payload};

use super::promql;
use crate::helpers::Gen;

/// One hostile HTTP request.
pub struct Request {
    pub method: reqwest::Method,
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// One hostile MQTT message.
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos1: bool,
}

/// A sensor id a hostile client might send: valid ones of its own, and
/// every way an id can be wrong. Never `good-*`.
fn sensor(g: &mut Gen) -> String {
    match g.below(10) {
        0 => String::new(),
        1 => "h".repeat(g.below(400) as usize + 1),
        2 => "h\u{1F642}é".into(),
        3 => "h a/b#+".into(),
        4 => "h\u{0}x".into(),
        5 => format!("h-{}", "*?".repeat(g.below(100) as usize)),
        _ => format!("h{}", g.below(40)),
    }
}

fn metric(g: &mut Gen) -> String {
    match g.below(8) {
        0 => String::new(),
        1 => "m".repeat(g.below(300) as usize + 1),
        2 => "temp.é$".into(),
        _ => (g.word(&["temp", "humidity", "co2", "v"])).to_owned(),
    }
}

/// A timestamp in every form and range a body may carry.
fn ts(g: &mut Gen, base_ms: i64) -> serde_json::Value {
    use serde_json::json;
    match g.below(12) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(i64::MAX),
        3 => json!(1e300),
        4 => json!("9999-12-31T23:59:59Z"),
        5 => json!("0000-01-01T00:00:00Z"),
        6 => json!("not a time"),
        7 => json!(base_ms as f64 / 1000.0),
        8 => json!(null),
        _ => json!(base_ms + g.below(86_400_000) as i64),
    }
}

fn number(g: &mut Gen) -> serde_json::Value {
    use serde_json::json;
    match g.below(10) {
        0 => json!("NaN"),
        1 => json!(1e308),
        2 => json!(-0.0),
        3 => json!("1"),
        4 => json!(true),
        5 => json!([1, 2]),
        6 => json!({ "value": 1 }),
        _ => json!(g.below(1000) as f64 / 8.0),
    }
}

/// A JSON value nested `depth` deep, of random shapes.
fn nested(g: &mut Gen, depth: u64) -> String {
    let open = *g.pick(&["[", "{\"a\":"]);
    let close = if open == "[" { "]" } else { "}" };
    format!(
        "{}1{}",
        open.repeat(depth as usize),
        close.repeat(depth as usize)
    )
}

fn readings_json(g: &mut Gen, base_ms: i64) -> Vec<u8> {
    match g.below(8) {
        0 => {
            let depth = g.below(100_000);
            nested(g, depth).into_bytes()
        }
        1 => {
            // Many readings: up to past the per-request limit.
            let n = g.below(60_000);
            let mut s = String::from("[");
            for i in 0..n {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(&format!(
                    "{{\"sensor\":\"h{}\",\"metric\":\"temp\",\"ts\":{},\"value\":{}}}",
                    i % 50,
                    base_ms + i as i64,
                    i
                ));
            }
            s.push(']');
            s.into_bytes()
        }
        2 => {
            let mut bytes = vec![0u8; g.below(4096) as usize];
            for b in bytes.iter_mut() {
                *b = g.below(256) as u8;
            }
            bytes
        }
        _ => {
            let n = g.below(20) + 1;
            let items: Vec<serde_json::Value> = (0..n)
                .map(|_| {
                    let mut o = serde_json::Map::new();
                    if g.below(8) > 0 {
                        o.insert("sensor".into(), sensor(g).into());
                    }
                    if g.below(8) > 0 {
                        o.insert("metric".into(), metric(g).into());
                    }
                    if g.below(8) > 0 {
                        o.insert("ts".into(), ts(g, base_ms));
                    }
                    if g.below(8) > 0 {
                        o.insert("value".into(), number(g));
                    }
                    if g.below(4) == 0 {
                        o.insert(
                            "labels".into(),
                            serde_json::json!({ "site": "x".repeat(g.below(70_000) as usize) }),
                        );
                    }
                    serde_json::Value::Object(o)
                })
                .collect();
            let v = if g.below(3) == 0 {
                serde_json::Value::Array(items)
            } else {
                serde_json::json!({ "readings": items })
            };
            v.to_string().into_bytes()
        }
    }
}

fn line_protocol(g: &mut Gen, base_ms: i64) -> Vec<u8> {
    let mut s = String::new();
    for _ in 0..g.below(30) + 1 {
        match g.below(10) {
            0 => s.push_str(&format!(
                "temp,sensor={} value=1 {}\n",
                "h".repeat(70_000),
                base_ms
            )),
            1 => {
                s.push_str("temp");
                for i in 0..g.below(500) {
                    s.push_str(&format!(",t{i}=v{i}"));
                }
                s.push_str(",sensor=h1 value=1\n");
            }
            2 => s.push_str(
                "temp,sensor=h1\\ \\,\\= value=1,other=\"x\\\"\",b=t,i=9223372036854775807i,u=1u\n",
            ),
            3 => s.push_str("\u{FEFF}temp,sensor=h2 value=1e400\n"),
            4 => s.push_str("# a comment\n\n\n"),
            5 => s.push_str(&format!("temp,sensor=h3 value=1 {}\n", i64::MAX)),
            6 => s.push_str("temp,sensor=h3 value=\n"),
            _ => s.push_str(&format!(
                "{},sensor={},site=s{} value={} {}\n",
                metric(g).replace([' ', ',', '\n'], "_"),
                sensor(g).replace([' ', ',', '\n', '='], "_"),
                g.below(5),
                g.below(100),
                base_ms / 1000 + g.below(86_400) as i64
            )),
        }
    }
    s.into_bytes()
}

fn csv(g: &mut Gen, base_ms: i64) -> Vec<u8> {
    let mut s = String::from(g.word(&[
        "sensor,metric,ts,value\n",
        "ts,value\n",
        "sensor,metric,ts,value,extra,\"quoted\nheader\"\n",
        "",
    ]));
    for _ in 0..g.below(50) {
        s.push_str(&format!(
            "{},{},{},{}\n",
            sensor(g).replace(['\n', ','], "_"),
            metric(g),
            base_ms + g.below(1000) as i64,
            g.word(&["1", "x", "\"2\"", "", "1e999", "\"unterminated"])
        ));
    }
    s.into_bytes()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// 256 MiB of zeros gzipped into about 256 KiB, made once.
fn bomb() -> &'static [u8] {
    static BOMB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BOMB.get_or_init(|| gzip(&vec![b'0'; 256 << 20]))
}

/// An encoding for a body: none, gzip, a bomb, a broken stream, or a
/// coding the service does not take.
fn encode(g: &mut Gen, r: &mut Request) {
    match g.below(8) {
        0 => {
            r.body = gzip(&r.body);
            r.headers.push(("content-encoding", "gzip".into()));
        }
        1 => {
            r.body = bomb().to_vec();
            r.headers.push(("content-encoding", "gzip".into()));
        }
        2 => {
            let mut z = gzip(&r.body);
            z.truncate(z.len() / 2);
            r.body = z;
            r.headers.push(("content-encoding", "gzip".into()));
        }
        3 => r.headers.push((
            "content-encoding",
            (g.word(&["br", "zstd", "x-bogus", "gzip, gzip"])).into(),
        )),
        _ => {}
    }
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn instant(g: &mut Gen, base_s: i64) -> String {
    if g.below(3) > 0 {
        return (base_s - g.below(86_400 * 3) as i64).to_string();
    }
    (g.word(&[
        "0",
        "-9223372036854775000",
        "1e300",
        "NaN",
        "abc",
        "9999-12-31T23:59:59Z",
        "2026-13-45T00:00:00Z",
        "",
    ]))
    .to_owned()
}

/// One hostile HTTP request on a random route.
pub fn request(g: &mut Gen, base_s: i64) -> Request {
    let base_ms = base_s * 1000;
    let mut r = Request {
        method: reqwest::Method::GET,
        path: String::new(),
        headers: Vec::new(),
        body: Vec::new(),
    };
    match g.below(16) {
        0 | 1 => {
            r.method = reqwest::Method::POST;
            r.path = "/api/v1/readings".into();
            r.body = readings_json(g, base_ms);
            r.headers.push(("content-type", "application/json".into()));
            encode(g, &mut r);
        }
        2 => {
            r.method = reqwest::Method::POST;
            r.path = "/api/v1/readings".into();
            r.body = csv(g, base_ms);
            r.headers.push((
                "content-type",
                (g.word(&[
                    "text/csv",
                    "application/x-ndjson",
                    "text/plain",
                    "multipart/form-data",
                ]))
                .into(),
            ));
            encode(g, &mut r);
        }
        3 | 4 => {
            r.method = reqwest::Method::POST;
            r.path = format!(
                "{}?precision={}",
                g.word(&["/write", "/api/v2/write"]),
                g.word(&["s", "ms", "us", "ns", "n", "h", "x", ""])
            );
            r.body = line_protocol(g, base_ms);
            encode(g, &mut r);
        }
        5..=8 => {
            let depth = g.below(6) as u32 + 1;
            let q = promql::query(g, depth);
            let (start, end) = (instant(g, base_s), instant(g, base_s));
            let step = *g.pick(&[
                "1", "0.001", "15", "60", "3600", "0", "-1", "1e-9", "abc", "1e300",
            ]);
            r.path = match g.below(3) {
                0 => format!(
                    "/prometheus/api/v1/query?query={}&time={}",
                    enc(&q),
                    enc(&start)
                ),
                _ => format!(
                    "/prometheus/api/v1/query_range?query={}&start={}&end={}&step={step}",
                    enc(&q),
                    enc(&start),
                    enc(&end)
                ),
            };
            if g.below(3) == 0 {
                // The same as a form.
                let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
                r.body = query.as_bytes().to_vec();
                r.path = path.to_owned();
                r.method = reqwest::Method::POST;
                r.headers
                    .push(("content-type", "application/x-www-form-urlencoded".into()));
            }
        }
        9 => {
            let matches: Vec<String> = (0..g.below(40))
                .map(|_| format!("match[]={}", enc(&promql::query(g, 1))))
                .collect();
            r.path = format!(
                "{}?{}&start={}&end={}",
                g.word(&[
                    "/prometheus/api/v1/series",
                    "/prometheus/api/v1/labels",
                    "/prometheus/api/v1/label/sensor/values",
                    "/prometheus/api/v1/label/__name__/values",
                    "/prometheus/api/v1/label/%FF%FE/values",
                ]),
                matches.join("&"),
                enc(&instant(g, base_s)),
                enc(&instant(g, base_s))
            );
        }
        10 | 11 => {
            let id = enc(&sensor(g));
            let from = enc(&instant(g, base_s));
            let to = enc(&instant(g, base_s));
            let step = *g.pick(&[
                "1s",
                "1m",
                "1h",
                "1d",
                "0s",
                "-1h",
                "1y",
                "100000000000000d",
                "1mo",
            ]);
            let extra = *g.pick(&[
                "",
                "&agg=p99",
                "&agg=twa&weighting=linear",
                "&tz=Europe/Paris",
                "&tz=../../etc/passwd",
                "&label.site=x",
                "&format=csv",
                "&staleness=1y",
                "&fill=previous",
            ]);
            r.path = match g.below(8) {
                0 => format!(
                    "/api/v1/sensors/{id}/series?metric=temp&from={from}&to={to}&step={step}{extra}"
                ),
                1 => format!("/api/v1/sensors/{id}/average?metric=temp&from={from}&to={to}{extra}"),
                2 => format!("/api/v1/sensors/{id}/latest?metric=temp"),
                3 => format!(
                    "/api/v1/sensors/{id}/uptime?metric=temp&from={from}&to={to}&interval={step}"
                ),
                4 => format!(
                    "/api/v1/series?sensor={id}&metric=temp&from={from}&to={to}&step={step}{extra}"
                ),
                5 => format!(
                    "/api/v1/average?sensor={}&metric=temp&from={from}&to={to}{extra}",
                    enc(&format!("h{}", "*".repeat(g.below(200) as usize)))
                ),
                6 => format!(
                    "/api/v1/sensors?sensor={id}&silent={}&limit={}",
                    g.word(&["true", "x"]),
                    g.word(&["1", "0", "-1", "99999999999"])
                ),
                _ => format!(
                    "/api/v1/export?sensor={id}&from={from}&to={to}&format={}{extra}",
                    g.word(&["ndjson", "csv", "lp", "xml"])
                ),
            };
        }
        12 => {
            r.method = reqwest::Method::PUT;
            r.path = format!("/api/v1/sensors/{}/labels", enc(&sensor(g)));
            r.headers.push(("content-type", "application/json".into()));
            let mut labels = serde_json::Map::new();
            for i in 0..g.below(200) {
                labels.insert(
                    match g.below(4) {
                        0 => format!("__l{i}"),
                        1 => "ü".repeat(i as usize + 1),
                        _ => format!("l{i}"),
                    },
                    serde_json::Value::String("v".repeat(g.below(5000) as usize)),
                );
            }
            r.body = serde_json::Value::Object(labels).to_string().into_bytes();
        }
        13 => {
            r.method = reqwest::Method::DELETE;
            r.path = format!(
                "/api/v1/readings?sensor={}&from={}&to={}",
                enc(g.word(&["h1", "h*", "h?", "h["])),
                enc(&instant(g, base_s)),
                enc(&instant(g, base_s))
            );
        }
        14 => {
            r.path = format!(
                "/api/v1/dead_letters?limit={}&after={}",
                g.word(&["1", "-1", "99999999", "x"]),
                g.word(&["", "zzz", "%00"])
            );
        }
        _ => {
            // A browser's cross-site form, or a route no one serves.
            r.method = reqwest::Method::POST;
            if g.below(2) == 0 {
                r.path = "/write".into();
                r.headers.push(("origin", "https://evil.example".into()));
                r.headers.push(("sec-fetch-site", "cross-site".into()));
                r.headers
                    .push(("content-type", "application/x-www-form-urlencoded".into()));
                r.body = b"temp,sensor=h1 value=1".to_vec();
            } else {
                r.path = format!("/{}", "a/".repeat(g.below(2000) as usize));
            }
        }
    }
    r
}

fn sparkplug_metric(g: &mut Gen, base_ms: i64) -> Metric {
    let mut m = Metric::default();
    if g.below(4) > 0 {
        m.name = Some(match g.below(6) {
            0 => "bdSeq".into(),
            1 => "Properties/site".into(),
            2 => "x/".repeat(g.below(3000) as usize),
            3 => String::new(),
            _ => format!("m{}", g.below(20)),
        });
    }
    if g.below(2) == 0 {
        m.alias = Some(g.below(30));
    }
    if g.below(2) == 0 {
        m.timestamp = Some(match g.below(4) {
            0 => u64::MAX,
            1 => 0,
            _ => (base_ms + g.below(86_400_000) as i64) as u64,
        });
    }
    m.datatype = Some(g.below(40) as u32);
    m.value = match g.below(6) {
        0 => None,
        1 => Some(MetricValue::StringValue(
            "s".repeat(g.below(100_000) as usize),
        )),
        2 => Some(MetricValue::LongValue(g.next())),
        3 => Some(MetricValue::BooleanValue(g.below(2) == 0)),
        _ => Some(MetricValue::DoubleValue(f64::from_bits(g.next()))),
    };
    m
}

/// One hostile MQTT message on a random topic form.
pub fn message(g: &mut Gen, base_s: i64) -> Message {
    let base_ms = base_s * 1000;
    let qos1 = g.below(8) == 0;
    let (topic, payload) = match g.below(8) {
        0 | 1 => (
            format!(
                "sensors/{}/{}",
                sensor(g).replace(['#', '+', '\0'], "_"),
                metric(g)
            ),
            match g.below(6) {
                0 => b"not a number".to_vec(),
                1 => {
                    let depth = g.below(50_000);
                    nested(g, depth).into_bytes()
                }
                2 => format!(
                    "{{\"value\":{},\"ts\":{}}}",
                    g.word(&["1", "1e999", "\"x\"", "null"]),
                    ts(g, base_ms)
                )
                .into_bytes(),
                3 => vec![0xff; g.below(2 << 20) as usize],
                _ => format!("{}", g.below(100)).into_bytes(),
            },
        ),
        2 => (
            format!("sensors/{}", sensor(g).replace(['#', '+', '\0'], "_")),
            readings_json(g, base_ms),
        ),
        3 => (
            format!("telegraf/{}/cpu", g.below(5)),
            line_protocol(g, base_ms),
        ),
        4..=6 => {
            let kind = *g.pick(&[
                "NBIRTH", "DBIRTH", "NDATA", "DDATA", "NDEATH", "DDEATH", "NCMD", "STATE", "XBIRTH",
            ]);
            let group = match g.below(4) {
                0 => "G".repeat(g.below(300) as usize),
                _ => format!("hg{}", g.below(3)),
            };
            let node = match g.below(5) {
                0 => "n\u{1F642}".into(),
                1 => "n".repeat(g.below(300) as usize),
                _ => format!("hn{}", g.below(30)),
            };
            let device = if kind.starts_with('D') || g.below(5) == 0 {
                format!("/hd{}", g.below(30))
            } else {
                String::new()
            };
            let topic = format!("spBv1.0/{group}/{kind}/{node}{device}");
            let payload = if g.below(6) == 0 {
                let mut b = vec![0u8; g.below(512) as usize];
                for x in b.iter_mut() {
                    *x = g.below(256) as u8;
                }
                b
            } else {
                let mut p = Payload {
                    timestamp: Some(base_ms as u64),
                    seq: Some(g.below(300)),
                    ..Payload::default()
                };
                let most = if g.below(10) == 0 { 5_000 } else { 20 };
                for _ in 0..g.below(most) {
                    p.metrics.push(sparkplug_metric(g, base_ms));
                }
                p.encode_to_vec()
            };
            (topic, payload)
        }
        _ => (
            match g.below(4) {
                0 => "$SYS/x".into(),
                1 => "hourglass/dead-letters".into(),
                2 => format!("sensors/{}", "x/".repeat(g.below(100) as usize)),
                _ => "other/topic".into(),
            },
            b"{}".to_vec(),
        ),
    };
    Message {
        topic,
        payload,
        qos1,
    }
}
