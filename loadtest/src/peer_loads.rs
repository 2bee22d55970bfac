//! One load of the `peers` comparison: the dataset into a fresh server
//! (Hourglass in each format, VictoriaMetrics, InfluxDB), its CPU, memory,
//! disk and query times measured, then the server stopped.

use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, rfc3339};
use crate::peer_servers::{send_lines, start_influx, start_victoria};
use crate::procs::{Proc, cpu_seconds_fine, cpu_until_settled, dir_bytes, peak_rss_mib};
use crate::waits::{STORED_WITHIN, wait_rolled_up, wait_stored};

const RUNS: usize = 5;

async fn median_ms(client: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let r = client.get(url).send().await?;
        anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
        let _ = r.bytes().await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

#[derive(Clone)]
pub(crate) struct Peer {
    pub(crate) name: &'static str,
    pub(crate) readings_per_s: f64,
    pub(crate) cpu_s: f64,
    pub(crate) rss_mib: f64,
    pub(crate) disk_bytes: f64,
    pub(crate) avg_ms: f64,
    pub(crate) series_ms: f64,
    /// Hourglass only: its idle CPU rate times the load's duration.
    pub(crate) idle_s: f64,
    /// Hourglass only: the driver's share of `idle_s` (its thread's
    /// monitoring and pool upkeep, the floor's reads).
    pub(crate) idle_driver_s: f64,
    /// The CPU until the server had done what the load left it: a peer's
    /// deferred work (see `cpu_until_settled`) counted, like Hourglass',
    /// whose `cpu_s` already runs until every reading is stored and rolled
    /// up (this is that figure again).
    pub(crate) settled_cpu_s: f64,
    /// The idle rate times the load's duration until settled (Hourglass:
    /// `idle_s`).
    pub(crate) settled_idle_s: f64,
    /// Hourglass only: the CPU seconds spent inside the MongoDB driver
    /// (`hourglass_mongodb_driver_cpu_seconds_total`), part of `cpu_s`.
    pub(crate) driver_s: f64,
    /// Hourglass only: the load's duration, until stored and rolled up.
    pub(crate) seconds: f64,
    /// Hourglass only: the 1-hour average's answer (readings and sum), the
    /// same whichever format loaded it.
    pub(crate) avg_answer: Option<(u64, f64)>,
}

/// Loads a line-protocol server with the dataset and measures it, then stops it.
#[allow(clippy::too_many_arguments)]
async fn line_peer(
    ctx: &Ctx,
    name: &'static str,
    server: Proc,
    write_url: &str,
    flush_url: Option<&str>,
    queries: &[String; 2],
    data: &Dataset,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<Peer> {
    let client = reqwest::Client::new();
    // Its idle rate, after its start's own work, for what the wait below
    // adds.
    tokio::time::sleep(PEER_STARTUP).await;
    let idle0 = server.cpu();
    tokio::time::sleep(PEER_IDLE_SAMPLE).await;
    let idle_rate = (server.cpu() - idle0) / PEER_IDLE_SAMPLE.as_secs_f64();
    let cpu0 = server.cpu();
    let secs = send_lines(ctx, write_url, data, batch, concurrency).await?;
    let cpu_s = server.cpu() - cpu0;
    let (settled, waited) = cpu_until_settled(server.pid, idle_rate, PEER_SETTLE_WITHIN).await?;
    if let Some(flush) = flush_url {
        let _ = client.get(flush).send().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let peer = Peer {
        name,
        readings_per_s: data.len() as f64 / secs,
        cpu_s,
        settled_cpu_s: settled - cpu0,
        settled_idle_s: idle_rate * (secs + waited),
        rss_mib: peak_rss_mib(server.pid),
        disk_bytes: server.dir.as_ref().map_or(0, |d| dir_bytes(d.path())) as f64,
        avg_ms: median_ms(&client, &queries[0]).await?,
        series_ms: median_ms(&client, &queries[1]).await?,
        avg_answer: None,
        idle_s: 0.0,
        idle_driver_s: 0.0,
        driver_s: 0.0,
        seconds: secs,
    };
    server.stop();
    Ok(peer)
}

#[derive(Clone, Copy)]
pub(crate) enum Format {
    Json,
    LineProtocol,
    /// Line protocol with the journal on (the service's default): an answer
    /// means journaled, and the load ends when every reading is stored.
    LineProtocolJournaled,
}

/// How long a peer is left after its start before its idle CPU is measured.
const PEER_STARTUP: Duration = Duration::from_secs(1);
/// How long a peer's idle CPU is measured before its load.
pub(crate) const PEER_IDLE_SAMPLE: Duration = Duration::from_secs(2);
/// How long a peer may take to finish what its load left it.
const PEER_SETTLE_WITHIN: Duration = Duration::from_secs(60);

fn as_f64(d: &mongodb::bson::Document, key: &str) -> f64 {
    d.get_i64(key)
        .map(|x| x as f64)
        .or_else(|_| d.get_i32(key).map(f64::from))
        .or_else(|_| d.get_f64(key))
        .unwrap_or(0.0)
}

/// A fresh Hourglass loaded with the dataset in `format`, measured like the
/// peers: journal off, so an answer means stored, or journal on, measured
/// until every reading is stored.
pub(crate) async fn hourglass_peer(
    ctx: &Ctx,
    format: Format,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    (from1, from24, end): (i64, i64, i64),
    idle_sample: Duration,
) -> anyhow::Result<Peer> {
    // Long: one load as the peers' are measured: idle sample, load, settle, queries, sizes; each a few lines.
    let client = reqwest::Client::new();
    let (what, name, journal) = match format {
        Format::Json => ("peers", "Hourglass, JSON (service only)", false),
        Format::LineProtocol => ("peers-lp", "Hourglass, line protocol (service only)", false),
        Format::LineProtocolJournaled => (
            "peers-lpj",
            "Hourglass, line protocol, journal on (service only)",
            true,
        ),
    };
    // Acknowledgements wait for storage: a stand-in's flush may outlast
    // the default write timeout, and a refused batch sent again costs CPU
    // twice.
    let timeouts = vec![
        ("HOURGLASS__HTTP__REQUEST_TIMEOUT".into(), "600s".into()),
        ("HOURGLASS__HTTP__WRITE_TIMEOUT".into(), "590s".into()),
    ];
    let target = ctx
        .target_with(what, "minute", false, journal, timeouts)
        .await?;
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    // The service's CPU while it waits (its floor reads, the
    // upkeep's polls, the driver's monitoring): the stand-in stretches a
    // load to tens of seconds where a real MongoDB takes a few, and this
    // rate times the load's duration is what the stretch costs.
    let pid = target.proc.as_ref().map(|p| p.pid);
    let idle0 = pid.map(cpu_seconds_fine);
    let idle_driver0 = driver_cpu(&client, &target.url).await?;
    tokio::time::sleep(idle_sample).await;
    let idle_for = idle_sample.as_secs_f64().max(1e-3);
    let idle_rate = idle0
        .zip(pid.map(cpu_seconds_fine))
        .map_or(0.0, |(a, b)| (b - a) / idle_for);
    let idle_driver_rate = (driver_cpu(&client, &target.url).await? - idle_driver0) / idle_for;
    let started = Instant::now();
    let cpu0 = target.cpu();
    let driver0 = driver_cpu(&client, &target.url).await?;
    let readings_per_s = match format {
        Format::Json => {
            let o = crate::send::send_all(ctx, &target, data, batch, concurrency).await?;
            o.readings as f64 / o.seconds
        }
        Format::LineProtocol | Format::LineProtocolJournaled => {
            let started = Instant::now();
            let url = format!("{}/write?precision=s", target.url);
            send_lines(ctx, &url, data, batch, concurrency).await?;
            if journal {
                wait_stored(&target.url, data.len()).await?;
            }
            data.len() as f64 / started.elapsed().as_secs_f64()
        }
    };
    // The data is an hour old: its hours are marked late and rolled up
    // once the writes pause. That upkeep is the service's work too.
    wait_rolled_up(&mongo, &target.database, STORED_WITHIN).await?;
    let cpu_s = cpu0.zip(target.cpu()).map_or(0.0, |(a, b)| b - a);
    let driver_s = driver_cpu(&client, &target.url).await? - driver0;
    let seconds = started.elapsed().as_secs_f64();
    let idle_s = idle_rate * seconds;
    let idle_driver_s = idle_driver_rate.min(idle_rate) * seconds;
    let stats = mongo
        .database(&target.database)
        .run_command(mongodb::bson::doc! { "collStats": "buckets" })
        .await?;
    let (s, m) = (Dataset::sensor(0), Dataset::metric(0));
    let avg = format!(
        "{}/api/v1/sensors/{s}/average?metric={m}&from={}&to={}",
        target.url,
        rfc3339(from1),
        rfc3339(end)
    );
    let series = format!(
        "{}/api/v1/sensors/{s}/series?metric={m}&from={}&to={}&step=1h",
        target.url,
        rfc3339(from24),
        rfc3339(end)
    );
    let answer: serde_json::Value = client.get(&avg).send().await?.json().await?;
    let avg_answer = answer["count"].as_u64().zip(answer["sum"].as_f64());
    Ok(Peer {
        avg_answer,
        idle_s,
        idle_driver_s,
        driver_s,
        seconds,
        name,
        readings_per_s,
        cpu_s,
        settled_cpu_s: cpu_s,
        settled_idle_s: idle_s,
        rss_mib: target.proc.as_ref().map_or(0.0, |p| peak_rss_mib(p.pid)),
        disk_bytes: as_f64(&stats, "size") + as_f64(&stats, "totalIndexSize"),
        avg_ms: median_ms(&client, &avg).await?,
        series_ms: median_ms(&client, &series).await?,
    })
}

/// The CPU seconds an instance spent inside the MongoDB driver so far.
async fn driver_cpu(client: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let name = "hourglass_mongodb_driver_cpu_seconds_total ";
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .ok_or_else(|| anyhow::anyhow!("{url}/metrics has no {}", name.trim()))
}

pub(crate) async fn victoria_peer(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    (from24, end): (i64, i64),
) -> anyhow::Result<Peer> {
    let vm = start_victoria(&[]).await?;
    let sel = r#"m0_value{sensor="lt-00000"}"#;
    let queries = [
        format!(
            "{}/api/v1/query?query=avg_over_time({sel}[1h])&time={end}",
            vm.url
        ),
        format!(
            "{}/api/v1/query_range?query=avg_over_time({sel}[1h])&start={from24}&end={end}&step=3600",
            vm.url
        ),
    ];
    // VictoriaMetrics keeps recent data in memory: flush it before measuring the disk.
    let flush = format!("{}/internal/force_flush", vm.url);
    let write = format!("{}/write?precision=s", vm.url);
    line_peer(
        ctx,
        "VictoriaMetrics",
        vm,
        &write,
        Some(&flush),
        &queries,
        data,
        batch,
        concurrency,
    )
    .await
}

pub(crate) async fn influx_peer(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    (from1, from24, end): (i64, i64, i64),
) -> anyhow::Result<Peer> {
    let influx = start_influx().await?;
    let q = |sql: String| {
        format!(
            "{}/query?db=hg&q={}",
            influx.url,
            sql.replace(' ', "%20")
                .replace('\'', "%27")
                .replace('"', "%22")
        )
    };
    let queries = [
        q(format!(
            "SELECT mean(value) FROM m0 WHERE sensor='lt-00000' AND time >= '{}' AND time < '{}'",
            rfc3339(from1),
            rfc3339(end)
        )),
        q(format!(
            "SELECT mean(value) FROM m0 WHERE sensor='lt-00000' AND time >= '{}' AND time < '{}' GROUP BY time(1h)",
            rfc3339(from24),
            rfc3339(end)
        )),
    ];
    let write = format!("{}/write?db=hg&precision=s", influx.url);
    line_peer(
        ctx,
        "InfluxDB 1.x",
        influx,
        &write,
        None,
        &queries,
        data,
        batch,
        concurrency,
    )
    .await
}
