//! Connections: HTTP/2 gets HTTP/1's bounds (a first head due in time, an
//! idle timeout that PINGs do not reset), and at the cap a connection that
//! has not sent a request head gives way to a new one, so a probe is
//! answered while twice the cap of slow clients try. A browser's
//! cross-site write is refused.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::live;
use crate::helpers::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// A PING frame with `n` as its payload.
fn ping(n: u64) -> Vec<u8> {
    let mut f = vec![0, 0, 8, 6, 0, 0, 0, 0, 0];
    f.extend_from_slice(&n.to_be_bytes());
    f
}

/// Pings every `every` until the server closes the connection (`true`) or
/// `limit` passes (`false`).
async fn pings_until_closed(mut s: TcpStream, every: Duration, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 4096];
    let mut k = 0;
    while tokio::time::Instant::now() < deadline {
        k += 1;
        if s.write_all(&ping(k)).await.is_err() {
            return true;
        }
        let end = tokio::time::Instant::now() + every;
        while let Ok(read) = tokio::time::timeout_at(end, s.read(&mut buf)).await {
            match read {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    }
    false
}

#[tokio::test]
async fn http2_connections_that_only_ping_are_closed_and_the_cap_gives_way() {
    let mut settings = test_settings();
    settings.http.header_read_timeout = Duration::from_secs(30);
    settings.http.idle_timeout = Duration::from_secs(2);
    settings.http.max_connections = 4;
    settings.http.max_concurrent_requests = 3;
    let app = spawn_app_with(settings).await;
    let addr = app.address.trim_start_matches("http://").to_owned();
    let client = http_client();
    // 1. Four prior-knowledge HTTP/2 connections, one request each, then
    // only PINGs: closed once idle, whatever they ping.
    let mut pingers = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).await.expect("connects");
        s.write_all(PREFACE).await.expect("preface");
        s.write_all(&SETTINGS).await.expect("settings");
        // HEADERS for GET /health/live on stream 1 (HPACK: :method GET,
        // :scheme http, :path from the static table's "/" then a literal).
        let path = b"/health/live";
        let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
        block.extend_from_slice(path);
        block.extend_from_slice(&[0x41, 1, b'x']);
        let mut frame = vec![0, 0, block.len() as u8, 1, 0x05, 0, 0, 0, 1];
        frame.extend_from_slice(&block);
        s.write_all(&frame).await.expect("a request");
        pingers.push(tokio::spawn(pings_until_closed(
            s,
            Duration::from_millis(500),
            Duration::from_secs(60),
        )));
    }
    for p in pingers {
        assert!(p.await.expect("ran"), "a pinging connection stayed open");
    }
    live(&client, &app.address, "the pingers").await;
    // 2. Twice the cap of slow HTTP/1 clients (a header line every 200 ms,
    // within a head timeout of 30 s): the probe still gets its slot.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let addr = addr.clone();
        slow.push(tokio::spawn(async move {
            let Ok(mut s) = TcpStream::connect(&addr).await else {
                return;
            };
            if s.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
                .await
                .is_err()
            {
                return;
            }
            for _ in 0..150 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in 0..3 {
        // Well within the slow clients' 30 s head timeout: only giving way
        // can answer it.
        let r = client
            .get(format!("{}/health/live", app.address))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("probe {k} behind slow clients: {e}"));
        assert_eq!(r.status(), 200);
    }
    for task in slow {
        task.abort();
    }
}

#[tokio::test]
async fn an_http2_connection_that_never_sends_a_request_is_cut_at_the_head_timeout() {
    let mut settings = test_settings();
    settings.http.header_read_timeout = Duration::from_secs(1);
    settings.http.idle_timeout = Duration::from_secs(600);
    let app = spawn_app_with(settings).await;
    let addr = app.address.trim_start_matches("http://").to_owned();
    let mut s = TcpStream::connect(&addr).await.expect("connects");
    s.write_all(PREFACE).await.expect("preface");
    s.write_all(&SETTINGS).await.expect("settings");
    assert!(
        pings_until_closed(s, Duration::from_millis(200), Duration::from_secs(60)).await,
        "cut although it only pings"
    );
    // Half a preface, then nothing: cut too.
    let mut s = TcpStream::connect(&addr).await.expect("connects");
    s.write_all(&PREFACE[..10]).await.expect("half a preface");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a half preface held the connection");
}

#[tokio::test]
async fn a_browsers_cross_site_write_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let t = base_time();
    let host = app.address.trim_start_matches("http://").to_owned();
    let line = format!("temp,sensor=csrf value=1 {t}");
    for (name, headers) in [
        (
            "a form from another site",
            vec![("origin", "http://evil.example".to_owned())],
        ),
        (
            "fetch metadata",
            vec![("sec-fetch-site", "cross-site".to_owned())],
        ),
    ] {
        for path in [
            "/write?db=x&precision=s",
            "/api/v2/write?bucket=b&precision=s",
        ] {
            let mut r = app
                .client
                .post(format!("{}{path}", app.address))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(line.clone());
            for (k, v) in &headers {
                r = r.header(*k, v.as_str());
            }
            let r = r.send().await.expect("sent");
            assert_eq!(r.status(), 403, "{name} {path}");
        }
    }
    // The same page's own origin (the console) and a client that is not a
    // browser write as ever.
    let r = app
        .client
        .post(format!("{}/api/v2/write?bucket=b&precision=s", app.address))
        .header("origin", format!("http://{host}"))
        .body(line.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    let latest = app.get("/api/v1/sensors/csrf/latest?metric=temp").await;
    assert_eq!(latest.status(), 200);
}
