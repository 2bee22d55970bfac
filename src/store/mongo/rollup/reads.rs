//! What the rollup upkeep reads (`rollups`): the buckets of the hours to
//! roll up, whole or only the minutes a flush wrote into an hour whose
//! document exists, and the stored rollup documents.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use mongodb::bson::{Bson, Document, RawDocument, doc};

use crate::domain::{BucketRead, Granularity, Period, RollupRead, Slot};
use crate::store::StoreError;
use crate::store::document::start_date;
use crate::store::mongo::MongoStore;
use crate::store::mongo::shapes::Series;
use crate::store::rollup::compute::{Hour, ReadBack, roll_hour, roll_hours_of};
use crate::store::rollup::schedule::HOUR;
use crate::store::rollup::{all_slots, read_rollup};

/// Sensors in one `$in` of the upkeep's reads.
pub(in crate::store::mongo) const SENSORS_PER_READ: usize = 200;

/// What a roll-up reads of a bucket.
pub(in crate::store::mongo) fn bucket_fields() -> Document {
    doc! { "_id": 0, "sensor": 1, "metric": 1, "start": 1, "v": 1, "n": 1, "count": 1, "sum": 1, "min": 1, "max": 1, "schema_version": 1 }
}

/// The series of a bucket or rollup document read.
pub(in crate::store::mongo) fn series_of(d: &RawDocument) -> Series {
    (
        d.get_str("sensor").unwrap_or_default().to_owned(),
        d.get_str("metric").unwrap_or_default().to_owned(),
    )
}

/// Per hour: the series rolled up from their hour document with the minutes
/// to read for each, and the union of those minutes.
type HourPlan<'a> = (Vec<(&'a Series, u64)>, u64);

/// The minutes (bits 0–59) a flush wrote into each ended hour of a series:
/// only those buckets are read again, the hour document holds the rest.
pub type Written = HashMap<(Series, i64), u64>;

/// What a roll-up read and wrote, for the write and read counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Upkept {
    pub round_trips: usize,
    pub buckets_read: u64,
    pub rollups_read: u64,
    pub rollups_written: u64,
}

