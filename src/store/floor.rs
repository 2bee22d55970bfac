//! This instance's floor: the earliest acknowledgement it may still hold
//! unstored, published beside the other instances' (see
//! `store::mongo::instances` and docs/src/internals/last-write-wins.md). The
//! others' earliest floor decides which values keep their version; once a
//! minute, versions older than every floor are dropped.
//!
//! While another instance runs, each reads the others' floors and the
//! deletes' tombstones and writes its own floor once a second. A lone
//! instance reads every three seconds (it answers a newcomer at once) and
//! writes once a minute, so that operators see it running; it also writes
//! as soon as it has taken a new delete in (the delete waits for that).
//! Each write promises the next ([`Cadence`]), and readers judge an
//! instance stopped by its promise. In between, the task sleeps: an idle
//! service wakes only to read or write.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use hashbrown::HashMap;

use super::MongoStore;
use super::mongo::{Beat, Others};
use crate::batcher::clock;
use crate::batcher::driver::BatcherHandle;
use crate::journal::Journal;

const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// How often a lone instance writes its document.
const ALONE_EVERY: Duration = Duration::from_secs(60);
/// How often a lone instance reads the others' documents: each read costs
/// it about half a millisecond of CPU, mostly the driver's wake-ups. An
/// instance that joins waits for it at most this long plus a write (see
/// [`SILENT_AFTER`]).
const ALONE_READ_EVERY: Duration = Duration::from_secs(3);
/// Another instance whose beat moved within this long is running: longer
/// than two of a lone instance's intervals, so two lone ones find each other.
const OTHERS_LIVE: Duration = Duration::from_secs(150);
/// An instance whose beat has not moved for this long is taken to be down:
/// a lone one reads every [`ALONE_READ_EVERY`] and answers a newcomer at
/// once, so this leaves a few round trips of margin.
const SILENT_AFTER: Duration = Duration::from_secs(8);
const JOIN_POLL: Duration = Duration::from_millis(200);
/// The most ticks [`run`] sleeps through at once (a lone instance reads
/// every [`ALONE_READ_EVERY`] anyway).
const MAX_IDLE_TICKS: u32 = 60;
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// A floor this far back is held by an instance that is not coming back
/// soon: operators are told which one, at most this often.
const STALE_FLOOR: Duration = Duration::from_secs(3600);
/// How long a floor must stay that far back before anyone is told.
const STALE_FOR: Duration = Duration::from_secs(300);

/// The earliest acknowledgement this instance may hold unstored, `now` if
/// none. The clock is read first: anything acknowledged after that read is
/// later than the answer, wherever it is on its way in. The journal's share
/// is read before the batcher's, since a group moves from one to the other.
pub fn own_floor(batcher: &BatcherHandle, journal: Option<&Journal>) -> i64 {
    let now = clock::ack_ms();
    let journal = journal.map_or(i64::MAX, Journal::floor);
    let batcher = batcher.oldest_ack().unwrap_or(i64::MAX);
    now.min(journal).min(batcher)
}

/// Who this instance is to the others.
pub struct Instance {
    pub id: String,
    /// It has a journal: what it holds unstored outlives a crash.
    pub durable: bool,
}

/// When this instance writes its document: a pure core, driven by
/// [`run`] with the time passed in.
#[derive(Debug)]
pub struct Cadence {
    /// The last write, and the interval it promised.
    written: Option<(Instant, Duration)>,
    /// The newest delete taken in when it was written.
    seen_written: i64,
    /// The last read of the others' documents.
    last_read: Option<Instant>,
    /// Each other instance's last beat, and when it was seen to move (never
    /// for one already stopped when first seen).
    others: HashMap<String, (i64, Option<Instant>)>,
}

impl Default for Cadence {
    fn default() -> Self {
        Self {
            written: None,
            seen_written: i64::MIN,
            last_read: None,
            others: HashMap::new(),
        }
    }
}

