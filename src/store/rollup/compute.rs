//! Rolling up (pure): buckets read back per series, and the slots of an
//! hour, a day and thirty days computed from them (`write` encodes them
//! and builds the statements; `mongo::rollup` reads and writes).

use mongodb::bson::RawDocument;

use super::schedule::HOUR;
use super::write::all_slots;
use crate::domain::{BucketRead, Granularity, Period, RollupRead, Sample, Slot};
use crate::store::StoreError;
use crate::store::document::read_bucket;

/// A bucket's readings as samples, in time order.
pub fn samples(b: &BucketRead) -> Vec<Sample> {
    let mut out = Vec::with_capacity(b.values.len());
    samples_into(b, &mut out);
    out
}

/// [`samples`] into `out` (emptied first), so that rolling up many buckets
/// reuses one buffer.
fn samples_into(b: &BucketRead, out: &mut Vec<Sample>) {
    out.clear();
    out.extend(b.values.iter().map(|&(o, v)| Sample {
        t: b.start + i64::from(o),
        v,
    }));
}

/// Buckets read back for a roll-up, kept per series asked. A document's
/// series is looked up by the names borrowed from its bytes, so reading one
/// allocates only its values: a pass reads back every bucket late flushes
/// wrote, one per 60 readings (reading them back was a tenth of a late
/// line-protocol load's CPU).
pub struct ReadBack<'a> {
    granularity: Granularity,
    /// Each series asked, by names, to its position (in the order given).
    index: hashbrown::HashMap<(&'a str, &'a str), usize>,
    buckets: Vec<Vec<BucketRead>>,
}

impl<'a> ReadBack<'a> {
    /// Reads buckets of `granularity` for `series` (a repeat is one series).
    pub fn new(
        granularity: Granularity,
        series: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        let mut index = hashbrown::HashMap::new();
        for s in series {
            let next = index.len();
            index.entry(s).or_insert(next);
        }
        let buckets = (0..index.len()).map(|_| Vec::new()).collect();
        Self {
            granularity,
            index,
            buckets,
        }
    }

    /// Reads the bucket document `d` and keeps it if its series was asked
    /// and `keep(position of the series, bucket start)` says so. A filter
    /// on sensors and metrics may match series nobody asked for: those are
    /// skipped unread. Answers whether it was kept.
    pub fn add(
        &mut self,
        d: &RawDocument,
        keep: impl FnOnce(usize, i64) -> bool,
    ) -> Result<bool, StoreError> {
        let names = (
            d.get_str("sensor").unwrap_or_default(),
            d.get_str("metric").unwrap_or_default(),
        );
        let Some(&position) = self.index.get(&names) else {
            return Ok(false);
        };
        let b = read_bucket(d, self.granularity)?;
        if !keep(position, b.start) {
            return Ok(false);
        }
        if let Some(kept) = self.buckets.get_mut(position) {
            kept.push(b);
        }
        Ok(true)
    }

    /// The buckets kept of a series, sorted by start (none if not asked).
    pub fn take(&mut self, sensor: &str, metric: &str) -> Vec<BucketRead> {
        let Some(mut kept) = self
            .index
            .get(&(sensor, metric))
            .and_then(|&p| self.buckets.get_mut(p))
            .map(std::mem::take)
        else {
            return Vec::new();
        };
        kept.sort_by_key(|b| b.start);
        kept
    }
}

/// Rolls up each hour of `[from, to)` (multiples of an hour) from `buckets`,
/// sorted by start, with sketches at `accuracy`; buckets outside the range
/// are ignored.
pub fn roll_hours_of(
    granularity: Granularity,
    accuracy: f64,
    from: i64,
    to: i64,
    buckets: &[BucketRead],
) -> Vec<Hour> {
    let mut rest = buckets;
    let mut out = Vec::new();
    let mut h = from;
    while h < to {
        let skip = rest.partition_point(|b| b.start < h);
        rest = &rest[skip..];
        let n = rest.partition_point(|b| b.start < h + HOUR);
        let (this, later) = rest.split_at(n);
        out.push(roll_hour(granularity, accuracy, h, this));
        rest = later;
        h += HOUR;
    }
    out
}

/// What an hour of one series rolls up to.
#[derive(Debug, Clone, PartialEq)]
pub struct Hour {
    pub start: i64,
    /// Minute buckets: the hour document's slots, one per bucket.
    pub minutes: Vec<Slot>,
    /// The day document's slot for the hour.
    pub slot: Slot,
    /// `minutes` holds only the minutes read again (the others stand as
    /// stored), not every minute of the hour.
    pub partial: bool,
}

/// Rolls up one hour from its buckets (sorted by start, all of the hour),
/// with sketches at `accuracy`.
pub fn roll_hour(
    granularity: Granularity,
    accuracy: f64,
    hour: i64,
    buckets: &[BucketRead],
) -> Hour {
    match granularity {
        Granularity::Minute => {
            let mut buf = Vec::new();
            let minutes: Vec<Slot> = buckets
                .iter()
                .map(|b| {
                    samples_into(b, &mut buf);
                    Slot::of(b.start, &buf, b.n)
                        .keeping(&buf)
                        .sketched(accuracy, &buf)
                })
                .collect();
            let slot = Slot::of_slots(hour, &minutes);
            Hour {
                start: hour,
                minutes,
                slot,
                partial: false,
            }
        }
        Granularity::Hour => {
            let (samples, n) = buckets
                .first()
                .map_or((Vec::new(), 0), |b| (samples(b), b.n));
            Hour {
                start: hour,
                minutes: Vec::new(),
                slot: Slot::of(hour, &samples, n)
                    .keeping(&samples)
                    .sketched(accuracy, &samples),
                partial: false,
            }
        }
    }
}

