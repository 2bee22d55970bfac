//! Ways readings come in. Each ingestor decodes and validates its input with
//! [`decode`], then hands whole requests to the batcher.

pub mod decode;
pub mod http;
pub mod mqtt;
