//! Runs the rollup upkeep (`store::rollup`): reads the
//! buckets of the hours to roll up, computes every level, writes the slots.
//! `hourglass rebuild-rollups` drives it over whole periods (`rebuild`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use mongodb::bson::{Bson, RawDocumentBuf};

use super::outbox::Outbox;
use super::reads::{SENSORS_PER_READ, Upkept, Written};
use crate::domain::{Granularity, Period, RollupRead, Slot};
use crate::store::StoreError;
use crate::store::mongo::MongoStore;
use crate::store::mongo::shapes::Series;
use crate::store::raw_writer::Writer;
use crate::store::rollup::compute::{Hour, roll_day};
use crate::store::rollup::schedule::{HOUR, Job};
use crate::store::rollup::write_statement;

const DAY: i64 = 86_400;

/// `jobs` in parts of at most `series` series each, every series' jobs in
/// one part.
fn series_parts(jobs: &[Job], series: usize) -> Vec<Vec<Job>> {
    let mut sorted: Vec<&Job> = jobs.iter().collect();
    sorted.sort_by(|a, b| (&a.sensor, &a.metric).cmp(&(&b.sensor, &b.metric)));
    let mut parts: Vec<Vec<Job>> = Vec::new();
    let mut in_part = 0;
    let mut last: Option<(&str, &str)> = None;
    for job in sorted {
        let key = (job.sensor.as_str(), job.metric.as_str());
        if last != Some(key) {
            if in_part == series.max(1) || parts.is_empty() {
                parts.push(Vec::new());
                in_part = 0;
            }
            in_part += 1;
            last = Some(key);
        }
        if let Some(part) = parts.last_mut() {
            part.push(job.clone());
        }
    }
    parts
}

/// Each series' hours rolled up, by start.
type Rolled = BTreeMap<Series, BTreeMap<i64, Hour>>;
/// Stored rollup documents of one period, by series and start.
type Documents = HashMap<(Series, i64), RollupRead>;

/// The day and thirty-day documents a roll-up read.
#[derive(Clone, Copy)]
struct Stored<'a> {
    days: &'a Documents,
    months: &'a Documents,
}

/// The slots lifted days give their thirty-day documents, and the days
/// with replaced hours, whose thirty-day slots are replaced too.
#[derive(Default)]
struct Thirty {
    slots: BTreeMap<(Series, i64), Vec<Slot>>,
    forced: BTreeMap<(Series, i64), Vec<i64>>,
}

impl Thirty {
    /// `day`'s slot into its thirty days; `forced` when the day's hours were
    /// replaced.
    fn lift(&mut self, series: &Series, day: i64, slot: Slot, forced: bool) {
        let p = day - day.rem_euclid(Period::Days30.seconds());
        if forced {
            self.forced
                .entry((series.clone(), p))
                .or_default()
                .push(day);
        }
        self.slots
            .entry((series.clone(), p))
            .or_default()
            .push(slot);
    }
}

/// A day's document as stored with `slots` laid over it: replaced slots
/// stand as computed, emptied ones are gone.
fn merged_day(
    stored: Option<&RollupRead>,
    day: i64,
    slots: &[Slot],
    replaced: &[i64],
) -> RollupRead {
    let mut merged = with_slots(stored, day, slots);
    merged.slots.retain(|s| !replaced.contains(&s.start));
    for s in slots.iter().filter(|s| replaced.contains(&s.start)) {
        if s.summary.is_some() {
            merged.slots.push(s.clone());
        }
    }
    merged.slots.sort_by_key(|s| s.start);
    merged
}

/// Each series' job hours.
fn job_hours(jobs: &[Job]) -> BTreeMap<Series, BTreeSet<i64>> {
    let mut hours: BTreeMap<Series, BTreeSet<i64>> = BTreeMap::new();
    for j in jobs {
        hours
            .entry((j.sensor.clone(), j.metric.clone()))
            .or_default()
            .insert(j.hour);
    }
    hours
}

