//! The product's vocabulary: readings, their validated parts, buckets and aggregates.
//!
//! Everything here is pure: no I/O, no clock (callers pass `now`).

mod aggregate;
mod bucket;
mod instant;
mod instants;
mod labels;
mod read;
mod reading;
mod sketch;
mod summary;
mod weighted;

pub use aggregate::Agg;
pub use bucket::{BucketKey, BucketKeyRef, BucketUpdate, Granularity, SECOND_FIELDS, field_name};
pub use instant::{format_ms, format_secs, representable_ms, rfc3339_ms, rfc3339_secs};
pub use instants::{At, value_at};
pub use labels::{
    InvalidLabels, LABEL_VALUE_MAX_LEN, Labels, MAX_LABELS, SensorLabels, valid_label_name,
    valid_label_value,
};
pub use read::{BucketRead, Level, Period, RollupRead, Starts, Values};
pub use reading::{
    InvalidReading, METRIC_MAX_LEN, MetricName, Reading, SENSOR_MAX_LEN, SensorId, TimeWindow,
    parse_timestamp_ms, parse_timestamp_str,
};
pub use sketch::{Sketch, SketchError};
pub use summary::{Integrals, Moments, Part, Rest, Sample, Slot, Summary};
/// The second-by-second model time-weighted folds are checked against.
#[cfg(test)]
pub(crate) use weighted::tests as weighted_model;
pub use weighted::{TimeFold, Weighted, Weighting};
