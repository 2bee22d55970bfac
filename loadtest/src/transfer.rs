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

struct Run {
    what: String,
    /// Until the last reading was acknowledged.
    seconds: f64,
    /// Until the last reading was stored.
    stored: Option<f64>,
    /// The service's CPU seconds.
    cpu: Option<f64>,
    /// The client's CPU seconds (the import or export command).
    client_cpu: Option<f64>,
}

pub async fn run(ctx: &Ctx, data: &Dataset) -> anyhow::Result<(Report, bool)> {
    let n = data.len();
    let dir = tempfile::tempdir()?;
    let mut runs = Vec::new();
    let mut ok = true;
    let mut report = Report::new("Hourglass import and export");

    // The HTTP path: the backfill's client, 5 000 readings a request, 4 at a time.
    // Each run waits until everything is stored before the next starts: the
    // stand-in server stores far slower than the service acknowledges, and
    // a run must not pay for the one before it.
    let http = ctx.target("transfer_http", "minute", false, true).await?;
    let cpu0 = http.cpu();
    let started = Instant::now();
    let o = crate::backfill::send_all(ctx, &http, data, 5000, 4).await?;
    let cpu = cpu0.zip(http.cpu()).map(|(a, b)| b - a);
    wait_stored(&http.url, n).await?;
    runs.push(Run {
        what: "HTTP path (POST /api/v1/readings, 5 000 a request, 4 in flight; bodies built beforehand)".into(),
        seconds: o.seconds,
        stored: Some(started.elapsed().as_secs_f64()),
        cpu,
        client_cpu: None,
    });
    drop(http);

    let mut imported = None;
    // The import's defaults (10 000 a request, 8 in flight), and CSV again
    // with the HTTP path's settings.
    for (format, csv, settings) in [
        ("ndjson", false, None),
        ("csv", true, Some(("5000", "4"))),
        ("csv", true, None),
    ] {
        // A file of its own each time: a finished import's checkpoint would
        // (rightly) refuse the file written again.
        let file = dir.path().join(format!(
            "data-{}.{format}",
            settings.map_or("default", |s| s.1)
        ));
        let bytes = write_file(data, &file, csv)?;
        // The instance before goes first: its upkeep must not load this run.
        drop(imported.take());
        let target = ctx
            .target(
                &format!("transfer_{format}_{}", settings.map_or("default", |s| s.1)),
                "minute",
                false,
                true,
            )
            .await?;
        let cpu0 = target.cpu();
        let path = file.to_string_lossy().into_owned();
        let started = Instant::now();
        let mut args = vec!["import", "--quiet", path.as_str()];
        if let Some((batch, in_flight)) = settings {
            args.extend(["--batch", batch, "--in-flight", in_flight]);
        }
        let (seconds, client) = cli(ctx, &target, &args).await?;
        let cpu = cpu0.zip(target.cpu()).map(|(a, b)| b - a);
        wait_stored(&target.url, n).await?;
        runs.push(Run {
            what: format!(
                "hourglass import, {format} ({:.1} MB, {} a request, {} in flight)",
                bytes as f64 / 1e6,
                settings.map_or("10 000", |s| s.0),
                settings.map_or("8", |s| s.1)
            ),
            seconds,
            stored: Some(started.elapsed().as_secs_f64()),
            cpu,
            client_cpu: Some(client),
        });
        let (verdict, good) = crate::verify::run(ctx, data, "minute", &target.database).await?;
        if !good {
            report.merge(verdict);
        }
        ok &= good;
        imported = Some(target);
    }
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
        runs.push(Run {
            what: format!(
                "hourglass export, ndjson ({lines} lines of {n}; service peak RSS {} → {} MiB)",
                rss_before.map_or_else(|| "-".into(), f),
                rss_after.map_or_else(|| "-".into(), f)
            ),
            seconds,
            stored: None,
            cpu,
            client_cpu: Some(client),
        });
    }

    let base = runs[0].seconds;
    let base_stored = runs[0].stored.unwrap_or(base);
    let mut s = Section::new(
        &format!("Import and export: {n} readings, one minute-bucket instance each (journal on)"),
        &[
            "path",
            "s to acknowledge",
            "readings/s acknowledged",
            "× HTTP",
            "s to store",
            "readings/s stored",
            "× HTTP",
            "service CPU/reading (µs)",
            "client CPU/reading (µs)",
        ],
    );
    let mut figures = Vec::new();
    let per = |c: Option<f64>| c.map_or_else(|| "-".into(), |c| f(c / n as f64 * 1e6));
    for r in &runs {
        let rate = n as f64 / r.seconds;
        s.row(vec![
            r.what.clone(),
            f(r.seconds),
            f(rate),
            f(base / r.seconds),
            r.stored.map_or_else(|| "-".into(), f),
            r.stored.map_or_else(|| "-".into(), |t| f(n as f64 / t)),
            r.stored.map_or_else(|| "-".into(), |t| f(base_stored / t)),
            per(r.cpu),
            per(r.client_cpu),
        ]);
        figures.push(serde_json::json!({
            "path": r.what, "seconds": r.seconds, "readings_per_s": rate,
            "ratio_to_http": base / r.seconds,
            "stored_seconds": r.stored,
            "stored_ratio_to_http": r.stored.map(|t| base_stored / t),
            "service_cpu_us_per_reading": r.cpu.map(|c| c / n as f64 * 1e6),
            "client_cpu_us_per_reading": r.client_cpu.map(|c| c / n as f64 * 1e6),
        }));
    }
    report.sections.push(s);
    report.set("transfer", figures);
    Ok((report, ok))
}