/// The days of `hours` that ended by `now`.
fn ended_days(
    hours: &BTreeMap<Series, BTreeSet<i64>>,
    now: i64,
) -> BTreeMap<Series, BTreeSet<i64>> {
    let mut ended: BTreeMap<Series, BTreeSet<i64>> = BTreeMap::new();
    for (series, hs) in hours {
        for &h in hs {
            let day = h - h.rem_euclid(DAY);
            if day + DAY <= now {
                ended.entry(series.clone()).or_default().insert(day);
            }
        }
    }
    ended
}

/// The thirty-day periods of the `ended` days.
fn thirty_day_periods(ended: &BTreeMap<Series, BTreeSet<i64>>) -> BTreeMap<Series, BTreeSet<i64>> {
    let mut periods: BTreeMap<Series, BTreeSet<i64>> = BTreeMap::new();
    for (series, ds) in ended {
        let ps = periods.entry(series.clone()).or_default();
        for &d in ds {
            ps.insert(d - d.rem_euclid(Period::Days30.seconds()));
        }
    }
    periods
}

/// Adds to `hours` the gap hours of the ended days and of the gap days of
/// their thirty days (settled by `settled`, not complete in what is
/// stored); answers the days lifted into their thirty days.
fn fill_gaps(
    hours: &mut BTreeMap<Series, BTreeSet<i64>>,
    ended: &BTreeMap<Series, BTreeSet<i64>>,
    periods: &BTreeMap<Series, BTreeSet<i64>>,
    stored: Stored<'_>,
    settled: i64,
) -> BTreeMap<Series, BTreeSet<i64>> {
    let mut lift: BTreeMap<Series, BTreeSet<i64>> = ended.clone();
    for (series, ds) in ended {
        let hs = hours.entry(series.clone()).or_default();
        for &d in ds {
            let doc = stored.days.get(&(series.clone(), d));
            for h in (d..d + DAY).step_by(HOUR as usize) {
                let k = ((h - d) / HOUR) as u16;
                if h + HOUR <= settled && !doc.is_some_and(|r| r.is_complete(k)) {
                    hs.insert(h);
                }
            }
        }
    }
    for (series, ps) in periods {
        for &p in ps {
            let doc = stored.months.get(&(series.clone(), p));
            for d in (p..p + Period::Days30.seconds()).step_by(DAY as usize) {
                let k = ((d - p) / DAY) as u16;
                let lifted = lift.get(series).is_some_and(|l| l.contains(&d));
                if d + DAY <= settled && !lifted && !doc.is_some_and(|r| r.is_complete(k)) {
                    lift.entry(series.clone()).or_default().insert(d);
                    let known = stored.days.get(&(series.clone(), d));
                    let hs = hours.entry(series.clone()).or_default();
                    for h in (d..d + DAY).step_by(HOUR as usize) {
                        let k = ((h - d) / HOUR) as u16;
                        if !known.is_some_and(|r| r.is_complete(k)) {
                            hs.insert(h);
                        }
                    }
                }
            }
        }
    }
    lift
}

impl MongoStore {
    /// Rolls up `jobs` at every level, as of `now` (epoch seconds):
    /// - each job's hour: the hour document (minute buckets) and the day
    ///   document's slot;
    /// - for each day of a job that has ended: the hours of that day not
    ///   complete yet (an hour nobody rolled up: no writes, or a writer that
    ///   stopped), and the 30-day document's slot once the day is complete,
    ///   with the days of that 30-day period not complete yet.
    ///
    /// Hours and days are "not complete yet" only once they ended
    /// `close_after` ago: an instance that wrote them may still roll them up.
    ///
    /// `written`: the minutes a flush wrote into its jobs' hours (minute
    /// buckets), so the roll-up reads those buckets and the hour documents,
    /// not every bucket of the hours again (a backfill in order would
    /// otherwise re-read each hour once per flush).
    ///
    /// `replace`: the jobs' hours are rolled up again after a delete may
    /// have removed readings, so their spans without readings remove the
    /// stored slots (late hours only: see `rollup::write_statement`).
    ///
    /// A series' first roll-up of an ended day fills in every hour of its
    /// thirty days not rolled up yet (up to 720): the series are rolled up
    /// [`SENSORS_PER_READ`] at a time, so what is held at once stays
    /// bounded whatever the fleet (at the first midnight of a fleet of
    /// 10 000 series, millions of hours).
    pub async fn roll_up(
        &self,
        jobs: &[Job],
        now: i64,
        written: Option<&Written>,
        replace: bool,
    ) -> Result<Upkept, StoreError> {
        let mut cost = Upkept::default();
        for part in series_parts(jobs, SENSORS_PER_READ) {
            cost += self.roll_up_part(&part, now, written, replace).await?;
        }
        Ok(cost)
    }

