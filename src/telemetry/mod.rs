//! Logging (`tracing`, JSON or human-readable) and Prometheus [`metrics`].

mod labels;
pub mod metrics;
mod register;

use tracing_subscriber::EnvFilter;

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Pretty,
}

/// `[log]`: the format and the filter.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub format: LogFormat,
    /// A tracing filter (`info`, `hourglass=debug,info`); `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            format: LogFormat::Pretty,
            level: "info".to_owned(),
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        EnvFilter::try_new(&self.level)
            .map(|_| ())
            .map_err(|e| invalid("log.level", e.to_string()))
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `log.level`.
/// Returns an error if one is installed already.
pub fn init(settings: &Settings) -> anyhow::Result<()> {
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
