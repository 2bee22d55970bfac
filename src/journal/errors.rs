//! Why readings were refused before anything was done with them.

use super::task::QUEUE;
use crate::batcher::driver::SubmitError;

/// Why readings were refused before anything was done with them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntakeError {
    #[error("the journal is full ({bytes} of {max} bytes)")]
    JournalFull { bytes: u64, max: u64 },
    #[error("the journal has {QUEUE} appends waiting")]
    Busy,
    #[error(transparent)]
    Full(#[from] crate::batcher::Full),
    #[error("the service is shutting down")]
    Closed,
    #[error(transparent)]
    NewSeries(#[from] crate::cardinality::Refused),
}

impl From<SubmitError> for IntakeError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Full(full) => Self::Full(full),
            SubmitError::Closed => Self::Closed,
        }
    }
}
