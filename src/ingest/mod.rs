//! Ways readings come in, apart from HTTP (which [`crate::api`] owns): the
//! decoder every ingestor shares, and MQTT. Each ingestor decodes and
//! validates its input with [`decode`], then hands whole messages to the batcher.

pub mod decode;
pub mod line_protocol;
pub mod mqtt;
pub mod routes;
mod settings;
pub mod sparkplug;

pub use settings::Settings;
