//! Bulk transfer for operators: `hourglass import` and `hourglass export`,
//! clients of a running instance's HTTP API.
//!
//! Going through the API rather than the database keeps every promise a
//! write or a read makes: the same validation, the journal's
//! acknowledgement and the batcher for imports (and so last write wins by
//! acknowledgement across instances), the same tokens and limits for both.
//!
//! - [`import`]: files into readings, with checkpoints and rejects.
//! - [`export`]: `GET /api/v1/export` into a file, gzip if asked.
//! - [`delete`]: `DELETE /api/v1/readings` for `hourglass delete`.
//! - [`client`]: the HTTP client they use, with its retries.

mod client;
pub mod export;
pub mod import;

pub use client::{TransferError, delete};
