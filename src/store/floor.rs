//! This instance's floor: the earliest acknowledgement it may still hold
//! unstored, published once a second beside the other instances' (see
//! `store::mongo::instances` and the README's "Last write wins"). The
//! others' earliest floor decides which values keep their version; once a
//! minute, versions older than every floor are dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use hashbrown::HashMap;

use super::MongoStore;
use super::mongo::Others;
use crate::batcher::clock;
use crate::batcher::driver::BatcherHandle;
use crate::journal::Journal;

const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// An instance whose beat has not moved for this long is taken to be down.
const SILENT_AFTER: Duration = Duration::from_secs(5);
const JOIN_POLL: Duration = Duration::from_millis(200);
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

/// Publishes the floor once and reads the others' into the watermarks.
pub async fn publish(
    instance: &Instance,
    store: &MongoStore,
    batcher: &BatcherHandle,
    journal: Option<&Journal>,
) -> Option<Others> {
    let floor = own_floor(batcher, journal);
    match store
        .publish_floor(&instance.id, floor, instance.durable, clock::unix_ms())
        .await
    {
        Ok(others) => {
            store.watermarks().set_others(others.floor);
            Some(others)
        }
        // The others' floors only rise: the last one read stays safe.
        Err(e) => {
            warn!(error = %e, "Could not publish this instance's floor; retrying.");
            None
        }
    }
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
    let Some(first) = publish(instance, store, batcher, journal).await else {
        return;
    };
    if first.beats.is_empty() {
        return;
    }
    let started = Instant::now();
    // Per instance: its last beat seen, how many times it moved, and when.
    let mut seen: HashMap<String, (i64, u8, Instant)> = first
        .beats
        .into_iter()
        .map(|(id, at)| (id, (at, 0, started)))
        .collect();
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
        let Some(others) = publish(instance, store, batcher, journal).await else {
            continue;
        };
        for (id, at) in others.beats {
            // One that joined after this one waits for this one itself.
            if let Some((last, moved, since)) = seen.get_mut(&id)
                && at != *last
            {
                *last = at;
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

/// Publishes the floor once a second until `end` resolves; then, if nothing
/// is left unstored, removes this instance's document.
pub async fn run(
    instance: Instance,
    store: Arc<MongoStore>,
    batcher: BatcherHandle,
    journal: Option<Journal>,
    end: impl std::future::Future<Output = ()>,
) {
    let watermarks = store.watermarks();
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_prune = Instant::now();
    let mut holder = None;
    let mut last_warned: Option<Instant> = None;
    let mut stale_since: Option<Instant> = None;
    tokio::pin!(end);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut end => break,
        }
        if let Some(others) = publish(&instance, &store, &batcher, journal.as_ref()).await {
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
            .publish_floor(&instance.id, i64::MIN, instance.durable, clock::unix_ms())
            .await
            .map(|_| ())
    } else {
        store.forget_instance(&instance.id).await
    };
    if let Err(e) = result {
        warn!(error = %e, "Could not update this instance's floor on the way out.");
    }
}
