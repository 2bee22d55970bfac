//! Queries pull the catch-up: the marked hours a query meets are rolled up
//! before the upkeep's own order (newest first), without waiting for the
//! quiet that other marked hours wait for (but never while this instance
//! still holds or writes buckets of them), and a query whose marked
//! hours are all in the step under way waits for that step when it ends
//! sooner than their buckets would be read. Without it a dashboard that
//! refreshes over a backfill read the same marked buckets at every refresh
//! while the upkeep, giving way to it, rolled up other hours.
//!
//! Pure: the upkeep and the queries call it with the time; waking is a
//! `watch` of the steps ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Marker documents asked for at most: the oldest asks go first beyond it.
const MAX_WANTED: usize = 4096;
/// Marker documents one query asks for at most: its newest.
const MAX_ASKED_PER_QUERY: usize = 1024;
/// An ask no query renewed in this long is dropped (its dashboard closed).
const WANTED_FOR: Duration = Duration::from_secs(120);
/// A document whose asked step failed is not asked for again this long: a
/// step that keeps failing does not keep going first while a dashboard
/// refreshes over it.
const FAILED_FOR: Duration = Duration::from_secs(30);

/// What a query does about the marked hours it met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Read their buckets.
    Read,
    /// Wait this long at most for the step under way, then look again.
    Wait(Duration),
    /// Reading them would outlast the query's time: refuse at once.
    Refuse,
}

/// Decides, from the time reading the marked buckets would take (`None`:
/// not measured yet), the time left of the step under way if it holds all
/// of them (`None`: it does not), and the query's time.
pub fn decide(reading: Option<Duration>, step_left: Option<Duration>, budget: Duration) -> Choice {
    if let Some(left) = step_left
        && left < budget / 2
        && reading.is_none_or(|r| left < r)
    {
        // A step may run late; waiting twice its estimate still leaves the
        // query time to read the buckets after all.
        return Choice::Wait((left * 2 + Duration::from_millis(50)).min(budget / 2));
    }
    match reading {
        Some(r) if r > budget => Choice::Refuse,
        _ => Choice::Read,
    }
}

#[derive(Debug, Default)]
struct State {
    /// Marker document ids asked for, with when they were last asked.
    wanted: BTreeMap<i64, Instant>,
    /// The step under way: its documents and when it should end.
    step: Option<(BTreeSet<i64>, Instant)>,
    /// Documents of failed steps, until when they may not be asked for.
    failed: BTreeMap<i64, Instant>,
}

/// The hours queries asked for, and the upkeep's step under way.
#[derive(Debug)]
pub struct Priority {
    state: Mutex<State>,
    /// Woken when a query asks (the upkeep may be asleep).
    asked: tokio::sync::Notify,
    /// Steps ended, for queries waiting on one.
    ended: tokio::sync::watch::Sender<u64>,
}

impl Default for Priority {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            asked: tokio::sync::Notify::new(),
            ended: tokio::sync::watch::channel(0).0,
        }
    }
}

impl Priority {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while it is held: the state is whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A query met the marker documents `docs`: roll them up first. The
    /// upkeep is woken only by documents not asked for already.
    pub fn want(&self, docs: &[i64], now: Instant) {
        // A query over a long backfill meets far more documents than a step
        // takes: it asks for its newest few (ids grow with the hour), and
        // the work under the lock stays small whatever it met.
        let newest = docs.len().saturating_sub(MAX_ASKED_PER_QUERY);
        let mut docs: Vec<i64> = docs.to_vec();
        if newest > 0 {
            docs.select_nth_unstable(newest);
        }
        let mut s = self.lock();
        let mut new = false;
        for &d in &docs[newest..] {
            if s.failed.get(&d).is_some_and(|&until| until > now) {
                continue;
            }
            new |= s.wanted.insert(d, now).is_none();
        }
        if s.wanted.len() > MAX_WANTED {
            // The oldest asks go, in one pass.
            let mut by_age: Vec<(Instant, i64)> =
                s.wanted.iter().map(|(&d, &at)| (at, d)).collect();
            let over = by_age.len() - MAX_WANTED;
            by_age.select_nth_unstable(over - 1);
            for (_, d) in &by_age[..over] {
                s.wanted.remove(d);
            }
        }
        drop(s);
        if new {
            self.asked.notify_one();
        }
    }

    /// The documents asked for and not dropped as of `now`.
    pub fn wanted(&self, now: Instant) -> BTreeSet<i64> {
        let mut s = self.lock();
        s.wanted
            .retain(|_, at| now.saturating_duration_since(*at) < WANTED_FOR);
        s.wanted.keys().copied().collect()
    }

    /// Resolves when a query asks for hours.
    pub async fn asked(&self) {
        self.asked.notified().await;
    }

    /// The upkeep begins rolling up `docs`, expecting to take `expected`;
    /// answers whether a query asked for any of them.
    pub fn begin(&self, docs: BTreeSet<i64>, expected: Duration, now: Instant) -> bool {
        let mut s = self.lock();
        let asked = docs.iter().any(|d| s.wanted.contains_key(d));
        s.step = Some((docs, now + expected));
        asked
    }