/// The 30-day slot of a day, from its complete day document.
pub fn roll_day(day: &RollupRead) -> Option<Slot> {
    (day.complete & all_slots(Period::Day) == all_slots(Period::Day))
        .then(|| Slot::of_slots(day.start, &day.slots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::document::start_date;
    use mongodb::bson::{RawDocumentBuf, doc};
    use proptest::prelude::*;

    /// A minute bucket as the upkeep's projection returns it, its values
    /// under their seconds in the order given.
    fn bucket_doc(sensor: &str, metric: &str, start: i64, values: &[(u16, f64)]) -> RawDocumentBuf {
        let mut v = mongodb::bson::Document::new();
        for (o, x) in values {
            v.insert(o.to_string(), *x);
        }
        let sum: f64 = values.iter().map(|x| x.1).sum();
        let d = doc! {
            "sensor": sensor, "metric": metric, "start": start_date(start), "v": v,
            "n": 2_i64, "count": values.len() as i64, "sum": sum,
            "min": values.iter().map(|x| x.1).fold(f64::INFINITY, f64::min),
            "max": values.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max),
            "schema_version": 2,
        };
        RawDocumentBuf::from_document(&d).expect("encodes")
    }

    proptest! {
        /// Whatever documents come back, in any order: each series asked
        /// keeps exactly its buckets that `keep` takes, and its hours roll
        /// up as each hour's buckets, sorted, roll up alone; others' are
        /// skipped.
        #[test]
        fn buckets_read_back_roll_up_as_each_hour_alone(
            docs in prop::collection::vec(
                (0usize..4, -70i64..190, prop::collection::btree_map(0u16..60, -100i32..100, 1..8), any::<bool>()),
                0..40,
            ),
            order in any::<u64>(),
        ) {
            let from = 10 * HOUR;
            let to = from + 2 * HOUR;
            let names = ["a", "b", "c", "d.e"];
            // "c" and "d.e" are not asked; series "a" is asked twice.
            let asked = [("a", "m"), ("b", "m"), ("a", "m")];
            let mut seen = std::collections::BTreeSet::new();
            // (name, start, values, kept)
            type Bucket = (usize, i64, Vec<(u16, f64)>, bool);
            let docs: Vec<Bucket> = docs
                .into_iter()
                .filter(|(s, minute, _, _)| seen.insert((*s, *minute)))
                .map(|(s, minute, v, keep)| {
                    let values = v.into_iter().rev().map(|(o, x)| (o, f64::from(x) / 4.0)).collect();
                    (s, from + minute * 60, values, keep)
                })
                .collect();
            let mut shuffled = docs.clone();
            let n = shuffled.len().max(1);
            shuffled.rotate_left(order as usize % n);
            let mut read = ReadBack::new(Granularity::Minute, asked);
            for (s, start, values, keep) in &shuffled {
                let d = bucket_doc(names[*s], "m", *start, values);
                let kept = read.add(&d, |position, at| {
                    assert_eq!(at, *start);
                    assert_eq!(asked[position].0, names[*s]);
                    *keep
                }).expect("readable");
                prop_assert_eq!(kept, *s < 2 && *keep);
            }
            for name in ["a", "b", "c"] {
                let buckets = read.take(name, "m");
                let mut want: Vec<(i64, Vec<(u16, f64)>)> = docs
                    .iter()
                    .filter(|(s, _, _, keep)| names[*s] == name && name != "c" && *keep)
                    .map(|(_, start, values, _)| {
                        let mut v = values.clone();
                        v.sort_by_key(|x| x.0);
                        (*start, v)
                    })
                    .collect();
                want.sort_by_key(|w| w.0);
                let got: Vec<(i64, Vec<(u16, f64)>)> = buckets.iter().map(|b| (b.start, b.values.clone())).collect();
                prop_assert_eq!(&got, &want);
                prop_assert!(read.take(name, "m").is_empty(), "taken once");
                let hours = roll_hours_of(Granularity::Minute, 0.01, from, to, &buckets);
                prop_assert_eq!(hours.len(), 2);
                for (k, hour) in hours.iter().enumerate() {
                    let h = from + k as i64 * HOUR;
                    let alone: Vec<BucketRead> = buckets
                        .iter()
                        .filter(|b| b.start >= h && b.start < h + HOUR)
                        .cloned()
                        .collect();
                    prop_assert_eq!(hour, &roll_hour(Granularity::Minute, 0.01, h, &alone));
                }
            }
        }
    }

    #[test]
    fn a_day_lifts_into_thirty_days_only_when_complete() {
        let mut day = RollupRead {
            start: 86_400,
            complete: all_slots(Period::Day) & !1,
            slots: vec![Slot::of(
                86_400 + 7200,
                &[Sample {
                    t: 86_400 + 7200,
                    v: 3.0,
                }],
                2,
            )],
        };
        assert_eq!(roll_day(&day), None);
        day.complete = all_slots(Period::Day);
        let slot = roll_day(&day).expect("complete");
        assert_eq!((slot.start, slot.n), (86_400, 2));
        assert_eq!(slot.summary.map(|s| s.count), Some(1));
    }
}
