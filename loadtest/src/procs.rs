//! Processes under test: spawning them on port 0 (the bound port read back
//! from /proc, never bind-then-close), and what /proc says about their CPU,
//! memory and disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use procfs::process::{FDTarget, Process};

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// CPU seconds of a process, every thread's, ended ones included, to the
/// nanosecond: its POSIX CPU-time clock (the scheduler's run time). /proc's
/// user and system times come in ticks of 10 ms, about a tenth of a peer's
/// whole load, which made ratios between short loads jump by that much.
/// Ticks remain the fallback where the clock cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    use nix::time::{clock_getcpuclockid, clock_gettime};
    let precise = i32::try_from(pid)
        .ok()
        .and_then(|p| clock_getcpuclockid(Pid::from_raw(p)).ok())
        .and_then(|clock| clock_gettime(clock).ok());
    if let Some(t) = precise {
        return t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9;
    }
    process(pid).and_then(|p| p.stat().ok()).map_or(0.0, |s| {
        (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64
    })
}

/// CPU seconds of a process's live threads, to the nanosecond (the
/// scheduler's run time): for short windows, where ticks are too coarse.
/// Threads that ended within the window are not counted.
pub fn cpu_seconds_fine(pid: u32) -> f64 {
    process(pid)
        .and_then(|p| p.tasks().ok())
        .map_or(0.0, |tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.schedstat().ok())
                .map(|s| s.sum_exec_runtime as f64 / 1e9)
                .sum()
        })
}

