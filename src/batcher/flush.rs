//! When the batcher writes, and what: the open batch and the held buckets
//! due (or pressed out by memory), taken as one [`Batch`], and each item
//! settled by its own outcome.

use tokio::time::Instant;

use super::batch::{Batch, FlushResult, Item, NotStored, Settled};
use super::coalesce::{Batcher, Open};
use crate::domain::{BucketKey, BucketUpdate};

impl<W> Batcher<W> {
    /// Makes the open batch due now. Returns whether there is one (and so the
    /// driver must look again).
    pub fn hurry(&mut self) -> bool {
        self.hurried = self.opened_at.is_some();
        self.hurried
    }

    /// Memory is running short: the oldest buckets go out early.
    pub(super) fn pressured(&self) -> bool {
        !self.pending.is_empty()
            && (self.buffered().saturating_add(self.wanted)
                > self.limits.max_buffered_readings / 10 * 9
                || self.buckets().saturating_add(self.wanted) > self.limits.max_buckets / 10 * 9)
    }

    fn batch_due(&self, now: Instant) -> bool {
        self.opened_at.is_some_and(|opened| {
            self.hurried
                || self.prompt_readings >= self.limits.max_pending_readings
                || opened + self.limits.flush_interval <= now
        })
    }

    /// When something must be written next, if anything is pending.
    pub fn deadline(&self, now: Instant) -> Option<Instant> {
        if self.pressured() {
            return Some(now);
        }
        let batch = self.opened_at.map(|opened| {
            if self.hurried || self.prompt_readings >= self.limits.max_pending_readings {
                opened
            } else {
                opened + self.limits.flush_interval
            }
        });
        match (batch, self.next_held_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline(now).is_some_and(|d| d <= now)
    }

    /// Under pressure: buckets first held at or before this go out, the oldest
    /// first, enough of them to bring memory back to 80 % of its bounds.
    fn pressure_cutoff(&self) -> Option<Instant> {
        if !self.pressured() {
            return None;
        }
        let mut ages: Vec<(Instant, usize)> = self
            .pending
            .values()
            .map(|o| (o.since, o.values.len()))
            .collect();
        ages.sort_unstable_by_key(|&(since, _)| since);
        let (mut values, mut buckets) = (self.buffered(), self.buckets());
        // Room for the refused offer too, if there was one.
        let values_goal = (self.limits.max_buffered_readings / 10 * 8).min(
            self.limits
                .max_buffered_readings
                .saturating_sub(self.wanted),
        );
        let buckets_goal = (self.limits.max_buckets / 10 * 8)
            .min(self.limits.max_buckets.saturating_sub(self.wanted));
        let mut cutoff = None;
        for (since, n) in ages {
            cutoff = Some(since);
            values = values.saturating_sub(n);
            buckets = buckets.saturating_sub(1);
            if values <= values_goal && buckets <= buckets_goal {
                break;
            }
        }
        cutoff
    }

    /// Takes what is due at `now` (the open batch's buckets once it is due,
    /// held buckets whose time has come, and under memory pressure the oldest
    /// buckets), at most `max_flush_buckets` of it, and counts it as in
    /// flight. What is left over stays due at once.
    pub fn take_due(&mut self, now: Instant) -> Option<Batch> {
        let batch_due = self.batch_due(now);
        let cutoff = self.pressure_cutoff();
        self.take_where(batch_due, |open| {
            (batch_due && open.prompt)
                || open.held_due.is_some_and(|d| d <= now)
                || cutoff.is_some_and(|c| open.since <= c)
        })
    }

    /// Takes everything pending, due or not (at shutdown, and in tests), at
    /// most `max_flush_buckets` at a time.
    pub fn take_all(&mut self) -> Option<Batch> {
        self.take_where(true, |_| true)
    }

    /// When more is due than one flush takes: the hour at which the flush
    /// is cut, and how many buckets of that hour it takes. Whole hours go
    /// first, the newest first (the open hour, then the recent past that
    /// dashboards look at): a backfill's hours are each written by one
    /// flush, or by consecutive ones, and can be rolled up as soon as it
    /// ends instead of once the whole backfill is written.
    fn cut(&self, take: &impl Fn(&Open) -> bool, room: usize) -> Option<(i64, usize)> {
        if room == 0 {
            return None;
        }
        let mut hours: Vec<i64> = Vec::new();
        for (key, open) in &self.pending {
            if take(open) {
                hours.push(key.start - key.start.rem_euclid(3600));
            }
        }
        if hours.len() <= room {
            return None;
        }
        let (_, &mut cut, _) = hours.select_nth_unstable_by(room - 1, |a, b| b.cmp(a));
        let newer = hours.iter().filter(|&&h| h > cut).count();
        Some((cut, room - newer))
    }

    fn take_where(&mut self, batch_due: bool, take: impl Fn(&Open) -> bool) -> Option<Batch> {
        let mut room = self.limits.max_flush_buckets;
        let mut next_held_due: Option<Instant> = None;
        let mut prompt_left = false;
        let cut = self.cut(&take, room);
        let (cut_hour, mut at_cut) = cut.unwrap_or((i64::MIN, usize::MAX));
        let items: Vec<Item> = self
            .pending
            .extract_if(|key, open| {
                let hour = key.start - key.start.rem_euclid(3600);
                let within = hour > cut_hour || (hour == cut_hour && at_cut > 0);
                if room > 0 && within && take(open) {
                    room -= 1;
                    if hour == cut_hour {
                        at_cut -= 1;
                    }
                    return true;
                }
                prompt_left |= open.prompt;
                if let Some(d) = open.held_due {
                    next_held_due = Some(next_held_due.map_or(d, |n| n.min(d)));
                }
                false
            })
            .map(Item::from)
            .collect();
        self.next_held_due = next_held_due;
        if !prompt_left {
            self.opened_at = None;
            self.hurried = false;
            self.prompt_readings = 0;
        } else if batch_due {
            // What of the open batch did not fit goes in the next flush, at once.
            self.hurried = true;
        }
        if items.is_empty() {
            return None;
        }
        let values: usize = items.iter().map(|i| i.update.values.len()).sum();
        let readings: usize = items.iter().map(|i| i.readings).sum();
        for item in &items {
            if let Some(&a) = item.update.acks.iter().min() {
                *self.in_flight_acks.entry(a).or_default() += 1;
            }
        }
        self.pending_values -= values;
        self.in_flight_values += values;
        self.in_flight_buckets += items.len();
        Some(Batch { items, readings })
    }

    /// One bucket of a taken batch is done with: frees its room and answers
    /// the writers for whom it was the last bucket, into `answers`.
    pub fn settle(&mut self, item: &Item, settled: Settled, answers: &mut Vec<(W, FlushResult)>) {
        self.in_flight_values = self
            .in_flight_values
            .saturating_sub(item.update.values.len());
        self.in_flight_buckets = self.in_flight_buckets.saturating_sub(1);
        self.owed.settle(item.update.key.start);
        if let Some(a) = item.update.acks.iter().min()
            && let Some(n) = self.in_flight_acks.get_mut(a)
        {
            *n -= 1;
            if *n == 0 {
                self.in_flight_acks.remove(a);
            }
        }
        if settled != Settled::Unstored {
            // Unstored held readings stay owed: the journal keeps them.
            for &(origin, n) in &item.origins {
                if let Some(left) = self.outstanding.get_mut(&origin) {
                    *left = left.saturating_sub(u64::from(n));
                    if *left == 0 {
                        self.outstanding.remove(&origin);
                    }
                }
            }
        }
        for ticket in &item.tickets {
            let Some(w) = self.waiting.get_mut(ticket) else {
                continue;
            };
            w.buckets -= 1;
            match settled {
                Settled::Stored => {}
                Settled::DeadLettered => w.dead.push(item.update.key.clone()),
                Settled::Unstored => w.unstored = true,
            }
            if w.buckets == 0
                && let Some(w) = self.waiting.remove(ticket)
            {
                let result = if w.unstored {
                    Err(NotStored::Shutdown)
                } else if !w.dead.is_empty() {
                    Err(NotStored::DeadLettered(w.dead))
                } else {
                    Ok(())
                };
                answers.push((w.waiter, result));
            }
        }
    }
}

impl From<(BucketKey, Open)> for Item {
    fn from((key, open): (BucketKey, Open)) -> Self {
        let (values, acks) = open.values.iter().map(|&(o, v, a)| ((o, v), a)).unzip();
        Item {
            update: BucketUpdate { key, values, acks },
            tickets: open.tickets,
            readings: open.readings,
            origins: open.origins,
        }
    }
}