impl std::ops::AddAssign for Upkept {
    fn add_assign(&mut self, other: Self) {
        self.round_trips += other.round_trips;
        self.buckets_read += other.buckets_read;
        self.rollups_read += other.rollups_read;
        self.rollups_written += other.rollups_written;
    }
}
impl MongoStore {
    /// Reads the buckets of the hours asked, per series, and rolls each hour
    /// up (an hour with no bucket rolls up to an empty slot).
    pub(in crate::store::mongo) async fn roll_hours(
        &self,
        hours: &BTreeMap<Series, BTreeSet<i64>>,
        written: Option<&Written>,
        cost: &mut Upkept,
    ) -> Result<BTreeMap<Series, BTreeMap<i64, Hour>>, StoreError> {
        let mut out: BTreeMap<Series, BTreeMap<i64, Hour>> = BTreeMap::new();
        let mut hours = hours.clone();
        if let Some(written) = written.filter(|_| self.granularity == Granularity::Minute) {
            self.roll_written_hours(&mut hours, written, &mut out, cost)
                .await?;
        }
        // Runs of consecutive hours, and the series sharing each run: one
        // read per run (and batch of sensors).
        let mut runs: BTreeMap<(i64, i64), Vec<&Series>> = BTreeMap::new();
        for (series, hs) in &hours {
            let mut run: Option<(i64, i64)> = None;
            for &h in hs {
                run = match run {
                    Some((a, b)) if b == h => Some((a, h + HOUR)),
                    Some(r) => {
                        runs.entry(r).or_default().push(series);
                        Some((h, h + HOUR))
                    }
                    None => Some((h, h + HOUR)),
                };
            }
            if let Some(r) = run {
                runs.entry(r).or_default().push(series);
            }
        }
        // Each chunk's hours are rolled up as soon as its buckets are read,
        // so the values held at once are one chunk's, not every hour's.
        for ((from, to), series) in &runs {
            for chunk in series.chunks(SENSORS_PER_READ) {
                let mut read = ReadBack::new(
                    self.granularity,
                    chunk.iter().map(|s| (s.0.as_str(), s.1.as_str())),
                );
                let rest = doc! { "start": { "$gte": start_date(*from), "$lt": start_date(*to) } };
                self.traffic.give_way().await;
                cost.round_trips += self
                    .each_series_document(&self.buckets, chunk, &rest, &bucket_fields(), |d| {
                        cost.buckets_read += 1;
                        read.add(d, |_, _| true).map(drop)
                    })
                    .await?;
                for &series in chunk {
                    let buckets = read.take(&series.0, &series.1);
                    let rolled = out.entry(series.clone()).or_default();
                    for hour in
                        roll_hours_of(self.granularity, self.sketch_accuracy, *from, *to, &buckets)
                    {
                        rolled.insert(hour.start, hour);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Rolls up the hours of `hours` a flush wrote into whose hour document
    /// exists, from that document's complete minute slots and the buckets of
    /// the minutes written (or not complete): those hours leave `hours`, the
    /// rest are read whole by the caller. Slots carry their write counts, so
    /// a stored minute slot older than another writer's bucket loses to that
    /// writer's own roll-up.
    async fn roll_written_hours(
        &self,
        hours: &mut BTreeMap<Series, BTreeSet<i64>>,
        written: &Written,
        out: &mut BTreeMap<Series, BTreeMap<i64, Hour>>,
        cost: &mut Upkept,
    ) -> Result<(), StoreError> {
        // Long: one pass over the hour documents and the buckets written: the slots kept, the minutes read again and the hours done share them.
        // Borrowed keys: a probe per hour asked must not build two strings.
        let was_written: HashSet<(&str, &str, i64)> = written
            .keys()
            .map(|((sensor, metric), h)| (sensor.as_str(), metric.as_str(), *h))
            .collect();
        let asked: BTreeMap<Series, BTreeSet<i64>> = hours
            .iter()
            .map(|(series, hs)| {
                let hs: BTreeSet<i64> = hs
                    .iter()
                    .copied()
                    .filter(|&h| was_written.contains(&(series.0.as_str(), series.1.as_str(), h)))
                    .collect();
                (series.clone(), hs)
            })
            .filter(|(_, hs)| !hs.is_empty())
            .collect();
        if asked.is_empty() {
            return Ok(());
        }
        let stored = self.read_rollups(Period::Hour, &asked, cost).await?;
        // Per hour, the series rolled up from their document, with the
        // minutes to read, and the union of those minutes (one read).
        let mut plan: BTreeMap<i64, HourPlan> = BTreeMap::new();
        for (series, hs) in &asked {
            for &h in hs {
                let Some(doc) = stored.get(&(series.clone(), h)) else {
                    continue;
                };
                let all = all_slots(Period::Hour);
                let minutes = (written[&(series.clone(), h)] | !doc.complete) & all;
                let (list, union) = plan.entry(h).or_default();
                list.push((series, minutes));
                *union |= minutes;
            }
        }
        let mut fresh: HashMap<(Series, i64), Vec<BucketRead>> = HashMap::new();
        for (&h, (list, union)) in &plan {
            let starts: Vec<Bson> = (0..60)
                .filter(|k| union & (1 << k) != 0)
                .map(|k| Bson::DateTime(start_date(h + k * 60)))
                .collect();
            for chunk in list.chunks(SENSORS_PER_READ) {
                if starts.is_empty() {
                    break;
                }
                let mut read = ReadBack::new(
                    self.granularity,
                    chunk.iter().map(|(s, _)| (s.0.as_str(), s.1.as_str())),
                );
                let rest = doc! { "start": { "$in": starts.clone() } };
                let series: Vec<&Series> = chunk.iter().map(|&(s, _)| s).collect();
                self.traffic.give_way().await;
                cost.round_trips += self
                    .each_series_document(&self.buckets, &series, &rest, &bucket_fields(), |d| {
                        cost.buckets_read += 1;
                        // Only the minutes this series asked (the read is of
                        // the union of every series' minutes).
                        let asked = |position: usize, start: i64| {
                            let k = (start - h).div_euclid(60);
                            (0..60).contains(&k)
                                && chunk.get(position).is_some_and(|&(_, m)| m & (1 << k) != 0)
                        };
                        read.add(d, asked).map(drop)
                    })
                    .await?;
                for &(series, _) in chunk {
                    let buckets = read.take(&series.0, &series.1);
                    if !buckets.is_empty() {
                        fresh.insert((series.clone(), h), buckets);
                    }
                }
            }
        }
        for (&h, (list, _)) in &plan {
            for &(series, minutes) in list {
                let doc = &stored[&(series.clone(), h)];
                let bs = fresh.remove(&(series.clone(), h)).unwrap_or_default();
                let read = roll_hour(Granularity::Minute, self.sketch_accuracy, h, &bs);
                // The hour's slots: the ones read, and the stored ones of the
                // minutes not read (complete, so equal to their buckets).
                let mut slots: Vec<Slot> = doc
                    .slots
                    .iter()
                    .filter(|s| minutes & (1 << ((s.start - h) / 60)) == 0)
                    .cloned()
                    .chain(read.minutes.iter().cloned())
                    .collect();
                slots.sort_by_key(|s| s.start);
                // Minutes read without a bucket are written as empty slots.
                let minutes_written: Vec<Slot> = (0..60)
                    .filter(|k| minutes & (1 << k) != 0)
                    .map(|k| {
                        let at = h + k * 60;
                        read.minutes
                            .iter()
                            .find(|s| s.start == at)
                            .cloned()
                            .unwrap_or_else(|| Slot::empty(at))
                    })
                    .collect();
                out.entry(series.clone()).or_default().insert(
                    h,
                    Hour {
                        start: h,
                        minutes: minutes_written,
                        slot: Slot::of_slots(h, &slots),
                        partial: true,
                    },
                );
                if let Some(hs) = hours.get_mut(series) {
                    hs.remove(&h);
                }
            }
        }
        hours.retain(|_, hs| !hs.is_empty());
        Ok(())
    }

    /// The rollup documents of `period` asked for, per series and start.
    pub(in crate::store::mongo) async fn read_rollups(
        &self,
        period: Period,
        asked: &BTreeMap<Series, BTreeSet<i64>>,
        cost: &mut Upkept,
    ) -> Result<HashMap<(Series, i64), RollupRead>, StoreError> {
        let mut out = HashMap::new();
        let all: Vec<(&Series, &BTreeSet<i64>)> = asked.iter().collect();
        for chunk in all.chunks(SENSORS_PER_READ) {
            let starts: BTreeSet<i64> = chunk.iter().flat_map(|(_, s)| s.iter().copied()).collect();
            let rest = doc! {
                "period": period.name(),
                "start": { "$in": starts.iter().map(|&s| Bson::DateTime(start_date(s))).collect::<Vec<_>>() },
            };
            let series: Vec<&Series> = chunk.iter().map(|&(s, _)| s).collect();
            let projection = doc! { "_id": 0, "sensor": 1, "metric": 1, "start": 1, "s": 1, "w": 1, "complete": 1, "schema_version": 1 };
            self.traffic.give_way().await;
            cost.round_trips += self
                .each_series_document(&self.rollups, &series, &rest, &projection, |d| {
                    cost.rollups_read += 1;
                    let key = series_of(d);
                    let r = read_rollup(d, period, Some(self.sketch_accuracy))?;
                    if asked.get(&key).is_some_and(|s| s.contains(&r.start)) {
                        out.insert((key, r.start), r);
                    }
                    Ok(())
                })
                .await?;
        }
        Ok(out)
    }
}
