//! `transfer`: `hourglass import` of files against the HTTP path on the same
//! data, each into a fresh journaled instance, and `hourglass export` of
//! what was imported: readings/s of each, measured in one run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use crate::ctx::{Ctx, Target};
use crate::dataset::{Dataset, rfc3339};
use crate::procs::{pause, server_pid, wait_idle};
use crate::report::{Report, Section, f};
use crate::waits::wait_stored;

/// The dataset as an import file: NDJSON (as the export writes it), CSV
/// (epoch ms) or line protocol (`<metric>,sensor=<sensor> value=<v> <ns>`).
fn write_file(data: &Dataset, path: &Path, format: &str) -> anyhow::Result<u64> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut line = String::new();
    if format == "csv" {
        writeln!(out, "sensor,metric,ts,value")?;
    }
    for (i, j, ts, v) in data.rows() {
        line.clear();
        let sensor = Dataset::sensor(i);
        let metric = Dataset::metric(j);
        let ms = ts * 1000;
        let _ = match format {
            "csv" => write!(line, "{sensor},{metric},{ms},{v}"),
            "lp" => write!(line, "{metric},sensor={sensor} value={v} {ts}000000000"),
            _ => write!(
                line,
                r#"{{"sensor":"{sensor}","metric":"{metric}","ts":{ms},"value":{v}}}"#
            ),
        };
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(std::fs::metadata(path)?.len())
}

/// CPU seconds of the children reaped so far.
fn children_cpu() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// Runs the `hourglass` binary's `args` against `target`: its wall time and
/// its CPU time.
async fn cli(ctx: &Ctx, target: &Target, args: &[&str]) -> anyhow::Result<(f64, f64)> {
    let cpu0 = children_cpu();
    let started = Instant::now();
    // Built-in defaults, as the instances under test run.
    let out = tokio::process::Command::new(ctx.hourglass_bin())
        .args(["--config", "/dev/null"])
        .args(args)
        .env("HOURGLASS_URL", &target.url)
        .env("HOURGLASS__MQTT__ENABLED", "false")
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "hourglass {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((started.elapsed().as_secs_f64(), children_cpu() - cpu0))
}

/// Interleaved rounds of every import path against the HTTP path, each on
/// a fresh instance. An acknowledgement takes a fifth of a second at this
/// size, half a second with the stand-in storing beside it (Python, on the
/// same two cores), which moved single runs by up to a half. So every round but the last measures
/// the acknowledgements alone: the run's series are registered first, the
/// local database server is paused (SIGSTOP) while the readings are sent,
/// the instance is killed once they are acknowledged, and the server is
/// resumed and left to finish what it was sent before the next run. The
/// journal acknowledges without the database, so that is the path's own
/// speed. The last round runs as users do, the server storing meanwhile,
/// until every reading is stored and verified.
pub const ROUNDS: usize = 5;

/// How long a database server may take to finish a killed run's commands.
const SETTLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// A run measured until acknowledged, with the local database server
/// paused meanwhile (see [`ROUNDS`]); resumed when dropped, whatever
/// happened.
struct Paused(u32);

impl Paused {
    /// Registers the run's series (one reading each, the dataset's first),
    /// waits for the server to be idle, and pauses it.
    async fn start(server: u32, target: &Target, data: &Dataset) -> anyhow::Result<Self> {
        let first: Vec<_> = data.tick(0).collect();
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/readings", target.url))
            .header("content-type", "application/json")
            .body(Dataset::json(&first))
            .send()
            .await?;
        anyhow::ensure!(
            r.status().is_success(),
            "registering the series: {}",
            r.status()
        );
        wait_stored(&target.url, first.len() as u64).await?;
        wait_idle(server, SETTLE_WITHIN).await?;
        pause(server, true)?;
        Ok(Self(server))
    }

