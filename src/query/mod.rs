//! Answers range queries exactly from buckets and their rollups.
//!
//! - [`grid`]: the points of a result, fixed or calendar steps in a time zone.
//! - [`plan`]: which documents at which level answer a range (pure).
//! - [`engine`]: runs a plan for many series at once, a level per round
//!   trip, over the store and the readings acknowledged but not yet stored.
//! - [`promql`]: the PromQL subset dashboards use, over the same engine.
//! - [`weighted`]: time-weighted averages, from the coarsest exact pieces.
//! - `settings`: `[query]`, what one query may ask for and take.

mod ask;
pub mod cache;
mod cell;
pub mod engine;
pub mod grid;
pub mod plan;
pub mod promql;
mod settings;
pub mod uptime;
pub mod weighted;

pub use engine::{CacheUse, Cost, Question, Series, evaluate, latest};
pub use grid::{Calendar, Grid, GridError};
pub use plan::{Need, Plan};
pub use settings::{MAX_VALUES_SECONDS, Settings};
