//! Logging (`tracing`, JSON or human-readable) and Prometheus [`metrics`].

pub mod metrics;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `log.level`.
/// Returns an error if one is installed already.
pub fn init(settings: &LogSettings) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&settings.level))?;
    // Spans (one per HTTP request, one per flush) carry the fields; their
    // events say what happened. Per-request and per-flush lines are DEBUG.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.try_init(),
    }
    .map_err(|e| anyhow::anyhow!(e))
}