    /// Kills the run's instance, resumes the server and waits until it has
    /// finished what the instance sent it.
    async fn end(self, target: Target) -> anyhow::Result<()> {
        target.kill();
        let server = self.0;
        drop(self);
        wait_idle(server, SETTLE_WITHIN).await
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = pause(self.0, false);
    }
}

/// One way of loading the dataset.
#[derive(Clone, Copy)]
struct Load {
    /// `ndjson`, `csv` or `lp`.
    format: &'static str,
    /// `(batch, in flight)`; `None`: the import's defaults.
    settings: Option<(&'static str, &'static str)>,
}

#[derive(Default)]
struct Run {
    what: String,
    /// Per round but the last: until the last reading was acknowledged.
    seconds: Vec<f64>,
    /// Per round but the last: the service's CPU seconds meanwhile.
    cpu: Vec<f64>,
    /// Per round: the client's CPU seconds (the import command).
    client_cpu: Vec<f64>,
    /// The last round: until acknowledged, the server storing meanwhile,
    /// and the service's CPU seconds meanwhile.
    storing: Option<f64>,
    storing_cpu: Option<f64>,
    /// The last round: until the last reading was stored.
    stored: Option<f64>,
    /// An export: whether it wrote every reading.
    exact: bool,
}

impl Run {
    fn record(&mut self, last: bool, seconds: f64, cpu: Option<f64>, client: Option<f64>) {
        if last {
            self.storing = Some(seconds);
            self.storing_cpu = cpu;
        } else {
            self.seconds.push(seconds);
            self.cpu.extend(cpu);
        }
        self.client_cpu.extend(client);
    }
}

/// Before a run of a round but the last: the server paused, if it runs here.
async fn quiet(
    server: Option<u32>,
    last: bool,
    target: &Target,
    data: &Dataset,
) -> anyhow::Result<Option<Paused>> {
    match server {
        Some(pid) if !last => Ok(Some(Paused::start(pid, target, data).await?)),
        _ => Ok(None),
    }
}

