use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hourglass::{Application, Settings};

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
    let app = Application::build(settings).await?;
    app.run_until_stopped(hourglass::signal()).await
}
