use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hourglass::{Application, Settings};

/// jemalloc rather than the system allocator: each request allocates and
/// frees thousands of small buffers (bucket keys and values), and glibc's
/// malloc spent ~13% of the service's CPU on them and on returning pages;
/// with jemalloc a 360 000-reading load took 10–12% less CPU per reading.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts (see [`hourglass::MALLOC_CONF`]).
#[cfg(not(target_env = "msvc"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 44] = hourglass::MALLOC_CONF;

/// Where the configuration is read from unless `--config` says otherwise.
const DEFAULT_CONFIG: &str = "config/default.toml";

/// IoT time-series ingestion into MongoDB buckets.
#[derive(Parser)]
#[command(version = hourglass::short_version(), long_version = hourglass::long_version())]
struct Args {
    /// The configuration file (TOML), config/default.toml by default.
    /// HOURGLASS__SECTION__KEY variables override it. `import`, `export` and
    /// `delete` are clients of a running instance and need none: the
    /// HOURGLASS_URL and HOURGLASS_TOKEN variables are enough.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Prints the SHA-256 of a token read from standard input, for auth.tokens[].sha256.
    HashToken,
    /// Reads and checks the configuration (the file, the HOURGLASS__
    /// variables, the tokens file) as a start does, then exits: 0 if it is
    /// valid, else the first invalid key and why. It does not reach MongoDB
    /// or the broker, nor bind the port or open the journal.
    CheckConfig,
    /// Recomputes rollups and sensor registry entries from the buckets: the
    /// migration for data written without them, and their repair. Safe while
    /// the service runs.
    RebuildRollups {
        /// Only sensors with this id, or (ending in `*`) this id prefix.
        #[arg(long)]
        sensor: Option<String>,
        /// From this instant (RFC 3339 or epoch ms), widened to the start of
        /// its 30-day rollup period (thirty days counted from the epoch).
        #[arg(long)]
        from: Option<String>,
        /// Up to this instant, widened to the end of its 30-day rollup period.
        #[arg(long)]
        to: Option<String>,
    },
    /// Lists the instances recorded on this database with their floors
    /// (see docs/src/internals/last-write-wins.md), or forgets one whose journal is
    /// gone for good so that versions are pruned again.
    Instances {
        /// Remove this instance's record (refused while it runs).
        #[arg(long, value_name = "ID")]
        forget: Option<String>,
    },
    /// Imports files of readings (CSV, NDJSON, line protocol; gzip or
    /// plain) into a running instance through its API (HOURGLASS_URL, or
    /// this config's http.listen; HOURGLASS_TOKEN with the ingest scope).
    /// Resumable: a checkpoint beside each file (or in --state-dir) records
    /// what was stored; refused lines go to <file>.rejects with their line
    /// numbers. Importing a file twice changes nothing.
    Import {
        /// The files, imported in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The files' format; by default from each name (.csv, .ndjson,
        /// .jsonl, .lp, with or without .gz).
        #[arg(long, value_enum)]
        format: Option<hourglass::ImportFormat>,
        /// CSV: the column holding a field of the reading, as FIELD=COLUMN
        /// (fields: sensor, metric, ts, value; each defaults to its own name).
        #[arg(long = "column", value_name = "FIELD=COLUMN", value_parser = pair)]
        columns: Vec<(String, String)>,
        /// CSV: a column to leave out (an unnamed column is; any other
        /// unknown column stops the import).
        #[arg(long = "ignore", value_name = "COLUMN")]
        ignore: Vec<String>,
        /// CSV: how integer timestamps count (auto: RFC 3339 or epoch ms).
        #[arg(long, value_enum, default_value = "auto")]
        ts_unit: hourglass::TsUnit,
        /// Line protocol: the timestamps' unit (ns, us, ms, s).
        #[arg(long, default_value = "ns")]
        precision: String,
        /// Readings per request (at most ingest.max_readings_per_request).
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        /// Requests in flight at once: while the service journals some,
        /// this command reads and checks the next.
        #[arg(long, default_value_t = 8)]
        in_flight: usize,
        /// Where checkpoints and rejects go (by default next to each file).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Import every file from its start, ignoring checkpoints.
        #[arg(long)]
        restart: bool,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Exports stored readings (or, with --step, their step series) as
    /// NDJSON or CSV through a running instance's GET /api/v1/export
    /// (HOURGLASS_URL, HOURGLASS_TOKEN with the query scope).
    Export {
        /// From this instant (RFC 3339 or epoch ms).
        #[arg(long)]
        from: String,
        /// Up to this instant (excluded).
        #[arg(long)]
        to: String,
        /// A sensor id or a glob of one (* and ?); all sensors by default.
        #[arg(long)]
        sensor: Option<String>,
        /// One metric; every metric by default (readings).
        #[arg(long)]
        metric: Option<String>,
        /// Only sensors with this label value, as NAME=VALUE (repeatable).
        #[arg(long = "label", value_name = "NAME=VALUE", value_parser = pair)]
        labels: Vec<(String, String)>,
        /// Export the step series (1m, 1h, 1d, …) instead of the readings.
        #[arg(long)]
        step: Option<String>,
        /// ndjson (which `hourglass import` takes back) or csv.
        #[arg(long, default_value = "ndjson")]
        format: String,
        /// Compress with gzip.
        #[arg(long)]
        gzip: bool,
        /// The file to write; standard output by default.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Deletes readings by sensor and range through a running instance's
    /// DELETE /api/v1/readings (HOURGLASS_URL, HOURGLASS_TOKEN with the admin
    /// scope): removed from their buckets, rollups and registry, and from
    /// what any instance still holds. Idempotent, safe to retry.
    Delete {
        /// A sensor id or a glob of one (* and ?).
        #[arg(long)]
        sensor: Option<String>,
        /// Only sensors with this label value, as NAME=VALUE (repeatable).
        #[arg(long = "label", value_name = "NAME=VALUE", value_parser = pair)]
        labels: Vec<(String, String)>,
        /// One metric; every metric by default.
        #[arg(long)]
        metric: Option<String>,
        /// From this instant (RFC 3339 or epoch ms).
        #[arg(long)]
        from: String,
        /// Up to this instant (excluded).
        #[arg(long)]
        to: String,
        /// Count what would be deleted; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Writes dead letters into their buckets (with rollups and registry)
    /// once what refused them is fixed, deleting each one stored; one
    /// refused again stays with the new reason. Idempotent, safe while the
    /// service runs.
    Redrive {
        /// Only sensors with this id, or (ending in `*`) this id prefix.
        #[arg(long)]
        sensor: Option<String>,
        /// Count what would be re-driven; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `NAME=VALUE`.
fn pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

/// Adds the parameters given and the `label.<name>` filters to `query`.
/// `NAME=VALUE` label selections, as the command line takes them.
type Labels = Vec<(String, String)>;

fn selection<const N: usize>(
    query: &mut Vec<(String, String)>,
    optional: [(&str, Option<String>); N],
    labels: Vec<(String, String)>,
) {
    for (k, v) in optional {
        if let Some(v) = v {
            query.push((k.to_owned(), v));
        }
    }
    query.extend(labels.into_iter().map(|(k, v)| (format!("label.{k}"), v)));
}

fn main() -> anyhow::Result<()> {
    hourglass::install_crypto_provider();
    let args = Args::parse();
    if let Some(Command::HashToken) = args.command {
        // From stdin, not argv: arguments show in `ps` and shell history.
        let mut token = String::new();
        std::io::stdin()
            .read_line(&mut token)
            .context("reading the token from standard input")?;
        println!(
            "{}",
            hourglass::hash_token(token.trim_end_matches(['\r', '\n']))
        );
        return Ok(());
    }
    let settings = match &args.command {
        // Clients of the HTTP API: a configuration only if there is one.
        Some(Command::Import { .. } | Command::Export { .. } | Command::Delete { .. }) => {
            let default = PathBuf::from(DEFAULT_CONFIG);
            let file = args.config.clone().or(default.exists().then_some(default));
            Settings::load_client(file.as_deref())?
        }
        _ => Settings::load(Some(
            args.config.as_deref().unwrap_or(DEFAULT_CONFIG.as_ref()),
        ))?,
    };
    if let Some(Command::CheckConfig) = args.command {
        println!(
            "The configuration is valid ({}).",
            args.config
                .as_deref()
                .unwrap_or(DEFAULT_CONFIG.as_ref())
                .display()
        );
        return Ok(());
    }
    settings
        .runtime
        .build()
        .context("starting the runtime")?
        .block_on(run(args, settings))
}

/// Everything but `hash-token`, on the runtime `[runtime]` sizes.
async fn run(args: Args, settings: Settings) -> anyhow::Result<()> {
    // Long: one arm per subcommand, each a call with its arguments.
    // Import, export and delete print their own lines; standard output may
    // be the exported file itself, so no log subscriber writes there.
    match args.command {
        Some(Command::Import {
            files,
            format,
            columns,
            ignore,
            ts_unit,
            precision,
            batch,
            in_flight,
            state_dir,
            restart,
            quiet,
        }) => {
            let options = hourglass::ImportOptions {
                files,
                format,
                columns,
                ignore,
                ts_unit,
                precision,
                batch,
                in_flight,
                state_dir,
                restart,
                progress: !quiet,
            };
            import(&settings, options).await
        }
        Some(Command::Delete {
            sensor,
            labels,
            metric,
            from,
            to,
            dry_run,
        }) => delete(&settings, (sensor, labels, metric), (from, to), dry_run).await,
        Some(Command::Export {
            from,
            to,
            sensor,
            metric,
            labels,
            step,
            format,
            gzip,
            output,
        }) => {
            let selected = (sensor, labels, metric, step);
            export(&settings, selected, (from, to), format, gzip, output).await
        }
        command => {
            hourglass::init_logging(&settings.log).context("installing the log subscriber")?;
            match command {
                Some(Command::RebuildRollups { sensor, from, to }) => {
                    rebuild_rollups(&settings, sensor, from, to).await
                }
                Some(Command::Instances { forget }) => instances(&settings, forget).await,
                Some(Command::Redrive { sensor, dry_run }) => {
                    redrive(&settings, sensor, dry_run).await
                }
                _ => {
                    // Before the slow part of the start: SIGHUP's default
                    // action would end the process.
                    let hangups =
                        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                            .context("listening for SIGHUP")?;
                    let file = args.config.unwrap_or_else(|| DEFAULT_CONFIG.into());
                    let app = Application::build(settings)
                        .await?
                        .reloading_tokens_from(file, hangups);
                    app.run_until_stopped(hourglass::signal()).await
                }
            }
        }
    }
}

/// `hourglass import`, and its summary.
async fn import(settings: &Settings, options: hourglass::ImportOptions) -> anyhow::Result<()> {
    let s = hourglass::import(settings, options).await?;
    let secs = s.elapsed.as_secs_f64().max(1e-3);
    println!(
        "Imported {} file{} ({} already imported): {} readings stored, {} lines refused, in {:.1} s ({:.0} readings/s){}.",
        s.files,
        if s.files == 1 { "" } else { "s" },
        s.skipped_files,
        s.readings,
        s.rejected,
        secs,
        s.readings as f64 / secs,
        if s.resumed > 0 {
            format!("; resumed after {} records", s.resumed)
        } else {
            String::new()
        }
    );
    if s.retries > 0 {
        println!(
            "{} requests were sent again (the service was busy or unreachable).",
            s.retries
        );
    }
    for f in &s.rejects_files {
        println!("Refused lines, with file and line number: {}", f.display());
    }
    Ok(())
}

/// `hourglass delete`, and what it did.
async fn delete(
    settings: &Settings,
    (sensor, labels, metric): (Option<String>, Labels, Option<String>),
    (from, to): (String, String),
    dry_run: bool,
) -> anyhow::Result<()> {
    let mut query = vec![
        ("from".to_owned(), from),
        ("to".to_owned(), to),
        ("dry_run".to_owned(), dry_run.to_string()),
    ];
    selection(&mut query, [("sensor", sensor), ("metric", metric)], labels);
    let answer = hourglass::delete(settings, &query).await?;
    let n = |k: &str| answer[k].as_u64().unwrap_or(0);
    println!(
        "{} {} readings of {} sensors: {} buckets edited, {} deleted, {} series emptied.",
        if dry_run { "Would delete" } else { "Deleted" },
        n("readings"),
        n("sensors"),
        n("buckets_edited"),
        n("buckets_deleted"),
        n("series_emptied")
    );
    Ok(())
}

/// `hourglass export`; the file it wrote, if not standard output.
async fn export(
    settings: &Settings,
    (sensor, labels, metric, step): (Option<String>, Labels, Option<String>, Option<String>),
    (from, to): (String, String),
    format: String,
    gzip: bool,
    output: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut query = vec![
        ("from".to_owned(), from),
        ("to".to_owned(), to),
        ("format".to_owned(), format),
    ];
    selection(
        &mut query,
        [("sensor", sensor), ("metric", metric), ("step", step)],
        labels,
    );
    let s = hourglass::export(
        settings,
        hourglass::ExportOptions {
            query,
            output,
            gzip,
        },
    )
    .await?;
    if let Some(path) = s.output {
        eprintln!("Exported {} bytes into {}.", s.bytes, path.display());
    }
    Ok(())
}

/// `hourglass rebuild-rollups`.
async fn rebuild_rollups(
    settings: &Settings,
    sensor: Option<String>,
    from: Option<String>,
    to: Option<String>,
) -> anyhow::Result<()> {
    let instant = |name: &str, s: Option<String>| -> anyhow::Result<Option<i64>> {
        s.map(|s| {
            hourglass::pure::parse_instant(name, &s)
                .map(|ms| ms.div_euclid(1000))
                .map_err(|e| anyhow::anyhow!("--{name}: {}", e.message))
        })
        .transpose()
    };
    let (from, to) = (instant("from", from)?, instant("to", to)?);
    let days = hourglass::rebuild_rollups(settings, sensor.as_deref(), from, to).await?;
    println!("Rebuilt the rollups of {days} days.");
    Ok(())
}

/// `hourglass instances`: the list, or one forgotten.
async fn instances(settings: &Settings, forget: Option<String>) -> anyhow::Result<()> {
    if let Some(id) = forget {
        hourglass::forget_instance(settings, &id).await?;
        println!(
            "Forgot instance {id}; versions older than the other floors are pruned within a minute."
        );
        return Ok(());
    }
    let now_ms = jiff::Timestamp::now().as_millisecond();
    println!(
        "{:<38} {:<8} {:<32} last published",
        "instance", "journal", "floor"
    );
    for i in hourglass::instances(settings).await? {
        let floor = match i.floor {
            Some(i64::MIN) => "owes readings (replay pending)".to_owned(),
            f => f
                .and_then(hourglass::pure::format_ms)
                .unwrap_or_else(|| "-".to_owned()),
        };
        let seen = i.at.map_or_else(
            || "-".to_owned(),
            |ms| format!("{} s ago", (now_ms - ms) / 1000),
        );
        println!(
            "{:<38} {:<8} {:<32} {seen}",
            i.id,
            if i.durable { "yes" } else { "no" },
            floor
        );
    }
    Ok(())
}

/// `hourglass redrive`.
async fn redrive(settings: &Settings, sensor: Option<String>, dry_run: bool) -> anyhow::Result<()> {
    let r = hourglass::redrive(settings, sensor.as_deref(), dry_run).await?;
    println!(
        "{} {} dead letters ({} readings); {} refused again, {} unreadable (kept).",
        if dry_run {
            "Would re-drive"
        } else {
            "Re-drove"
        },
        r.letters,
        r.readings,
        r.refused,
        r.unreadable
    );
    Ok(())
}
