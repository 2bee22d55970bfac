//! `storage`: bytes per reading. The same readings (a random walk at two
//! decimals, as thermometers report) at each interval asked, into minute and
//! hour buckets, everything rolled up; then every collection's documents
//! read back and sized as BSON and as WiredTiger would hold them (pages of
//! 32 KiB, compressed with snappy, its default, and zstd), beside one
//! document per reading (sized the same way, without a server) and
//! VictoriaMetrics and InfluxDB 1.x loaded with the same readings in the
//! same run.

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{DateTime, RawDocumentBuf, doc, oid::ObjectId, rawdoc};

use crate::ctx::Ctx;
use crate::dataset::{Row, splitmix};
use crate::peer_servers::{send_rows, start_influx_with, start_victoria};
use crate::procs::dir_bytes;
use crate::report::{Report, Section, f};
use crate::waits::wait_rolled_up;

/// WiredTiger's largest leaf page (`leaf_page_max`): what it compresses
/// as one block.
const PAGE: usize = 32 * 1024;
/// WiredTiger's zstd level (`compression_level` of its zstd extension).
const ZSTD_LEVEL: i32 = 6;
/// Readings per request.
const BATCH: usize = 5000;
/// How long a load's hours may take to be rolled up on the stand-in.
const ROLLED_UP_WITHIN: Duration = Duration::from_secs(1800);

#[derive(clap::Args, Clone, Debug)]
pub struct StorageArgs {
    /// Sensors, one metric each.
    #[arg(long, default_value_t = 20)]
    pub sensors: u32,
    /// Seconds of readings per series: a whole UTC day that has ended by default.
    #[arg(long, default_value_t = 86_400)]
    pub seconds: u32,
    /// Seconds between readings, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,10,60")]
    pub intervals: Vec<u32>,
    /// Bucket granularities, one run each.
    #[arg(long, value_delimiter = ',', default_value = "minute,hour")]
    pub granularities: Vec<String>,
    /// Leave VictoriaMetrics and InfluxDB out.
    #[arg(long)]
    pub no_peers: bool,
}

/// Every reading, tick by tick: each sensor a random walk in hundredths
/// (steps of -3..=3 hundredths), from 20 °C plus half a degree per sensor.
pub fn walk(sensors: u32, start: i64, seconds: u32, interval: u32) -> Vec<Row> {
    let interval = interval.max(1);
    let ticks = seconds.div_ceil(interval);
    let mut cents: Vec<i64> = (0..sensors).map(|i| 2000 + 50 * i64::from(i)).collect();
    let mut rows = Vec::with_capacity(ticks as usize * sensors as usize);
    for k in 0..ticks {
        let t = start + i64::from(k) * i64::from(interval);
        for (i, c) in cents.iter_mut().enumerate() {
            *c += (splitmix((i as u64) << 40 ^ t as u64) % 7) as i64 - 3;
            rows.push((i as u32, 0, t, *c as f64 / 100.0));
        }
    }
    rows
}

/// Bytes of documents as BSON, and in `PAGE` pages compressed with snappy
/// and with zstd (a document is never split across pages).
#[derive(Debug, Default, Clone, Copy)]
pub struct Bytes {
    pub documents: u64,
    pub bson: u64,
    pub snappy: u64,
    pub zstd: u64,
}

impl Bytes {
    pub fn of<'a>(docs: impl IntoIterator<Item = &'a [u8]>) -> anyhow::Result<Self> {
        let mut out = Self::default();
        let mut page = Vec::with_capacity(PAGE);
        let mut snappy = snap::raw::Encoder::new();
        let mut flush = |page: &mut Vec<u8>, out: &mut Self| -> anyhow::Result<()> {
            if !page.is_empty() {
                out.snappy += snappy.compress_vec(page)?.len() as u64;
                out.zstd += zstd::bulk::compress(page, ZSTD_LEVEL)?.len() as u64;
                page.clear();
            }
            Ok(())
        };
        for d in docs {
            if page.len() + d.len() > PAGE {
                flush(&mut page, &mut out)?;
            }
            page.extend_from_slice(d);
            out.documents += 1;
            out.bson += d.len() as u64;
        }
        flush(&mut page, &mut out)?;
        Ok(out)
    }

    fn add(&mut self, o: Bytes) {
        self.documents += o.documents;
        self.bson += o.bson;
        self.snappy += o.snappy;
        self.zstd += o.zstd;
    }
}