    /// The step under way ended: its documents are no longer asked for
    /// (rolled up; or failed, as of `now`: then they wait their turn and
    /// are not asked for again for [`FAILED_FOR`], so that a step that
    /// keeps failing does not keep going first), and the queries waiting
    /// look again.
    pub fn end(&self, failed: Option<Instant>) {
        let mut s = self.lock();
        if let Some(now) = failed {
            s.failed.retain(|_, until| *until > now);
        }
        if let Some((docs, _)) = s.step.take() {
            for d in docs {
                s.wanted.remove(&d);
                if let Some(now) = failed {
                    s.failed.insert(d, now + FAILED_FOR);
                }
            }
        }
        drop(s);
        self.ended.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Begins a step as [`Self::begin`] does, and ends it when the answer
    /// is dropped: as failed unless [`Step::done`] was called (an error, or
    /// the upkeep's future dropped mid-step), so no step stays under way.
    pub fn step(&self, docs: BTreeSet<i64>, expected: Duration, now: Instant) -> (Step<'_>, bool) {
        let asked = self.begin(docs, expected, now);
        (
            Step {
                priority: self,
                done: false,
            },
            asked,
        )
    }

    /// If the step under way holds every one of `docs`: about how long it
    /// has left, and a receiver that changes when it ends.
    pub fn step_holding(
        &self,
        docs: &[i64],
        now: Instant,
    ) -> Option<(Duration, tokio::sync::watch::Receiver<u64>)> {
        let s = self.lock();
        let (held, ends) = s.step.as_ref()?;
        if docs.is_empty() || !docs.iter().all(|d| held.contains(d)) {
            return None;
        }
        let rx = self.ended.subscribe();
        Some((ends.saturating_duration_since(now), rx))
    }
}

/// A step under way (see [`Priority::step`]).
pub struct Step<'a> {
    priority: &'a Priority,
    done: bool,
}

impl Step<'_> {
    /// The step rolled its documents up.
    pub fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Step<'_> {
    fn drop(&mut self) {
        let failed = (!self.done).then(Instant::now);
        self.priority.end(failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_query_waits_for_the_step_holding_its_hours_only_when_that_is_sooner() {
        let budget = Duration::from_secs(10);
        // The step ends in 0.3 s; reading the buckets takes 2 s.
        assert_eq!(
            decide(Some(2000 * MS), Some(300 * MS), budget),
            Choice::Wait(650 * MS)
        );
        // Reading is sooner.
        assert_eq!(decide(Some(100 * MS), Some(300 * MS), budget), Choice::Read);
        // A step that would take most of the query's time is not waited for.
        assert_eq!(decide(None, Some(6000 * MS), budget), Choice::Read);
        // The wait is bounded by half the query's time.
        assert_eq!(
            decide(Some(20_000 * MS), Some(4000 * MS), budget),
            Choice::Wait(5000 * MS)
        );
        // No step holds them, and reading outlasts the query.
        assert_eq!(decide(Some(11_000 * MS), None, budget), Choice::Refuse);
        assert_eq!(decide(None, None, budget), Choice::Read);
    }

    #[tokio::test]
    async fn asked_hours_are_held_until_their_step_ends_or_they_are_stale() {
        let p = Priority::default();
        let t0 = Instant::now();
        p.want(&[5, 7], t0);
        assert_eq!(p.wanted(t0), BTreeSet::from([5, 7]));
        assert!(p.begin(BTreeSet::from([7, 9]), 100 * MS, t0));
        let (left, mut rx) = p.step_holding(&[7, 9], t0 + 40 * MS).expect("held");
        assert_eq!(left, 60 * MS);
        assert!(
            p.step_holding(&[5, 7], t0).is_none(),
            "5 is not in the step"
        );
        p.end(None);
        rx.changed().await.expect("the step's end is sent");
        assert_eq!(p.wanted(t0), BTreeSet::from([5]));
        assert!(p.step_holding(&[7], t0).is_none(), "no step under way");
        assert!(!p.begin(BTreeSet::from([1]), MS, t0), "nobody asked for 1");
        assert!(
            p.wanted(t0 + WANTED_FOR).is_empty(),
            "stale asks are dropped"
        );
    }

    #[test]
    fn a_failed_step_is_not_asked_for_again_for_a_while_and_a_dropped_one_counts_as_failed() {
        let p = Priority::default();
        let t0 = Instant::now();
        p.want(&[3, 4], t0);
        let (step, asked) = p.step(BTreeSet::from([3]), MS, t0);
        assert!(asked);
        drop(step);
        assert!(p.step_holding(&[3], t0).is_none(), "no step under way");
        let now = Instant::now();
        p.want(&[3, 4], now);
        assert_eq!(p.wanted(now), BTreeSet::from([4]), "3 failed a moment ago");
        p.want(&[3], now + FAILED_FOR + MS);
        assert!(p.wanted(now + FAILED_FOR + MS).contains(&3));
        let (step, _) = p.step(BTreeSet::from([4]), MS, now);
        step.done();
        p.want(&[4], now);
        assert!(
            p.wanted(now).contains(&4),
            "a step that rolled up leaves no wait"
        );
    }

    #[test]
    fn the_asks_kept_are_bounded_and_the_oldest_go_first() {
        let p = Priority::default();
        let t0 = Instant::now();
        for d in 0..(MAX_WANTED as i64 + 10) {
            p.want(&[d], t0 + Duration::from_millis(d as u64));
        }
        let kept = p.wanted(t0);
        assert_eq!(kept.len(), MAX_WANTED);
        assert_eq!(kept.first(), Some(&10));
        // One query over a long backfill asks for its newest documents only.
        let p = Priority::default();
        let docs: Vec<i64> = (0..100_000).rev().collect();
        p.want(&docs, t0);
        let kept = p.wanted(t0);
        assert_eq!(kept.len(), MAX_ASKED_PER_QUERY);
        assert_eq!(kept.first(), Some(&(100_000 - MAX_ASKED_PER_QUERY as i64)));
    }
}
