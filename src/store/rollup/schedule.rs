//! When each hour of each series is rolled up: the pure core of the rollup
//! upkeep (see the folder's page), with the clock passed in.
//!
//! A flush reports what it stored. Each `(series, hour)` whose hour has
//! ended is handed back: the flush marks it late (`store::rollup::late`), before it
//! counts as stored, and it is rolled up once writes into it pause. An hour
//! still open is remembered, with a sequence number of its last write, and
//! is due `close_after` after it ends, unless a roll-up of the hours marked
//! late reads it first (an hour's last held bucket is written just after
//! the hour ends, so that is the usual case). Memory holds one entry per
//! series and open hour written by this instance.

use std::collections::{BTreeMap, HashMap};

use crate::domain::BucketUpdate;

/// Seconds in the unit the upkeep closes: an hour (the hour document of
/// minute buckets, the day document's hour slot of hour buckets).
pub const HOUR: i64 = 3600;

/// One series and one hour to roll up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Job {
    pub sensor: String,
    pub metric: String,
    /// Epoch seconds, a multiple of an hour.
    pub hour: i64,
}

/// A job handed out, with the write it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub job: Job,
    seq: u64,
}

/// The upkeep's memory of open hours.
#[derive(Debug)]
pub struct Upkeep {
    /// Seconds after an hour ends before a remembered hour is rolled up.
    close_after: i64,
    /// Per hour, the series written in it and the sequence of their last write.
    open: BTreeMap<i64, HashMap<(String, String), u64>>,
    entries: usize,
    seq: u64,
}

impl Upkeep {
    pub fn new(close_after: i64) -> Self {
        Self {
            close_after: close_after.max(0),
            open: BTreeMap::new(),
            entries: 0,
            seq: 0,
        }
    }

    /// Remembered `(series, hour)` not yet rolled up.
    pub fn pending(&self) -> usize {
        self.entries
    }

