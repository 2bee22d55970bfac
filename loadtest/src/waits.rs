//! Waiting for Hourglass to have stored what it acknowledged and rolled up
//! what it stored, before a figure is taken.

use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::procs::scrape;

/// How long a journaled load may take to reach MongoDB after its last answer.
pub(crate) const STORED_WITHIN: Duration = Duration::from_secs(240);

/// Waits until no hour is marked late: asked of the database, not the
/// measured service, once a second.
pub(crate) async fn wait_rolled_up(
    mongo: &mongodb::Client,
    database: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let late = mongo
        .database(database)
        .collection::<mongodb::bson::Document>("late");
    let deadline = Instant::now() + within;
    while late.count_documents(mongodb::bson::doc! {}).await? > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "hours marked late were not rolled up within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    Ok(())
}

/// [`wait_rolled_up`] for a target of `ctx`, on a client of its own.
pub(crate) async fn rolled_up(ctx: &Ctx, database: &str, within: Duration) -> anyhow::Result<()> {
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    wait_rolled_up(&mongo, database, within).await
}

/// Waits until the service has stored `n` readings. Asked once a second: a
/// `/metrics` scrape costs the measured service about 0.25 ms of CPU, which
/// ten scrapes a second would add to its figure.
pub async fn wait_stored(url: &str, n: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + STORED_WITHIN;
    loop {
        let stored = scrape(url)
            .await?
            .get("hourglass_readings_stored_total")
            .copied()
            .unwrap_or(0.0);
        if stored >= n as f64 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{stored} of {n} readings stored {} s after the last answer",
            STORED_WITHIN.as_secs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
