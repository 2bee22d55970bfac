//! `transfer`: `hourglass import` of files against the HTTP path on the same
//! data, each into a fresh journaled instance, and `hourglass export` of
//! what was imported: readings/s of each, measured in one run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use crate::ctx::{Ctx, Target};
use crate::dataset::{Dataset, rfc3339};
use crate::peers::wait_stored;
use crate::report::{Report, Section, f};

/// The dataset as an import file: NDJSON (as the export writes it) or CSV.
fn write_file(data: &Dataset, path: &Path, csv: bool) -> anyhow::Result<u64> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut line = String::new();
    if csv {
        writeln!(out, "sensor,metric,ts,value")?;
    }
    for (i, j, ts, v) in data.rows() {
        line.clear();
        let sensor = Dataset::sensor(i);
        let metric = Dataset::metric(j);
        let ms = ts * 1000;
        if csv {
            let _ = write!(line, "{sensor},{metric},{ms},{v}");
        } else {
            let _ = write!(
                line,
                r#"{{"sensor":"{sensor}","metric":"{metric}","ts":{ms},"value":{v}}}"#
            );
        }
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
/// a fresh instance: an acknowledgement takes about half a second at this
/// size, and the stand-in server storing beside it (on the same two cores)
/// moves a single run by a third. Only the last round waits until its
/// readings are stored (and verifies them); the others kill their instance
/// once acknowledged and let the stand-in finish what it was sent
/// ([`SETTLE`]), so no run pays for the one before.
pub const ROUNDS: usize = 5;

/// How long the stand-in gets to finish a killed instance's commands.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// One way of loading the dataset.
#[derive(Clone, Copy)]
struct Load {
    /// `ndjson` or `csv`.
    format: &'static str,
    /// `(batch, in flight)`; `None`: the import's defaults.
    settings: Option<(&'static str, &'static str)>,
}

#[derive(Default)]
struct Run {
    what: String,
    /// Per round: until the last reading was acknowledged.
    seconds: Vec<f64>,
    /// Per round: the service's CPU seconds while acknowledging.
    cpu: Vec<f64>,
    /// Per round: the client's CPU seconds (the import command).
    client_cpu: Vec<f64>,
    /// The last round: until the last reading was stored.
    stored: Vec<f64>,
}

/// Kills a run's instance once it has acknowledged, and waits for the
/// stand-in to finish the commands it was sent.
async fn settle(target: Target) {
    target.kill();
    tokio::time::sleep(SETTLE).await;
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub async fn run(ctx: &Ctx, data: &Dataset, rounds: usize) -> anyhow::Result<(Report, bool)> {
    let rounds = rounds.max(1);
    let n = data.len();
    let dir = tempfile::tempdir()?;
    let mut ok = true;
    let mut report = Report::new("Hourglass import and export");
    // The import's defaults (10 000 a request, 8 in flight), and CSV again
    // with the HTTP path's settings.
    let paths = [
        Load {
            format: "ndjson",
            settings: None,
        },
        Load {
            format: "csv",
            settings: Some(("5000", "4")),
        },
        Load {
            format: "csv",
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
        let bytes = write_file(data, &file, p.format == "csv")?;
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
    for round in 0..rounds {
        // The last round's stores are verified.
        let last = round + 1 == rounds;
        // The HTTP path: the backfill's client, 5 000 readings a request, 4 at a time.
        let http = ctx
            .target(&format!("transfer_http_{round}"), "minute", false, true)
            .await?;
        let cpu0 = http.cpu();
        let started = Instant::now();
        let o = crate::backfill::send_all(ctx, &http, data, 5000, 4).await?;
        if let Some(c) = cpu0.zip(http.cpu()).map(|(a, b)| b - a) {
            runs[0].cpu.push(c);
        }
        runs[0].seconds.push(o.seconds);
        if last {
            wait_stored(&http.url, n).await?;
            runs[0].stored.push(started.elapsed().as_secs_f64());
            drop(http);
        } else {
            settle(http).await;
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
            let cpu0 = target.cpu();
            let started = Instant::now();
            // Every round imports the file from its start.
            let mut args = vec!["import", "--quiet", "--restart", files[i].as_str()];
            if let Some((batch, in_flight)) = p.settings {
                args.extend(["--batch", batch, "--in-flight", in_flight]);
            }
            let (seconds, client) = cli(ctx, &target, &args).await?;
            let run = &mut runs[i + 1];
            if let Some(c) = cpu0.zip(target.cpu()).map(|(a, b)| b - a) {
                run.cpu.push(c);
            }
            run.seconds.push(seconds);
            run.client_cpu.push(client);
            if !last {
                settle(target).await;
                continue;
            }
            wait_stored(&target.url, n).await?;
            run.stored.push(started.elapsed().as_secs_f64());
            let (verdict, good) = crate::verify::run(ctx, data, "minute", &target.database).await?;
            if !good {
                report.merge(verdict);
            }
            ok &= good;
            imported = Some(target);
        }
    }
    let mut export = None;
    if let Some(target) = &imported {
        let out = dir.path().join("export.ndjson");
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
        ok &= lines == n;
        export = Some(Run {
            what: format!(
                "hourglass export, ndjson ({lines} lines of {n}; service peak RSS {} → {} MiB)",
                rss_before.map_or_else(|| "-".into(), f),
                rss_after.map_or_else(|| "-".into(), f)
            ),
            seconds: vec![seconds],
            cpu: cpu.into_iter().collect(),
            client_cpu: vec![client],
            stored: Vec::new(),
        });
    }

    let base = median(&runs[0].seconds).unwrap_or(f64::NAN);
    let base_stored = median(&runs[0].stored).unwrap_or(base);
    let mut s = Section::new(
        &format!(
            "Import and export: {n} readings, one minute-bucket instance each (journal on); \
             acknowledged: medians of {rounds} interleaved rounds; stored: the last round"
        ),
        &[
            "path",
            "s to acknowledge",
            "readings/s acknowledged",
            "× HTTP (median of rounds)",
            "rounds' × HTTP",
            "s to store",
            "readings/s stored",
            "× HTTP",
            "service CPU/reading (µs)",
            "client CPU/reading (µs)",
        ],
    );
    let mut figures = Vec::new();
    let per = |c: &[f64]| median(c).map_or_else(|| "-".into(), |c| f(c / n as f64 * 1e6));
    for r in runs.iter().chain(&export) {
        let seconds = median(&r.seconds).unwrap_or(f64::NAN);
        let stored = median(&r.stored);
        let rate = n as f64 / seconds;
        // Each round's ratio to the HTTP path of the same round.
        let ratios: Vec<f64> = if r.seconds.len() == runs[0].seconds.len() {
            r.seconds
                .iter()
                .zip(&runs[0].seconds)
                .map(|(s, h)| h / s)
                .collect()
        } else {
            vec![base / seconds]
        };
        let ratio = median(&ratios).unwrap_or(f64::NAN);
        s.row(vec![
            r.what.clone(),
            f(seconds),
            f(rate),
            f(ratio),
            ratios.iter().map(|r| f(*r)).collect::<Vec<_>>().join(", "),
            stored.map_or_else(|| "-".into(), f),
            stored.map_or_else(|| "-".into(), |t| f(n as f64 / t)),
            stored.map_or_else(|| "-".into(), |t| f(base_stored / t)),
            per(&r.cpu),
            per(&r.client_cpu),
        ]);
        figures.push(serde_json::json!({
            "path": r.what, "seconds": seconds, "readings_per_s": rate,
            "ratio_to_http": ratio, "round_ratios": ratios,
            "stored_seconds": stored,
            "stored_ratio_to_http": stored.map(|t| base_stored / t),
            "service_cpu_us_per_reading": median(&r.cpu).map(|c| c / n as f64 * 1e6),
            "client_cpu_us_per_reading": median(&r.client_cpu).map(|c| c / n as f64 * 1e6),
        }));
    }
    report.sections.push(s);
    report.set("transfer", figures);
    Ok((report, ok))
}