/// One document per reading, `{_id, sensor, metric, ts, value}`, as a
/// collection of them would hold it.
pub fn per_event(rows: &[Row]) -> anyhow::Result<Bytes> {
    let docs: Vec<RawDocumentBuf> = rows
        .iter()
        .map(|&(i, _, t, v)| {
            rawdoc! {
                "_id": ObjectId::new(),
                "sensor": format!("lt-{i:05}"),
                "metric": "temp",
                "ts": DateTime::from_millis(t * 1000),
                "value": v,
            }
        })
        .collect();
    Bytes::of(docs.iter().map(|d| d.as_bytes()))
}

/// What one Hourglass database holds, by collection.
#[derive(Debug, Default)]
struct Stored {
    buckets: Bytes,
    rollups: Bytes,
    /// Every other collection (registry, metadata, …).
    other: Bytes,
    /// Index bytes, as the server reports them (0 where it reports none).
    indexes: u64,
}

impl Stored {
    fn all(&self) -> Bytes {
        let mut a = self.buckets;
        a.add(self.rollups);
        a.add(self.other);
        a
    }
}

async fn hourglass(
    ctx: &Ctx,
    rows: &[Row],
    interval: u32,
    granularity: &str,
) -> anyhow::Result<Stored> {
    let granularity: &'static str = if granularity == "hour" {
        "hour"
    } else {
        "minute"
    };
    let timeouts = vec![
        ("HOURGLASS__HTTP__REQUEST_TIMEOUT".into(), "600s".into()),
        ("HOURGLASS__HTTP__WRITE_TIMEOUT".into(), "590s".into()),
    ];
    let what = format!("storage_{interval}s_{granularity}");
    let target = ctx
        .target_with(&what, granularity, false, false, timeouts)
        .await?;
    let url = format!("{}/write?precision=s", target.url);
    send_rows(ctx, &url, rows, BATCH, 4).await?;
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    wait_rolled_up(&mongo, &target.database, ROLLED_UP_WITHIN).await?;
    let database = target.database.clone();
    target.kill();
    let db = mongo.database(&database);
    let mut stored = Stored::default();
    for name in db.list_collection_names().await? {
        let docs: Vec<RawDocumentBuf> = db
            .collection::<RawDocumentBuf>(&name)
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .await?
            .try_collect()
            .await?;
        let bytes = Bytes::of(docs.iter().map(|d| d.as_bytes()))?;
        match name.as_str() {
            "buckets" => stored.buckets = bytes,
            "rollups" => stored.rollups = bytes,
            _ => stored.other.add(bytes),
        }
        let stats = db.run_command(doc! { "collStats": &name }).await?;
        stored.indexes += stats
            .get("totalIndexSize")
            .and_then(|v| {
                v.as_i64()
                    .or_else(|| v.as_i32().map(i64::from))
                    .or_else(|| v.as_f64().map(|x| x as i64))
            })
            .unwrap_or(0)
            .max(0) as u64;
    }
    Ok(stored)
}

