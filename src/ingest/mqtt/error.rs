//! The ingestor's errors: what stops it from starting.

use crate::settings::Invalid;

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("invalid configuration: {0}")]
    Config(#[from] Invalid),
    #[error("reading {what} {path}: {source}")]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}
