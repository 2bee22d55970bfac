//! Answers range queries exactly from buckets and their rollups.
//!
//! - [`grid`]: the points of a result, fixed or calendar steps in a time zone.
//! - [`plan`]: which documents at which level answer a range (pure).
//! - [`engine`]: runs a plan for many series at once, a level per round
//!   trip, over the store and the readings acknowledged but not yet stored.
//! - [`promql`]: the PromQL subset dashboards use, over the same engine.

pub mod engine;
pub mod grid;
pub mod plan;
pub mod promql;

pub use engine::{Cost, Question, Series, evaluate, latest};
pub use grid::{Calendar, Grid, GridError};
pub use plan::{Need, Plan};

use std::time::Duration;

/// `[query]`: how much one query may ask for and take.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub max_range: Duration,
    pub max_points: usize,
    /// Sensors one group query may cover; series one PromQL query may select.
    pub max_series: usize,
    /// Entries in one Prometheus listing (series, labels, label values);
    /// more are left out with a warning.
    pub max_listed: usize,
    /// A query answers 503 after this long; the server is told the same
    /// (`maxTimeMS`), so it stops working on it too.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Queries running at once, apart from ingest; more wait (within the timeout).
    pub max_concurrency: usize,
}

pub const DEFAULT_MAX_RANGE: Duration = Duration::from_secs(400 * 24 * 3600);
pub const DEFAULT_MAX_POINTS: usize = 10_000;

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_range: DEFAULT_MAX_RANGE,
            max_points: DEFAULT_MAX_POINTS,
            max_series: 1000,
            max_listed: 10_000,
            timeout: Duration::from_secs(10),
            max_concurrency: 16,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), crate::settings::Invalid> {
        crate::settings::at_least_one(&[
            ("query.max_points", self.max_points),
            ("query.max_series", self.max_series),
            ("query.max_listed", self.max_listed),
            ("query.max_concurrency", self.max_concurrency),
        ])?;
        crate::settings::longer_than_zero(&[
            ("query.max_range", self.max_range),
            ("query.timeout", self.timeout),
        ])
    }
}