impl Cadence {
    /// The interval a write at `now` promises: a second while another
    /// instance runs, else [`ALONE_EVERY`].
    pub fn every(&self, now: Instant) -> Duration {
        let others = self.others.values().any(|&(_, moved)| {
            moved.is_some_and(|m| now.saturating_duration_since(m) < OTHERS_LIVE)
        });
        if others { PUBLISH_EVERY } else { ALONE_EVERY }
    }

    /// Whether the tick at `now`, with the newest delete taken in `seen`,
    /// writes this instance's document (else it only reads the others').
    /// A promise is kept a tick early, so a slow round trip does not break it.
    pub fn due(&self, now: Instant, seen: i64) -> bool {
        let Some((at, promised)) = self.written else {
            return true;
        };
        seen != self.seen_written
            || self.every(now) == PUBLISH_EVERY
            || now.saturating_duration_since(at) + PUBLISH_EVERY >= promised
    }

    /// Whether a tick at `now` that does not write reads the others'
    /// documents: every [`ALONE_READ_EVERY`] (while another instance runs,
    /// every tick writes, and a write reads too).
    pub fn read_due(&self, now: Instant) -> bool {
        self.last_read.is_none_or(|at| {
            now.saturating_duration_since(at) + PUBLISH_EVERY / 2 >= ALONE_READ_EVERY
        })
    }

    /// Ticks ([`PUBLISH_EVERY`] apart) from `now` to the first that writes
    /// or reads, the newest delete taken in still `seen`: [`run`] sleeps
    /// through the ones between, which would do nothing (each wake-up of an
    /// idle service costs CPU), and a delete taken in wakes it.
    pub fn idle_ticks(&self, now: Instant, seen: i64) -> u32 {
        (1..MAX_IDLE_TICKS)
            .find(|&k| {
                let t = now + PUBLISH_EVERY * k;
                self.due(t, seen) || self.read_due(t)
            })
            .unwrap_or(MAX_IDLE_TICKS)
    }

    /// Records a write at `now` that published `seen` and promised `every`.
    pub fn wrote(&mut self, now: Instant, seen: i64, every: Duration) {
        self.written = Some((now, every));
        self.seen_written = seen;
    }

    /// Records the others' beats read at `now`. One seen for the first time
    /// counts as moving if it published recently enough to be running.
    pub fn read(&mut self, now: Instant, beats: &[Beat]) {
        self.last_read = Some(now);
        self.others
            .retain(|id, _| beats.iter().any(|b| &b.id == id));
        for b in beats {
            match self.others.get_mut(&b.id) {
                Some((at, moved)) => {
                    if *at != b.at {
                        *at = b.at;
                        *moved = Some(now);
                    }
                }
                None => {
                    let moved = b.running.then_some(now);
                    self.others.insert(b.id.clone(), (b.at, moved));
                }
            }
        }
    }
}

/// Publishes the floor once (promising the next write within `every`) and
/// reads the others' into the watermarks.
pub async fn publish(
    instance: &Instance,
    store: &MongoStore,
    batcher: &BatcherHandle,
    journal: Option<&Journal>,
    every: Duration,
) -> Option<Others> {
    let floor = own_floor(batcher, journal);
    let every_ms = every.as_millis() as i64;
    match store
        .publish_floor(
            &instance.id,
            floor,
            instance.durable,
            every_ms,
            clock::unix_ms(),
        )
        .await
    {
        Ok(others) => Some(taken(store, others)),
        // The others' floors only rise: the last one read stays safe.
        Err(e) => {
            warn!(error = %e, "Could not publish this instance's floor; retrying.");
            None
        }
    }
}

/// Reads the others' floors into the watermarks, without writing.
async fn read(instance: &Instance, store: &MongoStore) -> Option<Others> {
    match store.read_floors(&instance.id, clock::unix_ms()).await {
        Ok(others) => Some(taken(store, others)),
        Err(e) => {
            warn!(error = %e, "Could not read the other instances' floors; retrying.");
            None
        }
    }
}

