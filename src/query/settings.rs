//! `[query]`: how much one query may ask for and take, and its validation.

use std::time::Duration;

use super::promql;

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
    /// A PromQL text's bytes, depth and nodes (`promql::limits`), checked
    /// before it is parsed.
    pub max_query_length: usize,
    pub max_query_depth: usize,
    pub max_query_nodes: usize,
    /// Bytes of one series' labels as a function builds them.
    pub max_label_bytes: usize,
    /// Regular-expression matchers in one request (its query, or all its
    /// `match[]` selectors): each compiles to an automaton of up to 10 MiB.
    pub max_regex_matchers: usize,
    /// Values one PromQL query may hold: series × evaluation times, summed
    /// over its reads. Only subqueries can pass max_series × max_points.
    pub max_samples: usize,
    /// Bytes one PromQL evaluation may hold at once: every series, value and
    /// label it builds is charged before it is built. More is a 422.
    pub max_memory_per_query: usize,
    /// Bytes all PromQL evaluations together may hold; a query that would
    /// pass it while others hold it answers 503 with Retry-After.
    pub max_memory: usize,
    /// Bytes the results cache of closed periods may hold; 0 turns it off.
    pub cache_bytes: usize,
    /// How often a sensor is expected to report, unless its
    /// `expected_interval` label says otherwise: longer without a reading
    /// is silence (the silent listing, uptime).
    #[serde(with = "humantime_serde")]
    pub expected_interval: Duration,
    /// How long a reading's value holds in a time-weighted average when no
    /// reading follows it: a longer gap is no data (a request's
    /// `staleness=` overrides it).
    #[serde(with = "humantime_serde")]
    pub staleness: Duration,
}

/// The longest span a query reads reading by reading (`quantile_over_time`'s
/// windows, a time-weighted average's hours with long gaps): what one
/// request may hold in memory.
pub const MAX_VALUES_SECONDS: i64 = 31 * 86_400;

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
            max_query_length: promql::Limits::default().max_length,
            max_query_depth: promql::Limits::default().max_depth,
            max_query_nodes: promql::Limits::default().max_nodes,
            max_label_bytes: promql::Limits::default().max_label_bytes,
            max_regex_matchers: promql::Limits::default().max_regex_matchers,
            max_samples: 10_000_000,
            max_memory_per_query: 512 * 1024 * 1024,
            max_memory: 1024 * 1024 * 1024,
            cache_bytes: 64 * 1024 * 1024,
            expected_interval: Duration::from_secs(300),
            staleness: Duration::from_secs(86_400),
        }
    }
}

impl Settings {
    /// The limits on a PromQL text.
    pub fn limits(&self) -> promql::Limits {
        promql::Limits {
            max_length: self.max_query_length,
            max_depth: self.max_query_depth,
            max_nodes: self.max_query_nodes,
            max_label_bytes: self.max_label_bytes,
            max_regex_matchers: self.max_regex_matchers,
        }
    }

    pub fn validate(&self) -> Result<(), crate::settings::Invalid> {
        crate::settings::at_least_one(&[
            ("query.max_points", self.max_points),
            ("query.max_series", self.max_series),
            ("query.max_listed", self.max_listed),
            ("query.max_concurrency", self.max_concurrency),
            ("query.max_query_length", self.max_query_length),
            ("query.max_query_depth", self.max_query_depth),
            ("query.max_query_nodes", self.max_query_nodes),
            ("query.max_label_bytes", self.max_label_bytes),
            ("query.max_regex_matchers", self.max_regex_matchers),
            ("query.max_samples", self.max_samples),
            ("query.max_memory_per_query", self.max_memory_per_query),
        ])?;
        if self.max_memory < self.max_memory_per_query {
            return Err(crate::settings::invalid(
                "query.max_memory",
                "must be at least query.max_memory_per_query (one query alone could never run)",
            ));
        }
        if self.max_query_depth > promql::limits::DEPTH_CEILING {
            return Err(crate::settings::invalid(
                "query.max_query_depth",
                format!(
                    "must be at most {} (deeper queries could overflow a worker's stack)",
                    promql::limits::DEPTH_CEILING
                ),
            ));
        }
        crate::settings::longer_than_zero(&[
            ("query.max_range", self.max_range),
            ("query.timeout", self.timeout),
            ("query.expected_interval", self.expected_interval),
            ("query.staleness", self.staleness),
        ])
    }
}
