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

/// Runs the `hourglass` binary's `args` against `target`; its wall time.
async fn cli(ctx: &Ctx, target: &Target, args: &[&str]) -> anyhow::Result<f64> {
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
    Ok(started.elapsed().as_secs_f64())
}

struct Run {
    what: String,
    seconds: f64,
    cpu: Option<f64>,
}

pub async fn run(ctx: &Ctx, data: &Dataset) -> anyhow::Result<(Report, bool)> {
    let n = data.len();
    let dir = tempfile::tempdir()?;
    let mut runs = Vec::new();
    let mut ok = true;
    let mut report = Report::new("Hourglass import and export");

    // The HTTP path: the backfill's client, 5 000 readings a request, 4 at a time.
    let http = ctx.target("transfer_http", "minute", false, true).await?;
    let cpu0 = http.cpu();
    let o = crate::backfill::send_all(ctx, &http, data, 5000, 4).await?;
    runs.push(Run {
        what: "HTTP path (POST /api/v1/readings, 5 000 a request, 4 in flight)".into(),
        seconds: o.seconds,
        cpu: cpu0.zip(http.cpu()).map(|(a, b)| b - a),
    });
    drop(http);

    let mut imported = None;
    for (format, csv) in [("ndjson", false), ("csv", true)] {
        let file = dir.path().join(format!("data.{format}"));
        let bytes = write_file(data, &file, csv)?;
        let target = ctx
            .target(&format!("transfer_{format}"), "minute", false, true)
            .await?;
        let cpu0 = target.cpu();
        let path = file.to_string_lossy().into_owned();
        let seconds = cli(ctx, &target, &["import", "--quiet", &path]).await?;
        runs.push(Run {
            what: format!(
                "hourglass import, {format} ({:.1} MB, 5 000 a request, 4 in flight)",
                bytes as f64 / 1e6
            ),
            seconds,
            cpu: cpu0.zip(target.cpu()).map(|(a, b)| b - a),
        });
        wait_stored(&target.url, n).await?;
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
        let seconds = cli(
            ctx,
            target,
            &["export", "--from", &from, "--to", &to, "-o", &path],
        )
        .await?;
        let lines = std::fs::read_to_string(&out)?.lines().count() as u64;
        ok &= lines == n;
        runs.push(Run {
            what: format!("hourglass export, ndjson ({lines} lines of {n})"),
            seconds,
            cpu: None,
        });
    }

    let base = runs[0].seconds;
    let mut s = Section::new(
        &format!("Import and export: {n} readings, one minute-bucket instance each (journal on)"),
        &[
            "path",
            "seconds",
            "readings/s",
            "× the HTTP path's rate",
            "service CPU per reading (µs)",
        ],
    );
    let mut figures = Vec::new();
    for r in &runs {
        let rate = n as f64 / r.seconds;
        s.row(vec![
            r.what.clone(),
            f(r.seconds),
            f(rate),
            f(base / r.seconds),
            r.cpu.map_or_else(|| "-".into(), |c| f(c / n as f64 * 1e6)),
        ]);
        figures.push(serde_json::json!({
            "path": r.what, "seconds": r.seconds, "readings_per_s": rate,
            "ratio_to_http": base / r.seconds,
            "service_cpu_us_per_reading": r.cpu.map(|c| c / n as f64 * 1e6),
        }));
    }
    report.sections.push(s);
    report.set("transfer", figures);
    Ok((report, ok))
}
