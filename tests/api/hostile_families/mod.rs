//! The families of hostile input of issue 89, each through the binary:
//! a query's memory (one budget per query), MQTT's wait cycles, identities
//! and the authority to write them, and connections that outlive their
//! bounds. Each test drives the family's worst known case and a few of its
//! relatives, and checks that the process lives, answers and stays truthful.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

mod connections;
mod identities;
mod mqtt_flood;
mod promql_budget;
mod protocol_fuzz;

/// `GET /health/live` answers 200 (the process lives and serves).
pub async fn live(client: &reqwest::Client, address: &str, after: &str) {
    let r = client
        .get(format!("{address}/health/live"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the service died or hung after {after}: {e}"));
    assert_eq!(r.status(), 200, "after {after}");
}

/// The readiness answer: its status and its checks.
pub async fn readiness(client: &reqwest::Client, address: &str) -> (u16, Value) {
    let r = client
        .get(format!("{address}/health/ready"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("readiness answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

/// The latest reading of `sensor`'s `temp`, if any.
pub async fn latest_temp(address: &str, sensor: &str) -> Option<Value> {
    let r = reqwest::get(format!(
        "{address}/api/v1/sensors/{sensor}/latest?metric=temp"
    ))
    .await
    .ok()?;
    if r.status() != 200 {
        return None;
    }
    r.json().await.ok()
}

/// SIGTERM, and the process's exit within `within` (its stop is bounded
/// by `shutdown.timeout`; more is a stop that hangs).
pub fn stops_within(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    match wait_at_most(child, within) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process had not exited {within:?} after SIGTERM");
        }
    }
}
