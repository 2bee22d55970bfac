//! Processes under test: spawning them on free ports, and what /proc says
//! about their CPU, memory and disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// User plus system CPU seconds of a process (Linux clock ticks are 1/100 s).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Peak resident memory (VmHWM) in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

pub fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A child that is stopped with SIGTERM (and reaped) when dropped.
pub struct Proc {
    pub child: Child,
    pub pid: u32,
    pub url: String,
    pub dir: Option<tempfile::TempDir>,
}

impl Proc {
    pub fn cpu(&self) -> f64 {
        cpu_seconds(self.pid)
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        self.child
            .wait()
            .unwrap_or_else(|_| std::process::ExitStatus::default())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}

pub async fn wait_http(url: &str, limit: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("{url} did not answer within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How to start Hourglass.
#[derive(Clone, Debug)]
pub struct HourglassSpec {
    pub bin: PathBuf,
    pub mongodb_uri: String,
    pub database: String,
    pub granularity: &'static str,
    pub mqtt_url: Option<String>,
    pub extra: Vec<(String, String)>,
}

pub async fn spawn_hourglass(spec: &HourglassSpec) -> anyhow::Result<Proc> {
    let port = free_port()?;
    let dir = tempfile::tempdir()?;
    let log = std::fs::File::create(dir.path().join("hourglass.log"))?;
    let mut cmd = Command::new(&spec.bin);
    cmd.env("HOURGLASS__MONGODB__URI", &spec.mongodb_uri)
        .env("HOURGLASS__MONGODB__DATABASE", &spec.database)
        .env("HOURGLASS__HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("HOURGLASS__BUCKETS__GRANULARITY", spec.granularity)
        .env("HOURGLASS__LOG__FORMAT", "json")
        .env("HOURGLASS__LOG__LEVEL", "warn")
        .env(
            "HOURGLASS__MQTT__ENABLED",
            spec.mqtt_url.is_some().to_string(),
        )
        .env(
            "HOURGLASS__MQTT__URL",
            spec.mqtt_url.clone().unwrap_or_default(),
        )
        .env(
            "HOURGLASS__MQTT__CLIENT_ID",
            format!("loadtest-{}", spec.database),
        )
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Built-in defaults, no config file: the environment says everything.
    cmd.args(["--config", "/dev/null"]);
    for (k, v) in &spec.extra {
        cmd.env(k, v);
    }
    let child = cmd.spawn().with_context(|| {
        format!(
            "starting {} (build it first: cargo build --release)",
            spec.bin.display()
        )
    })?;
    let pid = child.id();
    let proc = Proc {
        child,
        pid,
        url: format!("http://127.0.0.1:{port}"),
        dir: Some(dir),
    };
    let ready = if spec.mqtt_url.is_some() {
        "/health/ready"
    } else {
        "/health/live"
    };
    if let Err(e) = wait_http(&format!("{}{ready}", proc.url), Duration::from_secs(60)).await {
        let log = std::fs::read_to_string(
            proc.dir
                .as_ref()
                .map(|d| d.path().join("hourglass.log"))
                .unwrap_or_default(),
        )
        .unwrap_or_default();
        bail!("{e}; its log:\n{log}");
    }
    Ok(proc)
}

/// Hourglass' metrics, summed over labels: family name → value.
pub async fn scrape(url: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let mut out: HashMap<String, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((series, value)) = line.rsplit_once(' ') {
            let name = series.split('{').next().unwrap_or(series).to_owned();
            *out.entry(name).or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    Ok(out)
}
