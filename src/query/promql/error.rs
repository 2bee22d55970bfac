//! Prometheus' error classes, as the query API answers them.

use crate::store::StoreError;

/// Prometheus' error classes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PromError {
    #[error("{0}")]
    BadData(String),
    #[error("{0}")]
    Execution(String),
    /// The instance is at a shared bound (`query.max_memory`): retry shortly.
    #[error("{0}")]
    Busy(String),
    /// The evaluation passed its deadline.
    #[error("the query took longer than its timeout")]
    Timeout,
    /// Reading the documents failed; the caller decides what to tell.
    #[error(transparent)]
    Storage(#[from] StoreError),
}
