//! `history`: what the default server does as history grows.
//!
//! - **Write cost**: the bucket statement Hourglass sends (its own code),
//!   into an existing bucket of a series with 200 buckets and of one with
//!   `--long-history` (50 000), timed on the server, with the documents its
//!   filter examines (`explain`); and the statement's filter as it was
//!   before (`a: {$exists: false}`) on the long series, for comparison.
//! - **Fleet panels**: `--panel-sensors` (72) sensors, a reading every 15
//!   minutes for 8 days, through the service; four Grafana-style PromQL
//!   panels over the 8 days and the JSON API's hourly series of every
//!   sensor, each cold (the results cache bypassed) and on refresh, with
//!   the documents read and round trips per query, and the same PromQL
//!   against VictoriaMetrics on the same samples.
//! - **Group average**: `--group-sensors` (150) sensors over two days, the
//!   group average of four days around them, cold and on refresh.

use std::time::{Duration, Instant};

use hourglass::Granularity;
use hourglass::pure::{
    BucketKey, BucketUpdate, MetricName, SensorId, Versioning, update_statement,
};
use mongodb::bson::{Bson, DateTime, Document, doc};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs};
use crate::panel_timing::timed_or_nan;
use crate::panel_timing::{TIMED_COLUMNS, Timed, cold_and_refresh};
use crate::peer_servers::{send_lines, start_victoria};
use crate::procs::scrape;
use crate::report::{Report, Section, f, percentiles};

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Inserts `n` minute buckets of `sensor`/`metric` ending before `end`,
/// straight into the database (as history a service wrote long ago).
pub(crate) async fn preload(
    db: &mongodb::Database,
    sensor: &str,
    metric: &str,
    n: i64,
    end: i64,
) -> anyhow::Result<()> {
    let c = db.collection::<Document>("buckets");
    let mut docs = Vec::with_capacity(10_000);
    for i in 0..n {
        let start = end - (i + 1) * 60;
        docs.push(doc! {
            "sensor": sensor, "metric": metric, "start": DateTime::from_millis(start * 1000),
            "v": { "0": 1.0 }, "count": 1, "sum": 1.0, "min": 1.0, "max": 1.0,
            "schema_version": 2, "n": 1_i64,
        });
        if docs.len() == 10_000 {
            c.insert_many(std::mem::take(&mut docs)).await?;
        }
    }
    if !docs.is_empty() {
        c.insert_many(docs).await?;
    }
    Ok(())
}

/// The statement Hourglass sends for one reading into `sensor`'s bucket at
/// `start`, with the filter as sent or (`old`) as it was before.
fn statement(sensor: &str, start: i64, value: f64, old: bool) -> anyhow::Result<Document> {
    let update = BucketUpdate {
        key: BucketKey {
            sensor: SensorId::parse(sensor.to_owned())?.into_owned(),
            metric: MetricName::parse("m0".to_owned())?.into_owned(),
            start,
        },
        values: vec![(7, value)],
        acks: Vec::new(),
    };
    let mut s = update_statement(&update, Granularity::Minute, Versioning::PLAIN)?.to_document()?;
    if old && let Ok(q) = s.get_document_mut("q") {
        q.remove("amax");
        q.insert("a", doc! { "$exists": false });
    }
    Ok(s)
}

/// Median ms of `n` statements into one bucket, and what the filter examines.
async fn write_cost(
    db: &mongodb::Database,
    sensor: &str,
    start: i64,
    n: usize,
    old: bool,
) -> anyhow::Result<(f64, i64)> {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let s = statement(sensor, start, i as f64, old)?;
        let t = Instant::now();
        db.run_command(doc! { "update": "buckets", "updates": [s] })
            .await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let q = statement(sensor, start, 0.0, old)?
        .get_document("q")
        .cloned()
        .unwrap_or_default();
    let explained = db
        .run_command(doc! { "explain": { "find": "buckets", "filter": q, "limit": 1 }, "verbosity": "executionStats" })
        .await?;
    let examined = explained
        .get_document("executionStats")
        .ok()
        .and_then(|s| match s.get("totalDocsExamined") {
            Some(Bson::Int32(n)) => Some(i64::from(*n)),
            Some(Bson::Int64(n)) => Some(*n),
            _ => None,
        })
        .unwrap_or(-1);
    Ok((percentiles(ms).0, examined))
}

