//! What the lifecycle suites share: the CLI run against a service, its
//! output, posting a data set, the open hour.

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{TestApp, reading};

/// Runs the `hourglass` binary's `args` against the service at `url`.
pub async fn cli(url: &str, args: &[&str]) -> Output {
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

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Posts `data` in requests of 500, each sent again on a 503 as a client
/// would (a store that did not confirm in time under load; retrying is
/// safe: a reading written again at its second changes nothing).
pub async fn post_all(app: &TestApp, data: &BTreeMap<(String, String, i64), f64>) {
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

/// The open hour so far, `(start, now)`, at least two minutes into it
/// (waiting if need be): readings in it are held, not stored, for a while.
pub async fn open_hour() -> (i64, i64) {
    let mut now = time::OffsetDateTime::now_utc().unix_timestamp();
    if now.rem_euclid(3600) < 120 {
        tokio::time::sleep(Duration::from_secs((121 - now.rem_euclid(3600)) as u64)).await;
        now = time::OffsetDateTime::now_utc().unix_timestamp();
    }
    (now - now.rem_euclid(3600), now)
}