    /// [`Self::roll_up`] of a few series' jobs.
    async fn roll_up_part(
        &self,
        jobs: &[Job],
        now: i64,
        written: Option<&Written>,
        replace: bool,
    ) -> Result<Upkept, StoreError> {
        let mut cost = Upkept::default();
        if jobs.is_empty() {
            return Ok(cost);
        }
        // Series and hour of every job whose empty spans remove stored slots.
        // Borrowed from the jobs: asked for every hour and slot a roll-up
        // writes, so a probe must not build a key (two strings).
        let replaced: HashSet<(&str, &str, i64)> = if replace {
            jobs.iter()
                .map(|j| (j.sensor.as_str(), j.metric.as_str(), j.hour))
                .collect()
        } else {
            HashSet::new()
        };
        let replaces = |series: &Series, hour: i64| {
            !replaced.is_empty() && replaced.contains(&(series.0.as_str(), series.1.as_str(), hour))
        };
        let mut hours = job_hours(jobs);
        // The ended days touched and their thirty days: their documents, to
        // find what is missing.
        let ended = ended_days(&hours, now);
        let days = self.read_rollups(Period::Day, &ended, &mut cost).await?;
        let periods = thirty_day_periods(&ended);
        let months = self
            .read_rollups(Period::Days30, &periods, &mut cost)
            .await?;
        let stored = Stored {
            days: &days,
            months: &months,
        };
        let lift = fill_gaps(&mut hours, &ended, &periods, stored, now - self.close_after);
        let rolled = self.roll_hours(&hours, written, &mut cost).await?;
        // Hour documents (minute buckets), then the day documents' slots,
        // then the thirty-day documents'.
        let mut outbox = Outbox::new(self.rollups.name(), self.limits);
        if self.granularity == Granularity::Minute {
            self.write_hours(&rolled, &replaces, &mut outbox, &mut cost)
                .await?;
        }
        let thirty = self
            .write_days(&rolled, &replaces, &lift, &days, &mut outbox, &mut cost)
            .await?;
        self.write_thirty(&thirty, &mut outbox, &mut cost).await?;
        Ok(cost)
    }

    /// The hour documents of `rolled` (minute buckets only: an hour bucket
    /// is its own hour).
    async fn write_hours(
        &self,
        rolled: &Rolled,
        replaces: &(dyn Fn(&Series, i64) -> bool + Sync),
        outbox: &mut Outbox,
        cost: &mut Upkept,
    ) -> Result<(), StoreError> {
        for (series, hs) in rolled {
            let (sensor, metric) = series;
            for h in hs.values() {
                let replacing = replaces(series, h.start);
                if !replacing && h.minutes.is_empty() {
                    continue;
                }
                let slots = every_slot(Period::Hour, h.start, &h.minutes);
                // Replaced: the minutes computed afresh, all of them or
                // those read again.
                let replaced: Vec<i64> = match (replacing, h.partial) {
                    (false, _) => Vec::new(),
                    (true, true) => h.minutes.iter().map(|s| s.start).collect(),
                    (true, false) => slots.iter().map(|s| s.start).collect(),
                };
                let s = |w: &mut Writer, key: &str| {
                    write_statement(
                        w,
                        key,
                        sensor,
                        metric,
                        Period::Hour,
                        h.start,
                        &slots,
                        &replaced,
                    );
                };
                if let Some(ready) = outbox.push(s)? {
                    self.write_rollups(ready, cost).await?;
                }
            }
        }
        if let Some(ready) = outbox.take()? {
            self.write_rollups(ready, cost).await?;
        }
        Ok(())
    }

