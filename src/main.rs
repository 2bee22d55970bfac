use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use hourglass::config::Settings;
use hourglass::startup::Application;
use hourglass::{shutdown, telemetry};

/// IoT time-series ingestion into MongoDB buckets.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The configuration file (TOML). HOURGLASS__SECTION__KEY variables override it.
    #[arg(long, default_value = "config/default.toml")]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings = Settings::load(Some(&args.config))?;
    telemetry::init(&settings.log).context("installing the log subscriber")?;
    let app = Application::build(settings).await?;
    app.run_until_stopped(shutdown::signal()).await
}
