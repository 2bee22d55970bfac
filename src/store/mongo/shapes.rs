//! What the server in front of us answers from its indexes, found out at
//! startup, and what is done where it does not.
//!
//! MongoDB bounds every command the service sends by an index: the unique
//! key's fields pinned, any other predicate checked on the few documents
//! found, and a `$in` of sensors as one interval per sensor. Another server
//! may not: the local stand-in (SecantusDB) answers a filter from an index
//! only when its fields are an index's leading fields (equalities, then one
//! range), and scans every document of the listed sensors for a `$in`.
//! So each shape is asked of the server with `explain`:
//! - a write filter with a predicate beyond the unique key (the version
//!   guard, a delete's write counter) gets an index with that field after
//!   the key where the server would scan;
//! - reads of many series go as one `$in` where the server examines what
//!   it returns, and as concurrent finds of one series each where it
//!   examines more.

use std::collections::BTreeSet;

use mongodb::bson::{Bson, DateTime, Document, doc, oid::ObjectId};
use mongodb::options::IndexOptions;
use mongodb::{Collection, Database, IndexModel};
use tracing::{info, warn};

use super::classify::classify;
use crate::store::StoreError;

/// A series: sensor and metric.
pub type Series = (String, String);

/// How reads of many series are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadShape {
    /// `{sensor: {$in: […]}, …}`: one command, each sensor's index interval.
    #[default]
    InList,
    /// One find per series, `CONCURRENT_FINDS` at a time.
    PerSeries,
}

impl ReadShape {
    /// The `shape` label of `hourglass_store_read_shape`.
    pub fn name(self) -> &'static str {
        match self {
            ReadShape::InList => "in_list",
            ReadShape::PerSeries => "per_series",
        }
    }
}

/// Finds of one series each in flight at once ([`ReadShape::PerSeries`]).
pub const CONCURRENT_FINDS: usize = 8;