/// Peak resident memory (VmHWM) in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    process(pid)
        .and_then(|p| p.status().ok())
        .and_then(|s| s.vmhwm)
        .map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// The TCP ports `pid` listens on, from its socket inodes and /proc/net/tcp.
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let Some(proc) = process(pid) else {
        return Vec::new();
    };
    let inodes: std::collections::HashSet<u64> = proc
        .fd()
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| match fd.target {
                    FDTarget::Socket(inode) => Some(inode),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let tables = [procfs::net::tcp(), procfs::net::tcp6()];
    let mut ports: Vec<u16> = tables
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.state == procfs::net::TcpState::Listen && inodes.contains(&e.inode))
        .map(|e| e.local_address.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The base URL of the HTTP server `pid` started on port 0: the listening
/// port that answers `probe` with success.
pub async fn http_url(pid: u32, probe: &str, limit: Duration) -> anyhow::Result<String> {
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        for port in listening_ports(pid) {
            let url = format!("http://127.0.0.1:{port}");
            if let Ok(r) = client.get(format!("{url}{probe}")).send().await
                && r.status().is_success()
            {
                return Ok(url);
            }
        }
        if start.elapsed() > limit {
            bail!("process {pid} did not answer {probe} on any port within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// How long a process may take to stop after SIGTERM before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(120);

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

    /// Stops it at once (SIGKILL), whatever it holds: for runs measured
    /// only until acknowledged, whose journal nobody reads again.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        // Bounded: every process started here stops within seconds of
        // SIGTERM; one that hangs is killed (its status then says so)
        // rather than holding the run for ever.
        let deadline = Instant::now() + STOP_WITHIN;
        while let Ok(None) = self.child.try_wait() {
            if Instant::now() >= deadline {
                eprintln!(
                    "Process {} did not stop within {STOP_WITHIN:?} of SIGTERM; killing it.",
                    self.pid
                );
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// How to start Hourglass.
#[derive(Clone, Debug)]
pub struct HourglassSpec {
    pub bin: PathBuf,
    pub mongodb_uri: String,
    pub database: String,
    pub granularity: &'static str,
    pub mqtt_url: Option<String>,
    pub extra: Vec<(String, String)>,
    /// A configuration file's text (built-in defaults when `None`).
    pub config: Option<String>,
}

pub async fn spawn_hourglass(spec: &HourglassSpec) -> anyhow::Result<Proc> {
    let dir = tempfile::tempdir()?;
    let log = std::fs::File::create(dir.path().join("hourglass.log"))?;
    let mut cmd = Command::new(&spec.bin);
    cmd.env("HOURGLASS__MONGODB__URI", &spec.mongodb_uri)
        .env("HOURGLASS__MONGODB__DATABASE", &spec.database)
        .env("HOURGLASS__HTTP__LISTEN", "127.0.0.1:0")
        .env("HOURGLASS__BUCKETS__GRANULARITY", spec.granularity)
        .env("HOURGLASS__LOG__FORMAT", "json")
        .env("HOURGLASS__LOG__LEVEL", "warn")
        .env("HOURGLASS__JOURNAL__DIR", dir.path().join("journal"))
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
    // Built-in defaults, and the environment says the rest.
    match &spec.config {
        Some(text) => {
            let file = dir.path().join("hourglass.toml");
            std::fs::write(&file, text)?;
            cmd.arg("--config").arg(file);
        }
        None => {
            cmd.args(["--config", "/dev/null"]);
        }
    }
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
    let mut proc = Proc {
        child,
        pid,
        url: String::new(),
        dir: Some(dir),
    };
    let ready = if spec.mqtt_url.is_some() {
        "/health/ready"
    } else {
        "/health/live"
    };
    // Starting is a few dozen round trips to the storage server; a stand-in
    // busy with another client's minute-long commands (CI runs several
    // suites on each) answered them in over 60 s once.
    match http_url(pid, ready, Duration::from_secs(180)).await {
        Ok(url) => proc.url = url,
        Err(e) => {
            let log = std::fs::read_to_string(
                proc.dir
                    .as_ref()
                    .map(|d| d.path().join("hourglass.log"))
                    .unwrap_or_default(),
            )
            .unwrap_or_default();
            bail!("{e}; its log:\n{log}");
        }
    }
    Ok(proc)
}

/// Hourglass' metrics, summed over labels: family name → value (histograms
/// count their observations).
pub async fn scrape(url: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
    let mut out: HashMap<String, f64> = HashMap::new();
    for sample in scrape.samples {
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => continue,
        };
        *out.entry(sample.metric).or_default() += value;
    }
    Ok(out)
}

/// The samples of metric `name`, by the value of their label `label`.
pub async fn scrape_by(url: &str, name: &str, label: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?;
    let mut out: HashMap<String, f64> = HashMap::new();
    for sample in scrape.samples.into_iter().filter(|s| s.metric == name) {
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        let key = sample.labels.get(label).unwrap_or_default().to_owned();
        *out.entry(key).or_default() += value;
    }
    Ok(out)
}

/// `url` `n` times in a row: latencies (ms) and the last JSON answer.
pub async fn timed(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, serde_json::Value)> {
    let mut ms = Vec::with_capacity(n);
    let mut last = serde_json::Value::Null;
    for _ in 0..n {
        let t = std::time::Instant::now();
        let r = client.get(url).send().await?;
        anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
        last = r.json().await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((ms, last))
}

/// The local process listening on the port of `uri` (a MongoDB URI with one
/// host), if this machine runs it and lets us see it.
pub fn server_pid(uri: &str) -> Option<u32> {
    let rest = uri.split_once("://")?.1;
    let host = rest.split(['/', '?', ',']).next()?;
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let port: u16 = host.rsplit_once(':')?.1.parse().ok()?;
    let inodes: std::collections::HashSet<u64> = [procfs::net::tcp(), procfs::net::tcp6()]
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.state == procfs::net::TcpState::Listen && e.local_address.port() == port)
        .map(|e| e.inode)
        .collect();
    procfs::process::all_processes()
        .ok()?
        .flatten()
        .find_map(|p| {
            let mine = p.fd().ok()?.flatten().any(|fd| match fd.target {
                FDTarget::Socket(inode) => inodes.contains(&inode),
                _ => false,
            });
            mine.then(|| u32::try_from(p.pid).ok()).flatten()
        })
}

/// Waits until `pid` has been idle (under 5% of a core) for half a second:
/// a server finishing what a killed client sent it.
pub async fn wait_idle(pid: u32, limit: Duration) -> anyhow::Result<()> {
    const SAMPLE: Duration = Duration::from_millis(500);
    let started = Instant::now();
    loop {
        let before = cpu_seconds_fine(pid);
        tokio::time::sleep(SAMPLE).await;
        if cpu_seconds_fine(pid) - before < 0.05 * SAMPLE.as_secs_f64() {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("process {pid} was still busy after {limit:?}");
        }
    }
}

/// How a server's deferred work is waited for (see `cpu_until_settled`).
const SETTLE_TICK: Duration = Duration::from_millis(250);
/// Quiet ticks in a row that end the wait: one second.
const SETTLE_QUIET_TICKS: usize = 4;
/// CPU a quiet second may use above the idle rate: the Go runtime's timers
/// and a GC cycle, far below the tenth of a second a peer defers.
const SETTLE_SLACK_S: f64 = 0.003;

/// Where a server's deferred work ended, from its CPU used in each tick
/// since the load's last answer: the first tick that starts `quiet` ticks
/// in a row using together at most `allowed` CPU seconds. `None` while the
/// samples do not yet show such a run.
pub fn settled_at(ticks: &[f64], quiet: usize, allowed: f64) -> Option<usize> {
    (0..=ticks.len().checked_sub(quiet)?)
        .find(|&i| ticks[i..i + quiet].iter().sum::<f64>() <= allowed)
}

/// Waits until a server has done the work a load left it (VictoriaMetrics
/// turns the rows it acknowledged into parts a second or so later, and that
/// is as much CPU again as the writes): until it spends a second at its
/// `idle_rate`. Returns its CPU-time clock where the quiet second began and
/// the seconds waited until then, or an error after `limit`.
pub async fn cpu_until_settled(
    pid: u32,
    idle_rate: f64,
    limit: Duration,
) -> anyhow::Result<(f64, f64)> {
    let allowed =
        idle_rate * SETTLE_TICK.as_secs_f64() * SETTLE_QUIET_TICKS as f64 + SETTLE_SLACK_S;
    let started = Instant::now();
    let mut clock = vec![cpu_seconds(pid)];
    loop {
        tokio::time::sleep(SETTLE_TICK).await;
        clock.push(cpu_seconds(pid));
        let ticks: Vec<f64> = clock.windows(2).map(|w| w[1] - w[0]).collect();
        if let Some(i) = settled_at(&ticks, SETTLE_QUIET_TICKS, allowed) {
            return Ok((clock[i], i as f64 * SETTLE_TICK.as_secs_f64()));
        }
        if started.elapsed() > limit {
            bail!("process {pid} was still busy {limit:?} after its load");
        }
    }
}

/// Stops (SIGSTOP) or resumes (SIGCONT) a process.
pub fn pause(pid: u32, paused: bool) -> anyhow::Result<()> {
    let signal = if paused {
        Signal::SIGSTOP
    } else {
        Signal::SIGCONT
    };
    kill(Pid::from_raw(i32::try_from(pid)?), signal)
        .with_context(|| format!("sending {signal} to {pid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_settles_where_its_first_quiet_second_begins() {
        let busy = [0.05, 0.04, 0.02];
        let quiet = [0.0005, 0.0007, 0.0004, 0.0006];
        let ticks: Vec<f64> = busy.iter().chain(&quiet).copied().collect();
        assert_eq!(settled_at(&ticks, 4, 0.003), Some(3));
        // Not yet: the quiet run is one tick short.
        assert_eq!(settled_at(&ticks[..6], 4, 0.003), None);
        // Work after the first quiet second is not the load's: the wait
        // ended there.
        let late: Vec<f64> = ticks.iter().chain(&[0.03]).chain(&quiet).copied().collect();
        assert_eq!(settled_at(&late, 4, 0.003), Some(3));
        // A burst inside a would-be quiet second (a merge) moves the end
        // past it.
        let burst: Vec<f64> = busy
            .iter()
            .chain(&[0.0005, 0.03, 0.0005])
            .chain(&quiet)
            .copied()
            .collect();
        // The quiet second begins with the tick after the burst.
        assert_eq!(settled_at(&burst, 4, 0.003), Some(5));
        // A server that was idle all along settled at once.
        assert_eq!(settled_at(&quiet, 4, 0.003), Some(0));
        assert_eq!(settled_at(&[], 4, 0.003), None);
    }

    #[test]
    fn the_precise_cpu_clock_agrees_with_the_kernel_s_ticks() {
        let pid = std::process::id();
        let ticks = |pid: u32| {
            process(pid).and_then(|p| p.stat().ok()).map_or(0.0, |s| {
                (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64
            })
        };
        let start = cpu_seconds(pid);
        // Burn a few ticks' worth of CPU on this thread.
        let mut x = 0u64;
        while cpu_seconds(pid) - start < 0.05 {
            for i in 0..10_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
        }
        std::hint::black_box(x);
        let (precise, coarse) = (cpu_seconds(pid), ticks(pid));
        assert!(precise >= start + 0.05);
        // Finer than a tick: a whole number of 10 ms is one chance in 10^7.
        let ns = (precise * 1e9).round() as u64;
        assert_ne!(ns % 10_000_000, 0, "{precise} s is a whole number of ticks");
        // Ticks are truncated per user and system time: two ticks apart at most,
        // plus what other test threads ran between the two reads.
        assert!(
            (precise - coarse).abs() < 0.05,
            "precise {precise} s, ticks {coarse} s"
        );
    }
}
