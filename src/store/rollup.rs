//! Rollups, MongoDB's computed pattern: one summary document per (sensor,
//! metric, period) for hours, days and thirty days, each holding the count,
//! sum, min and max of every sub-period under `s.<n>` (minutes of an hour,
//! hours of a day, days of thirty) and their totals, so a range of any length
//! is answered from a few documents.
//!
//! Rollups are never maintained by adding deltas. After each flush, one
//! aggregation per level recomputes the sub-periods the flush touched from
//! their source (buckets, then hour rollups) and `$merge`s them in, so a
//! rollup is always what its buckets say, whatever overwrites, duplicates or
//! other instances did. Every source carries a write counter `n` (buckets
//! count their writes; a rollup's `n` is the sum of its sub-periods'), and a
//! sub-period is only replaced by one computed from at least as many writes:
//! a slow instance that read a bucket before a newer write cannot overwrite
//! the newer figure. `hourglass rebuild-rollups` recomputes whole periods
//! from the buckets with the same stages and replaces them.
//!
//! Pure: this builds pipelines; `mongo::rollups` runs them.

use std::collections::BTreeSet;

use mongodb::bson::{Bson, Document, doc};

use super::document::start_date;
use crate::domain::{BucketUpdate, Granularity, Period};

/// Milliseconds from the start of the `level` period holding a source's
/// `start` (thirty days are counted from the epoch, which `$dateTrunc` has no
/// unit for).
fn into_period_ms(level: Period) -> Document {
    doc! { "$mod": [ { "$toLong": "$start" }, level.seconds() * 1000 ] }
}

/// The aggregation expressions of the start of the `level` period holding a
/// source document, and of the source's sub-period number in it.
fn period_and_slot(level: Period) -> (Document, Document) {
    match level {
        Period::Hour => (
            doc! { "$dateTrunc": { "date": "$start", "unit": "hour" } },
            doc! { "$toString": { "$minute": "$start" } },
        ),
        Period::Day => (
            doc! { "$dateTrunc": { "date": "$start", "unit": "day" } },
            doc! { "$toString": { "$hour": "$start" } },
        ),
        Period::Days30 => (
            doc! { "$toDate": { "$subtract": [ { "$toLong": "$start" }, into_period_ms(level) ] } },
            doc! { "$toString": { "$toInt": { "$divide": [
                into_period_ms(level),
                level.slot_seconds() * 1000,
            ] } } },
        ),
    }
}

/// Where a rollup level reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Buckets,
    Rollups(Period),
}

impl Source {
    /// The source of a level: the buckets, or the level below.
    pub fn of(level: Period, granularity: Granularity) -> Self {
        match (level, granularity) {
            (Period::Day, Granularity::Minute) => Source::Rollups(Period::Hour),
            (Period::Days30, _) => Source::Rollups(Period::Day),
            _ => Source::Buckets,
        }
    }

    /// The distance between two neighbouring source documents.
    pub fn len(self, granularity: Granularity) -> i64 {
        match self {
            Source::Buckets => granularity.seconds(),
            Source::Rollups(p) => p.seconds(),
        }
    }
}

/// At or below this many sensors in a flush, the recomputation also filters
/// on them: a few late readings then re-read only their own sensors' sources.
pub const NARROW_SENSORS: usize = 64;

/// Touched starts closer than this (or than two neighbouring sources) are
/// recomputed as one range: a few extra sources read, one aggregation fewer.
/// Ranges, not `$in` lists of starts, because every server answers a range
/// from the index at the cost of what it returns.
pub const MERGE_GAP: i64 = 3600;

/// What a flush touched at one level's source: the distinct source starts
/// and, when few, the sensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touched {
    pub starts: Vec<i64>,
    pub sensors: Option<Vec<String>>,
}

impl Touched {
    /// The bucket starts and sensors of a flush's stored updates.
    pub fn of_updates<'a>(updates: impl IntoIterator<Item = &'a BucketUpdate>) -> Self {
        let mut starts = BTreeSet::new();
        let mut sensors = BTreeSet::new();
        for u in updates {
            starts.insert(u.key.start);
            if sensors.len() <= NARROW_SENSORS {
                sensors.insert(u.key.sensor.as_str().to_owned());
            }
        }
        Self {
            starts: starts.into_iter().collect(),
            sensors: (sensors.len() <= NARROW_SENSORS).then(|| sensors.into_iter().collect()),
        }
    }

    /// The same sensors at the next level up: the periods of `level` that hold
    /// these starts.
    pub fn lifted(&self, level: Period) -> Self {
        let len = level.seconds();
        let starts: BTreeSet<i64> = self.starts.iter().map(|&s| s - s.rem_euclid(len)).collect();
        Self {
            starts: starts.into_iter().collect(),
            sensors: self.sensors.clone(),
        }
    }
}

