//! The catch-up keeps half the server. While hours are marked late or the
//! batcher still owes ended hours (a backfill being written and rolled up),
//! queries read the buckets of those hours instead of rollups, and a
//! dashboard refreshing over the backfill read them again at every refresh:
//! five panels every 5 s took nine tenths of the stand-in, and the
//! catch-up they waited for ran at 0.4 of its rate alone.
//!
//! So, during a catch-up, the time queries spend reading such buckets (as
//! the measured pace estimates it before they read) is drawn from a budget
//! that refills at [`SHARE`] of the wall clock, up to [`BURST`]: a query
//! goes at once while the budget is not in debt, waits for it when that
//! leaves it time to read, and is refused at once (503, with about when
//! the catch-up ends) otherwise. Outside a catch-up nothing is drawn. Pure:
//! the caller gives the time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The part of the wall clock queries may spend reading a catch-up's
/// buckets.
pub(super) const SHARE: f64 = 0.5;
/// Reading time saved up while queries do not read: a dashboard's first
/// round goes at once.
pub(super) const BURST: Duration = Duration::from_secs(5);

/// What a query does about reading a catch-up's buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Go,
    /// Wait this long, then go.
    Wait(Duration),
    Refuse,
}

#[derive(Debug)]
struct State {
    /// Seconds of reading available (negative: owed).
    balance: f64,
    at: Instant,
}

/// The queries' budget of reading time during a catch-up.
#[derive(Debug)]
pub(super) struct Share {
    state: Mutex<State>,
}

impl Default for Share {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                balance: BURST.as_secs_f64(),
                at: Instant::now(),
            }),
        }
    }
}

impl Share {
    /// A query would read for `cost` during a catch-up, with `budget` left
    /// of its time: whether it goes (its cost drawn), waits, or is refused.
    pub(super) fn admit(&self, cost: Duration, budget: Duration, now: Instant) -> Admit {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(s.at).as_secs_f64();
        s.balance = (s.balance + elapsed * SHARE).min(BURST.as_secs_f64());
        // A caller that took `now` before another's does not move the
        // clock back (the time between would be credited twice).
        s.at = s.at.max(now);
        // Until the debt is paid back at SHARE of the clock.
        let wait = Duration::from_secs_f64((-s.balance).max(0.0) / SHARE);
        if wait + cost > budget {
            return Admit::Refuse;
        }
        s.balance -= cost.as_secs_f64();
        if wait.is_zero() {
            Admit::Go
        } else {
            Admit::Wait(wait)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn queries_reading_a_catch_up_get_half_the_clock() {
        let share = Share::default();
        let t0 = Instant::now();
        let budget = 10 * S;
        // The burst goes at once; the next read waits for the debt.
        assert_eq!(share.admit(4 * S, budget, t0), Admit::Go);
        assert_eq!(share.admit(3 * S, budget, t0), Admit::Go);
        // Balance -2 s: 4 s of clock to pay it back at half.
        assert_eq!(share.admit(2 * S, budget, t0), Admit::Wait(4 * S));
        // Balance -4 s: 8 s of waiting and 3 s of reading outlast 10 s.
        assert_eq!(share.admit(3 * S, budget, t0), Admit::Refuse);
        // 8 s later the debt is paid.
        assert_eq!(share.admit(3 * S, budget, t0 + 8 * S), Admit::Go);
        // A read longer than the query's time is refused whatever the balance.
        assert_eq!(share.admit(11 * S, budget, t0 + 1000 * S), Admit::Refuse);
    }

    /// Against a model: over any sequence of admitted reads, the reading
    /// time admitted by time t never exceeds the burst plus half of t.
    #[test]
    fn admitted_reading_never_exceeds_half_the_clock_plus_the_burst() {
        let share = Share::default();
        let t0 = Instant::now();
        let mut admitted = 0.0;
        let mut x: u64 = 7;
        for i in 0..2000_u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let cost = Duration::from_millis(x >> 54);
            let now = t0 + Duration::from_millis(i * 150);
            match share.admit(cost, 10 * S, now) {
                Admit::Go => admitted += cost.as_secs_f64(),
                // A waiting query reads after its wait: charged now, read later.
                Admit::Wait(_) => admitted += cost.as_secs_f64(),
                Admit::Refuse => {}
            }
            let elapsed = (i * 150) as f64 / 1000.0;
            // A wait's read lands after its wait: what was admitted by now
            // is covered by the burst, half the clock and the debt allowed
            // (the query's time).
            assert!(
                admitted <= BURST.as_secs_f64() + elapsed * SHARE + 10.0,
                "{admitted} by {elapsed}"
            );
        }
        assert!(admitted > 2000.0 * 0.15 * SHARE * 0.8, "{admitted}");
    }
}
