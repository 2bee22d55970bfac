//! Every ingest format over HTTP: bodies too large, too deep or wrong.

use super::cases::{Case, Request, nested, post};
use crate::helpers::{base_time, rfc3339};

/// Every ingest format over HTTP, each refused whole.
pub fn cases() -> Vec<Case> {
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
