//! Waiting for Hourglass to have stored what it acknowledged and rolled up
//! what it stored, before a figure is taken.

use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::procs::scrape;

/// How long a journaled load may take to reach MongoDB after its last answer.
pub(crate) const STORED_WITHIN: Duration = Duration::from_secs(900);

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

/// The first five seconds after a backfill's last reading was stored, until
/// a user opens a dashboard over it.
pub(crate) struct FirstSeconds {
    /// Series-hours marked late at 5 s.
    pub marked_at_5s: f64,
    /// When the gauge was first seen at 0, if it was by 5 s.
    pub cleared_after_s: Option<f64>,
}

/// Sleeps until 5 s after `stored_at`, looking at the late gauge four times
/// a second meanwhile (a scrape is about 0.25 ms of the service's CPU): the
/// catch-up's end is timed even when it comes before the 5 s panels, which
/// take a second or more themselves.
pub(crate) async fn first_five_seconds(
    url: &str,
    stored_at: Instant,
) -> anyhow::Result<FirstSeconds> {
    let five = stored_at + Duration::from_secs(5);
    let mut cleared_after_s = None;
    while let Some(left) = five.checked_duration_since(Instant::now()) {
        tokio::time::sleep(left.min(Duration::from_millis(250))).await;
        if cleared_after_s.is_none() && marked_late(url).await? == 0.0 {
            cleared_after_s = Some(stored_at.elapsed().as_secs_f64());
        }
    }
    let marked_at_5s = marked_late(url).await?;
    if marked_at_5s > 0.0 {
        // Not cleared after all (a pass had not yet counted the last marks).
        cleared_after_s = None;
    }
    Ok(FirstSeconds {
        marked_at_5s,
        cleared_after_s,
    })
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
/// sent at `sent_at`) and the moment the last reading was stored; `first`
/// times an end that came within five seconds.
pub(crate) async fn caught_up(
    url: &str,
    before: &std::collections::HashMap<String, f64>,
    sent_at: Instant,
    stored_at: Instant,
    first: FirstSeconds,
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
            let after_stored_s = first
                .cleared_after_s
                .unwrap_or_else(|| stored_at.elapsed().as_secs_f64());
            return Ok(CatchUp {
                after_stored_s,
                total_s: stored_at.duration_since(sent_at).as_secs_f64() + after_stored_s,
                hours: rolled(&now) - rolled(before),
                marked_after_5s: first.marked_at_5s,
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
