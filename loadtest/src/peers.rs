//! `peers`: the same data as Influx line protocol into VictoriaMetrics and
//! InfluxDB 1.x (both started here on free ports, with throw-away data
//! directories), the same queries, next to Hourglass.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::backfill;
use crate::ctx::Ctx;
use crate::dataset::{Dataset, Row, rfc3339};
use crate::procs::{
    Proc, cpu_seconds_fine, cpu_until_settled, dir_bytes, http_url, peak_rss_mib, scrape,
};
use crate::report::{Plot, Report, Section, f};

const RUNS: usize = 5;
/// Interleaved rounds of the five loads, each on fresh servers (see `run`).
const ROUNDS: usize = 3;

pub(crate) fn which(bin: &str) -> anyhow::Result<String> {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let p = format!("{dir}/{bin}");
        if Path::new(&p).exists() {
            return Ok(p);
        }
    }
    anyhow::bail!("{bin} is not installed (apt-get install victoria-metrics influxdb prometheus)")
}

pub(crate) async fn start_victoria(extra: &[&str]) -> anyhow::Result<Proc> {
    let dir = tempfile::tempdir()?;
    let child = Command::new(which("victoria-metrics")?)
        .args(extra)
        .arg(format!(
            "-storageDataPath={}",
            dir.path().join("data").display()
        ))
        .arg("-httpListenAddr=127.0.0.1:0")
        .arg("-retentionPeriod=100y")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let mut proc = Proc {
        pid,
        child,
        url: String::new(),
        dir: Some(dir),
    };
    proc.url = http_url(pid, "/health", Duration::from_secs(60)).await?;
    Ok(proc)
}

pub(crate) async fn start_influx() -> anyhow::Result<Proc> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    let config = format!(
        "reporting-disabled = true\nbind-address = \"127.0.0.1:0\"\n[meta]\ndir = \"{d}/meta\"\n[data]\ndir = \"{d}/data\"\nwal-dir = \"{d}/wal\"\nquery-log-enabled = false\n[http]\nbind-address = \"127.0.0.1:0\"\nlog-enabled = false\n[monitor]\nstore-enabled = false\n"
    );
    std::fs::write(dir.path().join("influxdb.conf"), config)?;
    let child = Command::new(which("influxd")?)
        .arg("-config")
        .arg(dir.path().join("influxdb.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let mut proc = Proc {
        pid,
        child,
        url: String::new(),
        dir: Some(dir),
    };
    // Two listeners on port 0 (HTTP and RPC): the one that answers /ping.
    proc.url = http_url(pid, "/ping", Duration::from_secs(60)).await?;
    let r = reqwest::Client::new()
        .post(format!("{}/query?q=CREATE%20DATABASE%20hg", proc.url))
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "CREATE DATABASE: {}", r.status());
    Ok(proc)
}

/// Sends every reading as line protocol; returns the seconds it took.
pub(crate) async fn send_lines(
    ctx: &Ctx,
    url: &str,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let rows: Vec<Row> = data.rows().collect();
    send_rows(ctx, url, &rows, batch, concurrency).await
}