/// Puts the others' floor read into the watermarks.
fn taken(store: &MongoStore, others: Others) -> Others {
    store.watermarks().set_others(others.floor);
    others
}

/// Writes this instance's document as `cadence` says (and reads the
/// others').
async fn write(
    cadence: &mut Cadence,
    instance: &Instance,
    store: &MongoStore,
    batcher: &BatcherHandle,
    journal: Option<&Journal>,
) -> Option<Others> {
    let now = Instant::now();
    let seen = store.deletes_seen();
    let every = cadence.every(now);
    let others = publish(instance, store, batcher, journal, every).await?;
    cadence.wrote(now, seen, every);
    cadence.read(Instant::now(), &others.beats);
    Some(others)
}

/// Joins the instances at start, before anything is acknowledged: publishes
/// this instance's floor, then waits until every other instance that is
/// running has read it and acts on it (it has published twice since: the
/// first of those publishes came after this one's, so the read that follows
/// it saw this instance, and the second after that read took effect). An
/// instance that never stores a value unversioned while this one may hold
/// an older one is what makes its versions enough. An instance silent for
/// [`SILENT_AFTER`] is taken to be down; a lone one waits for nobody.
pub async fn join(
    instance: &Instance,
    store: &MongoStore,
    batcher: &BatcherHandle,
    journal: Option<&Journal>,
) {
    let Some(first) = publish(instance, store, batcher, journal, PUBLISH_EVERY).await else {
        return;
    };
    let started = Instant::now();
    // Per running instance: its last beat seen, how many times it moved,
    // and when. One stopped by its own promise is not waited for.
    let mut seen: HashMap<String, (i64, u8, Instant)> = first
        .beats
        .into_iter()
        .filter(|b| b.running)
        .map(|b| (b.id, (b.at, 0, started)))
        .collect();
    if seen.is_empty() {
        return;
    }
    loop {
        let now = Instant::now();
        let waiting = seen
            .values()
            .filter(|&&(_, moved, since)| moved < 2 && now.duration_since(since) < SILENT_AFTER)
            .count();
        if waiting == 0 {
            break;
        }
        tokio::time::sleep(JOIN_POLL).await;
        let Some(others) = publish(instance, store, batcher, journal, PUBLISH_EVERY).await else {
            continue;
        };
        for b in others.beats {
            // One that joined after this one waits for this one itself.
            if let Some((last, moved, since)) = seen.get_mut(&b.id)
                && b.at != *last
            {
                *last = b.at;
                *moved = moved.saturating_add(1);
                *since = Instant::now();
            }
        }
    }
    info!(
        instances = seen.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "Joined the other instances on this database."
    );
}

