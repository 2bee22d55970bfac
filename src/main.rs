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

/// IoT time-series ingestion into MongoDB buckets.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The configuration file (TOML). HOURGLASS__SECTION__KEY variables override it.
    #[arg(long, default_value = "config/default.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Prints the SHA-256 of a token read from standard input, for auth.tokens[].sha256.
    HashToken,
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
    /// (see the README's "Last write wins"), or forgets one whose journal is
    /// gone for good so that versions are pruned again.
    Instances {
        /// Remove this instance's record (refused while it runs).
        #[arg(long, value_name = "ID")]
        forget: Option<String>,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
    let settings = Settings::load(Some(&args.config))?;
    hourglass::init_logging(&settings.log).context("installing the log subscriber")?;
    if let Some(Command::RebuildRollups { sensor, from, to }) = args.command {
        let instant = |name: &str, s: Option<String>| -> anyhow::Result<Option<i64>> {
            s.map(|s| {
                hourglass::pure::parse_instant(name, &s)
                    .map(|ms| ms.div_euclid(1000))
                    .map_err(|e| anyhow::anyhow!("--{name}: {}", e.message))
            })
            .transpose()
        };
        let (from, to) = (instant("from", from)?, instant("to", to)?);
        let days = hourglass::rebuild_rollups(&settings, sensor.as_deref(), from, to).await?;
        println!("Rebuilt the rollups of {days} days.");
        return Ok(());
    }
    if let Some(Command::Instances { forget }) = args.command {
        if let Some(id) = forget {
            hourglass::forget_instance(&settings, &id).await?;
            println!(
                "Forgot instance {id}; versions older than the other floors are pruned within a minute."
            );
            return Ok(());
        }
        let now = time::OffsetDateTime::now_utc();
        let at = |ms: Option<i64>| {
            ms.and_then(|ms| {
                time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
            })
        };
        println!(
            "{:<38} {:<8} {:<32} last published",
            "instance", "journal", "floor"
        );
        for i in hourglass::instances(&settings).await? {
            let floor = match i.floor {
                Some(i64::MIN) => "owes readings (replay pending)".to_owned(),
                f => at(f)
                    .and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    })
                    .unwrap_or_else(|| "-".to_owned()),
            };
            let seen = at(i.at).map_or_else(
                || "-".to_owned(),
                |t| format!("{} s ago", (now - t).whole_seconds()),
            );
            println!(
                "{:<38} {:<8} {:<32} {seen}",
                i.id,
                if i.durable { "yes" } else { "no" },
                floor
            );
        }
        return Ok(());
    }
    if let Some(Command::Redrive { sensor, dry_run }) = args.command {
        let r = hourglass::redrive(&settings, sensor.as_deref(), dry_run).await?;
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
        return Ok(());
    }
    let app = Application::build(settings).await?;
    app.run_until_stopped(hourglass::signal()).await
}
