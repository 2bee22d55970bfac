//! `versions`: what last write wins by acknowledgement costs in storage.
//! Several instances on one database take a live fleet round robin over
//! HTTP (every sensor's readings spread over all of them, as behind a load
//! balancer); then the buckets' bytes are counted with and without their
//! versions (`a`, `amax`), and once more after a lone instance's prune.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{RawDocumentBuf, doc};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, Row};
use crate::procs::{HourglassSpec, scrape, scrape_by, spawn_hourglass};
use crate::report::{Report, Section, f};

/// The kinds `loadtest fleet` counts as the database's work per reading
/// (instance floors and version prunes are reported beside them).
const DATA_KINDS: [&str; 4] = [
    "bucket_update",
    "rollup_upkeep",
    "registry_update",
    "dead_letter",
];

/// Bytes of the buckets, of their versions, and values stored.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct Bytes {
    documents: u64,
    versioned: u64,
    total: u64,
    versions: u64,
    values: u64,
}

/// Values under `v` (one level for minute buckets, two for hour).
fn values_in(v: &mongodb::bson::RawDocument) -> u64 {
    v.iter()
        .flatten()
        .map(|(_, value)| match value.as_document() {
            Some(minute) => values_in(minute),
            None => 1,
        })
        .sum()
}

async fn measure(coll: &mongodb::Collection<RawDocumentBuf>) -> anyhow::Result<Bytes> {
    let mut out = Bytes::default();
    let mut cursor = coll.find(doc! {}).await?;
    while let Some(d) = cursor.try_next().await? {
        out.documents += 1;
        out.total += d.as_bytes().len() as u64;
        let mut versioned = false;
        for element in d.iter_elements() {
            let element = element?;
            match element.key() {
                // Type byte, key, its NUL, and the value.
                "a" | "amax" => {
                    out.versions += (2 + element.key().len() + element.len()) as u64;
                    versioned = true;
                }
                "v" => {
                    if let Some(v) = element.value()?.as_document() {
                        out.values += values_in(v);
                    }
                }
                _ => {}
            }
        }
        out.versioned += u64::from(versioned);
    }
    Ok(out)
}

fn row(s: &mut Section, what: &str, b: Bytes) {
    let per = |x: u64| x as f64 / b.values.max(1) as f64;
    s.row(vec![
        what.into(),
        b.documents.to_string(),
        b.versioned.to_string(),
        f(per(b.total - b.versions)),
        f(per(b.total)),
        format!(
            "{:+.1}%",
            100.0 * b.versions as f64 / (b.total - b.versions).max(1) as f64
        ),
    ]);
}