/// Reads the others' floors and publishes this one's as the [`Cadence`]
/// says, until `end` resolves; then, if nothing is left unstored, removes
/// this instance's document.
pub async fn run(
    instance: Instance,
    store: Arc<MongoStore>,
    batcher: BatcherHandle,
    journal: Option<Journal>,
    end: impl std::future::Future<Output = ()>,
) {
    // Long: the floor task's loop: read the others' floors, publish this one's, leave at the end.
    let watermarks = store.watermarks();
    // The last tick's start: the next is the first due after it.
    let mut last_tick: Option<Instant> = None;
    let mut last_prune = Instant::now();
    let mut holder = None;
    let mut last_warned: Option<Instant> = None;
    let mut stale_since: Option<Instant> = None;
    // `join` has just written, promising a second.
    let mut cadence = Cadence::default();
    cadence.wrote(Instant::now(), i64::MIN, PUBLISH_EVERY);
    tokio::pin!(end);
    loop {
        let next = last_tick.map_or_else(Instant::now, |at| {
            at + PUBLISH_EVERY * cadence.idle_ticks(at, store.deletes_seen())
        });
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = store.delete_taken() => {}
            _ = &mut end => break,
        }
        let now = Instant::now();
        last_tick = Some(now);
        let others = if cadence.due(now, store.deletes_seen()) {
            write(&mut cadence, &instance, &store, &batcher, journal.as_ref()).await
        } else if cadence.read_due(now) {
            match read(&instance, &store).await {
                Some(others) => {
                    cadence.read(Instant::now(), &others.beats);
                    // An instance that just appeared waits for this one's
                    // beat to move: at once, not a tick later.
                    if cadence.due(Instant::now(), store.deletes_seen()) {
                        write(&mut cadence, &instance, &store, &batcher, journal.as_ref())
                            .await
                            .or(Some(others))
                    } else {
                        Some(others)
                    }
                }
                None => None,
            }
        } else {
            None
        };
        if let Some(others) = others {
            holder = others.holder;
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = Instant::now();
            // An hour back, or MIN (a backlog) for longer than a replay takes.
            let held_for = clock::unix_ms().saturating_sub(watermarks.others());
            if held_for > STALE_FLOOR.as_millis() as i64 {
                stale_since.get_or_insert_with(Instant::now);
            } else {
                stale_since = None;
            }
            if stale_since.is_some_and(|since| since.elapsed() >= STALE_FOR)
                && last_warned.is_none_or(|at| at.elapsed() >= STALE_FLOOR)
                && let Some(id) = &holder
            {
                last_warned = Some(Instant::now());
                warn!(
                    instance = %id,
                    held_for_s = held_for / 1000,
                    "Another instance's floor has held versions back for over an hour: new buckets keep their versions until it returns and drains its journal. If its journal is gone for good, run `hourglass instances --forget <id>`."
                );
            }
            let all = watermarks
                .others()
                .min(own_floor(&batcher, journal.as_ref()));
            match store.prune_tombstones(all).await {
                Ok(0) => {}
                Ok(n) => info!(
                    deletes = n,
                    "Dropped the records of deletes no instance can hold older readings for."
                ),
                Err(e) => {
                    warn!(error = %e, "Could not drop old delete records; retrying in a minute.")
                }
            }
            match store.prune_versions(all).await {
                Ok(0) => {}
                Ok(n) => info!(
                    buckets = n,
                    "Dropped versions no write can contest any more."
                ),
                Err(e) => warn!(error = %e, "Could not drop old versions; retrying in a minute."),
            }
        }
    }
    let unstored = batcher.buffered() > 0 || journal.as_ref().is_some_and(|j| !j.caught_up());
    let result = if unstored {
        // Owed readings wait for the next start: until then every value the
        // others store keeps its version.
        store
            .publish_floor(
                &instance.id,
                i64::MIN,
                instance.durable,
                PUBLISH_EVERY.as_millis() as i64,
                clock::unix_ms(),
            )
            .await
            .map(|_| ())
    } else {
        store.forget_instance(&instance.id).await
    };
    if let Err(e) = result {
        warn!(error = %e, "Could not update this instance's floor on the way out.");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn beat(id: &str, at: i64) -> Beat {
        Beat {
            id: id.to_owned(),
            at,
            running: true,
        }
    }

    /// One tick of [`run`] at `now`: a write if due, else a read if due,
    /// followed by a write if that read made one due. `others` is what a
    /// read finds. Returns (wrote, read).
    fn tick(c: &mut Cadence, now: Instant, seen: i64, others: &[Beat]) -> (bool, bool) {
        if c.due(now, seen) {
            let every = c.every(now);
            c.wrote(now, seen, every);
            c.read(now, others);
            (true, true)
        } else if c.read_due(now) {
            c.read(now, others);
            if c.due(now, seen) {
                let every = c.every(now);
                c.wrote(now, seen, every);
                return (true, true);
            }
            (false, true)
        } else {
            (false, false)
        }
    }

    /// Drives a cadence one tick a second for `seconds`; `others(t)` gives
    /// the beats a read finds at second `t`. Returns the seconds it wrote
    /// at and the seconds it read at.
    fn drive(seconds: u64, others: impl Fn(u64) -> Vec<Beat>) -> (Vec<u64>, Vec<u64>) {
        let start = Instant::now();
        let mut c = Cadence::default();
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        for t in 0..seconds {
            let (wrote, read) = tick(&mut c, start + Duration::from_secs(t), i64::MIN, &others(t));
            if wrote {
                writes.push(t);
            }
            if read {
                reads.push(t);
            }
        }
        (writes, reads)
    }

    #[test]
    fn a_lone_instance_writes_its_document_once_a_minute_and_reads_every_three_seconds() {
        let (writes, reads) = drive(600, |_| Vec::new());
        assert_eq!(
            writes,
            vec![0, 59, 118, 177, 236, 295, 354, 413, 472, 531, 590]
        );
        assert!(reads.windows(2).all(|w| w[1] - w[0] <= 3), "{reads:?}");
        // A write reads too, and restarts the three seconds.
        assert!(reads.len() <= 200 + writes.len(), "{}", reads.len());
    }

    #[test]
    fn another_running_instance_makes_it_write_every_second_until_it_stops() {
        // The other beats for seconds 100..200, then stops.
        let (writes, _) = drive(600, |t| {
            if t < 100 {
                Vec::new()
            } else {
                vec![beat("b", t.min(200) as i64)]
            }
        });
        // It is seen at the first read from second 100, and answered then.
        let first = writes.iter().copied().find(|&t| t >= 100).expect("a write");
        assert!(first <= 102, "{writes:?}");
        let every_second: Vec<u64> = (first..=200 + 149).collect();
        assert!(
            writes
                .windows(every_second.len())
                .any(|w| w == every_second)
        );
        // Then once a minute again, the first of those promising a minute.
        let after: Vec<u64> = writes.into_iter().filter(|&t| t > 349).collect();
        assert_eq!(after, vec![350, 409, 468, 527, 586]);
    }

    #[test]
    fn a_stopped_instance_s_document_does_not_make_it_write_every_second() {
        let stale = Beat {
            id: "gone".to_owned(),
            at: 5,
            running: false,
        };
        let (writes, _) = drive(200, |_| vec![stale.clone()]);
        assert_eq!(writes, vec![0, 59, 118, 177]);
    }

    #[test]
    fn a_lone_instance_wakes_only_to_read_or_write() {
        let start = Instant::now();
        let mut c = Cadence::default();
        let (mut t, mut wakes) = (0u64, 0);
        while t < 600 {
            tick(&mut c, start + Duration::from_secs(t), i64::MIN, &[]);
            wakes += 1;
            t += u64::from(c.idle_ticks(start + Duration::from_secs(t), i64::MIN));
        }
        // Only at the seconds where a tick reads or writes (a read every
        // three seconds, a write once a minute), where ticking woke 600 times.
        let (writes, reads) = drive(600, |_| Vec::new());
        let acting: std::collections::BTreeSet<u64> = writes.into_iter().chain(reads).collect();
        assert_eq!(wakes, acting.len());
        assert!(wakes <= 211, "{wakes}");
    }

    #[test]
    fn a_delete_taken_in_is_published_at_the_next_tick() {
        let start = Instant::now();
        let mut c = Cadence::default();
        c.wrote(start, 1, ALONE_EVERY);
        assert!(!c.due(start + Duration::from_secs(1), 1));
        assert!(c.due(start + Duration::from_secs(1), 2));
    }

    proptest! {
        /// Against the rules stated plainly, ticks a second apart: every
        /// promise is kept; a lone instance reads at least every three
        /// seconds and every tick while another runs; a read that finds the
        /// other's beat moved is answered by a write in the same tick; a tick
        /// writes when the other was seen moving within `OTHERS_LIVE` or a
        /// delete was taken in since the last write, and otherwise only when
        /// its promise is a tick from due.
        #[test]
        fn the_cadence_keeps_its_promises_and_writes_only_when_needed(
            events in prop::collection::vec((prop::bool::weighted(0.02), prop::bool::weighted(0.01)), 1..900)
        ) {
            let start = Instant::now();
            let mut c = Cadence::default();
            let mut last: Option<(u64, u64, i64)> = None; // (second, promised s, seen)
            let mut last_read: Option<u64> = None;
            // The other instance's beat, and when a read last saw it move.
            let mut other_at = 0i64;
            let mut seen_at = 0i64;
            let mut seen_moving: Option<u64> = None;
            let mut seen = 0i64;
            let other = |at| [Beat { id: "b".to_owned(), at, running: false }];
            c.read(start, &other(0));
            for (t, &(moves, delete)) in events.iter().enumerate() {
                let t = t as u64;
                let now = start + Duration::from_secs(t);
                if delete {
                    seen += 1;
                }
                if moves {
                    other_at += 1;
                }
                let live = |m: Option<u64>| m.is_some_and(|m| t - m < OTHERS_LIVE.as_secs());
                let must_write = |live: bool| match last {
                    None => true,
                    Some((at, promised, s)) => live || s != seen || t - at + 1 >= promised,
                };
                let must_before_read = must_write(live(seen_moving));
                let (wrote, read) = tick(&mut c, now, seen, &other(other_at));
                if read {
                    if other_at != seen_at {
                        seen_at = other_at;
                        seen_moving = Some(t);
                    }
                    last_read = Some(t);
                } else {
                    prop_assert!(!live(seen_moving), "second {}: reads every tick while the other runs", t);
                    prop_assert!(last_read.is_some_and(|r| t - r < 3), "second {}: reads every 3 s", t);
                }
                prop_assert_eq!(wrote, must_write(live(seen_moving)), "second {}", t);
                if must_before_read {
                    prop_assert!(wrote);
                }
                if wrote {
                    if let Some((at, promised, _)) = last {
                        prop_assert!(t - at <= promised);
                    }
                    let every = if live(seen_moving) { PUBLISH_EVERY } else { ALONE_EVERY };
                    last = Some((t, every.as_secs(), seen));
                }
            }
        }

        /// Sleeping through the idle ticks, woken by each delete taken in,
        /// writes and reads at exactly the seconds a tick every second does
        /// (`run` against the tick-driven loop), whatever the other instance
        /// and the deletes do.
        #[test]
        fn sleeping_through_idle_ticks_writes_and_reads_as_ticking_every_second(
            events in prop::collection::vec((prop::bool::weighted(0.03), prop::bool::weighted(0.01), prop::bool::weighted(0.005)), 1..900)
        ) {
            let start = Instant::now();
            let (mut ticking, mut sleeping) = (Cadence::default(), Cadence::default());
            let (mut other_at, mut seen, mut running) = (0i64, 0i64, true);
            let other = |at, running| [Beat { id: "b".to_owned(), at, running }];
            // Second 0 ticks in both; `next` is the sleeper's next tick.
            let mut next = 0u64;
            let mut woken = 0;
            for (t, &(moves, delete, stops)) in events.iter().enumerate() {
                let t = t as u64;
                let now = start + Duration::from_secs(t);
                if stops {
                    running = !running;
                }
                if moves && running {
                    other_at += 1;
                }
                if delete {
                    seen += 1;
                }
                let beats = other(other_at, running);
                let expected = tick(&mut ticking, now, seen, &beats);
                if t == next || delete {
                    let got = tick(&mut sleeping, now, seen, &beats);
                    prop_assert_eq!(got, expected, "second {}", t);
                    next = t + u64::from(sleeping.idle_ticks(now, seen));
                    woken += 1;
                } else {
                    prop_assert_eq!(expected, (false, false), "second {}: a tick slept through would have acted", t);
                }
            }
            prop_assert!(woken <= events.len());
        }
    }
}
