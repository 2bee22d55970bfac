//! `compare-designs`: one document per reading (insert-many) against minute
//! and hour buckets through Hourglass, on the same server, same data; plus
//! the same bucket updates sent straight to the server, to see what the
//! service itself costs.

use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};
use hourglass::Granularity;
use hourglass::pure::{
    Batch, Batcher, BatcherSettings, BucketUpdate, Chunk, Commands, Limits, MetricName, Reading,
    SensorId, Settled, Target, Versioning,
};
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::{Database, IndexModel};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, Row, rfc3339};
use crate::report::{Plot, Report, Section, f};

const RUNS: usize = 5;

struct Design {
    name: &'static str,
    documents: f64,
    data_bytes: f64,
    index_bytes: f64,
    round_trips: f64,
    writes: f64,
    readings_per_s: f64,
    /// avg 1h, avg 24h, avg 7d, series 24h/1h: median ms, or None when unsupported.
    queries: [Option<f64>; 4],
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn num(d: &Document, k: &str) -> f64 {
    match d.get(k) {
        Some(Bson::Double(x)) => *x,
        Some(Bson::Int32(x)) => f64::from(*x),
        Some(Bson::Int64(x)) => *x as f64,
        _ => 0.0,
    }
}

async fn coll_stats(db: &Database, coll: &str) -> anyhow::Result<(f64, f64, f64)> {
    let s = db.run_command(doc! { "collStats": coll }).await?;
    Ok((num(&s, "count"), num(&s, "size"), num(&s, "totalIndexSize")))
}

fn ranges(data: &Dataset) -> [(i64, i64); 3] {
    let end = data.end();
    [
        (end - 3600, end),
        (end - 86_400, end),
        (end - 7 * 86_400, end),
    ]
}

async fn raw_design(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<Design> {
    // Long: one design's documents written and timed field by field, as the design lays them out.
    let client = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let db = client.database(&ctx.database("raw"));
    let coll = db.collection::<Document>("readings");
    coll.create_index(
        IndexModel::builder()
            .keys(doc! { "sensor": 1, "metric": 1, "ts": 1 })
            .build(),
    )
    .await?;
    let rows: Vec<Row> = data.rows().collect();
    let bar = ctx.bar(rows.len() as u64, "insert-many");
    let started = Instant::now();
    let chunks: Vec<&[Row]> = rows.chunks(batch.max(1)).collect();
    let round_trips = chunks.len() as f64;
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(chunks)
        .map(|chunk| {
            let (coll, bar) = (coll.clone(), bar.clone());
            async move {
                let docs: Vec<Document> = chunk
                    .iter()
                    .map(|(i, j, ts, v)| doc! { "sensor": Dataset::sensor(*i), "metric": Dataset::metric(*j), "ts": DateTime::from_millis(ts * 1000), "value": *v })
                    .collect();
                coll.insert_many(docs).ordered(false).await?;
                bar.inc(chunk.len() as u64);
                Ok(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let (documents, data_bytes, index_bytes) = coll_stats(&db, "readings").await?;
    let (s, m) = (Dataset::sensor(0), Dataset::metric(0));
    let mut queries = [None; 4];
    for (q, (from, to)) in ranges(data).into_iter().enumerate() {
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let pipeline = vec![
                doc! { "$match": { "sensor": &s, "metric": &m, "ts": { "$gte": DateTime::from_millis(from * 1000), "$lt": DateTime::from_millis(to * 1000) } } },
                doc! { "$group": { "_id": Bson::Null, "count": { "$sum": 1 }, "sum": { "$sum": "$value" }, "min": { "$min": "$value" }, "max": { "$max": "$value" } } },
            ];
            let _: Vec<Document> = coll.aggregate(pipeline).await?.try_collect().await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        queries[q] = Some(median(times));
    }
    // A 24-hour series by hour: group on the hour since the range start.
    let (from, to) = ranges(data)[1];
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let pipeline = vec![
            doc! { "$match": { "sensor": &s, "metric": &m, "ts": { "$gte": DateTime::from_millis(from * 1000), "$lt": DateTime::from_millis(to * 1000) } } },
            doc! { "$group": {
                "_id": { "$floor": { "$divide": [ { "$subtract": ["$ts", DateTime::from_millis(from * 1000)] }, 3_600_000 ] } },
                "count": { "$sum": 1 }, "sum": { "$sum": "$value" }, "min": { "$min": "$value" }, "max": { "$max": "$value" },
            } },
        ];
        match coll.aggregate(pipeline).await {
            Ok(c) => {
                let _: Vec<Document> = c.try_collect().await?;
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Err(_) => break,
        }
    }
    queries[3] = (!times.is_empty()).then(|| median(times));
    Ok(Design {
        name: "one document per reading",
        documents,
        data_bytes,
        index_bytes,
        round_trips,
        writes: rows.len() as f64,
        readings_per_s: rows.len() as f64 / seconds,
        queries,
    })
}

async fn bucket_design(
    ctx: &Ctx,
    data: &Dataset,
    granularity: &'static str,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<(Design, bool)> {
    let target = ctx
        .target(&format!("design_{granularity}"), granularity, false, false)
        .await?;
    let o = crate::send::send_all(ctx, &target, data, batch, concurrency).await?;
    let client = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let (documents, data_bytes, index_bytes) =
        coll_stats(&client.database(&target.database), "buckets").await?;
    let http = reqwest::Client::new();
    let (s, m) = (Dataset::sensor(0), Dataset::metric(0));
    let mut paths: Vec<String> = ranges(data)
        .iter()
        .map(|(from, to)| {
            format!(
                "/api/v1/sensors/{s}/average?metric={m}&from={}&to={}",
                rfc3339(*from),
                rfc3339(*to)
            )
        })
        .collect();
    let (from, to) = ranges(data)[1];
    paths.push(format!(
        "/api/v1/sensors/{s}/series?metric={m}&from={}&to={}&step=1h",
        rfc3339(from),
        rfc3339(to)
    ));
    let mut queries = [None; 4];
    for (q, path) in paths.iter().enumerate() {
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let r = http.get(format!("{}{path}", target.url)).send().await?;
            anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
            let _ = r.bytes().await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        queries[q] = Some(median(times));
    }
    let (_, ok) = crate::verify::run(ctx, data, granularity, &target.database).await?;
    Ok((
        Design {
            name: if granularity == "hour" {
                "hour buckets (Hourglass)"
            } else {
                "minute buckets (Hourglass)"
            },
            documents,
            data_bytes,
            index_bytes,
            round_trips: o.round_trips,
            writes: o.bucket_updates,
            readings_per_s: o.readings as f64 / o.seconds,
            queries,
        },
        ok,
    ))
}

/// The bucket updates Hourglass would send for the same requests, built with
/// its public pure core and sent straight to the server as a plain MongoDB
/// client: readings per second without the service around them.
async fn direct_updates(ctx: &Ctx, data: &Dataset, batch: usize) -> anyhow::Result<f64> {
    let client = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let db = client.database(&ctx.database("direct"));
    db.collection::<Document>("buckets")
        .create_index(
            IndexModel::builder()
                .keys(doc! { "sensor": 1, "metric": 1, "start": 1 })
                .options(
                    mongodb::options::IndexOptions::builder()
                        .unique(true)
                        .build(),
                )
                .build(),
        )
        .await?;
    let limits = BatcherSettings {
        max_buffered_readings: usize::MAX,
        max_buckets: usize::MAX,
        max_flush_buckets: usize::MAX,
        ..BatcherSettings::default()
    }
    .limits();
    let mut core: Batcher<()> = Batcher::new(Granularity::Minute, limits);
    let rows: Vec<Row> = data.rows().collect();
    let sensors: Vec<String> = (0..data.args.sensors).map(Dataset::sensor).collect();
    let metrics: Vec<String> = (0..data.args.metrics).map(Dataset::metric).collect();
    let started = Instant::now();
    let now = tokio::time::Instant::now();
    for chunk in rows.chunks(batch.max(1)) {
        let readings: Vec<Reading<'_>> = chunk
            .iter()
            .map(|(i, j, ts, v)| Reading {
                sensor: SensorId::parse(sensors[*i as usize].as_str())
                    .unwrap_or_else(|_| unreachable!()),
                metric: MetricName::parse(metrics[*j as usize].as_str())
                    .unwrap_or_else(|_| unreachable!()),
                ts: *ts,
                value: *v,
            })
            .collect();
        core.offer(readings, None, now, 0)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // Flushed when full, as Hourglass does under a backfill.
        if core.is_due(now)
            && let Some(b) = core.take_all()
        {
            write_all(&db, &mut core, b).await?;
        }
    }
    if let Some(b) = core.take_all() {
        write_all(&db, &mut core, b).await?;
    }
    Ok(rows.len() as f64 / started.elapsed().as_secs_f64())
}

/// Sends a whole batch as `update` commands and frees its room; any statement
/// not applied fails the run.
async fn write_all(db: &Database, core: &mut Batcher<()>, batch: Batch) -> anyhow::Result<()> {
    let updates: Vec<&BucketUpdate> = batch.items.iter().map(|i| &i.update).collect();
    let target = Target {
        collection: "buckets",
        write_concern: None,
        granularity: Granularity::Minute,
        limits: Limits::default(),
        versioning: Versioning::PLAIN,
    };
    let commands = Commands::new(&updates, 0..updates.len(), target);
    for chunk in commands {
        let Chunk::Command(command) = chunk else {
            anyhow::bail!("a bucket update too large to send");
        };
        let reply = db.run_raw_command(command.body).await?;
        if let Ok(errors) = reply.get_array("writeErrors") {
            anyhow::bail!("direct bucket updates were refused: {errors:?}");
        }
    }
    let mut answers = Vec::new();
    for item in &batch.items {
        core.settle(item, Settled::Stored, &mut answers);
    }
    Ok(())
}

pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<(Report, bool)> {
    // Long: a scenario's steps in order, one per design compared, each a few lines.
    let raw = raw_design(ctx, data, batch, concurrency).await?;
    let (minute, ok_m) = bucket_design(ctx, data, "minute", batch, concurrency).await?;
    let (hour, ok_h) = bucket_design(ctx, data, "hour", batch, concurrency).await?;
    let direct = direct_updates(ctx, data, batch).await?;
    let n = data.len() as f64;
    let mut s = Section::new(
        &format!(
            "Designs: {} readings ({} sensors × {} metrics, every {} s for {} s), batches of {batch}",
            data.len(),
            data.args.sensors,
            data.args.metrics,
            data.args.interval,
            data.args.seconds
        ),
        &[
            "design",
            "documents",
            "data bytes",
            "index bytes",
            "bytes / reading",
            "write round trips",
            "writes / reading",
            "ingest readings/s",
            "avg 1h ms",
            "avg 24h ms",
            "avg 7d ms",
            "series 24h ms",
        ],
    );
    let designs = [&raw, &minute, &hour];
    let q = |x: Option<f64>| x.map_or("unsupported".to_owned(), f);
    for d in designs {
        s.row(vec![
            d.name.into(),
            f(d.documents),
            f(d.data_bytes),
            f(d.index_bytes),
            f((d.data_bytes + d.index_bytes) / n),
            f(d.round_trips),
            f(d.writes / n),
            f(d.readings_per_s),
            q(d.queries[0]),
            q(d.queries[1]),
            q(d.queries[2]),
            q(d.queries[3]),
        ]);
    }
    let mut o = Section::new(
        "The service's own cost: the same bucket updates sent straight to the server",
        &["path", "readings/s", "ratio"],
    );
    o.row(vec![
        "Hourglass end to end (HTTP, minute buckets)".into(),
        f(minute.readings_per_s),
        f(minute.readings_per_s / direct),
    ]);
    o.row(vec![
        "same bucket updates written directly".into(),
        f(direct),
        "1".into(),
    ]);
    let mut report = Report::new("Hourglass designs");
    report.sections.push(s);
    report.sections.push(o);
    report.notes.push(format!(
        "Minute buckets need {:.0}× fewer writes and {:.1}× fewer bytes per reading than one document per reading.",
        raw.writes / minute.writes.max(1.0),
        (raw.data_bytes + raw.index_bytes) / (minute.data_bytes + minute.index_bytes).max(1.0)
    ));
    report.plots.push(Plot::Bars {
        file: "designs-bytes-per-reading.svg".into(),
        title: "Bytes per reading (data + index)".into(),
        y: "bytes".into(),
        bars: designs
            .iter()
            .map(|d| {
                (
                    d.name.replace(" (Hourglass)", ""),
                    (d.data_bytes + d.index_bytes) / n,
                )
            })
            .collect(),
    });
    report.plots.push(Plot::Bars {
        file: "designs-writes-per-reading.svg".into(),
        title: "Writes per reading".into(),
        y: "writes".into(),
        bars: designs
            .iter()
            .map(|d| (d.name.replace(" (Hourglass)", ""), d.writes / n))
            .collect(),
    });
    let json: Vec<serde_json::Value> = designs
        .iter()
        .map(|d| serde_json::json!({
            "design": d.name, "documents": d.documents, "data_bytes": d.data_bytes, "index_bytes": d.index_bytes,
            "bytes_per_reading": (d.data_bytes + d.index_bytes) / n, "round_trips": d.round_trips,
            "writes_per_reading": d.writes / n, "readings_per_s": d.readings_per_s,
            "avg_1h_ms": d.queries[0], "avg_24h_ms": d.queries[1], "avg_7d_ms": d.queries[2], "series_24h_ms": d.queries[3],
        }))
        .collect();
    report.set("designs", json);
    report.set("overhead", serde_json::json!({ "hourglass_readings_per_s": minute.readings_per_s, "direct_readings_per_s": direct, "ratio": minute.readings_per_s / direct }));
    Ok((report, ok_m && ok_h))
}