/// `{count, sum, min, max, n}` of a rollup, recomputed from its `s`.
fn totals_stage() -> Document {
    let of_slots = |field: &str| {
        doc! { "$map": { "input": { "$objectToArray": "$s" }, "in": format!("$$this.v.{field}") } }
    };
    doc! { "$set": {
        "count": { "$sum": of_slots("count") },
        "sum": { "$sum": of_slots("sum") },
        "min": { "$min": of_slots("min") },
        "max": { "$max": of_slots("max") },
        "n": { "$sum": of_slots("n") },
    }}
}

/// The `$merge` pipeline of a flush: each sub-period of the incoming document
/// (`$$new`) replaces the stored one unless the stored one counts more writes.
fn merge_slots() -> Vec<Document> {
    let previous = doc! { "$arrayElemAt": [
        { "$filter": { "input": "$$cur", "as": "o", "cond": { "$eq": ["$$o.k", "$$x.k"] } } },
        0,
    ]};
    let kept = doc! { "$filter": {
        "input": "$$cur", "as": "o",
        "cond": { "$not": [ { "$in": ["$$o.k", { "$map": { "input": "$$inc", "as": "i", "in": "$$i.k" } }] } ] },
    }};
    let merged = doc! { "$map": {
        "input": "$$inc", "as": "x",
        "in": { "k": "$$x.k", "v": { "$let": {
            "vars": { "prev": previous },
            "in": { "$cond": [
                { "$gte": ["$$x.v.n", { "$ifNull": ["$$prev.v.n", -1] }] },
                "$$x.v",
                "$$prev.v",
            ]},
        }}},
    }};
    vec![
        doc! { "$set": { "s": { "$let": {
            "vars": {
                "cur": { "$objectToArray": { "$ifNull": ["$s", {}] } },
                "inc": { "$objectToArray": "$$new.s" },
            },
            "in": { "$arrayToObject": { "$concatArrays": [kept, merged] } },
        }}}},
        totals_stage(),
    ]
}

/// How a recomputed rollup meets the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// After a flush: the touched sub-periods merge in, newest writes winning.
    Merge,
    /// A rebuild of whole periods: the recomputation replaces the document.
    Replace,
}

/// The aggregation (run on the level's source collection) that recomputes
/// the `level` rollups of the sources matched by `filter`.
pub fn pipeline(
    level: Period,
    source: Source,
    filter: Document,
    into: &str,
    mode: Mode,
) -> Vec<Document> {
    let mut filter = filter;
    if let Source::Rollups(p) = source {
        filter.insert("period", p.name());
    }
    let (period_start, slot) = period_and_slot(level);
    let counter = match source {
        Source::Buckets => Bson::Document(doc! { "$ifNull": ["$n", 0] }),
        Source::Rollups(_) => Bson::String("$n".into()),
    };
    let when_matched = match mode {
        Mode::Merge => Bson::Array(merge_slots().into_iter().map(Bson::Document).collect()),
        Mode::Replace => Bson::String("replace".into()),
    };
    vec![
        doc! { "$match": filter },
        doc! { "$project": {
            "_id": 0, "sensor": 1, "metric": 1,
            "start": period_start,
            "k": slot,
            "v": { "count": "$count", "sum": "$sum", "min": "$min", "max": "$max", "n": counter },
        }},
        doc! { "$group": {
            "_id": { "sensor": "$sensor", "metric": "$metric", "start": "$start" },
            "slots": { "$push": { "k": "$k", "v": "$v" } },
        }},
        doc! { "$project": {
            "_id": 0,
            "sensor": "$_id.sensor",
            "metric": "$_id.metric",
            "period": level.name(),
            "start": "$_id.start",
            "s": { "$arrayToObject": "$slots" },
            "schema_version": { "$literal": super::SCHEMA_VERSION },
        }},
        totals_stage(),
        doc! { "$merge": {
            "into": into,
            "on": ["sensor", "metric", "period", "start"],
            "whenMatched": when_matched,
            "whenNotMatched": "insert",
        }},
    ]
}

