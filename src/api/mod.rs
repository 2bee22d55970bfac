//! The HTTP surface: the routes (`routes`), the state every handler shares
//! (`state`), the error every handler answers with (`error`), whether a
//! request may use the results cache (`cache`), and one file per handler
//! family. Handlers import this module only for its re-exports.

mod auth;
mod cache;
mod console;
mod cross_site;
mod delete;
mod descriptions;
mod error;
mod export;
pub mod health;
mod influx;
mod ingest;
pub mod openapi;
mod params;
pub mod prom;
pub mod query;
mod routes;
mod serve;
mod settings;
mod state;
mod unread;

pub(crate) use cache::cache_use;
pub use error::{ApiError, RETRY_AFTER};
pub use routes::router;
pub use serve::serve;
pub use settings::Settings;
pub use state::{AppState, Config};