    /// The day documents' slots of `rolled`; answers the slots each lifted
    /// day gives its thirty days.
    async fn write_days(
        &self,
        rolled: &Rolled,
        replaces: &(dyn Fn(&Series, i64) -> bool + Sync),
        lift: &BTreeMap<Series, BTreeSet<i64>>,
        days: &Documents,
        outbox: &mut Outbox,
        cost: &mut Upkept,
    ) -> Result<Thirty, StoreError> {
        let mut thirty = Thirty::default();
        for (series, hs) in rolled {
            let mut by_day: BTreeMap<i64, Vec<Slot>> = BTreeMap::new();
            for h in hs.values() {
                by_day
                    .entry(h.start - h.start.rem_euclid(DAY))
                    .or_default()
                    .push(h.slot.clone());
            }
            for (&day, slots) in &by_day {
                let lifted = lift.get(series).is_some_and(|l| l.contains(&day));
                let stored = days.get(&(series.clone(), day));
                let empty = slots.iter().all(|s| s.summary.is_none());
                let replaced: Vec<i64> = slots
                    .iter()
                    .filter(|s| replaces(series, s.start))
                    .map(|s| s.start)
                    .collect();
                // A day of nothing that only lifts into its thirty days
                // needs no document of its own.
                if !(empty && lifted && stored.is_none()) {
                    let s = |w: &mut Writer, key: &str| {
                        write_statement(
                            w,
                            key,
                            &series.0,
                            &series.1,
                            Period::Day,
                            day,
                            slots,
                            &replaced,
                        );
                    };
                    if let Some(ready) = outbox.push(s)? {
                        self.write_rollups(ready, cost).await?;
                    }
                }
                if lifted && let Some(slot) = roll_day(&merged_day(stored, day, slots, &replaced)) {
                    thirty.lift(series, day, slot, !replaced.is_empty());
                }
            }
            // Ended days whose hours needed nothing: lift what is stored.
            for &day in lift.get(series).into_iter().flatten() {
                if !by_day.contains_key(&day)
                    && let Some(slot) = days.get(&(series.clone(), day)).and_then(roll_day)
                {
                    thirty.lift(series, day, slot, false);
                }
            }
        }
        if let Some(ready) = outbox.take()? {
            self.write_rollups(ready, cost).await?;
        }
        Ok(thirty)
    }

    /// The thirty-day documents' slots the days lifted.
    async fn write_thirty(
        &self,
        thirty: &Thirty,
        outbox: &mut Outbox,
        cost: &mut Upkept,
    ) -> Result<(), StoreError> {
        for ((series, p), slots) in &thirty.slots {
            let replaced = thirty
                .forced
                .get(&(series.clone(), *p))
                .map_or(&[][..], Vec::as_slice);
            let s = |w: &mut Writer, key: &str| {
                write_statement(
                    w,
                    key,
                    &series.0,
                    &series.1,
                    Period::Days30,
                    *p,
                    slots,
                    replaced,
                );
            };
            if let Some(ready) = outbox.push(s)? {
                self.write_rollups(ready, cost).await?;
            }
        }
        if let Some(ready) = outbox.take()? {
            self.write_rollups(ready, cost).await?;
        }
        Ok(())
    }

    /// Sends one rollup `update` command of [`Outbox`] (`statements`
    /// statements, within the server's limits), with the URI's write
    /// concern. A statement refused is an error for the whole roll-up
    /// (rollups are derived: the batch is sent again, or the operator
    /// rebuilds).
    async fn write_rollups(
        &self,
        (command, statements): (RawDocumentBuf, usize),
        cost: &mut Upkept,
    ) -> Result<(), StoreError> {
        self.traffic.give_way().await;
        let reply = self.run_raw_write(command, "a rollup update").await?;
        cost.round_trips += 1;
        if let Ok(errors) = reply.get_array("writeErrors")
            && let Some(first) = errors.iter().filter_map(Bson::as_document).next()
        {
            let code = first.get_i32("code").unwrap_or_default();
            let message = format!(
                "{} rollup statements refused, first: code {code}: {}",
                errors.len(),
                first.get_str("errmsg").unwrap_or_default()
            );
            // Two writers creating one document: the loser is sent again.
            return Err(match crate::store::errors::classify_write_error(code) {
                _ if code == crate::store::errors::DUPLICATE_KEY => StoreError::Outage(message),
                crate::store::errors::Class::Outage => StoreError::Outage(message),
                crate::store::errors::Class::Poison => StoreError::Poison(message),
            });
        }
        cost.rollups_written += statements as u64;
        Ok(())
    }
}

