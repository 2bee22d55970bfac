//! Dashboards' routes: averages and series of one sensor or of a group of
//! sensors, the newest reading, and the sensor registry.
//!
//! - [`range`]: the parameters every route shares (instants, steps, time
//!   zones, the range and its grid).
//! - [`admission`]: admission under `query.max_concurrency`, the deadline,
//!   the cost recorded.
//! - [`evaluation`]: the one evaluation every point route runs.
//! - [`points`]: each group's points, weighted or plain, with percentiles.
//! - [`csv`]: CSV answers for spreadsheets.
//! - [`groups`]: groups of sensors from the registry.
//! - [`registry`]: the sensor listing and labels.
//! - [`dead_letters`]: the newest dead letters.
//! - [`weighting`]: time-weighted averages (`weighting=`, `staleness=`).
//! - [`answers`]: the answers' types.
//! - [`one_sensor`]: the one-sensor routes (average, series, latest).
//! - this module: only what its files share, re-exported.

mod admission;
mod answers;
mod csv;
mod dead_letters;
mod evaluation;
mod groups;
mod instants;
mod one_sensor;
mod points;
mod quantiles;
mod range;
mod registry;
mod silence;
mod weighting;

pub(super) use admission::store_error;
pub(super) use admission::{Admitted, admit};
pub use answers::{
    AverageResponse, Group, GroupResponse, LatestResponse, Point, SensorEntry, SensorList,
    SeriesResponse,
};
use csv::{csv_point, csv_response, point_columns, wants_csv};
pub use dead_letters::{
    __path_list_dead_letters, DeadLetterEntry, DeadLetterList, list_dead_letters,
};
pub(super) use evaluation::evaluate;
pub use groups::check_group_params;
pub(super) use groups::sensor_glob;
pub use groups::{__path_group_average, __path_group_series, group_average, group_series};
pub use instants::{__path_at, AtReading, AtResponse, AtValue, at};
use one_sensor::sensor_param;
pub use one_sensor::{__path_average, __path_latest, __path_series, average, latest, series};
pub use quantiles::QuantileValues;
pub use range::Coarse;
pub(super) use range::{Range, coarse, coarse_header, metric, range, series_grid};
pub use range::{Step, parse_instant, parse_step};
use range::{format_ms, format_start, parse_tz};
pub use registry::{__path_list_sensors, __path_put_labels, list_sensors, put_labels};
pub use silence::{__path_uptime, GapEntry, UptimeResponse, count_silent, uptime};
pub(super) use weighting::{Weighing, weighing, weighted_points};