/// Sends these readings as line protocol; returns the seconds it took.
pub(crate) async fn send_rows(
    ctx: &Ctx,
    url: &str,
    rows: &[Row],
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let client = reqwest::Client::new();
    let bar = ctx.bar(rows.len() as u64, "line protocol");
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(
        rows.chunks(batch.max(1))
            .map(|c| (c.len(), Dataset::line_protocol(c)))
            .collect::<Vec<_>>(),
    )
    .map(|(n, body)| {
        let (client, bar) = (client.clone(), bar.clone());
        async move {
            let r = client.post(url).body(body).send().await?;
            anyhow::ensure!(
                r.status().is_success(),
                "{url}: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
            bar.inc(n as u64);
            Ok(())
        }
    })
    .buffer_unordered(concurrency.max(1))
    .collect()
    .await;
    bar.finish_and_clear();
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(started.elapsed().as_secs_f64())
}

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
struct Peer {
    name: &'static str,
    readings_per_s: f64,
    cpu_s: f64,
    rss_mib: f64,
    disk_bytes: f64,
    avg_ms: f64,
    series_ms: f64,
    /// Hourglass only: its idle CPU rate times the load's duration.
    idle_s: f64,
    /// Hourglass only: the driver's share of `idle_s` (its thread's
    /// monitoring and pool upkeep, the floor's reads).
    idle_driver_s: f64,
    /// The CPU until the server had done what the load left it: a peer's
    /// deferred work (see `cpu_until_settled`) counted, like Hourglass',
    /// whose `cpu_s` already runs until every reading is stored and rolled
    /// up (this is that figure again).
    settled_cpu_s: f64,
    /// The idle rate times the load's duration until settled (Hourglass:
    /// `idle_s`).
    settled_idle_s: f64,
    /// Hourglass only: the CPU seconds spent inside the MongoDB driver
    /// (`hourglass_mongodb_driver_cpu_seconds_total`), part of `cpu_s`.
    driver_s: f64,
    /// Hourglass only: the load's duration, until stored and rolled up.
    seconds: f64,
    /// Hourglass only: the 1-hour average's answer (readings and sum), the
    /// same whichever format loaded it.
    avg_answer: Option<(u64, f64)>,
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
enum Format {
    Json,
    LineProtocol,
    /// Line protocol with the journal on (the service's default): an answer
    /// means journaled, and the load ends when every reading is stored.
    LineProtocolJournaled,
}

/// How long a peer is left after its start before its idle CPU is measured.
const PEER_STARTUP: Duration = Duration::from_secs(1);
/// How long a peer's idle CPU is measured before its load.
const PEER_IDLE_SAMPLE: Duration = Duration::from_secs(2);
/// How long a peer may take to finish what its load left it.
const PEER_SETTLE_WITHIN: Duration = Duration::from_secs(60);

/// How long the service's idle CPU is measured before each load.
pub(crate) const IDLE_SAMPLE: Duration = Duration::from_secs(10);

/// How long a journaled load may take to reach MongoDB after its last answer.
const STORED_WITHIN: Duration = Duration::from_secs(240);

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
async fn hourglass_peer(
    ctx: &Ctx,
    format: Format,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    (from1, from24, end): (i64, i64, i64),
    idle_sample: Duration,
) -> anyhow::Result<Peer> {
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
            let o = backfill::send_all(ctx, &target, data, batch, concurrency).await?;
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

async fn victoria_peer(
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

async fn influx_peer(
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

pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    idle_sample: Duration,
) -> anyhow::Result<Report> {
    let (end, n) = (data.end(), data.len() as f64);
    let (from24, from1) = (end - 86_400, end - 3600);

    // The peers load in about a second, where scheduling noise moves their
    // CPU figure by a third, and this machine's speed drifts by a fifth
    // within minutes: the loads run in ROUNDS interleaved rounds, each on
    // fresh servers, and VictoriaMetrics loads again after each Hourglass
    // load, so that each Hourglass load has a VictoriaMetrics load just
    // before and just after it; its ratio is over their mean CPU, and each
    // row's ratio the median of its rounds' ratios.
    let mut rounds: Vec<Vec<Peer>> = Vec::with_capacity(ROUNDS);
    // Per round: VictoriaMetrics before the first Hourglass load and after
    // each.
    let mut victorias: Vec<Vec<Peer>> = Vec::with_capacity(ROUNDS);
    let mut victoria_runs: Vec<Peer> = Vec::new();
    for _ in 0..ROUNDS {
        let first = victoria_peer(ctx, data, batch, concurrency, (from24, end)).await?;
        let mut round = vec![
            first.clone(),
            influx_peer(ctx, data, batch, concurrency, (from1, from24, end)).await?,
        ];
        let mut vm = vec![first.clone()];
        victoria_runs.push(first);
        // Hourglass thrice: the JSON API, then the very bodies the peers
        // got, with the journal off and on.
        for format in [
            Format::Json,
            Format::LineProtocol,
            Format::LineProtocolJournaled,
        ] {
            round.push(
                hourglass_peer(
                    ctx,
                    format,
                    data,
                    batch,
                    concurrency,
                    (from1, from24, end),
                    idle_sample,
                )
                .await?,
            );
            let after = victoria_peer(ctx, data, batch, concurrency, (from24, end)).await?;
            vm.push(after.clone());
            victoria_runs.push(after);
        }
        rounds.push(round);
        victorias.push(vm);
    }
    // Per Hourglass row (index 2 on): each round's `cpu(row)` over the mean
    // `vm_cpu` of that round's VictoriaMetrics loads just before and after
    // it, sorted.
    let ratios_against = |cpu: fn(&Peer) -> f64, vm_cpu: fn(&Peer) -> f64| -> Vec<Vec<f64>> {
        (2..rounds[0].len())
            .map(|i| {
                let mut r: Vec<f64> = rounds
                    .iter()
                    .zip(&victorias)
                    .map(|(round, vm)| {
                        let around = (vm_cpu(&vm[i - 2]) + vm_cpu(&vm[i - 1])) / 2.0;
                        cpu(&round[i]).max(0.0) / around.max(1e-9)
                    })
                    .collect();
                r.sort_by(f64::total_cmp);
                r
            })
            .collect()
    };
    // Against VictoriaMetrics' CPU at its last answer.
    let ratios_of = |cpu: fn(&Peer) -> f64| ratios_against(cpu, |vm| vm.cpu_s);
    let ratios = ratios_of(|p| p.cpu_s);
    let mut peers: Vec<Peer> = (0..rounds[0].len())
        .map(|i| {
            let mut runs: Vec<Peer> = rounds.iter().map(|r| r[i].clone()).collect();
            runs.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s));
            runs.swap_remove(ROUNDS / 2)
        })
        .collect();
    // The median of VictoriaMetrics' loads counted until settled, and above
    // its idle CPU.
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let vm_settled = median(victoria_runs.iter().map(|p| p.settled_cpu_s).collect());
    let vm_settled_above_idle = median(
        victoria_runs
            .iter()
            .map(|p| p.settled_cpu_s - p.settled_idle_s)
            .collect(),
    );
    // VictoriaMetrics' row: its run of median CPU among all its loads.
    victoria_runs.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s));
    peers[0] = victoria_runs.swap_remove(victoria_runs.len() / 2);

    let mut sec = Section::new(
        &format!(
            "Peers: {} readings as line protocol in batches of {batch}, {concurrency} at a time",
            data.len()
        ),
        &[
            "system",
            "readings/s",
            "CPU s per million readings (a peer's at its last answer)",
            "the same, until settled",
            "of which the MongoDB driver",
            "peak RSS MiB",
            "bytes per reading (disk)",
            "avg 1h ms",
            "series 24h/1h ms",
        ],
    );
    for p in &peers {
        sec.row(vec![
            p.name.into(),
            f(p.readings_per_s),
            f(p.cpu_s / n * 1e6),
            f(p.settled_cpu_s / n * 1e6),
            if p.idle_s > 0.0 || p.driver_s > 0.0 {
                f(p.driver_s / n * 1e6)
            } else {
                "-".into()
            },
            f(p.rss_mib),
            f(p.disk_bytes / n),
            f(p.avg_ms),
            f(p.series_ms),
        ]);
    }
    let mut report = Report::new("Hourglass and its peers");
    report.sections.push(sec);
    report.notes.push("Disk bytes are what each data directory holds right after the load: VictoriaMetrics keeps its newest parts in memory even after a forced flush (a lower bound), InfluxDB 1.x holds its write-ahead log before compaction (an upper bound). Compare them only after a long run.".into());
    report.notes.push(format!("Each system loaded {ROUNDS} times in interleaved rounds, each on a fresh server; a row is its run of median CPU (the peers' loads take a tenth of a CPU second and vary by a third from run to run, and this machine's speed drifts by a fifth within minutes). CPU is each process's CPU-time clock, to the nanosecond: /proc's 10 ms ticks were a tenth of a peer's load. VictoriaMetrics loaded again after each Hourglass load ({} loads in all, its row their median): each Hourglass ratio is over the mean of the VictoriaMetrics loads just before and after it, and a row's ratio is the median of its rounds' ratios.", ROUNDS * 4));
    report.notes.push("The data ends an hour ago, so Hourglass marks its hours late and rolls them up once the writes pause: each Hourglass row's CPU runs until that upkeep is done.".into());
    // Late writes into a UTC day that has ended complete that whole day (every
    // hour of each series, its 30-day slot): a run started in the first hour
    // or so after midnight measures that too.
    let today = time::OffsetDateTime::now_utc()
        .unix_timestamp()
        .div_euclid(86_400);
    if data.start.div_euclid(86_400) < today {
        report.notes.push("This run's data lies in a UTC day that had ended by the run's end, so Hourglass' loads after midnight also rolled up that whole day (every hour of every series, and its 30-day slot): their CPU is not comparable with runs whose data lies in the current day (those started after about 01:15 UTC).".into());
    }
    report.notes.push("Hourglass' journaled row runs the service's default: each answer waits for the journal's fsync, not MongoDB, and the load's CPU and time run until every reading is stored (a bucket is written once its minute has closed, not once per request). The other Hourglass rows run with the journal off, so each answer means stored.".into());
    report.notes.push("Hourglass' row counts the service process only; its storage is the Python stand-in SecantusDB (bytes are the collection's data and index sizes as the server reports them), so its throughput is the stand-in's. The CPU column is the fair comparison of the ingest paths.".into());
    for (h, r) in peers[2..].iter().zip(&ratios) {
        report.notes.push(format!(
            "Service CPU per reading, {}: {} µs against VictoriaMetrics' {} µs; ratio {} (the median of the rounds' ratios {}).",
            h.name,
            f(h.cpu_s / n * 1e6),
            f(peers[0].cpu_s / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // The same ratios above each Hourglass run's idle CPU.
    let above_idle = ratios_of(|p| p.cpu_s - p.idle_s);
    for (h, r) in peers[2..].iter().zip(&above_idle) {
        report.notes.push(format!(
            "{}, above its idle CPU ({:.2} ms a second, measured for {} s before the load, times the load's {:.1} s on the stand-in): {} µs per reading; ratio {} (rounds {}). What a faster database would leave of the figure above: the idle share shrinks with the load's duration.",
            h.name,
            h.idle_s * 1e3 / h.seconds.max(1e-9),
            idle_sample.as_secs(),
            h.seconds,
            f((h.cpu_s - h.idle_s).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // The same ratios without the CPU spent inside the official driver:
    // the service's own work (see `store/mongo/driver_cpu.rs`).
    let without_driver = ratios_of(|p| p.cpu_s - p.driver_s);
    for (h, r) in peers[2..].iter().zip(&without_driver) {
        report.notes.push(format!(
            "{}, without the CPU spent by the MongoDB driver ({} µs per reading: encoding commands, socket I/O, decoding replies on the write path and the rollup upkeep, and its own thread's monitoring and pool upkeep): {} µs per reading; ratio {} (rounds {}).",
            h.name,
            f(h.driver_s / n * 1e6),
            f((h.cpu_s - h.driver_s).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // Both: the service's own work per reading, as a database that does not
    // stretch the load would leave it.
    let own_work = ratios_of(|p| p.cpu_s - p.driver_s - (p.idle_s - p.idle_driver_s));
    for (h, r) in peers[2..].iter().zip(&own_work) {
        report.notes.push(format!(
            "{}, without the driver and above its own idle CPU (the idle CPU less the driver's share of it): {} µs per reading; ratio {} (rounds {}). The idle share is the stand-in's stretch of the load.",
            h.name,
            f((h.cpu_s - h.driver_s - (h.idle_s - h.idle_driver_s)).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // Each system counted until it has done what the load asked: the peers
    // until settled (Hourglass' rows already run until stored and rolled
    // up).
    let settled_ratios = |cpu: fn(&Peer) -> f64| ratios_against(cpu, |vm| vm.settled_cpu_s);
    report.notes.push(format!(
        "VictoriaMetrics answers a write before it has done most of the work: a second or so later it turns the acknowledged rows into parts (sorted, compressed, indexed). The ratios above stop its clock at its last answer. Counted until it settles (its CPU back at its idle rate, measured for {} s before the load, for a whole second), VictoriaMetrics spent {} µs per reading ({} above its idle CPU) against {} µs at its last answer, the medians of its {} loads; InfluxDB 1.x spent {} µs against {}. Hourglass' rows already run until every reading is stored and rolled up, so the ratios below count each system until it has done what the load asked. Each is over the VictoriaMetrics loads just before and after it, counted the same way.",
        PEER_IDLE_SAMPLE.as_secs(),
        f(vm_settled / n * 1e6),
        f(vm_settled_above_idle / n * 1e6),
        f(peers[0].cpu_s / n * 1e6),
        ROUNDS * 4,
        f(peers[1].settled_cpu_s / n * 1e6),
        f(peers[1].cpu_s / n * 1e6),
    ));
    let settled = settled_ratios(|p| p.cpu_s);
    let settled_without_driver = settled_ratios(|p| p.cpu_s - p.driver_s);
    let settled_above_idle = ratios_against(
        |p| p.cpu_s - p.driver_s - (p.idle_s - p.idle_driver_s),
        |vm| vm.settled_cpu_s - vm.settled_idle_s,
    );
    for (((h, a), b), c) in peers[2..]
        .iter()
        .zip(&settled)
        .zip(&settled_without_driver)
        .zip(&settled_above_idle)
    {
        let rounds = |r: &Vec<f64>| r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ");
        report.notes.push(format!(
            "{}, against VictoriaMetrics until settled: ratio {} (rounds {}); without the driver {} (rounds {}); without the driver and above idle CPU, against VictoriaMetrics above its idle CPU, {} (rounds {}).",
            h.name,
            f(a[ROUNDS / 2]),
            rounds(a),
            f(b[ROUNDS / 2]),
            rounds(b),
            f(c[ROUNDS / 2]),
            rounds(c),
        ));
    }
    report.plots.push(Plot::Bars {
        file: "peers-cpu.svg".into(),
        title: "CPU seconds per million readings".into(),
        y: "CPU s".into(),
        bars: peers
            .iter()
            .map(|p| (p.name.replace(" (service only)", ""), p.cpu_s / n * 1e6))
            .collect(),
    });
    report.set("peers", peers.iter().map(|p| serde_json::json!({
        "system": p.name, "readings_per_s": p.readings_per_s, "cpu_s_per_million": p.cpu_s / n * 1e6,
        "settled_cpu_s_per_million": p.settled_cpu_s / n * 1e6, "settled_idle_cpu_s_per_million": p.settled_idle_s / n * 1e6,
        "driver_cpu_s_per_million": p.driver_s / n * 1e6, "peak_rss_mib": p.rss_mib, "bytes_per_reading": p.disk_bytes / n, "avg_1h_ms": p.avg_ms, "series_24h_ms": p.series_ms,
        "avg_1h_answer": p.avg_answer,
    })).collect::<Vec<_>>());
    // Each VictoriaMetrics load in the order run, per round: the spread
    // behind every ratio above.
    report.set(
        "victoria_metrics_cpu_s_per_million_by_round",
        victorias
            .iter()
            .map(|vm| vm.iter().map(|p| p.cpu_s / n * 1e6).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
    );
    report.set(
        "victoria_metrics_settled_cpu_s_per_million_by_round",
        victorias
            .iter()
            .map(|vm| {
                vm.iter()
                    .map(|p| p.settled_cpu_s / n * 1e6)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>(),
    );
    report.set(
        "cpu_ratios_to_victoria_metrics_settled",
        serde_json::json!({
            "with_driver": settled,
            "without_driver": settled_without_driver,
            "without_driver_above_idle": settled_above_idle,
            "rows": ["json", "line_protocol", "line_protocol_journaled"],
        }),
    );
    report.set(
        "cpu_ratios_to_victoria_metrics",
        serde_json::json!({
            "json": ratios[0],
            "line_protocol": ratios[1],
            "line_protocol_journaled": ratios[2],
        }),
    );
    report.set(
        "cpu_ratios_without_driver_to_victoria_metrics",
        serde_json::json!({
            "json": without_driver[0],
            "line_protocol": without_driver[1],
            "line_protocol_journaled": without_driver[2],
        }),
    );
    report.set(
        "cpu_ratios_without_driver_above_idle_to_victoria_metrics",
        serde_json::json!({
            "json": own_work[0],
            "line_protocol": own_work[1],
            "line_protocol_journaled": own_work[2],
        }),
    );
    report.set(
        "cpu_ratios_above_idle_to_victoria_metrics",
        serde_json::json!({
            "json": above_idle[0],
            "line_protocol": above_idle[1],
            "line_protocol_journaled": above_idle[2],
        }),
    );
    Ok(report)
}
