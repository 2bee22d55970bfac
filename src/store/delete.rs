//! Deleting readings by series and range: the pure parts.
//!
//! A delete is recorded first as a *tombstone* in the metadata collection,
//! `{_id: "delete:<uuid>", sensors, metric, from, to, at}`: the sensors it
//! covers (sorted), one metric or every metric, the range in epoch seconds
//! `[from, to)`, and `at`, the acknowledgement time of the delete (epoch
//! ms, on the same clock as readings'). A reading is deleted when it lies
//! in the range and was acknowledged before `at`; one acknowledged later
//! is a new write and stays.
//!
//! Every instance reads the tombstones with the floors, once a second, and
//! from then on drops the readings they delete from whatever it writes:
//! held in its batcher, in its journal, replayed after a crash (tombstones
//! are read before a replay). Then the buckets already stored are edited
//! ([`removals`]), and the rollups of the hours touched are recomputed. A
//! tombstone stays until no instance may still hold a reading acknowledged
//! before it (every floor is past `at`).

use std::borrow::Cow;

use mongodb::bson::{Bson, Document, doc};

use crate::domain::BucketUpdate;
use crate::store::errors::StoreError;

/// The `_id` prefix of tombstones in the metadata collection.
pub const PREFIX: &str = "delete:";

/// One recorded delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    pub id: String,
    /// Sorted, without duplicates.
    pub sensors: Vec<String>,
    /// `None`: every metric.
    pub metric: Option<String>,
    /// Epoch seconds, `[from, to)`.
    pub from: i64,
    pub to: i64,
    /// The delete's acknowledgement time, epoch ms.
    pub at: i64,
}

impl Tombstone {
    pub fn covers(&self, sensor: &str, metric: &str) -> bool {
        self.metric.as_deref().is_none_or(|m| m == metric)
            && self
                .sensors
                .binary_search_by(|s| s.as_str().cmp(sensor))
                .is_ok()
    }

    /// Whether the reading at `ts` acknowledged at `ack` is deleted.
    pub fn deletes(&self, ts: i64, ack: i64) -> bool {
        (self.from..self.to).contains(&ts) && ack < self.at
    }

    pub fn document(&self) -> Document {
        doc! {
            "_id": &self.id,
            "sensors": &self.sensors,
            "metric": self.metric.as_deref().map_or(Bson::Null, |m| Bson::String(m.to_owned())),
            "from": self.from,
            "to": self.to,
            "at": self.at,
        }
    }

    /// A stored tombstone; `None` if it is not one this version can read.
    pub fn read(d: &Document) -> Option<Self> {
        let id = d.get_str("_id").ok()?;
        if !id.starts_with(PREFIX) {
            return None;
        }
        let int = |k: &str| match d.get(k)? {
            Bson::Int64(x) => Some(*x),
            Bson::Int32(x) => Some(i64::from(*x)),
            _ => None,
        };
        let mut sensors: Vec<String> = d
            .get_array("sensors")
            .ok()?
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
        sensors.sort_unstable();
        sensors.dedup();
        Some(Self {
            id: id.to_owned(),
            sensors,
            metric: d.get_str("metric").ok().map(str::to_owned),
            from: int("from")?,
            to: int("to")?,
            at: int("at")?,
        })
    }
}

/// What a delete covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub sensors: Vec<String>,
    /// `None`: every metric.
    pub metric: Option<String>,
    /// Epoch seconds, `[from, to)`.
    pub from: i64,
    pub to: i64,
}

/// What a delete removed (or, dry, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Deleted {
    pub readings: u64,
    /// Buckets that keep other readings.
    pub buckets_edited: u64,
    /// Buckets left with nothing, deleted.
    pub buckets_deleted: u64,
    /// Series (sensor and metric) with nothing left, taken out of the
    /// registry's metrics.
    pub series_emptied: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The tombstone is recorded and every write follows it once the
    /// instance reads it; the buckets are not edited yet. Sending the
    /// delete again finishes it.
    #[error("instance {0} has not taken the delete in yet; send it again")]
    NotSeen(String),
}

/// `update` without the readings the tombstones delete: borrowed when none
/// is, `None` when nothing is left.
pub fn without_deleted<'a>(
    update: &'a BucketUpdate,
    tombstones: &[Tombstone],
) -> Option<Cow<'a, BucketUpdate>> {
    let (sensor, metric) = (update.key.sensor.as_str(), update.key.metric.as_str());
    let covering: Vec<&Tombstone> = tombstones
        .iter()
        .filter(|t| t.covers(sensor, metric))
        .collect();
    let start = update.key.start;
    // Values without a recorded acknowledgement count as the oldest.
    let ack = |i: usize| update.acks.get(i).copied().unwrap_or(i64::MIN);
    let deleted = |i: usize, offset: u16| {
        covering
            .iter()
            .any(|t| t.deletes(start + i64::from(offset), ack(i)))
    };
    if covering.is_empty()
        || !update
            .values
            .iter()
            .enumerate()
            .any(|(i, &(o, _))| deleted(i, o))
    {
        return Some(Cow::Borrowed(update));
    }
    let mut kept = BucketUpdate {
        key: update.key.clone(),
        values: Vec::with_capacity(update.values.len()),
        acks: Vec::with_capacity(update.acks.len()),
    };
    for (i, &(o, v)) in update.values.iter().enumerate() {
        if !deleted(i, o) {
            kept.values.push((o, v));
            if let Some(&a) = update.acks.get(i) {
                kept.acks.push(a);
            }
        }
    }
    (!kept.values.is_empty()).then_some(Cow::Owned(kept))
}

