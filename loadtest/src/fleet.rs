//! `fleet`: sensors sending live, paced in real time, over HTTP or MQTT.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::{Mutex, Semaphore};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, Row};
use crate::procs::{scrape, scrape_by};
use crate::report::{Plot, Report, Section, f, percentiles};

#[derive(Clone, Copy, Debug, clap::ValueEnum, serde::Serialize)]
pub enum Transport {
    /// Batches of --batch readings per request.
    Http,
    /// One reading per request.
    HttpSingle,
    /// One reading per MQTT message on sensors/{sensor}/{metric}.
    Mqtt,
    /// One message per sensor a tick through the zigbee2mqtt preset: an
    /// object with a field per metric and Zigbee2MQTT's ISO `last_seen`
    /// (the route's time, so the readings are checked exactly).
    MqttRoute,
    /// One message per sensor a tick on telegraf/<sensor>: a line-protocol
    /// line per metric.
    MqttLineProtocol,
}

impl Transport {
    pub fn mqtt(self) -> bool {
        matches!(
            self,
            Transport::Mqtt | Transport::MqttRoute | Transport::MqttLineProtocol
        )
    }

    /// The configuration file it needs (the route), if any.
    fn config(self) -> Option<String> {
        matches!(self, Transport::MqttRoute).then(|| {
            "[[mqtt.routes]]\npreset = \"zigbee2mqtt\"\nts = \"field:/last_seen\"\nts_format = \"rfc3339\"\n"
                .to_owned()
        })
    }

    /// The MQTT messages of `rows` (one tick, sensor by sensor): topic,
    /// payload and the readings each holds.
    fn messages(self, rows: &[Row]) -> Vec<(String, String, u64)> {
        if matches!(self, Transport::Mqtt) {
            return rows
                .iter()
                .map(|(i, j, ts, v)| {
                    (
                        format!("sensors/{}/{}", Dataset::sensor(*i), Dataset::metric(*j)),
                        format!(r#"{{"value":{v},"ts":{}}}"#, ts * 1000),
                        1,
                    )
                })
                .collect();
        }
        rows.chunk_by(|a, b| a.0 == b.0 && a.2 == b.2)
            .map(|group| {
                let (i, _, ts, _) = group[0];
                let sensor = Dataset::sensor(i);
                let n = group.len() as u64;
                if matches!(self, Transport::MqttRoute) {
                    let mut o = serde_json::Map::new();
                    for (_, j, _, v) in group {
                        o.insert(Dataset::metric(*j), serde_json::json!(v));
                    }
                    let seen = jiff::Timestamp::from_second(ts).map(|t| t.to_string());
                    o.insert(
                        "last_seen".into(),
                        serde_json::json!(seen.unwrap_or_default()),
                    );
                    (
                        format!("zigbee2mqtt/{sensor}"),
                        serde_json::Value::Object(o).to_string(),
                        n,
                    )
                } else {
                    let lines: String = group
                        .iter()
                        .map(|(_, j, _, v)| {
                            format!(
                                "{},sensor={sensor} value={v} {}000000000\n",
                                Dataset::metric(*j),
                                ts
                            )
                        })
                        .collect();
                    (format!("telegraf/{sensor}"), lines, n)
                }
            })
            .collect()
    }
}

fn mqtt_host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url
        .strip_prefix("mqtt://")
        .ok_or_else(|| anyhow::anyhow!("MQTT url must be mqtt://host:port"))?;
    let (h, p) = rest
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("MQTT url needs a port"))?;
    Ok((h.to_owned(), p.trim_end_matches('/').parse()?))
}

/// Documents written, by kind (bucket_update, rollup_upkeep, registry_update,
/// dead_letter), and documents the rollup upkeep read.
async fn writes(url: &str) -> (std::collections::HashMap<String, f64>, f64) {
    let written = scrape_by(url, "hourglass_db_documents_written_total", "kind")
        .await
        .unwrap_or_default();
    let read = scrape_by(url, "hourglass_db_documents_read_total", "kind")
        .await
        .unwrap_or_default()
        .get("rollup_upkeep")
        .copied()
        .unwrap_or(0.0);
    (written, read)
}

/// The data's documents: what the write-ratio targets count.
const DATA_KINDS: [&str; 4] = [
    "bucket_update",
    "rollup_upkeep",
    "registry_update",
    "dead_letter",
];