/// Disk bytes of VictoriaMetrics after the readings and a forced flush (its
/// few fixed files included: at these sizes they are a share of it, so the
/// figure is an upper bound).
async fn victoria(ctx: &Ctx, rows: &[Row]) -> anyhow::Result<u64> {
    let vm = start_victoria(&[]).await?;
    send_rows(
        ctx,
        &format!("{}/write?precision=s", vm.url),
        rows,
        BATCH,
        4,
    )
    .await?;
    // Acknowledged is not yet added: at 1.7 million rows a directory sized
    // right after the writes once held almost none of them.
    let want = rows.len() as f64;
    let mut added = 0.0;
    for _ in 0..120 {
        let _ = reqwest::get(format!("{}/internal/force_flush", vm.url)).await;
        added = crate::procs::scrape(&vm.url)
            .await?
            .get("vm_rows_added_to_storage_total")
            .copied()
            .unwrap_or(0.0);
        if added >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::ensure!(
        added >= want,
        "VictoriaMetrics added {added} of {want} rows to its storage"
    );
    // Its background merges settle within seconds at these sizes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let bytes = vm.dir.as_ref().map_or(0, |d| dir_bytes(d.path()));
    vm.stop();
    Ok(bytes)
}

/// Bytes of the files under `dir` whose names end in one of `suffixes`.
fn files_bytes(dir: &std::path::Path, suffixes: &[&str]) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => files_bytes(&e.path(), suffixes),
            Ok(m)
                if suffixes
                    .iter()
                    .any(|s| e.file_name().to_string_lossy().ends_with(s)) =>
            {
                m.len()
            }
            _ => 0,
        })
        .sum()
}

