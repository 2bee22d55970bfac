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

/// How the rollup upkeep caught up with a backfill.
pub(crate) struct CatchUp {
    /// Seconds from the last reading stored until no hour was marked late.
    pub after_stored_s: f64,
    /// Seconds from the first request until then.
    pub total_s: f64,
    /// Series-hours rolled up meanwhile.
    pub hours: f64,
    /// Series-hours marked late 5 s after the last reading was stored.
    pub marked_after_5s: f64,
}

impl CatchUp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "seconds_after_stored": self.after_stored_s, "seconds_from_first_request": self.total_s,
            "series_hours_rolled_up": self.hours, "marked_late_5s_after_stored": self.marked_after_5s,
            "series_hours_per_s": self.hours / self.total_s.max(1e-9),
        })
    }

    pub fn section(&self, title: &str) -> crate::report::Section {
        use crate::report::f;
        let mut s = crate::report::Section::new(title, &["metric", "value"]);
        s.row(vec!["series-hours rolled up".into(), f(self.hours)]);
        s.row(vec![
            "series-hours marked late 5 s after the last reading stored (hourglass_rollup_late_hours)".into(),
            f(self.marked_after_5s),
        ]);
        s.row(vec![
            "seconds from the last reading stored to none marked late".into(),
            f(self.after_stored_s),
        ]);
        s.row(vec![
            "catch-up rate (series-hours rolled up per second, from the first request)".into(),
            f(self.hours / self.total_s.max(1e-9)),
        ]);
        s
    }
}

/// Waits until the service's gauge says no hour is marked late, then
/// measures the catch-up from `before` (a scrape before the first request,
/// sent at `sent_at`) and the moment the last reading was stored.
pub(crate) async fn caught_up(
    url: &str,
    before: &std::collections::HashMap<String, f64>,
    sent_at: Instant,
    stored_at: Instant,
    marked_after_5s: f64,
) -> anyhow::Result<CatchUp> {
    let deadline = Instant::now() + Duration::from_secs(4 * 3600);
    loop {
        let now = scrape(url).await?;
        let marked = now
            .get("hourglass_rollup_late_hours")
            .copied()
            .unwrap_or(0.0);
        if marked == 0.0 {
            let rolled = |m: &std::collections::HashMap<String, f64>| {
                m.get("hourglass_rollup_hours_total")
                    .copied()
                    .unwrap_or(0.0)
            };
            return Ok(CatchUp {
                after_stored_s: stored_at.elapsed().as_secs_f64(),
                total_s: sent_at.elapsed().as_secs_f64(),
                hours: rolled(&now) - rolled(before),
                marked_after_5s,
            });
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{marked} series-hours still marked late after four hours"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The series-hours marked late, as the service counts them.
pub(crate) async fn marked_late(url: &str) -> anyhow::Result<f64> {
    Ok(scrape(url)
        .await?
        .get("hourglass_rollup_late_hours")
        .copied()
        .unwrap_or(0.0))
}