pub async fn run(
    ctx: &Ctx,
    mut data: Dataset,
    instances: usize,
    granularity: &'static str,
    prune: bool,
) -> anyhow::Result<(Report, bool)> {
    // Long: the scenario's steps in order: two instances, their writes, the checks of what each version kept.
    let database = ctx.database(&format!("versions_{granularity}"));
    let spec = HourglassSpec {
        bin: ctx.hourglass_bin(),
        mongodb_uri: ctx.mongodb_uri()?,
        database: database.clone(),
        granularity,
        mqtt_url: None,
        extra: Vec::new(),
        config: None,
    };
    let mut procs = Vec::new();
    for _ in 0..instances.max(1) {
        procs.push(spawn_hourglass(&spec).await?);
    }
    let urls: Vec<String> = procs
        .iter()
        .map(|p| format!("{}/api/v1/readings", p.url))
        .collect();
    let http = reqwest::Client::new();
    data.start = jiff::Timestamp::now().as_second();
    let interval = Duration::from_secs(u64::from(data.args.interval.max(1)));
    let bar = ctx.bar(u64::from(data.ticks()), "versions");
    let mut next = tokio::time::Instant::now();
    let mut errors = 0u64;
    for k in 0..data.ticks() {
        tokio::time::sleep_until(next).await;
        next += interval;
        // Round robin per reading: each instance takes every n-th second of
        // every sensor.
        let mut shares: Vec<Vec<Row>> = vec![Vec::new(); urls.len()];
        for row in data.tick(k) {
            let to = (row.0 as usize + k as usize) % urls.len();
            shares[to].push(row);
        }
        let sends = shares
            .iter()
            .zip(&urls)
            .filter(|(rows, _)| !rows.is_empty())
            .map(|(rows, url)| {
                http.post(url)
                    .header("content-type", "application/json")
                    .body(Dataset::json(rows))
                    .send()
            });
        for r in futures_util::future::join_all(sends).await {
            if !r.is_ok_and(|r| r.status().is_success()) {
                errors += 1;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Everything stored (a window is written after its end plus the grace),
    // then what each instance wrote, summed: instances that share windows
    // should not multiply the work beyond what each wrote.
    let offered = data.len() as f64;
    let base: Vec<String> = procs.iter().map(|p| p.url.clone()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while tokio::time::Instant::now() < deadline {
        let mut stored = 0.0;
        for url in &base {
            stored += scrape(url)
                .await
                .unwrap_or_default()
                .get("hourglass_readings_stored_total")
                .copied()
                .unwrap_or(0.0);
        }
        if stored >= offered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut written: HashMap<String, f64> = HashMap::new();
    let mut upkeep_read = 0.0;
    for url in &base {
        for (kind, n) in scrape_by(url, "hourglass_db_documents_written_total", "kind")
            .await
            .unwrap_or_default()
        {
            *written.entry(kind).or_default() += n;
        }
        upkeep_read += scrape_by(url, "hourglass_db_documents_read_total", "kind")
            .await
            .unwrap_or_default()
            .get("rollup_upkeep")
            .copied()
            .unwrap_or(0.0);
    }
    // SIGTERM: every instance stores what it holds and leaves.
    for p in procs {
        p.stop();
    }
    let client = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let coll = client
        .database(&database)
        .collection::<RawDocumentBuf>("buckets");
    let stored_bytes = measure(&coll).await?;
    let (verdict, ok) = crate::verify::run(ctx, &data, granularity, &database).await?;
    // A lone instance prunes a minute after it starts: every version is
    // older than any floor then.
    let pruned = if prune {
        let lone = spawn_hourglass(&spec).await?;
        tokio::time::sleep(Duration::from_secs(70)).await;
        lone.stop();
        Some(measure(&coll).await?)
    } else {
        None
    };

    let mut report = Report::new("Hourglass load test: the storage cost of versions");
    let mut s = Section::new(
        &format!(
            "{instances} instances round robin, {} sensors × {} metrics at 1/{} Hz for {} s, {granularity} buckets",
            data.args.sensors, data.args.metrics, data.args.interval, data.args.seconds
        ),
        &[
            "when",
            "buckets",
            "with versions",
            "bytes/reading without versions",
            "bytes/reading",
            "versions add",
        ],
    );
    row(&mut s, "all written", stored_bytes);
    if let Some(pruned) = pruned {
        row(&mut s, "after the prune", pruned);
    }
    report.sections.push(s);
    let mut w = Section::new(
        &format!("Documents written by the {instances} instances together (kinds as in /metrics)"),
        &["kind", "documents", "per reading", "1 in …"],
    );
    let mut kinds: Vec<_> = written.iter().collect();
    kinds.sort_by(|a, b| a.0.cmp(b.0));
    let data_writes: f64 = kinds
        .iter()
        .filter(|(k, _)| DATA_KINDS.contains(&k.as_str()))
        .map(|(_, n)| **n)
        .sum();
    let one_in = |n: f64| {
        if n > 0.0 { f(offered / n) } else { "-".into() }
    };
    for (kind, n) in &kinds {
        w.row(vec![(*kind).clone(), f(**n), f(**n / offered), one_in(**n)]);
    }
    w.row(vec![
        "buckets, rollups, registry, dead letters".into(),
        f(data_writes),
        f(data_writes / offered),
        one_in(data_writes),
    ]);
    w.row(vec![
        "documents the rollup upkeep read".into(),
        f(upkeep_read),
        f(upkeep_read / offered),
        "-".into(),
    ]);
    report.sections.push(w);
    report.sections.extend(verdict.sections);
    report.set(
        &format!("versions_{granularity}"),
        serde_json::json!({ "written": stored_bytes, "pruned": pruned, "errors": errors, "exact": ok,
            "documents_written": written, "data_writes_per_reading": data_writes / offered,
            "rollup_upkeep_read": upkeep_read, "instances": instances }),
    );
    let pruned_all = pruned.is_none_or(|p| p.versioned == 0);
    Ok((report, ok && errors == 0 && pruned_all))
}
