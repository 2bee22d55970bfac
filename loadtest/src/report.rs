//! Reports: a table on the terminal, or JSON; `report.md`, `report.json` and
//! SVG plots under `loadtest/results/<name>/`.

use std::path::Path;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Serialize)]
pub struct Section {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Section {
    pub fn new(title: &str, headers: &[&str]) -> Self {
        Self {
            title: title.into(),
            headers: headers.iter().map(|h| (*h).into()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
}

#[derive(Debug, Clone, Serialize)]
pub enum Plot {
    Lines {
        file: String,
        title: String,
        x: String,
        y: String,
        series: Vec<(String, Vec<(f64, f64)>)>,
    },
    Bars {
        file: String,
        title: String,
        y: String,
        bars: Vec<(String, f64)>,
    },
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub title: String,
    pub machine: String,
    /// When the report was made (UTC) and the commit it ran (with `+dirty` for
    /// uncommitted changes): a figure is read with its date and code.
    pub date: String,
    pub commit: String,
    /// The command line that repeats the run.
    pub command: String,
    pub notes: Vec<String>,
    pub sections: Vec<Section>,
    pub plots: Vec<Plot>,
    /// Every figure, machine-readable.
    pub data: serde_json::Map<String, Value>,
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("PRETTY_NAME=")
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem:.0} GiB RAM, {os}")
}

/// The commit the run's code is at, `+dirty` when it has changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{head}+dirty"),
            _ => head,
        },
        None => "unknown".into(),
    }
}

/// This process's command line, as `hourglass-loadtest …`.
fn command() -> String {
    let mut args = std::env::args();
    args.next();
    std::iter::once("hourglass-loadtest".to_owned())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Report {
    pub fn new(title: &str) -> Self {
        let now = jiff::Timestamp::now();
        Self {
            title: title.into(),
            machine: machine(),
            date: now.strftime("%Y-%m-%d %H:%M UTC").to_string(),
            commit: commit(),
            command: command(),
            ..Self::default()
        }
    }

    pub fn set(&mut self, key: &str, value: impl Serialize) {
        self.data.insert(
            key.into(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
    }

    pub fn merge(&mut self, other: Report) {
        self.notes.extend(other.notes);
        self.sections.extend(other.sections);
        self.plots.extend(other.plots);
        for (k, v) in other.data {
            self.data.insert(k, v);
        }
    }

    fn table(s: &Section) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_header(s.headers.clone());
        for r in &s.rows {
            t.add_row(r.clone());
        }
        t
    }

    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
            return Ok(());
        }
        println!("\n{}\nMachine: {}", self.title, self.machine);
        for s in &self.sections {
            println!("\n{}\n{}", s.title, Self::table(s));
        }
        for n in &self.notes {
            println!("- {n}");
        }
        Ok(())
    }

    pub fn markdown(&self) -> String {
        let mut md = format!(
            "# {}\n\nRun {} at commit {} on {}: `{}`\n\n",
            self.title, self.date, self.commit, self.machine, self.command
        );
        for n in &self.notes {
            md += &format!("- {n}\n");
        }
        for s in &self.sections {
            md += &format!(
                "\n## {}\n\n| {} |\n|{}|\n",
                s.title,
                s.headers.join(" | "),
                vec!["---"; s.headers.len()].join("|")
            );
            for r in &s.rows {
                md += &format!("| {} |\n", r.join(" | "));
            }
        }
        if !self.plots.is_empty() {
            md += "\n## Plots\n\n";
            for p in &self.plots {
                let (file, title) = match p {
                    Plot::Lines { file, title, .. } | Plot::Bars { file, title, .. } => {
                        (file, title)
                    }
                };
                md += &format!("![{title}]({file})\n\n");
            }
        }
        md
    }

    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), self.markdown())?;
        std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(self)?)?;
        for p in &self.plots {
            draw(dir, p)?;
        }
        Ok(())
    }
}

fn draw(dir: &Path, plot: &Plot) -> anyhow::Result<()> {
    // Long: one arm per kind of plot, each plotters' builder calls.
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot: {e}");
    match plot {
        Plot::Lines {
            file,
            title,
            x,
            y,
            series,
        } => {
            let path = dir.join(file);
            let root = SVGBackend::new(&path, (900, 480)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            let points = series.iter().flat_map(|(_, p)| p.iter());
            let xmax = points.clone().map(|p| p.0).fold(1e-9, f64::max);
            let ymax = points.map(|p| p.1).fold(1e-9, f64::max) * 1.1;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..xmax, 0f64..ymax)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc(x.as_str())
                .y_desc(y.as_str())
                .draw()
                .map_err(|e| err(&e))?;
            for (n, (name, pts)) in series.iter().enumerate() {
                let color = Palette99::pick(n).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            }
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Plot::Bars {
            file,
            title,
            y,
            bars,
        } => {
            let path = dir.join(file);
            let root = SVGBackend::new(&path, (900, 480)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            let ymax = bars.iter().map(|b| b.1).fold(1e-9, f64::max) * 1.15;
            let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0..bars.len(), 0f64..ymax)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(bars.len() + 1)
                .x_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
                .y_desc(y.as_str())
                .draw()
                .map_err(|e| err(&e))?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                    let color = Palette99::pick(i).to_rgba().filled();
                    Rectangle::new([(i, 0.0), (i + 1, *v)], color)
                }))
                .map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
    }
    Ok(())
}

/// `(p50, p99, max)` of latencies in milliseconds, through an HDR histogram
/// at microsecond resolution (3 significant digits).
pub fn percentiles(v: Vec<f64>) -> (f64, f64, f64) {
    let Ok(mut h) = hdrhistogram::Histogram::<u64>::new(3) else {
        return (0.0, 0.0, 0.0);
    };
    for ms in v {
        let _ = h.record((ms * 1000.0).max(0.0) as u64);
    }
    if h.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let ms = |us: u64| us as f64 / 1000.0;
    (
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    )
}

pub fn f(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}