    /// A flush stored `updates`; `now` is the wall clock after the write
    /// (epoch seconds). Answers the ended hours written (sorted, distinct),
    /// which the flush marks late, and remembers the open hours.
    pub fn stored<'a>(
        &mut self,
        updates: impl IntoIterator<Item = &'a BucketUpdate>,
        now: i64,
    ) -> Vec<Job> {
        self.seq += 1;
        let mut now_jobs = Vec::new();
        for u in updates {
            let hour = u.key.start - u.key.start.rem_euclid(HOUR);
            let series = (
                u.key.sensor.as_str().to_owned(),
                u.key.metric.as_str().to_owned(),
            );
            if hour + HOUR <= now {
                now_jobs.push(Job {
                    sensor: series.0,
                    metric: series.1,
                    hour,
                });
            } else {
                let before = self.open.entry(hour).or_default().insert(series, self.seq);
                self.entries += usize::from(before.is_none());
            }
        }
        now_jobs.sort_unstable();
        now_jobs.dedup();
        now_jobs
    }

    /// Remembered hours that ended `close_after` ago or more, at most `max`.
    pub fn due(&self, now: i64, max: usize) -> Vec<Due> {
        self.starting_until(now - HOUR - self.close_after, max)
    }

    /// Every remembered hour that has ended (at shutdown: this instance
    /// writes nothing more), at most `max`.
    pub fn ended(&self, now: i64, max: usize) -> Vec<Due> {
        self.starting_until(now - HOUR, max)
    }

    fn starting_until(&self, last: i64, max: usize) -> Vec<Due> {
        let mut out = Vec::new();
        for (&hour, series) in self.open.range(..=last) {
            for ((sensor, metric), &seq) in series {
                if out.len() >= max {
                    return out;
                }
                out.push(Due {
                    job: Job {
                        sensor: sensor.clone(),
                        metric: metric.clone(),
                        hour,
                    },
                    seq,
                });
            }
        }
        out
    }

    /// These jobs were rolled up: their entries are forgotten unless written
    /// again since they were handed out.
    pub fn done(&mut self, jobs: &[Due]) {
        for d in jobs {
            self.forget(&d.job, d.seq);
        }
    }

    /// Marks the writes stored so far: taken by another roll-up (of the
    /// hours marked late) before it reads buckets, for [`Self::rolled_up`].
    pub fn mark(&self) -> u64 {
        self.seq
    }

    /// A roll-up of the hours marked late read `jobs`' buckets after
    /// [`Self::mark`] answered `mark` at `at`. The remembered entries of
    /// those hours, if they had ended by `at`, are covered unless written
    /// since: they are forgotten, not rolled up a second time once due (the
    /// last held bucket of an hour is written after it ends, so it is
    /// marked late and rolled up well before the hour is due here).
    pub fn rolled_up(&mut self, jobs: &[Job], mark: u64, at: i64) {
        for job in jobs.iter().filter(|j| j.hour + HOUR <= at) {
            self.forget(job, mark);
        }
    }

    fn forget(&mut self, job: &Job, seq: u64) {
        let Some(series) = self.open.get_mut(&job.hour) else {
            return;
        };
        let key = (job.sensor.clone(), job.metric.clone());
        if series.get(&key).is_some_and(|&s| s <= seq) {
            series.remove(&key);
            self.entries -= 1;
        }
        if series.is_empty() {
            self.open.remove(&job.hour);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::{BucketKey, MetricName, SensorId};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A one-reading update of `sensor`'s default metric (shared by `late`).
    pub(crate) fn update(sensor: &str, start: i64) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse(sensor.to_owned())
                    .expect("valid")
                    .into_owned(),
                metric: MetricName::default_metric(),
                start,
            },
            values: vec![(0, 1.0)],
            acks: Vec::new(),
        }
    }

    #[test]
    fn ended_hours_are_handed_back_and_open_ones_are_due_later() {
        let mut u = Upkeep::new(60);
        let now = 10 * HOUR + 30;
        let jobs = u.stored(&[update("a", 9 * HOUR + 120), update("b", 10 * HOUR)], now);
        assert_eq!(jobs.len(), 1, "the ended hour");
        assert_eq!(jobs[0].hour, 9 * HOUR);
        assert_eq!(u.pending(), 1);
        assert!(u.due(11 * HOUR + 59, 10).is_empty(), "not yet due");
        let due = u.due(11 * HOUR + 60, 10);
        assert_eq!(due.len(), 1);
        u.done(&due);
        assert_eq!(u.pending(), 0);
    }

    #[test]
    fn a_write_after_a_job_was_handed_out_keeps_its_hour_remembered() {
        let mut u = Upkeep::new(0);
        u.stored(&[update("a", 0)], 100);
        let due = u.due(HOUR, 10);
        u.stored(&[update("a", 60)], 200);
        u.done(&due);
        assert_eq!(u.pending(), 1, "written again while rolling up");
    }

    proptest! {
        /// Against a model: every (series, hour) written is rolled up by
        /// some roll-up that started after its last write, once its hour
        /// has ended (marked late at once) or `close_after` later (the roller).
        #[test]
        fn every_write_is_covered_by_a_later_roll_up(
            events in prop::collection::vec((0usize..3, 0i64..4, 0i64..200, 0u8..4, any::<u16>()), 1..60),
            close_after in 0i64..120,
        ) {
            let mut u = Upkeep::new(close_after);
            let mut now = 0;
            // (series, hour) → the event of its last write, and whether a
            // roll-up started after it.
            let mut model: BTreeMap<(usize, i64), (usize, bool)> = BTreeMap::new();
            // A late roll-up under way: its mark, time, event and jobs.
            let mut late: Option<(u64, i64, usize, Vec<Job>)> = None;
            for (event, (sensor, hour, wait, action, pick)) in events.into_iter().enumerate() {
                now += wait * 60;
                let start = hour * HOUR + (now % HOUR).min(HOUR - 60) / 60 * 60;
                let name = format!("s{sensor}");
                let jobs = u.stored(&[update(&name, start)], now);
                model.insert((sensor, hour), (event, false));
                for j in &jobs {
                    let s: usize = j.sensor[1..].parse().expect("index");
                    model.insert((s, j.hour / HOUR), (event, true));
                }
                match action {
                    1 => {
                        let due = u.due(now, usize::MAX);
                        for d in &due {
                            let s: usize = d.job.sensor[1..].parse().expect("index");
                            prop_assert!(d.job.hour + HOUR + close_after <= now);
                            if let Some(e) = model.get_mut(&(s, d.job.hour / HOUR)) {
                                e.1 = true;
                            }
                        }
                        u.done(&due);
                    }
                    // A late roll-up starts: of any hours, ended or not
                    // (another instance's clock may run ahead).
                    2 if late.is_none() => {
                        let jobs = (0..12)
                            .filter(|k| pick & (1 << k) != 0)
                            .map(|k| Job { sensor: format!("s{}", k % 3), metric: MetricName::default_metric().as_str().to_owned(), hour: (k / 3) as i64 * HOUR })
                            .collect();
                        late = Some((u.mark(), now, event, jobs));
                    }
                    // It ends: what it read covers the writes before it,
                    // in the hours that had ended when it started (an open
                    // hour's slots must not count as complete).
                    3 => if let Some((mark, at, started, jobs)) = late.take() {
                        for j in jobs.iter().filter(|j| j.hour + HOUR <= at) {
                            let s: usize = j.sensor[1..].parse().expect("index");
                            if let Some(e) = model.get_mut(&(s, j.hour / HOUR))
                                && e.0 <= started
                            {
                                e.1 = true;
                            }
                        }
                        u.rolled_up(&jobs, mark, at);
                    }
                    _ => {}
                }
            }
            // At the end: whatever is not covered is still remembered.
            let remembered: BTreeSet<(usize, i64)> = u
                .ended(i64::MAX / 2, usize::MAX)
                .iter()
                .map(|d| (d.job.sensor[1..].parse().expect("index"), d.job.hour / HOUR))
                .collect();
            for (key, (_, covered)) in &model {
                prop_assert!(*covered || remembered.contains(key), "{:?} was lost", key);
            }
        }
    }
}