/// The fleet panels over the 8 days before `end`: name, the PromQL for
/// Hourglass and for VictoriaMetrics, the step.
fn panels() -> Vec<(&'static str, String, String, i64)> {
    let fleet = "{__name__=\"m0\",sensor=~\"lt-000[0-9][0-9]\"}".to_owned();
    let vm_fleet = "m0_value{sensor=~\"lt-000[0-9][0-9]\"}".to_owned();
    vec![
        (
            "avg_over_time(m0[1h]), 1 h step",
            format!("avg_over_time({fleet}[1h])"),
            format!("avg_over_time({vm_fleet}[1h])"),
            3600,
        ),
        (
            "max_over_time(m0[1h]), 1 h step",
            format!("max_over_time({fleet}[1h])"),
            format!("max_over_time({vm_fleet}[1h])"),
            3600,
        ),
        (
            "fleet avg(avg_over_time(m0[1h])), 1 h step",
            format!("avg(avg_over_time({fleet}[1h]))"),
            format!("avg(avg_over_time({vm_fleet}[1h]))"),
            3600,
        ),
        (
            "fleet 1 d mean, 1 d step",
            format!("avg(avg_over_time({fleet}[1d]))"),
            format!("avg(avg_over_time({vm_fleet}[1d]))"),
            86_400,
        ),
    ]
}

/// The panels' window: 8 days to the hour begun now. A dashboard asks up
/// to its present, whose last hours the results cache does not keep yet
/// (a load of over an hour would otherwise leave refreshes nothing to read).
fn panel_window() -> (i64, i64) {
    let now = jiff::Timestamp::now().as_second();
    let end = now - now.rem_euclid(3600);
    (end - 8 * 86_400, end)
}

fn range_args(q: &str, begin: i64, end: i64, step: i64) -> String {
    format!(
        "query={}&start={}&end={end}&step={step}",
        encode(q),
        begin + step
    )
}

/// The dashboard's panels' names, in [`panel_paths`]' order.
fn panel_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = panels().iter().map(|p| p.0).collect();
    names.push("JSON API: hourly series of every sensor");
    names
}

/// The dashboard: the four PromQL panels and the JSON API's hourly series
/// of every sensor, over [`panel_window`].
fn panel_paths() -> Vec<String> {
    let (begin, end) = panel_window();
    let mut paths: Vec<String> = panels()
        .iter()
        .map(|(_, hq, _, step)| {
            format!(
                "/prometheus/api/v1/query_range?{}",
                range_args(hq, begin, end, *step)
            )
        })
        .collect();
    paths.push(series_path(begin, end));
    paths
}

fn series_path(begin: i64, end: i64) -> String {
    format!(
        "/api/v1/series?metric=m0&sensor=lt-*&group_by=sensor&step=1h&from={}&to={}",
        crate::dataset::rfc3339(begin),
        crate::dataset::rfc3339(end)
    )
}

