//! PromQL, what dashboards and alert rules use, answered from rollups and
//! buckets with Prometheus 3's semantics, so Grafana's Prometheus data
//! source and rule evaluators work unchanged.
//!
//! - [`compile`]: the parsed expression checked and turned into a tree (pure).
//! - [`eval`]: the selector reads a tree needs, and its evaluation over what
//!   was read (pure), with [`binary`] (vector matching), [`aggregate`] and
//!   [`functions`] (range functions from window summaries, counters too).
//! - [`window`]: each step's window `(t − range, t]` as cells of stored
//!   seconds; the planner answers cells from levels, windows merge cells (pure).
//! - [`value`]: values over all steps at once (pure).
//! - [`budget`]: one memory budget per query, charged before values are
//!   built (pure).
//! - [`limits`]: a text's length, depth and nodes, measured before it is
//!   parsed; the recursive walks grow their stack past what that leaves
//!   ([`deep`]).
//! - `error`: Prometheus' error classes.
//! - [`read`]: finds each read's series in the registry and reads its cells.

pub mod aggregate;
pub mod ast;
pub mod binary;
pub mod budget;
pub mod compile;
#[cfg(test)]
mod deep_queries;
mod error;
pub mod eval;
pub mod functions;
pub mod limits;
pub mod memory;
pub mod read;
pub mod value;
pub mod window;

pub use budget::MemoryPool;
pub use error::PromError;
pub use limits::Limits;
pub use value::{LabelSet, Series, Value, format_value};
pub use window::Steps;

pub use read::{Context, Outcome, evaluate, labels_of, select};