/// Every slot of a `period` document starting at `start`: the ones given,
/// and empty ones for the rest (all complete).
fn every_slot(period: Period, start: i64, given: &[Slot]) -> Vec<Slot> {
    let len = period.slot_seconds();
    let mut all: Vec<Slot> = (0..period.seconds() / len)
        .map(|k| Slot::empty(start + k * len))
        .collect();
    // In reverse, so the first of slots given twice stands.
    for s in given.iter().rev() {
        let k = (s.start - start).div_euclid(len);
        if let Some(slot) = usize::try_from(k).ok().and_then(|k| all.get_mut(k))
            && slot.start == s.start
        {
            *slot = s.clone();
        }
    }
    all
}

/// A day document as stored with `slots` written over it (a stored slot
/// from more writes stays, as the statement keeps it).
fn with_slots(stored: Option<&RollupRead>, day: i64, slots: &[Slot]) -> RollupRead {
    let mut doc = stored.cloned().unwrap_or(RollupRead {
        start: day,
        ..RollupRead::default()
    });
    for s in slots {
        doc.complete |= 1 << ((s.start - day) / HOUR);
        match doc.slots.binary_search_by_key(&s.start, |x| x.start) {
            // An empty figure never removes a stored slot.
            Ok(i) if doc.slots[i].n > s.n || s.summary.is_none() => {}
            Ok(i) => doc.slots[i] = s.clone(),
            Err(i) => {
                if s.summary.is_some() {
                    doc.slots.insert(i, s.clone());
                }
            }
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::command::Limits;
    use proptest::prelude::*;

    #[test]
    fn an_upkeep_update_holds_no_more_statements_than_a_query_would_wait_for() {
        use crate::store::mongo::give_way::UPKEEP_STATEMENTS;
        let mut outbox = Outbox::new("rollups", Limits::default());
        let statement = mongodb::bson::rawdoc! { "q": { "_id": 1 }, "u": { "$set": { "n": 1 } } };
        let mut counts = Vec::new();
        for _ in 0..(2 * UPKEEP_STATEMENTS + 7) {
            let write = |w: &mut Writer, key: &str| w.raw_document(key, &statement);
            if let Some((_, count)) = outbox.push(write).expect("closes") {
                counts.push(count);
            }
        }
        counts.extend(outbox.take().expect("closes").map(|(_, count)| count));
        assert_eq!(counts, [UPKEEP_STATEMENTS, UPKEEP_STATEMENTS, 7]);
    }

    proptest! {
        /// Every job lands in exactly one part, a part holds at most the
        /// series asked, a series is never split, and no part is empty.
        #[test]
        fn a_roll_up_is_cut_into_parts_of_whole_series(
            jobs in prop::collection::vec((0u8..6, 0u8..3, 0i64..4), 0..80),
            series in 1usize..5,
        ) {
            let jobs: Vec<Job> = jobs
                .into_iter()
                .map(|(s, m, h)| Job { sensor: format!("s{s}"), metric: format!("m{m}"), hour: h * HOUR })
                .collect();
            let parts = series_parts(&jobs, series);
            let key = |j: &Job| (j.sensor.clone(), j.metric.clone());
            let mut seen: BTreeMap<Series, usize> = BTreeMap::new();
            for (i, part) in parts.iter().enumerate() {
                prop_assert!(!part.is_empty());
                let in_part: BTreeSet<Series> = part.iter().map(key).collect();
                prop_assert!(in_part.len() <= series);
                for s in in_part {
                    prop_assert!(seen.insert(s, i).is_none(), "a series in two parts");
                }
            }
            let mut got: Vec<Job> = parts.into_iter().flatten().collect();
            let mut want = jobs.clone();
            got.sort_by_key(|j| (key(j), j.hour));
            want.sort_by_key(|j| (key(j), j.hour));
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        /// Whatever the statements' sizes, every command the outbox lets go
        /// is an `update` of the rollups that fits the limits, nothing is
        /// lost or reordered, and a command is let go only when the next
        /// statement would not fit it.
        #[test]
        fn the_outbox_lets_go_whole_commands_in_order(
            sizes in prop::collection::vec(0usize..300, 0..60),
            batch in 1usize..6,
        ) {
            let limits = Limits {
                max_bson_object_size: crate::store::command::DRIVER_MARGIN + 1000,
                max_message_size: 48_000_000,
                max_write_batch_size: batch,
            };
            let budget = limits.command_budget() / 2;
            // A statement's bytes in its command: type, index key, its own.
            let element = |i: usize, d: &RawDocumentBuf| 2 + i.to_string().len() + d.as_bytes().len();
            let elements = |ds: &[RawDocumentBuf]| -> usize {
                ds.iter().enumerate().map(|(i, d)| element(i, d)).sum()
            };
            let statements: Vec<RawDocumentBuf> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| mongodb::bson::rawdoc! { "i": i as i64, "pad": "x".repeat(n) })
                .collect();
            let mut outbox = Outbox::new("rollups", limits);
            let mut sent: Vec<Vec<RawDocumentBuf>> = Vec::new();
            let check = |command: RawDocumentBuf, count: usize| -> Result<Vec<RawDocumentBuf>, TestCaseError> {
                prop_assert_eq!(command.get_str("update"), Ok("rollups"));
                prop_assert_eq!(command.get_bool("ordered"), Ok(false));
                let updates: Vec<RawDocumentBuf> = command
                    .get_array("updates")
                    .expect("updates")
                    .into_iter()
                    .map(|u| u.expect("readable").as_document().expect("a statement").to_raw_document_buf())
                    .collect();
                prop_assert_eq!(updates.len(), count);
                prop_assert!(count <= batch);
                let bytes = elements(&updates);
                prop_assert!(count == 1 || bytes <= budget, "{} bytes of statements", bytes);
                Ok(updates)
            };
            for (i, s) in statements.iter().enumerate() {
                let write = |w: &mut Writer, key: &str| w.raw_document(key, s);
                if let Some((command, count)) = outbox.push(write).expect("closes") {
                    sent.push(check(command, count)?);
                    let last = sent.last().expect("just sent");
                    let next = element(last.len(), s);
                    prop_assert!(last.len() == batch || elements(last) + next > budget);
                    prop_assert_eq!(sent.iter().map(Vec::len).sum::<usize>(), i);
                }
            }
            if let Some((command, count)) = outbox.take().expect("closes") {
                sent.push(check(command, count)?);
            }
            prop_assert!(outbox.take().expect("empty").is_none());
            let all: Vec<RawDocumentBuf> = sent.into_iter().flatten().collect();
            prop_assert_eq!(all, statements);
        }

        /// Every slot of the period, each the first given at its start (one
        /// off the period or off a slot's start is left out), as a search
        /// of the slots given for each start finds it.
        #[test]
        fn every_slot_is_the_first_given_at_its_start_or_empty(
            given in prop::collection::vec((-3i64..65, 0i64..3, 1u64..4), 0..80),
        ) {
            let hour = 7 * HOUR;
            let given: Vec<Slot> = given
                .iter()
                .map(|&(k, off, n)| Slot {
                    n,
                    ..Slot::empty(hour + k * 60 + if off == 2 { 30 } else { 0 })
                })
                .collect();
            let model: Vec<Slot> = (0..60)
                .map(|k| {
                    let at = hour + k * 60;
                    given.iter().find(|s| s.start == at).cloned().unwrap_or_else(|| Slot::empty(at))
                })
                .collect();
            prop_assert_eq!(every_slot(Period::Hour, hour, &given), model);
        }
    }

    #[test]
    fn a_stored_slot_from_more_writes_stays_under_a_new_figure() {
        use crate::domain::Sample;
        let day = 86_400;
        let older = Slot::of(day, &[Sample { t: day, v: 1.0 }], 5);
        let stored = RollupRead {
            start: day,
            complete: 1,
            slots: vec![older.clone()],
        };
        let newer = Slot::of(day, &[Sample { t: day, v: 2.0 }], 4);
        let empty = Slot::empty(day + HOUR);
        let doc = with_slots(Some(&stored), day, &[newer, empty]);
        assert_eq!(doc.slots, vec![older]);
        assert_eq!(doc.complete, 0b11);
    }
}