/// The offsets of a stored bucket (starting at `start`) a delete of
/// `[from, to)` acknowledged at `at` removes: values in the range whose
/// version is older than `at` or gone (pruned: older than every floor, so
/// older than any write concurrent with the delete).
pub fn removals(
    start: i64,
    values: &[(u16, f64)],
    versions: &[(u16, i64)],
    from: i64,
    to: i64,
    at: i64,
) -> Vec<u16> {
    values
        .iter()
        .filter(|&&(o, _)| (from..to).contains(&(start + i64::from(o))))
        .filter(|&&(o, _)| {
            versions
                .binary_search_by_key(&o, |&(vo, _)| vo)
                .map_or(true, |i| versions[i].1 < at)
        })
        .map(|&(o, _)| o)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketKey, MetricName, SensorId};
    use proptest::prelude::*;

    fn tomb(sensors: &[&str], metric: Option<&str>, from: i64, to: i64, at: i64) -> Tombstone {
        let mut sensors: Vec<String> = sensors.iter().map(|s| (*s).to_owned()).collect();
        sensors.sort();
        Tombstone {
            id: "delete:x".into(),
            sensors,
            metric: metric.map(str::to_owned),
            from,
            to,
            at,
        }
    }

    fn update(sensor: &str, start: i64, values: &[(u16, f64, i64)]) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse(sensor.to_owned()).expect("valid"),
                metric: MetricName::parse("temp".to_owned()).expect("valid"),
                start,
            },
            values: values.iter().map(|&(o, v, _)| (o, v)).collect(),
            acks: values.iter().map(|&(_, _, a)| a).collect(),
        }
    }

    #[test]
    fn a_tombstone_reads_back_as_written() {
        let t = tomb(&["b", "a"], Some("temp"), 60, 120, 5_000);
        assert_eq!(Tombstone::read(&t.document()), Some(t.clone()));
        let every = tomb(&["a"], None, 0, 60, 1);
        assert_eq!(Tombstone::read(&every.document()), Some(every));
        assert_eq!(Tombstone::read(&doc! { "_id": "instance:x" }), None);
    }

    #[test]
    fn only_readings_in_range_and_acknowledged_before_the_delete_are_dropped() {
        let t = [tomb(&["s1"], Some("temp"), 100, 110, 1_000)];
        let u = update(
            "s1",
            60,
            &[
                (39, 1.0, 10),
                (40, 2.0, 999),
                (41, 3.0, 1_000),
                (50, 4.0, 1),
            ],
        );
        let kept = without_deleted(&u, &t).expect("some left");
        // 99 is before the range, 100 is deleted, 101 was acknowledged at
        // the delete (kept), 110 is past the range.
        assert_eq!(kept.values, vec![(39, 1.0), (41, 3.0), (50, 4.0)]);
        assert_eq!(kept.acks, vec![10, 1_000, 1]);
        let other = update("s2", 60, &[(40, 2.0, 1)]);
        assert!(matches!(
            without_deleted(&other, &t),
            Some(Cow::Borrowed(_))
        ));
        let all = update("s1", 60, &[(40, 2.0, 1), (45, 2.0, 1)]);
        assert!(without_deleted(&all, &t).is_none());
        let untouched = update("s1", 0, &[(1, 1.0, 1)]);
        assert!(matches!(
            without_deleted(&untouched, &t),
            Some(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn stored_values_are_removed_unless_their_version_is_newer_than_the_delete() {
        let values = [(0, 1.0), (5, 2.0), (10, 3.0), (20, 4.0)];
        let versions = [(5, 2_000), (10, 500)];
        assert_eq!(removals(100, &values, &versions, 105, 120, 1_000), vec![10]);
        assert_eq!(
            removals(100, &values, &[], 100, 200, 1_000),
            vec![0, 5, 10, 20]
        );
        assert!(removals(100, &values, &[], 200, 300, 1_000).is_empty());
    }

    proptest! {
        /// Against a model: a value stays exactly when no covering tombstone
        /// has it in range with an older acknowledgement.
        #[test]
        fn filtering_matches_the_model(
            values in proptest::collection::btree_map(0u16..60, (-5.0f64..5.0, 0i64..20), 0..20),
            tombs in proptest::collection::vec((0i64..80, 0i64..30, 0i64..25, any::<bool>()), 0..4),
        ) {
            let start = 60;
            let vs: Vec<(u16, f64, i64)> = values.iter().map(|(&o, &(v, a))| (o, v, a)).collect();
            let u = update("s1", start, &vs);
            let ts: Vec<Tombstone> = tombs
                .iter()
                .map(|&(from, len, at, mine)| tomb(&[if mine { "s1" } else { "s9" }], None, from + 40, from + 40 + len, at))
                .collect();
            let want: Vec<(u16, f64)> = vs
                .iter()
                .filter(|&&(o, _, a)| {
                    !ts.iter().any(|t| t.sensors == ["s1"] && (t.from..t.to).contains(&(start + i64::from(o))) && a < t.at)
                })
                .map(|&(o, v, _)| (o, v))
                .collect();
            let got = without_deleted(&u, &ts).map(|c| c.values.clone()).unwrap_or_default();
            prop_assert_eq!(got, want);
        }
    }
}
