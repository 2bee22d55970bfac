//! A dashboard that keeps refreshing while a backfill is caught up: every
//! few seconds it asks all its panels at once, as Grafana does, waiting for
//! the last round to end before the next. `history` and `backfill` run the
//! same backfill twice, on fresh databases, alone and with it refreshing
//! from the first request, and report the catch-up's rate in both: a
//! dashboard must not starve the catch-up it waits for.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::ctx::{Ctx, Target};
use crate::dataset::Dataset;
use crate::report::{Section, f, percentiles};
use crate::waits::CatchUp;

/// How often the dashboard refreshes.
pub(crate) const EVERY: Duration = Duration::from_secs(5);
/// A panel's answer is waited for at most this long (Grafana's default
/// data source timeout is longer; the service's query timeout is 10 s).
const PANEL_TIMEOUT: Duration = Duration::from_secs(30);

/// What the panels answered while the dashboard refreshed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    pub rounds: u64,
    pub ok: u64,
    /// 503s: the service said when to retry.
    pub unavailable: u64,
    /// Any other status, or no answer in time.
    pub failed: u64,
    /// Latencies of every answer (ms), whatever its status.
    pub latencies_ms: Vec<f64>,
}

/// A dashboard refreshing until [`Refresher::stop`].
pub(crate) struct Refresher {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Tally>,
}

impl Refresher {
    /// Starts refreshing `paths` of `url` every [`EVERY`].
    pub(crate) fn start(url: &str, paths: Vec<String>) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder().timeout(PANEL_TIMEOUT).build()?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let url = url.to_owned();
        let task = tokio::spawn(async move {
            let mut tally = Tally::default();
            while !*stopped.borrow() {
                let began = Instant::now();
                let round = paths.iter().map(|p| {
                    let (client, full) = (client.clone(), format!("{url}{p}"));
                    async move {
                        let t = Instant::now();
                        let status = match client.get(&full).send().await {
                            Ok(r) => {
                                let s = r.status().as_u16();
                                let _ = r.bytes().await;
                                Some(s)
                            }
                            Err(_) => None,
                        };
                        (status, t.elapsed().as_secs_f64() * 1000.0)
                    }
                });
                for (status, ms) in join_all(round).await {
                    tally.latencies_ms.push(ms);
                    match status {
                        Some(200) => tally.ok += 1,
                        Some(503) => tally.unavailable += 1,
                        _ => tally.failed += 1,
                    }
                }
                tally.rounds += 1;
                let next = began + EVERY;
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => {}
                    _ = stopped.changed() => {}
                }
            }
            tally
        });
        Ok(Self { stop, task })
    }

    /// Stops refreshing (after the round under way) and answers the tally.
    pub(crate) async fn stop(self) -> anyhow::Result<Tally> {
        let _ = self.stop.send(true);
        Ok(self.task.await?)
    }
}

/// Sends `data` to `target` (a fresh service) with a
/// dashboard of `paths` refreshing from the first request until nothing is
/// marked late, and measures the catch-up as `history` and `backfill` do
/// alone.
pub(crate) async fn catch_up_refreshed(
    ctx: &Ctx,
    target: &Target,
    data: &Dataset,
    paths: Vec<String>,
    (batch, concurrency): (usize, usize),
    journal: bool,
) -> anyhow::Result<(CatchUp, Tally)> {
    let before = crate::procs::scrape(&target.url).await?;
    let sent_at = Instant::now();
    let dashboard = Refresher::start(&target.url, paths)?;
    let sent = crate::send::send_all(ctx, target, data, batch, concurrency).await?;
    if journal {
        crate::waits::wait_stored(&target.url, sent.readings).await?;
    }
    let stored_at = Instant::now();
    let first = crate::waits::first_five_seconds(&target.url, stored_at).await?;
    let caught = crate::waits::caught_up(&target.url, &before, sent_at, stored_at, first).await;
    let tally = dashboard.stop().await?;
    Ok((caught?, tally))
}

/// The two catch-ups side by side, and whether the refreshed one kept at
/// least half the rate alone (the target).
pub(crate) fn compare(alone: &CatchUp, refreshed: &CatchUp, tally: &Tally) -> (Section, bool) {
    let rate = |c: &CatchUp| c.hours / c.total_s.max(1e-9);
    let ratio = rate(refreshed) / rate(alone).max(1e-9);
    let mut s = Section::new(
        &format!(
            "Catch-up alone and with a dashboard of {} panels refreshing every {} s from the first request (fresh databases, the same readings)",
            tally.latencies_ms.len() as u64 / tally.rounds.max(1),
            EVERY.as_secs()
        ),
        &["", "alone", "with the dashboard"],
    );
    s.row(vec![
        "series-hours rolled up".into(),
        f(alone.hours),
        f(refreshed.hours),
    ]);
    s.row(vec![
        "seconds from the first request to none marked late".into(),
        f(alone.total_s),
        f(refreshed.total_s),
    ]);
    s.row(vec![
        "seconds from the last reading stored to none marked late".into(),
        f(alone.after_stored_s),
        f(refreshed.after_stored_s),
    ]);
    s.row(vec![
        "series-hours marked late 5 s after stored".into(),
        f(alone.marked_after_5s),
        f(refreshed.marked_after_5s),
    ]);
    s.row(vec![
        "catch-up rate (series-hours per second from the first request)".into(),
        f(rate(alone)),
        format!("{} ({ratio:.2}× alone)", f(rate(refreshed))),
    ]);
    let (p50, p99, max) = percentiles(tally.latencies_ms.clone());
    s.row(vec![
        "panel answers: 200 / 503 / failed".into(),
        "".into(),
        format!("{} / {} / {}", tally.ok, tally.unavailable, tally.failed),
    ]);
    s.row(vec![
        "panel latency p50 / p99 / max (ms)".into(),
        "".into(),
        format!("{} / {} / {}", f(p50), f(p99), f(max)),
    ]);
    (s, ratio >= 0.5)
}

/// [`compare`]'s figures for the JSON report.
pub(crate) fn json(alone: &CatchUp, refreshed: &CatchUp, tally: &Tally) -> serde_json::Value {
    let rate = |c: &CatchUp| c.hours / c.total_s.max(1e-9);
    let (p50, p99, max) = percentiles(tally.latencies_ms.clone());
    serde_json::json!({
        "alone": alone.json(),
        "refreshed": refreshed.json(),
        "rate_ratio": rate(refreshed) / rate(alone).max(1e-9),
        "panels": { "rounds": tally.rounds, "ok": tally.ok, "unavailable": tally.unavailable,
            "failed": tally.failed, "latency_ms": { "p50": p50, "p99": p99, "max": max } },
    })
}
