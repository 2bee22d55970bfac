//! The peers' servers: VictoriaMetrics and InfluxDB 1.x started on free
//! ports with throw-away data directories, and data sent to them as line
//! protocol or rows.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::ctx::Ctx;
use crate::dataset::{Dataset, Row};
use crate::procs::{Proc, http_url};

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
    start_influx_with("").await
}

/// [`start_influx`] with further lines of its `[data]` section.
pub(crate) async fn start_influx_with(data: &str) -> anyhow::Result<Proc> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    let config = format!(
        "reporting-disabled = true\nbind-address = \"127.0.0.1:0\"\n[meta]\ndir = \"{d}/meta\"\n[data]\ndir = \"{d}/data\"\nwal-dir = \"{d}/wal\"\nquery-log-enabled = false\n{data}[http]\nbind-address = \"127.0.0.1:0\"\nlog-enabled = false\n[monitor]\nstore-enabled = false\n"
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