/// The scenario's settings (see `main`'s `History`).
pub struct Args {
    pub long_history: i64,
    pub panel_sensors: u32,
    pub group_sensors: u32,
    pub repeats: usize,
    pub journal: bool,
    pub catch_up_only: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<(Report, bool)> {
    // Long: the scenario's steps in order (write costs, a backfill read right after, the settled panels, the group average, the refreshed catch-up), each a call.
    let Args {
        long_history,
        panel_sensors,
        group_sensors,
        repeats,
        journal,
        catch_up_only,
    } = args;
    let target = ctx
        .target_with(
            "history",
            "minute",
            false,
            journal,
            crate::ctx::long_running_with(60, journal),
        )
        .await?;
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let db = mongo.database(&target.database);
    let mut report = Report::new("History: write cost and fleet reads on the default server");
    // Targets missed are reported, not failures: the answers' equality
    // (cold against refresh) is what fails the run.
    let mut missed: Vec<String> = Vec::new();
    if !catch_up_only {
        write_costs(&db, long_history, &mut report, &mut missed).await?;
    }
    // Fleet panels: 8 days, a reading every 15 minutes.
    let panel = Dataset::recent(
        DatasetArgs {
            sensors: panel_sensors,
            metrics: 1,
            seconds: 8 * 86_400,
            interval: 900,
            seed: 11,
        },
        1800,
    );
    let (early, catch_up) = right_after_backfill(ctx, &target, &panel, journal).await?;
    let mut json = serde_json::Map::new();
    if catch_up_only {
        let mut s = Section::new(
            "Fleet panels 5 s after stored",
            &["panel", "cold / refresh ms", "documents (cold)"],
        );
        for (name, e) in panel_names().iter().zip(&early) {
            if e.cold_ms > 2000.0 || e.refresh_ms > 300.0 {
                missed.push(format!(
                    "{name} 5 s after stored: {:.0} ms cold, {:.0} ms on refresh",
                    e.cold_ms, e.refresh_ms
                ));
            }
            s.row(vec![
                (*name).to_owned(),
                format!("{} / {}", f(e.cold_ms), f(e.refresh_ms)),
                f(e.cold.0),
            ]);
            json.insert(
                (*name).into(),
                serde_json::json!({ "after_stored": e.json() }),
            );
        }
        json.insert("catch_up".into(), catch_up.json());
        report.sections.push(s);
        report
            .sections
            .push(catch_up.section("Catch-up after the panels' backfill"));
        target.kill();
        refreshed_catch_up(
            ctx,
            &panel,
            journal,
            &catch_up,
            &mut missed,
            &mut report,
            &mut json,
        )
        .await?;
        report.set("history", json);
        report.notes.push(if missed.is_empty() {
            "Every target met.".to_owned()
        } else {
            format!("Targets missed: {}.", missed.join("; "))
        });
        return Ok((report, true));
    }
    let group = Dataset::recent(
        DatasetArgs {
            sensors: group_sensors,
            metrics: 1,
            seconds: 2 * 86_400,
            interval: 300,
            seed: 12,
        },
        9 * 86_400,
    );
    // Every panel reading is stored by now: what the group adds is counted
    // from here.
    let stored = scrape(&target.url)
        .await?
        .get("hourglass_readings_stored_total")
        .copied()
        .unwrap_or(0.0);
    let sent = crate::send::send_all(ctx, &target, &group, 5000, 2).await?;
    if journal {
        // Acknowledged from the journal: stored first, then rolled up,
        // before the settled figures.
        crate::waits::wait_stored(&target.url, stored as u64 + sent.readings).await?;
    }
    crate::waits::rolled_up(ctx, &target.database, Duration::from_secs(4 * 3600)).await?;
    let vm = start_victoria(&[]).await?;
    send_lines(
        ctx,
        &format!("{}/write?precision=s", vm.url),
        &panel,
        5000,
        4,
    )
    .await?;
    let http = reqwest::Client::new();
    let _ = http
        .get(format!("{}/internal/force_flush", vm.url))
        .send()
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = settled_panels(
        &target.url,
        &vm.url,
        panel_sensors,
        repeats,
        early,
        &mut missed,
        &mut json,
    )
    .await?;
    report.sections.push(s);
    report.sections.push(catch_up.section(&format!(
        "Catch-up after the panels' backfill ({} readings)",
        panel.len()
    )));
    json.insert("catch_up".into(), catch_up.json());
    let s = group_average(
        &target.url,
        &group,
        group_sensors,
        repeats,
        &mut missed,
        &mut json,
    )
    .await?;
    report.sections.push(s);
    refreshed_catch_up(
        ctx,
        &panel,
        journal,
        &catch_up,
        &mut missed,
        &mut report,
        &mut json,
    )
    .await?;
    report.set("history", json);
    report.notes.push(
        "The default server is SecantusDB, MongoDB's wire protocol in Python: its cost per document dominates the latency. Documents read and round trips are what a real MongoDB would do too; cold figures bypass the results cache (Cache-Control: no-cache), refresh figures are a dashboard's next refresh. Targets: each panel 2 s cold and 0.3 s on refresh, the group average 1 s, the write cost within 2x.".into(),
    );
    report.notes.push(if missed.is_empty() {
        "Every target met.".to_owned()
    } else {
        format!("Targets missed: {}.", missed.join("; "))
    });
    vm.stop();
    Ok((report, true))
}

/// The panels' backfill again, on a fresh database, with the dashboard
/// refreshing from its first request, beside `catch_up` (alone).
async fn refreshed_catch_up(
    ctx: &Ctx,
    panel: &Dataset,
    journal: bool,
    catch_up: &crate::waits::CatchUp,
    missed: &mut Vec<String>,
    report: &mut Report,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<()> {
    // The same backfill again, on a fresh database, with the dashboard
    // refreshing from its first request.
    let refreshed_target = ctx
        .target_with(
            "history-dashboard",
            "minute",
            false,
            journal,
            crate::ctx::long_running_with(60, journal),
        )
        .await?;
    let (refreshed, tally) = crate::dashboard::catch_up_refreshed(
        ctx,
        &refreshed_target,
        panel,
        panel_paths(),
        (5000, 2),
        journal,
    )
    .await?;
    refreshed_target.kill();
    let (s, kept) = crate::dashboard::compare(catch_up, &refreshed, &tally);
    if !kept {
        missed.push("the catch-up with a refreshing dashboard under half its rate alone".into());
    }
    for (c, how) in [(catch_up, "alone"), (&refreshed, "with the dashboard")] {
        if c.after_stored_s > 30.0 {
            missed.push(format!(
                "hours still marked {:.0} s after stored {how} (target: none at 30 s)",
                c.after_stored_s
            ));
        }
    }
    report.sections.push(s);
    json.insert(
        "catch_up_refreshed".into(),
        crate::dashboard::json(catch_up, &refreshed, &tally),
    );
    Ok(())
}

/// Write cost, flat in history: one bucket statement into a series of 200
/// buckets and into one of `long_history`.
async fn write_costs(
    db: &mongodb::Database,
    long_history: i64,
    report: &mut Report,
    missed: &mut Vec<String>,
) -> anyhow::Result<()> {
    let now = jiff::Timestamp::now().as_second();
    let end = now - now.rem_euclid(60) - 40 * 86_400;
    let loaded = Instant::now();
    preload(db, "wc-short", "m0", 200, end).await?;
    preload(db, "wc-long", "m0", long_history, end).await?;
    let load_s = loaded.elapsed().as_secs_f64();
    let start = end - 100 * 60;
    let (short_ms, short_ex) = write_cost(db, "wc-short", start, 30, false).await?;
    let (long_ms, long_ex) = write_cost(db, "wc-long", start, 30, false).await?;
    let (old_ms, old_ex) = write_cost(db, "wc-long", start, 3, true).await?;
    let ratio = long_ms / short_ms.max(1e-9);
    if ratio > 2.0 {
        missed.push(format!("write cost {ratio:.2}x over 2x"));
    }
    let mut s = Section::new(
        &format!(
            "One bucket statement into an existing bucket (Hourglass' own statement, sent directly; {} buckets loaded in {load_s:.0} s)",
            long_history + 200
        ),
        &[
            "series history (buckets)",
            "filter",
            "ms (median)",
            "documents examined",
            "round trips",
        ],
    );
    s.row(vec![
        "200".into(),
        "amax: {$lte: null} (now)".into(),
        f(short_ms),
        short_ex.to_string(),
        "1".into(),
    ]);
    s.row(vec![
        long_history.to_string(),
        "amax: {$lte: null} (now)".into(),
        f(long_ms),
        long_ex.to_string(),
        "1".into(),
    ]);
    s.row(vec![
        long_history.to_string(),
        "a: {$exists: false} (before)".into(),
        f(old_ms),
        old_ex.to_string(),
        "1".into(),
    ]);
    report.sections.push(s);
    report.notes.push(format!(
        "Write cost at {long_history} buckets over 200: {ratio:.2}x (target: within 2x)."
    ));
    report.set(
        "write_cost",
        serde_json::json!({ "short_ms": short_ms, "long_ms": long_ms, "ratio": ratio,
            "short_examined": short_ex, "long_examined": long_ex,
            "before_ms": old_ms, "before_examined": old_ex, "long_history": long_history }),
    );

    Ok(())
}

/// The panels five seconds after the last reading of `panel`'s backfill is
/// stored (the answer to its request: the journal is off), before the
/// upkeep may have caught up: what a user who opens the dashboard right
/// after a backfill sees. Then the catch-up, measured to its end.
async fn right_after_backfill(
    ctx: &Ctx,
    target: &crate::ctx::Target,
    panel: &Dataset,
    journal: bool,
) -> anyhow::Result<(Vec<Timed>, crate::waits::CatchUp)> {
    let rolled_before = scrape(&target.url).await?;
    let sent_at = Instant::now();
    let sent = crate::send::send_all(ctx, target, panel, 5000, 2).await?;
    // Five seconds after the last reading is stored (the answer to its
    // request with the journal off; counted stored by the service with it
    // on), before the upkeep may have caught up: what a user who opens the
    // dashboard right after a backfill sees.
    if journal {
        crate::waits::wait_stored(&target.url, sent.readings).await?;
    }
    let stored_at = Instant::now();
    let first = crate::waits::first_five_seconds(&target.url, stored_at).await?;
    let mut early: Vec<Timed> = Vec::new();
    for path in panel_paths() {
        early.push(cold_and_refresh(&target.url, &path, 1).await?);
    }
    let catch_up =
        crate::waits::caught_up(&target.url, &rolled_before, sent_at, stored_at, first).await?;
    Ok((early, catch_up))
}

/// The panels once every hour is rolled up, cold and on refresh, beside
/// VictoriaMetrics on the same samples and the figures `early` took right
/// after the backfill.
async fn settled_panels(
    url: &str,
    vm_url: &str,
    panel_sensors: u32,
    repeats: usize,
    early: Vec<Timed>,
    missed: &mut Vec<String>,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Section> {
    // Long: one row per panel, each beside its VictoriaMetrics figure and its early one.
    let http = reqwest::Client::new();
    // The settled figures' window ends at the hour begun now, too.
    let (begin, end) = panel_window();
    let mut s = Section::new(
        &format!(
            "Fleet panels: {panel_sensors} sensors, a reading every 15 minutes for 8 days; cold (results cache bypassed) and on refresh"
        ),
        &[
            "panel",
            TIMED_COLUMNS[0],
            TIMED_COLUMNS[1],
            TIMED_COLUMNS[2],
            TIMED_COLUMNS[3],
            "VictoriaMetrics ms",
            "cold / refresh ms 5 s after stored",
            "documents (cold) 5 s after stored",
        ],
    );
    let mut early = early.into_iter();
    let mut early_cells = |name: &str, missed: &mut Vec<String>| {
        let Some(t) = early.next() else {
            return (
                vec!["-".to_owned(), "-".to_owned()],
                serde_json::Value::Null,
            );
        };
        if t.cold_ms > 2000.0 || t.refresh_ms > 300.0 {
            missed.push(format!(
                "{name} 5 s after stored: {:.0} ms cold, {:.0} ms on refresh",
                t.cold_ms, t.refresh_ms
            ));
        }
        (
            vec![
                format!("{} / {}", f(t.cold_ms), f(t.refresh_ms)),
                f(t.cold.0),
            ],
            t.json(),
        )
    };
    for (name, hq, vq, step) in &panels() {
        let args = |q: &str| range_args(q, begin, end, *step);
        let t = cold_and_refresh(
            url,
            &format!("/prometheus/api/v1/query_range?{}", args(hq)),
            repeats,
        )
        .await?;
        let (cold, refresh) = (t.cold_ms, t.refresh_ms);
        let (vm_ms, _) = timed_or_nan(
            &http,
            &format!("{}/api/v1/query_range?{}", vm_url, args(vq)),
            repeats,
        )
        .await;
        if cold > 2000.0 || refresh > 300.0 {
            missed.push(format!(
                "{name}: {cold:.0} ms cold, {refresh:.0} ms on refresh"
            ));
        }
        let (cells, early_json) = early_cells(name, missed);
        let mut row = vec![(*name).to_owned()];
        row.extend(t.cells());
        row.push(f(vm_ms));
        row.extend(cells);
        s.row(row);
        let mut j = t.json();
        j["victoriametrics_ms"] = serde_json::json!(vm_ms);
        j["after_stored"] = early_json;
        json.insert((*name).into(), j);
    }
    let t = cold_and_refresh(url, &series_path(begin, end), repeats).await?;
    let (cold, refresh) = (t.cold_ms, t.refresh_ms);
    if cold > 2000.0 || refresh > 300.0 {
        missed.push(format!(
            "the JSON hourly series: {cold:.0} ms cold, {refresh:.0} ms on refresh"
        ));
    }
    let (cells, early_json) = early_cells("the JSON hourly series", missed);
    let mut row = vec!["JSON API: hourly series of every sensor".to_owned()];
    row.extend(t.cells());
    row.push("-".into());
    row.extend(cells);
    s.row(row);
    let mut j = t.json();
    j["after_stored"] = early_json;
    json.insert("json_hourly_series".into(), j);
    Ok(s)
}

/// The group average over four days around the group's two.
async fn group_average(
    url: &str,
    group: &Dataset,
    group_sensors: u32,
    repeats: usize,
    missed: &mut Vec<String>,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Section> {
    let g_end = group.start + 3 * 86_400;
    let g_path = format!(
        "/api/v1/average?metric=m0&sensor=lt-*&from={}&to={}",
        crate::dataset::rfc3339(g_end - 4 * 86_400),
        crate::dataset::rfc3339(g_end)
    );
    let t = cold_and_refresh(url, &g_path, repeats).await?;
    let cold = t.cold_ms;
    if cold > 1000.0 {
        missed.push(format!("the group average: {cold:.0} ms cold"));
    }
    let mut s = Section::new(
        &format!(
            "Group average: {group_sensors} sensors, two days of readings every 5 minutes, over four days"
        ),
        &[
            "query",
            TIMED_COLUMNS[0],
            TIMED_COLUMNS[1],
            TIMED_COLUMNS[2],
            TIMED_COLUMNS[3],
        ],
    );
    let mut row = vec!["GET /api/v1/average?sensor=lt-*".to_owned()];
    row.extend(t.cells());
    s.row(row);
    json.insert("group_average".into(), t.json());
    Ok(s)
}
