//! Descriptions the routes' OpenAPI annotations (`#[utoipa::path]`) share,
//! written once: parameters (units, format, default, bounds) and answers.
//! Imported as `text`.

// Parameters.
pub const SENSOR: &str = "The sensor's id: 1 to 128 characters of A-Z a-z 0-9 _ . : -";
pub const SENSOR_GLOB: &str = "A sensor id or a glob of one (`*`: any characters, `?`: one), at most 128 characters; every sensor when absent";
pub const LABEL_FILTER: &str = "Only sensors whose label `<name>` has this value; any number of filters (each name once), all of which must match. `<name>`: A-Z a-z 0-9 _, not starting with a digit or `__`";
pub const METRIC: &str = "The metric: 1 to 64 characters of A-Z a-z 0-9 _ -; `value` when absent";
pub const FROM: &str = "Start of the range, included: an RFC 3339 timestamp or integer epoch milliseconds, between 0000-01-01 and 9999-12-30; before `to`";
pub const TO: &str = "End of the range, excluded: RFC 3339 or epoch milliseconds, as `from`; at most `query.max_range` (400 days by default) after it";
pub const STEP: &str = "Width of each point: a calendar step, `1d`, `1w` (from Monday) or `1mo`, aligned to local midnight in `tz`; or a whole number of minutes (`1m`, `15m`, `1h`, `90m`, `2d`), aligned to multiples of it since the Unix epoch. At most `query.max_points` (10 000 by default) points in the range";
pub const TZ: &str = "An IANA time zone name (`Europe/Berlin`): calendar steps align to its midnight, and each point's `start` carries its offset; `UTC` (starts written `…Z`) when absent";
pub const FORMAT: &str = "`json` (the default) or `csv` (a header row, then a row per point; empty cells where JSON has `null`); without it, `Accept: text/csv` asks for CSV";
pub const WEIGHTING: &str = "`readings` (the default: `avg` is the mean of the readings), `time` (each value holds until the next reading, for at most the staleness limit) or `linear` (straight lines between readings within the limit): `time` and `linear` weigh `avg` by time and add `held_seconds`";
pub const STALENESS: &str = "With `weighting=time` or `linear` only: the longest a value holds without a next reading, a duration from `1s` to `query.max_range` (`15m`, `2d`); by default each sensor's `staleness` label, else `query.staleness` (1 day by default)";
pub const QUANTILES: &str = "Percentiles to add to each point: up to 10 distinct numbers from 0 to 1, separated by commas (`0.5,0.95,0.99`), each within `buckets.sketch_accuracy` (1 % by default) of the exact one, from the rollups' sketches; at most 100 000 points (groups times steps) with them";
pub const GROUP_BY: &str = "`sensor` (a group per sensor) or `label.<name>` (a group per value of that label, `null` for sensors without it); one group of every sensor when absent";

// Answers.
pub const BAD_QUERY: &str = "A parameter is missing, unknown, given twice, malformed or out of its bounds (the message says which and why)";
pub const UNAUTHORIZED: &str =
    "With `auth.enabled`: no bearer token, or one that matches no configured token";
pub const FORBIDDEN_QUERY: &str = "With `auth.enabled`: the token lacks the `query` scope";
pub const FORBIDDEN_QUERY_SENSOR: &str = "With `auth.enabled`: the token lacks the `query` scope, or is a device token whose `sensors` do not cover this sensor";
pub const TOO_BIG: &str = "The sum of the readings (or, weighted by time, their time integral) is beyond the range of a double; or, with `weighting=time` or `linear`, gaps over the staleness limit span more than 31 days of hours to read reading by reading";
pub const QUERY_FAILED: &str =
    "Storage refused the read for good, or a stored document could not be read (logged)";
pub const QUERY_UNAVAILABLE: &str = "Retry later: storage is unavailable; the query took longer than `query.timeout` (10 s by default), or waited that long for one of `query.max_concurrency` slots; hours of the range written late are being rolled up again and reading their buckets would take longer (`Retry-After` is about when that ends); more than `http.max_concurrent_requests` API requests are in progress; or the request took longer than `http.request_timeout` (an empty body)";
pub const API_UNAVAILABLE: &str = "Retry later: more than `http.max_concurrent_requests` API requests are in progress, or the request took longer than `http.request_timeout` (an empty body)";
