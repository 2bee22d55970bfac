//! `backfill`: history uploaded in large batches, as fast as the service takes it.

use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::dataset::Dataset;
use crate::procs::scrape;
use crate::report::{Report, Section, f, percentiles};

pub use crate::send::Outcome;
use crate::send::send_all;

pub fn section(title: &str, o: &Outcome) -> Section {
    let (p50, p99, max) = percentiles(o.latencies_ms.clone());
    let mut s = Section::new(title, &["metric", "value"]);
    let rate = o.readings as f64 / o.seconds;
    s.row(vec!["readings".into(), o.readings.to_string()]);
    s.row(vec!["throughput (readings/s, stored)".into(), f(rate)]);
    s.row(vec![
        "request latency p50 / p99 / max (ms)".into(),
        format!("{} / {} / {}", f(p50), f(p99), f(max)),
    ]);
    s.row(vec!["503 retries".into(), o.retries.to_string()]);
    if let Some(cpu) = o.service_cpu {
        s.row(vec![
            "service CPU per reading (µs)".into(),
            f(cpu / o.readings as f64 * 1e6),
        ]);
    }
    s.row(vec![
        "bucket updates (writes) per reading".into(),
        f(o.bucket_updates / o.readings as f64),
    ]);
    s.row(vec!["write round trips".into(), f(o.round_trips)]);
    s
}

pub fn record(report: &mut Report, key: &str, o: &Outcome) {
    let (p50, p99, max) = percentiles(o.latencies_ms.clone());
    report.set(key, serde_json::json!({
        "readings": o.readings, "seconds": o.seconds, "readings_per_s": o.readings as f64 / o.seconds,
        "latency_ms": { "p50": p50, "p99": p99, "max": max }, "retries": o.retries,
        "service_cpu_s": o.service_cpu,
        "service_cpu_us_per_reading": o.service_cpu.map(|c| c / o.readings as f64 * 1e6),
        "bucket_updates": o.bucket_updates, "round_trips": o.round_trips,
        "writes_per_reading": o.bucket_updates / o.readings as f64,
    }));
}

/// The first series' average over the last 1, 7 and 60 days of `data`
/// (those its span holds), timed cold and on refresh.
async fn averages(
    url: &str,
    data: &Dataset,
    repeats: usize,
) -> anyhow::Result<Vec<(i64, crate::panel_timing::Timed)>> {
    let mut out = Vec::new();
    for (days, path) in average_paths(data) {
        out.push((
            days,
            crate::panel_timing::cold_and_refresh(url, &path, repeats).await?,
        ));
    }
    Ok(out)
}

/// The first series' average over the last 1, 7 and 60 days of `data`
/// (those its span holds): the days and the path.
fn average_paths(data: &Dataset) -> Vec<(i64, String)> {
    let end = data.end();
    let span = end - data.start;
    let mut out = Vec::new();
    for days in [1_i64, 7, 60] {
        if days > 1 && days * 86_400 > span + 86_400 {
            break;
        }
        let path = format!(
            "/api/v1/sensors/{}/average?metric={}&from={}&to={}",
            Dataset::sensor(0),
            Dataset::metric(0),
            crate::dataset::rfc3339(end - days * 86_400),
            crate::dataset::rfc3339(end)
        );
        out.push((days, path));
    }
    out
}

pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    verify: bool,
    journal: bool,
) -> anyhow::Result<(Report, bool)> {
    // Long: a scenario's steps in order (target, send, wait for storage, figures, report), each a few lines.
    // History older than the default `ingest.max_age` is taken too.
    let days = data.args.seconds / 86_400;
    let target = ctx
        .target_with(
            "backfill",
            "minute",
            false,
            journal,
            crate::ctx::long_running_with(days.max(28) + 2, journal),
        )
        .await?;
    let before = scrape(&target.url).await.unwrap_or_default();
    let cpu0 = target.cpu();
    let started = Instant::now();
    let mut o = send_all(ctx, &target, data, batch, concurrency).await?;
    // Stored (with the journal off each answer came once its readings
    // were; with it on, once the service counts them stored); five seconds
    // later a user opens a dashboard over it.
    if journal {
        crate::waits::wait_stored(&target.url, o.readings).await?;
        // The answers came once journaled: the write's figures are taken
        // when stored, not when the last answer came.
        let after = scrape(&target.url).await.unwrap_or_default();
        let delta =
            |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        o.seconds = started.elapsed().as_secs_f64();
        o.bucket_updates = delta("hourglass_bucket_updates_total");
        o.round_trips = delta("hourglass_write_round_trips_total");
        o.service_cpu = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
    }
    let stored_at = Instant::now();
    let first = crate::waits::first_five_seconds(&target.url, stored_at).await?;
    let early = averages(&target.url, data, 1).await?;
    let catch_up = crate::waits::caught_up(&target.url, &before, started, stored_at, first).await?;
    // Ended hours are rolled up after the writes: stored is not done.
    crate::waits::rolled_up(ctx, &target.database, Duration::from_secs(4 * 3600)).await?;
    let rolled_up_s = started.elapsed().as_secs_f64();
    let settled = averages(&target.url, data, 3).await?;
    let mut report = Report::new("Hourglass backfill");
    let mut s = section(
        &format!(
            "Backfill: {} readings in batches of {batch}, {concurrency} at a time",
            o.readings
        ),
        &o,
    );
    s.row(vec!["seconds to stored".into(), f(o.seconds)]);
    s.row(vec!["seconds to rolled up".into(), f(rolled_up_s)]);
    s.row(vec![
        "throughput (readings/s, rolled up)".into(),
        f(o.readings as f64 / rolled_up_s),
    ]);
    report.sections.push(s);
    report
        .sections
        .push(catch_up.section("Catch-up of the rollups"));
    report.set("backfill_catch_up", catch_up.json());
    let mut s = Section::new(
        "One sensor's average over the last days of the backfill, 5 s after the last reading was stored and settled (rolled up)",
        &[
            "days",
            "cold / refresh ms 5 s after stored",
            "documents (cold) 5 s after stored",
            "cold / refresh ms settled",
            "documents (cold) settled",
        ],
    );
    let mut json = serde_json::Map::new();
    for ((days, e), (_, t)) in early.iter().zip(&settled) {
        s.row(vec![
            days.to_string(),
            format!("{} / {}", f(e.cold_ms), f(e.refresh_ms)),
            f(e.cold.0),
            format!("{} / {}", f(t.cold_ms), f(t.refresh_ms)),
            f(t.cold.0),
        ]);
        json.insert(
            format!("{days}d"),
            serde_json::json!({ "after_stored": e.json(), "settled": t.json() }),
        );
    }
    report.sections.push(s);
    report.set("backfill_averages", serde_json::Value::Object(json));
    if let (Some((1, one)), Some((n, long))) = (early.first(), early.last())
        && *n > 1
    {
        let bound = 3.0 * one.cold_ms + 15.0;
        report.notes.push(format!(
            "5 s after stored, the {n}-day average took {:.0} ms cold against the 1-day one's {:.0} ms: {} (target: at most 3x plus 15 ms, {bound:.0} ms).",
            long.cold_ms,
            one.cold_ms,
            if long.cold_ms <= bound { "met" } else { "missed" }
        ));
    }
    // The same backfill again, on a fresh database, with a dashboard of
    // those averages refreshing from its first request.
    let refreshed_target = ctx
        .target_with(
            "backfill-dashboard",
            "minute",
            false,
            journal,
            crate::ctx::long_running_with(days.max(28) + 2, journal),
        )
        .await?;
    let paths = average_paths(data).into_iter().map(|(_, p)| p).collect();
    let (refreshed, tally) = crate::dashboard::catch_up_refreshed(
        ctx,
        &refreshed_target,
        data,
        paths,
        (batch, concurrency),
        journal,
    )
    .await?;
    refreshed_target.kill();
    let (s, kept) = crate::dashboard::compare(&catch_up, &refreshed, &tally);
    report.sections.push(s);
    report.notes.push(format!(
        "With a refreshing dashboard the catch-up kept {:.2} of its rate alone: {} (target: at least half).",
        refreshed.hours / refreshed.total_s.max(1e-9) / (catch_up.hours / catch_up.total_s.max(1e-9)).max(1e-9),
        if kept { "met" } else { "missed" }
    ));
    report.set(
        "backfill_catch_up_refreshed",
        crate::dashboard::json(&catch_up, &refreshed, &tally),
    );
    record(&mut report, "backfill", &o);
    report.set(
        "backfill_rolled_up",
        serde_json::json!({ "seconds": rolled_up_s, "readings_per_s": o.readings as f64 / rolled_up_s }),
    );
    let mut ok = true;
    if verify {
        let (r, good) = crate::verify::run(ctx, data, "minute", &target.database).await?;
        report.merge(r);
        ok = good;
    }
    Ok((report, ok))
}