/// The filters of a flush's recomputation at one level: one per run of
/// touched source starts (and the sensors, when few); `source_len` is the
/// distance between neighbouring sources. Ranges are half-open (`$lt` the
/// end of the last source), never closed: the test stand-in answers a
/// closed range on a field followed by others in an index
/// (`{period, start, sensor}`) without the documents at its upper bound.
pub fn flush_filters(touched: &Touched, source_len: i64) -> Vec<Document> {
    let gap = MERGE_GAP.max(source_len);
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for &s in &touched.starts {
        match runs.last_mut() {
            Some((_, last)) if s - *last <= gap => *last = s,
            _ => runs.push((s, s)),
        }
    }
    runs.into_iter()
        .map(|(first, last)| {
            let mut f = doc! {
                "start": { "$gte": start_date(first), "$lt": start_date(last + source_len) },
            };
            if let Some(sensors) = &touched.sensors {
                f.insert("sensor", doc! { "$in": sensors.clone() });
            }
            f
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketKey, MetricName, SENSOR_MAX_LEN, SensorId};

    fn update(sensor: &str, start: i64) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse(sensor.to_owned())
                    .expect("valid")
                    .into_owned(),
                metric: MetricName::default_metric(),
                start,
            },
            values: vec![(0, 1.0)],
        }
    }

    #[test]
    fn a_flush_of_few_sensors_filters_on_them_and_many_do_not() {
        let few: Vec<_> = (0..3).map(|i| update(&format!("s{i}"), 60 * i)).collect();
        let t = Touched::of_updates(&few);
        assert_eq!(t.starts, vec![0, 60, 120]);
        assert_eq!(t.sensors.as_ref().map(Vec::len), Some(3));
        let many: Vec<_> = (0..=NARROW_SENSORS)
            .map(|i| update(&format!("s{i}"), 60))
            .collect();
        let t = Touched::of_updates(&many);
        assert_eq!(t.starts, vec![60]);
        assert_eq!(t.sensors, None);
        assert_eq!(
            Touched {
                starts: vec![60, 3599, 3600 * 24],
                sensors: None
            }
            .lifted(Period::Day)
            .starts,
            vec![0, 86_400]
        );
    }

    #[test]
    fn touched_starts_become_ranges_and_the_largest_command_stays_small() {
        let touched = Touched {
            starts: vec![0, 60, 120, 3720, 3720 + 3601, 86_400 * 3],
            sensors: Some(
                (0..NARROW_SENSORS)
                    .map(|i| format!("{i:0>width$}", width = SENSOR_MAX_LEN))
                    .collect(),
            ),
        };
        let filters = flush_filters(&touched, 60);
        let ranges: Vec<(i64, i64)> = filters
            .iter()
            .map(|f| {
                let r = f.get_document("start").expect("start");
                let at = |k: &str| r.get_datetime(k).expect("date").timestamp_millis() / 1000;
                (at("$gte"), at("$lt"))
            })
            .collect();
        assert_eq!(
            ranges,
            vec![(0, 3780), (7321, 7381), (259_200, 259_260)],
            "half-open: a lone start is [start, start + 60)"
        );
        for f in filters {
            let p = pipeline(Period::Hour, Source::Buckets, f, "rollups", Mode::Merge);
            let body = doc! { "aggregate": "buckets", "pipeline": p, "cursor": {} };
            let bytes = mongodb::bson::to_vec(&body).expect("encodes").len();
            assert!(bytes < 64 * 1024, "{bytes} bytes");
        }
    }

    #[test]
    fn neighbouring_sources_are_one_range_at_every_level() {
        let days = Touched {
            starts: vec![0, 86_400, 3 * 86_400],
            sensors: None,
        };
        // Day rollups, a day apart, feeding the 30-day level: a flush over
        // midnight is one aggregation; a gap of two days is not bridged.
        let source = Source::of(Period::Days30, Granularity::Minute);
        assert_eq!(source, Source::Rollups(Period::Day));
        assert_eq!(
            flush_filters(&days, source.len(Granularity::Minute)).len(),
            2
        );
        assert_eq!(flush_filters(&days, 3600).len(), 3);
    }

    #[test]
    fn day_rollups_read_hour_rollups_only_with_minute_buckets() {
        assert_eq!(
            Source::of(Period::Day, Granularity::Minute),
            Source::Rollups(Period::Hour)
        );
        assert_eq!(Source::of(Period::Day, Granularity::Hour), Source::Buckets);
        let p = pipeline(
            Period::Day,
            Source::Rollups(Period::Hour),
            doc! {},
            "rollups",
            Mode::Replace,
        );
        assert_eq!(
            p[0].get_document("$match").expect("match"),
            &doc! { "period": "hour" }
        );
        assert_eq!(
            p[5].get_document("$merge")
                .expect("merge")
                .get_str("whenMatched"),
            Ok("replace")
        );
    }
}