/// Seconds past a clock hour at which the steady-state marks are taken:
/// after the hold grace (10 s), the roll-up (`buckets.rollup_after`, 60 s)
/// and the late markers' clearing.
const STEADY_AFTER: i64 = 120;

#[allow(clippy::too_many_arguments)]
pub async fn run(
    ctx: &Ctx,
    mut data: Dataset,
    transport: Transport,
    batch: usize,
    concurrency: usize,
    verify: bool,
    journal: bool,
    granularity: &'static str,
    preload_days: u32,
) -> anyhow::Result<(Report, bool)> {
    // Long: the scenario's steps in order (target, preload, offer, settle), then its figures gathered one field each and reported.
    let mqtt = transport.mqtt();
    let label = format!(
        "{}{}{}",
        format!("{transport:?}").to_lowercase(),
        if journal { "_journal" } else { "" },
        if granularity == "minute" { "" } else { "_hour" },
    );
    let target = ctx
        .target_configured(
            &format!("fleet_{label}"),
            granularity,
            mqtt,
            journal,
            transport.config(),
        )
        .await?;
    let preloaded_s = preload_history(ctx, &target.database, &data, preload_days).await?;
    // Live sensors: the data starts now, once the history is in (readings
    // stamped before a long preload would arrive late, and be written at once).
    data.start = jiff::Timestamp::now().as_second();
    let interval = Duration::from_secs(u64::from(data.args.interval.max(1)));
    let batch = if matches!(transport, Transport::HttpSingle) {
        1
    } else {
        batch.max(1)
    };
    let sender = Sender {
        latencies: Arc::default(),
        errors: Arc::default(),
        sent: Arc::default(),
        permits: Arc::new(Semaphore::new(concurrency.max(1))),
        http: reqwest::Client::new(),
        url: format!("{}/api/v1/readings", target.url),
        batch,
        transport,
        publisher: if mqtt {
            Some(connect_publisher(ctx)?)
        } else {
            None
        },
    };
    let before = scrape(&target.url).await.unwrap_or_default();
    let writes_before = writes(&target.url).await;
    let cpu0 = target.cpu();
    let stored0 = before
        .get("hourglass_readings_stored_total")
        .copied()
        .unwrap_or(0.0);
    let started = Instant::now();
    let offering = offer(ctx, &data, &sender, &target.url, interval, stored0, started).await?;
    let offered_s = started.elapsed().as_secs_f64();
    // The intake's own cost (decode, journal, batcher), before the storing
    // that follows the offering; the same for every message shape.
    let cpu_offering = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
    let acked_early = scrape(&target.url)
        .await
        .unwrap_or_default()
        .get("hourglass_readings_stored_total")
        .copied()
        .unwrap_or(0.0)
        - stored0;
    // Let every in-flight request finish.
    let _ = sender
        .permits
        .acquire_many(concurrency.max(1) as u32)
        .await?;
    let offered = data.len();
    let errors = sender.errors.load(Ordering::Relaxed);
    let Offering {
        mut samples,
        pending,
        marks,
    } = offering;
    let stored = settle(
        &target.url,
        stored0,
        offered as f64 - errors as f64 * batch as f64,
        started,
        &mut samples,
    )
    .await;
    let all_s = started.elapsed().as_secs_f64();
    let cpu = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
    let after = scrape(&target.url).await.unwrap_or_default();
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let writes_after = writes(&target.url).await;
    let written = |kind: &str| {
        writes_after.0.get(kind).copied().unwrap_or(0.0)
            - writes_before.0.get(kind).copied().unwrap_or(0.0)
    };
    // Every kind the service counts, coordination included (late markers,
    // the instance floor, version prunes, tombstones).
    let kinds: std::collections::BTreeMap<String, f64> = writes_after
        .0
        .keys()
        .chain(writes_before.0.keys())
        .map(|k| (k.clone(), written(k)))
        .collect();
    let (p50, p99, max) = percentiles(sender.latencies.lock().await.clone());
    let figures = Figures {
        transport,
        journal,
        mqtt,
        granularity,
        preload_days,
        preloaded_s,
        offered,
        offered_s,
        stored,
        all_s,
        acked_early,
        errors,
        latency: (p50, p99, max),
        peak_rss: target.peak_rss_mib(),
        cpu,
        cpu_offering,
        updates: delta("hourglass_bucket_updates_total"),
        journal_bytes: delta("hourglass_journal_appended_bytes_total"),
        fsyncs: delta("hourglass_journal_fsyncs_total"),
        data_written: DATA_KINDS.iter().map(|k| written(k)).sum(),
        all_written: kinds.values().sum(),
        kinds,
        steady: steady_hour(&marks),
        upkeep_read: writes_after.1 - writes_before.1,
        pending_thirds: thirds(&pending),
    };
    let mut report = Report::new("Hourglass fleet");
    report.sections.push(section(&figures, &data));
    report.set(&format!("fleet_{label}"), figures.json());
    report.set(
        &format!("fleet_{label}_pending"),
        serde_json::json!({ "thirds": figures.pending_thirds, "preload_days": preload_days, "preload_s": preloaded_s }),
    );
    report.plots.push(Plot::Lines {
        file: format!("fleet-{label}-throughput.svg"),
        title: format!("Fleet over {label}: readings stored over time"),
        x: "seconds".into(),
        y: "readings stored".into(),
        series: vec![
            (
                "offered".into(),
                (0..=data.ticks())
                    .map(|k| {
                        (
                            f64::from(k) * interval.as_secs_f64(),
                            (u64::from(k) * data.series()) as f64,
                        )
                    })
                    .collect(),
            ),
            ("stored".into(), samples),
        ],
    });
    let mut ok = errors == 0 && stored as u64 == offered;
    if verify {
        let (r, good) = crate::verify::run(ctx, &data, granularity, &target.database).await?;
        report.merge(r);
        ok &= good;
    }
    Ok((report, ok))
}