/// Where reads go one find per series, a level read of at least this many
/// series may go as one find by metric and time instead (see
/// [`bound_reads`]), when what it takes beyond what was asked is small.
pub const TIME_FIRST_MIN_SERIES: usize = 16;
/// What a time-first read may take beyond what was asked, in documents per
/// series asked: about what a round trip costs on the stand-in (2 ms). The
/// documents beyond are the metric's other series' in the range, counted
/// at most: every start asked, for each of them.
pub const TIME_FIRST_SPARE: u64 = 32;
/// How long a metric's count of series is trusted (it only chooses a shape).
pub const SERIES_COUNT_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The time-first indexes: `(name, keys)` of the buckets' and the rollups'.
fn time_first_indexes() -> [(&'static str, Document); 2] {
    [
        ("metric_start", doc! { "metric": 1, "start": 1 }),
        (
            "metric_period_start",
            doc! { "metric": 1, "period": 1, "start": 1 },
        ),
    ]
}

/// Where the server scans for a `$in` of sensors ([`ReadShape::PerSeries`]),
/// one find per series costs a round trip each: about 2 ms on the stand-in,
/// so a dashboard's refresh of a hundred series over two levels takes
/// 0.4 s in round trips alone. A read that would take few documents
/// beyond what it asks goes as one find by metric and time instead
/// ([`TIME_FIRST_SPARE`]), which these indexes bound (the
/// stand-in walks them for a range or a `$in` of starts). MongoDB gets
/// neither: its `$in` is already one bounded read, and an index costs every
/// insert.
pub async fn bound_reads(
    buckets: &Collection<Document>,
    rollups: &Collection<Document>,
) -> Result<(), StoreError> {
    for (collection, (name, keys)) in [buckets, rollups].into_iter().zip(time_first_indexes()) {
        let index = IndexModel::builder()
            .keys(keys)
            .options(IndexOptions::builder().name(name.to_owned()).build())
            .build();
        collection.create_index(index).await.map_err(classify)?;
    }
    Ok(())
}

/// The indexes a server needs for its write filters to be bounded: `(name,
/// keys, a filter of that shape)`.
fn write_guards() -> [(&'static str, Document, Document); 3] {
    let start = DateTime::from_millis(0);
    [
        (
            "guard",
            doc! { "sensor": 1, "metric": 1, "start": 1, "amax": 1 },
            doc! { "sensor": "probe", "metric": "probe", "start": start, "amax": { "$lte": Bson::Null } },
        ),
        (
            "id_n",
            doc! { "_id": 1, "n": 1 },
            doc! { "_id": ObjectId::new(), "n": 3_i64 },
        ),
        (
            "id_n",
            doc! { "_id": 1, "n": 1 },
            doc! { "_id": ObjectId::new(), "n": { "$lte": Bson::Null } },
        ),
    ]
}

/// Whether the server's plan for `filter` on `collection` walks an index
/// (not a collection scan).
async fn index_bounded(
    db: &Database,
    collection: &str,
    filter: &Document,
) -> Result<bool, StoreError> {
    let reply = db
        .run_command(doc! {
            "explain": { "find": collection, "filter": filter.clone() },
            "verbosity": "queryPlanner",
        })
        .await
        .map_err(classify)?;
    let plan = reply
        .get_document("queryPlanner")
        .and_then(|q| q.get_document("winningPlan"))
        .cloned()
        .unwrap_or_default();
    Ok(has_stage(&plan, "IXSCAN") || has_stage(&plan, "IDHACK") || has_stage(&plan, "EXPRESS"))
}

/// Whether a plan (or any stage under it) is `stage`.
fn has_stage(plan: &Document, stage: &str) -> bool {
    if plan
        .get_str("stage")
        .is_ok_and(|s| s == stage || s.starts_with(stage))
    {
        return true;
    }
    plan.iter().any(|(_, v)| match v {
        Bson::Document(d) => has_stage(d, stage),
        Bson::Array(a) => a
            .iter()
            .filter_map(Bson::as_document)
            .any(|d| has_stage(d, stage)),
        _ => false,
    })
}

/// Adds the indexes the server needs for the write filters of `buckets`
/// to be bounded, where its plans say so.
pub async fn bound_writes(db: &Database, buckets: &Collection<Document>) -> Result<(), StoreError> {
    for (name, keys, filter) in write_guards() {
        if index_bounded(db, buckets.name(), &filter).await? {
            continue;
        }
        info!(
            index = name,
            keys = %keys,
            "The storage server would scan for a bucket write's filter; adding an index that bounds it (MongoDB needs none)."
        );
        let index = IndexModel::builder()
            .keys(keys)
            .options(IndexOptions::builder().name(name.to_owned()).build())
            .build();
        buckets.create_index(index).await.map_err(classify)?;
        if !index_bounded(db, buckets.name(), &filter).await? {
            warn!(
                filter = %filter,
                "The storage server scans for a bucket write's filter even with an index for it: writes cost more as history grows."
            );
        }
    }
    Ok(())
}

/// Sensors and buckets of the read probe.
const PROBE_SENSORS: usize = 4;
const PROBE_BUCKETS: i64 = 40;

/// How the server answers a read of several series over a short range,
/// measured on a scratch collection: one `$in` if it examines about what
/// it returns, one find per series otherwise.
pub async fn read_shape(db: &Database, scratch: &str) -> Result<ReadShape, StoreError> {
    let c = db.collection::<Document>(scratch);
    let _ = c.drop().await;
    c.create_index(
        IndexModel::builder()
            .keys(doc! { "sensor": 1, "metric": 1, "start": 1 })
            .build(),
    )
    .await
    .map_err(classify)?;
    let docs: Vec<Document> = (0..PROBE_SENSORS)
        .flat_map(|s| {
            (0..PROBE_BUCKETS).map(move |b| {
                doc! { "sensor": format!("p{s}"), "metric": "m", "start": DateTime::from_millis(b * 60_000) }
            })
        })
        .collect();
    c.insert_many(docs).await.map_err(classify)?;
    let sensors: Vec<String> = (0..PROBE_SENSORS).map(|s| format!("p{s}")).collect();
    // Two buckets of each sensor.
    let filter = doc! {
        "sensor": { "$in": sensors },
        "metric": "m",
        "start": { "$gte": DateTime::from_millis(10 * 60_000), "$lt": DateTime::from_millis(12 * 60_000) },
    };
    let reply = db
        .run_command(doc! {
            "explain": { "find": scratch, "filter": filter },
            "verbosity": "executionStats",
        })
        .await
        .map_err(classify);
    let _ = c.drop().await;
    let stats = reply?
        .get_document("executionStats")
        .cloned()
        .unwrap_or_default();
    let number = |k: &str| match stats.get(k) {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(n)) => *n as i64,
        _ => -1,
    };
    let (returned, examined) = (number("nReturned"), number("totalDocsExamined"));
    let shape = if returned >= 0 && examined >= 0 && examined <= 2 * returned + 2 {
        ReadShape::InList
    } else {
        ReadShape::PerSeries
    };
    info!(
        ?shape,
        returned,
        examined,
        "Measured how the storage server reads several series at once: InList sends one $in of sensors, PerSeries one find per series, concurrently."
    );
    Ok(shape)
}

/// A filter on the sensors and metrics of `series`: their product may hold
/// series nobody asked for, which the reader skips. One value is an
/// equality, not a `$in` of one: a server that scans for `$in` (see the
/// module's doc) answers an equality from its index.
pub(super) fn series_filter<'a>(series: impl Iterator<Item = &'a Series>) -> Document {
    let mut sensors = BTreeSet::new();
    let mut metrics = BTreeSet::new();
    for (sensor, metric) in series {
        sensors.insert(sensor.as_str());
        metrics.insert(metric.as_str());
    }
    let one_or_in = |values: BTreeSet<&str>| match values.len() {
        1 => Bson::String(values.into_iter().next().unwrap_or_default().to_owned()),
        _ => Bson::Document(doc! { "$in": values.into_iter().collect::<Vec<_>>() }),
    };
    doc! { "sensor": one_or_in(sensors), "metric": one_or_in(metrics) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_found_anywhere_in_a_plan() {
        let plan = doc! { "stage": "FETCH", "inputStage": { "stage": "IXSCAN" } };
        assert!(has_stage(&plan, "IXSCAN"));
        let or = doc! { "stage": "OR", "inputStages": [ { "stage": "IXSCAN" } ] };
        assert!(has_stage(&or, "IXSCAN"));
        assert!(!has_stage(&doc! { "stage": "COLLSCAN" }, "IXSCAN"));
    }

    #[test]
    fn one_sensor_or_metric_is_an_equality_and_several_a_list() {
        let one: Series = ("s1".into(), "temp".into());
        assert_eq!(
            series_filter([&one].into_iter()),
            doc! { "sensor": "s1", "metric": "temp" }
        );
        let two: Series = ("s2".into(), "temp".into());
        assert_eq!(
            series_filter([&one, &two].into_iter()),
            doc! { "sensor": { "$in": ["s1", "s2"] }, "metric": "temp" }
        );
    }
}