/// Bytes of InfluxDB 1.x's readings once its cache is snapshotted and its
/// shard compacted (told to do both within seconds): its TSM and WAL files.
/// Its series file and index are left out: they preallocate tens of
/// megabytes whatever the data, and grow with series, not readings.
async fn influx(ctx: &Ctx, rows: &[Row]) -> anyhow::Result<u64> {
    let server = start_influx_with(
        "cache-snapshot-write-cold-duration = \"2s\"\ncompact-full-write-cold-duration = \"4s\"\n",
    )
    .await?;
    send_rows(
        ctx,
        &format!("{}/write?db=hg&precision=s", server.url),
        rows,
        BATCH,
        4,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let bytes = server
        .dir
        .as_ref()
        .map_or(0, |d| files_bytes(d.path(), &[".tsm", ".wal"]));
    server.stop();
    Ok(bytes)
}

/// The start of the latest whole UTC day that ended an hour ago or more,
/// minus `seconds` past a day.
fn start_of(seconds: u32) -> i64 {
    let now = jiff::Timestamp::now().as_second() - 3600;
    let end = now - now.rem_euclid(86_400);
    end - i64::from(seconds)
}

pub async fn run(ctx: &Ctx, args: &StorageArgs) -> anyhow::Result<Report> {
    // Long: one row per collection and per peer, in the order the report reads.
    let mut report = Report::new("Storage: bytes per reading");
    let start = start_of(args.seconds);
    let mut mine = Section::new(
        "Hourglass, bytes per reading by collection (BSON; all collections also in 32 KiB pages)",
        &[
            "interval",
            "buckets",
            "readings",
            "documents per 1 000 readings",
            "buckets B",
            "rollups B",
            "other B",
            "all, BSON B",
            "all, snappy B",
            "all, zstd B",
            "indexes B",
            "rollups ÷ buckets",
        ],
    );
    let mut against = Section::new(
        "Against one document per reading and the peers (bytes per reading, same readings, same run)",
        &[
            "interval",
            "one document per reading, BSON / snappy / zstd",
            "VictoriaMetrics (disk)",
            "InfluxDB 1.x (TSM and WAL files, compacted)",
            "Hourglass minute, snappy ÷ VictoriaMetrics",
            "Hourglass hour, snappy ÷ VictoriaMetrics",
        ],
    );
    for &interval in &args.intervals {
        let rows = walk(args.sensors, start, args.seconds, interval);
        let n = rows.len() as f64;
        let per = |b: u64| f(b as f64 / n);
        let event = per_event(&rows)?;
        let (vm, ifx) = if args.no_peers {
            (None, None)
        } else {
            (
                Some(victoria(ctx, &rows).await?),
                Some(influx(ctx, &rows).await?),
            )
        };
        let mut snappy_by = std::collections::BTreeMap::new();
        for g in &args.granularities {
            let s = hourglass(ctx, &rows, interval, g).await?;
            let all = s.all();
            mine.row(vec![
                format!("{interval} s"),
                g.clone(),
                rows.len().to_string(),
                f(all.documents as f64 * 1000.0 / n),
                per(s.buckets.bson),
                per(s.rollups.bson),
                per(s.other.bson),
                per(all.bson),
                per(all.snappy),
                per(all.zstd),
                if s.indexes == 0 {
                    "not reported".into()
                } else {
                    per(s.indexes)
                },
                format!(
                    "{:.0} %",
                    100.0 * s.rollups.bson as f64 / s.buckets.bson.max(1) as f64
                ),
            ]);
            let key = format!("storage_{interval}s_{g}");
            report.set(
                &key,
                serde_json::json!({
                    "readings": rows.len(),
                    "documents": all.documents,
                    "buckets_bson_per_reading": s.buckets.bson as f64 / n,
                    "rollups_bson_per_reading": s.rollups.bson as f64 / n,
                    "other_bson_per_reading": s.other.bson as f64 / n,
                    "bson_per_reading": all.bson as f64 / n,
                    "snappy_per_reading": all.snappy as f64 / n,
                    "zstd_per_reading": all.zstd as f64 / n,
                    "index_per_reading": s.indexes as f64 / n,
                    "victoria_metrics_per_reading": vm.map(|b| b as f64 / n),
                }),
            );
            snappy_by.insert(g.clone(), all.snappy);
        }
        let ratio = |g: &str| match (snappy_by.get(g), vm) {
            (Some(&h), Some(v)) if v > 0 => format!("{:.1}×", h as f64 / v as f64),
            _ => "—".into(),
        };
        against.row(vec![
            format!("{interval} s"),
            format!(
                "{} / {} / {}",
                per(event.bson),
                per(event.snappy),
                per(event.zstd)
            ),
            vm.map_or("—".into(), per),
            ifx.map_or("—".into(), per),
            ratio("minute"),
            ratio("hour"),
        ]);
        report.set(
            &format!("storage_{interval}s_peers"),
            serde_json::json!({
                "per_event_bson_per_reading": event.bson as f64 / n,
                "per_event_snappy_per_reading": event.snappy as f64 / n,
                "per_event_zstd_per_reading": event.zstd as f64 / n,
                "victoria_metrics_per_reading": vm.map(|b| b as f64 / n),
                "influxdb_per_reading": ifx.map(|b| b as f64 / n),
            }),
        );
    }
    report.sections.push(mine);
    report.sections.push(against);
    report.notes.push(format!(
        "{} sensors, one metric each, {} s of readings ending at a UTC midnight an hour ago or more, each a random walk in hundredths; every hour rolled up before sizing. BSON is the documents' own bytes; the pages are the documents in _id order cut into {} KiB pages (WiredTiger's leaf_page_max) and compressed one by one with snappy (MongoDB's default block compressor) and zstd level {ZSTD_LEVEL} (`mongodb.block_compressor = \"zstd\"`, the default), an estimate of what WiredTiger writes. One document per reading is sized the same way without a server. VictoriaMetrics is its data directory after a forced flush (its fixed files included: an upper bound at these sizes); InfluxDB 1.x its TSM and WAL files after a snapshot and a full compaction (its series file and index, tens of megabytes preallocated whatever the data, left out). Index bytes are the server's own figure: the stand-in's are not WiredTiger's.",
        args.sensors,
        args.seconds,
        PAGE / 1024
    ));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_moves_by_hundredths_and_is_the_same_every_run() {
        let rows = walk(3, 3600, 600, 10);
        assert_eq!(rows.len(), 3 * 60);
        assert_eq!(rows, walk(3, 3600, 600, 10));
        for w in rows.chunks(3).collect::<Vec<_>>().windows(2) {
            for (a, b) in w[0].iter().zip(w[1]) {
                let step = ((b.3 - a.3) * 100.0).round();
                assert!(step.abs() <= 3.0, "{a:?} → {b:?}");
                assert!(format!("{}", b.3).split('.').nth(1).map_or(0, str::len) <= 2);
            }
        }
    }

    #[test]
    fn pages_hold_whole_documents_and_compress() {
        let rows = walk(2, 3600, 3600, 1);
        let b = per_event(&rows).expect("sized");
        assert_eq!(b.documents, rows.len() as u64);
        assert!(b.snappy < b.bson && b.zstd < b.snappy, "{b:?}");
    }
}