/// After such a run: its instance killed, the server left to finish.
async fn settle(paused: Option<Paused>, target: Target) -> anyhow::Result<()> {
    match paused {
        Some(p) => p.end(target).await,
        None => {
            // A remote server: storing went on meanwhile; give it time.
            target.kill();
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            Ok(())
        }
    }
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub async fn run(ctx: &Ctx, data: &Dataset, rounds: usize) -> anyhow::Result<(Report, bool)> {
    // Long: the rounds, each of the HTTP path and every import format, paused or stored and verified.
    let rounds = rounds.max(1);
    let n = data.len();
    let dir = tempfile::tempdir()?;
    let mut ok = true;
    let mut report = Report::new("Hourglass import and export");
    // Each format with the import's defaults (10 000 a request, 8 in flight).
    let paths = [
        Load {
            format: "ndjson",
            settings: None,
        },
        Load {
            format: "csv",
            settings: None,
        },
        Load {
            format: "lp",
            settings: None,
        },
    ];
    let mut files = Vec::new();
    let mut runs = vec![Run {
        what: "HTTP path (POST /api/v1/readings, 5 000 a request, 4 in flight; bodies built beforehand)".into(),
        ..Run::default()
    }];
    for p in &paths {
        let file = dir.path().join(format!(
            "data-{}.{}",
            p.settings.map_or("default", |s| s.1),
            p.format
        ));
        let bytes = write_file(data, &file, p.format)?;
        files.push(file.to_string_lossy().into_owned());
        runs.push(Run {
            what: format!(
                "hourglass import, {} ({:.1} MB, {} a request, {} in flight)",
                p.format,
                bytes as f64 / 1e6,
                p.settings.map_or("10 000", |s| s.0),
                p.settings.map_or("8", |s| s.1)
            ),
            ..Run::default()
        });
    }
    let mut imported = None;
    // The stand-in server, when it runs on this machine (see [`ROUNDS`]):
    // another server (a MongoDB others may use) is never paused.
    let server = server_pid(&ctx.mongodb_uri()?).filter(|&pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("secantusd"))
    });
    for round in 0..rounds {
        // The last round stores, and its stores are verified.
        let last = round + 1 == rounds;
        // The HTTP path: the backfill's client, 5 000 readings a request, 4 at a time.
        let http = ctx
            .target(&format!("transfer_http_{round}"), "minute", false, true)
            .await?;
        let paused = quiet(server, last, &http, data).await?;
        let cpu0 = http.cpu();
        let started = Instant::now();
        let o = crate::send::send_all(ctx, &http, data, 5000, 4).await?;
        let cpu = cpu0.zip(http.cpu()).map(|(a, b)| b - a);
        runs[0].record(last, o.seconds, cpu, None);
        if last {
            wait_stored(&http.url, n).await?;
            runs[0].stored = Some(started.elapsed().as_secs_f64());
            drop(http);
        } else {
            settle(paused, http).await?;
        }
        for (i, p) in paths.iter().enumerate() {
            // The instance before goes first: its upkeep must not load this run.
            drop(imported.take());
            let target = ctx
                .target(
                    &format!(
                        "transfer_{}_{}_{round}",
                        p.format,
                        p.settings.map_or("default", |s| s.1)
                    ),
                    "minute",
                    false,
                    true,
                )
                .await?;
            let paused = quiet(server, last, &target, data).await?;
            let cpu0 = target.cpu();
            let started = Instant::now();
            // Every round imports the file from its start.
            let mut args = vec!["import", "--quiet", "--restart", files[i].as_str()];
            if let Some((batch, in_flight)) = p.settings {
                args.extend(["--batch", batch, "--in-flight", in_flight]);
            }
            let (seconds, client) = cli(ctx, &target, &args).await?;
            let cpu = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
            runs[i + 1].record(last, seconds, cpu, Some(client));
            if !last {
                settle(paused, target).await?;
                continue;
            }
            wait_stored(&target.url, n).await?;
            runs[i + 1].stored = Some(started.elapsed().as_secs_f64());
            let (verdict, good) = crate::verify::run(ctx, data, "minute", &target.database).await?;
            if !good {
                report.merge(verdict);
            }
            ok &= good;
            imported = Some(target);
        }
    }
    let export = match &imported {
        Some(target) => {
            let run = export_all(ctx, target, data, dir.path(), &mut report).await?;
            ok &= run.exact;
            Some(run)
        }
        None => None,
    };
    let (s, figures) = table(&runs, export.as_ref(), server.is_some(), rounds, n);
    report.sections.push(s);
    report.set("transfer", figures);
    Ok((report, ok))
}

/// Exports every reading imported to NDJSON and counts its lines.
async fn export_all(
    ctx: &Ctx,
    target: &crate::ctx::Target,
    data: &Dataset,
    dir: &std::path::Path,
    report: &mut Report,
) -> anyhow::Result<Run> {
    let n = data.len();
    let out = dir.join("export.ndjson");
    let path = out.to_string_lossy().into_owned();
    let (from, to) = (rfc3339(data.start), rfc3339(data.end()));
    let cpu0 = target.cpu();
    let rss_before = target.peak_rss_mib();
    let (seconds, client) = cli(
        ctx,
        target,
        &["export", "--from", &from, "--to", &to, "-o", &path],
    )
    .await?;
    let cpu = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
    // Peak RSS is a high-water mark: the export's own peak shows only
    // if it passes the import's.
    let rss_after = target.peak_rss_mib();
    report.set(
        "export_peak_rss_mib",
        serde_json::json!({ "before": rss_before, "after": rss_after }),
    );
    let lines = std::fs::read_to_string(&out)?.lines().count() as u64;
    Ok(Run {
        what: format!(
            "hourglass export, ndjson ({lines} lines of {n}; service peak RSS {} → {} MiB)",
            rss_before.map_or_else(|| "-".into(), f),
            rss_after.map_or_else(|| "-".into(), f)
        ),
        seconds: vec![seconds],
        cpu: cpu.into_iter().collect(),
        client_cpu: vec![client],
        exact: lines == n,
        ..Run::default()
    })
}

