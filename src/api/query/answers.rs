//! The answers' types: a point's aggregates, and each route's body.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::domain::{Agg, Labels};

use super::{Coarse, QuantileValues};

/// Aggregates of one point, range or group.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Point {
    /// Start of the point, RFC 3339 (with the `tz` offset when one is given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    pub count: u64,
    pub sum: f64,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// With `weighting=time` or `linear`: the seconds of the point a
    /// reading's value held (of its sensors, summed, for a group); `avg`
    /// is the time integral over them, and count, sum, min and max stay
    /// the readings'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_seconds: Option<i64>,
    /// With `quantiles=`: each quantile of the point's readings, within
    /// `buckets.sketch_accuracy` of the exact one (`null` without readings).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub quantiles: Option<QuantileValues>,
}

impl Point {
    pub(super) fn new(start: Option<String>, a: &Agg) -> Self {
        Self {
            start,
            count: a.count,
            sum: a.sum,
            avg: a.avg(),
            min: a.min(),
            max: a.max(),
            held_seconds: None,
            quantiles: None,
        }
    }
}

/// `GET /api/v1/sensors/{sensor}/average`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AverageResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    #[serde(flatten)]
    pub aggregates: Point,
    /// With `weighting=time` or `linear`: the weighting of `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    /// With `weighting=time` or `linear`: the staleness limit applied, in
    /// seconds (`staleness=`, else the sensor's `staleness` label, else
    /// `query.staleness`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_seconds: Option<i64>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// `GET /api/v1/sensors/{sensor}/series`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeriesResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    pub step: String,
    pub tz: String,
    /// With `weighting=time` or `linear`: the weighting of each point's `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    /// With `weighting=time` or `linear`: the staleness limit applied, in
    /// seconds, as for the average.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_seconds: Option<i64>,
    pub points: Vec<Point>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// One group of a group query.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Group {
    /// What the group shares: `{}` without `group_by`, `{"sensor": id}`, or
    /// `{"<label>": value}` (`null` for sensors without the label).
    #[schema(value_type = Object)]
    pub group: BTreeMap<String, Option<String>>,
    /// How many sensors it sums.
    pub sensors: usize,
    /// Averages: the group's aggregates.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub aggregates: Option<Point>,
    /// Series: its points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub points: Option<Vec<Point>>,
}

/// `GET /api/v1/average` and `GET /api/v1/series`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GroupResponse {
    pub metric: String,
    pub from: String,
    pub to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    pub group_by: Option<String>,
    /// With `weighting=time` or `linear`: the weighting of each group's `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    pub groups: Vec<Group>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// `GET /api/v1/sensors/{sensor}/latest`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LatestResponse {
    pub sensor: String,
    pub metric: String,
    pub ts: String,
    pub value: f64,
}

/// A registered sensor.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SensorEntry {
    pub sensor: String,
    pub metrics: Vec<String>,
    #[schema(value_type = Object)]
    pub labels: Labels,
    /// Start of the hour of its newest reading.
    pub last_seen: Option<String>,
    /// With `silent=true`: the time of its newest reading (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reading: Option<Option<String>>,
}

/// `GET /api/v1/sensors`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SensorList {
    pub sensors: Vec<SensorEntry>,
    /// Pass as `after` for the next page; `null` on the last.
    pub next: Option<String>,
}