/// History the same series wrote before (minute buckets, straight into the
/// database): what every write and roll-up then runs beside. Its seconds.
async fn preload_history(
    ctx: &Ctx,
    database: &str,
    data: &Dataset,
    preload_days: u32,
) -> anyhow::Result<f64> {
    if preload_days == 0 {
        return Ok(0.0);
    }
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let db = mongo.database(database);
    let now = jiff::Timestamp::now().as_second();
    let end = now - now.rem_euclid(3600) - 3600;
    let t = Instant::now();
    let bar = ctx.bar(u64::from(data.args.sensors * data.args.metrics), "preload");
    for i in 0..data.args.sensors {
        for j in 0..data.args.metrics {
            crate::history::preload(
                &db,
                &Dataset::sensor(i),
                &Dataset::metric(j),
                i64::from(preload_days) * 1440,
                end,
            )
            .await?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(t.elapsed().as_secs_f64())
}

/// One MQTT client; PUBACK latency is the broker's acknowledgement. Counts
/// the PUBACKs.
fn connect_publisher(ctx: &Ctx) -> anyhow::Result<(AsyncClient, Arc<AtomicU64>)> {
    let (host, port) = mqtt_host_port(ctx.global.mqtt_url.as_deref().unwrap_or_default())?;
    // A client id of its own per run: a second run's publisher under the
    // same id would take the session over, and the first's event loop would
    // take it back, over and over, slowing both.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let mut o = MqttOptions::new(format!("fleet-{}-{n}", ctx.run), host, port);
    o.set_keep_alive(Duration::from_secs(30)).set_inflight(1000);
    let (client, mut el) = AsyncClient::new(o, 10_000);
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    a.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                // The run is over and its client dropped.
                Err(rumqttc::ConnectionError::RequestsDone) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok((client, acked))
}

/// How a tick's readings are sent: MQTT messages, or HTTP requests of
/// `batch` readings, `permits` of them at once.
struct Sender {
    latencies: Arc<Mutex<Vec<f64>>>,
    errors: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    permits: Arc<Semaphore>,
    http: reqwest::Client,
    url: String,
    batch: usize,
    transport: Transport,
    publisher: Option<(AsyncClient, Arc<AtomicU64>)>,
}

impl Sender {
    async fn send(&self, rows: Vec<Row>) -> anyhow::Result<()> {
        if let Some((client, _)) = &self.publisher {
            for (topic, payload, n) in self.transport.messages(&rows) {
                client
                    .publish(topic, QoS::AtLeastOnce, false, payload)
                    .await?;
                self.sent.fetch_add(n, Ordering::Relaxed);
            }
            return Ok(());
        }
        for chunk in rows.chunks(self.batch) {
            let body = Dataset::json(chunk);
            let n = chunk.len() as u64;
            let permit = self.permits.clone().acquire_owned().await?;
            let (http, url, latencies, errors, sent) = (
                self.http.clone(),
                self.url.clone(),
                self.latencies.clone(),
                self.errors.clone(),
                self.sent.clone(),
            );
            tokio::spawn(async move {
                let t = Instant::now();
                match http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        latencies
                            .lock()
                            .await
                            .push(t.elapsed().as_secs_f64() * 1000.0);
                        sent.fetch_add(n, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                drop(permit);
            });
        }
        Ok(())
    }
}

/// What the offering saw: readings stored over time, readings pending once
/// a tick, and the steady-state marks.
struct Offering {
    samples: Vec<(f64, f64)>,
    /// Readings held and not stored, once a tick: flat when storage keeps up.
    pending: Vec<f64>,
    /// (readings offered, documents written by kind) at each mark.
    marks: Vec<(f64, std::collections::HashMap<String, f64>)>,
}

/// Sends the data tick by tick, in real time.
async fn offer(
    ctx: &Ctx,
    data: &Dataset,
    sender: &Sender,
    url: &str,
    interval: Duration,
    stored0: f64,
    started: Instant,
) -> anyhow::Result<Offering> {
    let bar = ctx.bar(u64::from(data.ticks()), "fleet");
    let mut out = Offering {
        samples: Vec::new(),
        pending: Vec::new(),
        marks: Vec::new(),
    };
    let mut next = tokio::time::Instant::now();
    // The steady state: writes between two marks an hour apart, each
    // `STEADY_AFTER` past a clock hour, once the previous hour's last held
    // buckets, roll-ups and late markers are done, so each window holds one
    // whole hour's work and none of the start's one-off writes.
    let mut next_mark = {
        let now = jiff::Timestamp::now().as_second();
        now - now.rem_euclid(3600) + 3600 + STEADY_AFTER
    };
    for k in 0..data.ticks() {
        let now = jiff::Timestamp::now().as_second();
        if now >= next_mark {
            next_mark += 3600;
            out.marks
                .push((f64::from(k) * data.series() as f64, writes(url).await.0));
        }
        tokio::time::sleep_until(next).await;
        next += interval;
        sender.send(data.tick(k).collect()).await?;
        if let Ok(m) = scrape(url).await {
            let stored = m
                .get("hourglass_readings_stored_total")
                .copied()
                .unwrap_or(0.0)
                - stored0;
            out.samples.push((started.elapsed().as_secs_f64(), stored));
            out.pending
                .push(m.get("hourglass_pending_readings").copied().unwrap_or(0.0));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Waits (bounded) until `expected` readings are stored; what was stored.
/// With the journal, a bucket is written after its minute ends plus the
/// grace: up to about 70 s after its last reading.
async fn settle(
    url: &str,
    stored0: f64,
    expected: f64,
    started: Instant,
    samples: &mut Vec<(f64, f64)>,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut stored = 0.0;
    while Instant::now() < deadline {
        let m = scrape(url).await.unwrap_or_default();
        stored = m
            .get("hourglass_readings_stored_total")
            .copied()
            .unwrap_or(0.0)
            - stored0;
        samples.push((started.elapsed().as_secs_f64(), stored));
        if stored >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stored
}

/// The last whole hour between two marks, if the run held one: readings
/// offered, data and all document writes.
fn steady_hour(marks: &[(f64, std::collections::HashMap<String, f64>)]) -> Option<(f64, f64, f64)> {
    marks.windows(2).last().map(|w| {
        let (o0, w0) = &w[0];
        let (o1, w1) = &w[1];
        let d = |k: &str| w1.get(k).copied().unwrap_or(0.0) - w0.get(k).copied().unwrap_or(0.0);
        let data: f64 = DATA_KINDS.iter().map(|k| d(k)).sum();
        let all: f64 = w1.keys().map(|k| d(k)).sum();
        (o1 - o0, data, all)
    })
}

/// Pending readings by thirds of the run: flat when storage keeps up.
fn thirds(pending: &[f64]) -> [f64; 3] {
    let third = |k: usize| {
        let n = pending.len();
        let part = &pending[n * k / 3..n * (k + 1) / 3];
        part.iter().sum::<f64>() / part.len().max(1) as f64
    };
    [third(0), third(1), third(2)]
}

/// A fleet run's figures, as the report shows them.
struct Figures {
    transport: Transport,
    journal: bool,
    mqtt: bool,
    granularity: &'static str,
    preload_days: u32,
    preloaded_s: f64,
    offered: u64,
    offered_s: f64,
    stored: f64,
    all_s: f64,
    acked_early: f64,
    errors: u64,
    /// Acknowledgement latency p50, p99, max (ms).
    latency: (f64, f64, f64),
    peak_rss: Option<f64>,
    cpu: Option<f64>,
    /// Service CPU while the readings were offered (no storing after).
    cpu_offering: Option<f64>,
    updates: f64,
    journal_bytes: f64,
    fsyncs: f64,
    /// Document writes by kind.
    kinds: std::collections::BTreeMap<String, f64>,
    data_written: f64,
    all_written: f64,
    steady: Option<(f64, f64, f64)>,
    upkeep_read: f64,
    pending_thirds: [f64; 3],
}

impl Figures {
    fn written(&self, kind: &str) -> f64 {
        self.kinds.get(kind).copied().unwrap_or(0.0)
    }

    fn json(&self) -> serde_json::Value {
        let Figures {
            offered,
            offered_s,
            stored,
            all_s,
            errors,
            cpu,
            cpu_offering,
            updates,
            ref kinds,
            data_written,
            all_written,
            upkeep_read,
            granularity,
            peak_rss,
            journal,
            journal_bytes,
            fsyncs,
            steady,
            latency: (p50, p99, max),
            ..
        } = *self;
        let offered = offered as f64;
        serde_json::json!({
            "offered": offered, "stored": stored, "offered_per_s": offered / offered_s, "stored_per_s": stored / all_s,
            "latency_ms": { "p50": p50, "p99": p99, "max": max }, "errors": errors,
            "service_cpu_s": cpu, "service_cpu_us_per_reading": cpu.map(|c| c / offered * 1e6),
            "service_cpu_us_per_reading_offering": cpu_offering.map(|c| c / offered * 1e6),
            "bucket_updates": updates, "writes_per_reading": updates / offered,
            "documents_written": kinds, "data_writes_per_reading": data_written / offered,
            "all_writes_per_reading": all_written / offered, "rollup_upkeep_read": upkeep_read,
            "granularity": granularity, "peak_rss_mib": peak_rss,
            "journal": journal, "journal_bytes_per_reading": journal_bytes / offered,
            "journal_fsyncs": fsyncs, "seconds_to_all_stored": all_s - offered_s,
            "steady_hour": steady.map(|(readings, data, all)| serde_json::json!({
                "readings": readings, "data_writes": data, "all_writes": all,
                "data_writes_per_reading": data / readings.max(1.0),
                "all_writes_per_reading": all / readings.max(1.0),
            })),
        })
    }
}

/// The report's table of a fleet run.
fn section(fig: &Figures, data: &Dataset) -> Section {
    // Long: one row per figure, in the order the report reads.
    let Figures {
        transport,
        journal,
        mqtt,
        preload_days,
        preloaded_s,
        offered,
        offered_s,
        stored,
        all_s,
        acked_early,
        errors,
        peak_rss,
        cpu,
        updates,
        journal_bytes,
        fsyncs,
        ref kinds,
        data_written,
        all_written,
        steady,
        upkeep_read,
        latency: (p50, p99, max),
        ..
    } = *fig;
    let written = |kind: &str| fig.written(kind);
    let third = |k: usize| fig.pending_thirds[k];
    let mut s = Section::new(
        &format!(
            "Fleet over {}, journal {}: {} sensors × {} metrics, every {} s, for {} s",
            format!("{transport:?}").to_lowercase(),
            if journal { "on" } else { "off" },
            data.args.sensors,
            data.args.metrics,
            data.args.interval,
            data.args.seconds
        ),
        &["metric", "value"],
    );
    s.row(vec![
        "offered (readings/s)".into(),
        f(offered as f64 / offered_s),
    ]);
    s.row(vec![
        "stored (readings/s, until all stored)".into(),
        f(stored / all_s),
    ]);
    s.row(vec![
        "stored / offered".into(),
        format!("{} / {}", stored as u64, offered),
    ]);
    s.row(vec![
        "stored when the last reading was offered".into(),
        format!("{} / {}", acked_early as u64, offered),
    ]);
    s.row(vec![
        "last reading offered to all stored (s)".into(),
        f(all_s - offered_s),
    ]);
    if journal {
        s.row(vec![
            "journal bytes per reading".into(),
            f(journal_bytes / offered as f64),
        ]);
        s.row(vec![
            "readings per journal fsync".into(),
            f(offered as f64 / fsyncs.max(1.0)),
        ]);
    }
    s.row(vec![
        if mqtt {
            "broker PUBACK: n/a here (see throughput)".into()
        } else {
            "acknowledgement latency p50 / p99 / max (ms)".into()
        },
        if mqtt {
            "-".into()
        } else {
            format!("{} / {} / {}", f(p50), f(p99), f(max))
        },
    ]);
    s.row(vec!["errors".into(), errors.to_string()]);
    if let Some(rss) = peak_rss {
        s.row(vec!["service peak RSS (MiB)".into(), f(rss)]);
    }
    // Live 1 Hz series give each flush about one new value per bucket:
    // batcher.flush_interval sets how many readings a bucket update carries.
    s.row(vec![
        "bucket updates (writes) per reading".into(),
        f(updates / offered as f64),
    ]);
    s.row(vec![
        "rollup documents written per reading".into(),
        f(written("rollup_upkeep") / offered as f64),
    ]);
    s.row(vec![
        "registry documents written per reading".into(),
        f(written("registry_update") / offered as f64),
    ]);
    let one_in = |w: f64| {
        format!(
            "{} (1 in {})",
            f(w / offered as f64),
            f(offered as f64 / w.max(1.0))
        )
    };
    s.row(vec![
        "data document writes per reading: buckets, rollups, registry (1 in …)".into(),
        one_in(data_written),
    ]);
    let others: Vec<String> = kinds
        .iter()
        .filter(|&(k, &w)| {
            w > 0.0
                && !matches!(
                    k.as_str(),
                    "bucket_update" | "rollup_upkeep" | "registry_update" | "dead_letter"
                )
        })
        .map(|(k, w)| format!("{k} {}", f(w / offered as f64)))
        .collect();
    s.row(vec![
        "other document writes per reading".into(),
        if others.is_empty() {
            "0".into()
        } else {
            others.join(", ")
        },
    ]);
    s.row(vec![
        "all document writes per reading (1 in …)".into(),
        one_in(all_written),
    ]);
    if let Some((readings, data, all)) = steady {
        let one_in = |w: f64| format!("1 in {}", f(readings / w.max(1.0)));
        s.row(vec![
            "steady state, the last whole clock hour: data / all document writes per reading"
                .into(),
            format!("{} / {}", one_in(data), one_in(all)),
        ]);
    }
    s.row(vec![
        "documents the rollup upkeep read per reading".into(),
        f(upkeep_read / offered as f64),
    ]);
    // Upkeep follows the work: per bucket update, not per series of the fleet.
    s.row(vec![
        "rollup upkeep per bucket update: documents written / read".into(),
        format!(
            "{} / {}",
            f(written("rollup_upkeep") / updates.max(1.0)),
            f(upkeep_read / updates.max(1.0))
        ),
    ]);
    if let Some(c) = cpu {
        s.row(vec![
            "service CPU per reading, until all stored (µs)".into(),
            f(c / offered as f64 * 1e6),
        ]);
    }
    if let Some(c) = fig.cpu_offering {
        s.row(vec![
            "service CPU per reading while offered (µs)".into(),
            f(c / offered as f64 * 1e6),
        ]);
    }
    // Pending readings by thirds of the run: flat when storage keeps up.
    s.row(vec![
        "pending readings, mean of each third of the run".into(),
        format!("{} / {} / {}", f(third(0)), f(third(1)), f(third(2))),
    ]);
    if preload_days > 0 {
        s.row(vec![
            "history preloaded (days of minute buckets per series; seconds)".into(),
            format!("{preload_days}; {}", f(preloaded_s)),
        ]);
    }
    s
}