/// The report's table: each path's acknowledgement and storing times
/// against the HTTP path's, and its CPU per reading.
fn table(
    runs: &[Run],
    export: Option<&Run>,
    paused_server: bool,
    rounds: usize,
    n: u64,
) -> (Section, Vec<serde_json::Value>) {
    // Long: one row per path, each with its rounds' ratios to the HTTP path.
    // Rounds paused for the acknowledgements, or the last one alone.
    let acked = |r: &Run| -> (Vec<f64>, Vec<f64>) {
        if r.seconds.is_empty() {
            (
                r.storing.into_iter().collect(),
                r.storing_cpu.into_iter().collect(),
            )
        } else {
            (r.seconds.clone(), r.cpu.clone())
        }
    };
    let (base_rounds, _) = acked(&runs[0]);
    let base = median(&base_rounds).unwrap_or(f64::NAN);
    let base_storing = runs[0].storing.unwrap_or(f64::NAN);
    let base_stored = runs[0].stored.unwrap_or(f64::NAN);
    let paused = if paused_server {
        "the stand-in paused"
    } else {
        "the database server storing meanwhile (not a local stand-in: not paused)"
    };
    let mut s = Section::new(
        &format!(
            "Import and export: {n} readings, one minute-bucket instance each (journal on). \
             Acknowledged: medians of the {} rounds before the last, {paused}; \
             the last round as users run it, storing meanwhile, until stored",
            rounds - 1
        ),
        &[
            "path",
            "s to acknowledge",
            "readings/s acknowledged",
            "× HTTP (median of rounds)",
            "rounds' × HTTP",
            "last round: s to acknowledge",
            "× HTTP",
            "s to store",
            "readings/s stored",
            "× HTTP",
            "service CPU/reading (µs)",
            "client CPU/reading (µs)",
        ],
    );
    let mut figures = Vec::new();
    let per = |c: &[f64]| median(c).map_or_else(|| "-".into(), |c| f(c / n as f64 * 1e6));
    let opt = |x: Option<f64>| x.map_or_else(|| "-".into(), f);
    for r in runs.iter().chain(export) {
        let (rounds, cpu) = acked(r);
        let seconds = median(&rounds).unwrap_or(f64::NAN);
        let rate = n as f64 / seconds;
        // Each round's ratio to the HTTP path of the same round.
        let ratios: Vec<f64> = if rounds.len() == base_rounds.len() {
            rounds
                .iter()
                .zip(&base_rounds)
                .map(|(s, h)| h / s)
                .collect()
        } else {
            vec![base / seconds]
        };
        let ratio = median(&ratios).unwrap_or(f64::NAN);
        let storing_ratio = r.storing.map(|t| base_storing / t);
        let stored_ratio = r.stored.map(|t| base_stored / t);
        s.row(vec![
            r.what.clone(),
            f(seconds),
            f(rate),
            f(ratio),
            ratios.iter().map(|r| f(*r)).collect::<Vec<_>>().join(", "),
            opt(r.storing),
            opt(storing_ratio),
            opt(r.stored),
            opt(r.stored.map(|t| n as f64 / t)),
            opt(stored_ratio),
            per(&cpu),
            per(&r.client_cpu),
        ]);
        figures.push(serde_json::json!({
            "path": r.what, "seconds": seconds, "readings_per_s": rate,
            "ratio_to_http": ratio, "round_ratios": ratios,
            "storing_seconds": r.storing, "storing_ratio_to_http": storing_ratio,
            "stored_seconds": r.stored, "stored_ratio_to_http": stored_ratio,
            "service_cpu_us_per_reading": median(&cpu).map(|c| c / n as f64 * 1e6),
            "client_cpu_us_per_reading": median(&r.client_cpu).map(|c| c / n as f64 * 1e6),
        }));
    }
    (s, figures)
}
