//! [`Deletes`]: the tombstones this instance's writes follow (see
//! `store::delete`).

use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::{RwLock, RwLockReadGuard};

use crate::store::delete::Tombstone;

/// The tombstones this instance's writes follow.
#[derive(Debug)]
pub struct Deletes {
    set: RwLock<Vec<Tombstone>>,
    /// The newest tombstone applied (`at`), published with the floor.
    seen: AtomicI64,
    /// Wakes the floor task when this instance takes a delete in, so that it
    /// publishes `seen` at once rather than sleep through its idle ticks.
    pub(super) taken: tokio::sync::Notify,
}

impl Default for Deletes {
    fn default() -> Self {
        Self {
            set: RwLock::new(Vec::new()),
            seen: AtomicI64::new(i64::MIN),
            taken: tokio::sync::Notify::new(),
        }
    }
}

impl Deletes {
    /// The tombstones, held while a write is going.
    pub async fn read(&self) -> RwLockReadGuard<'_, Vec<Tombstone>> {
        self.set.read().await
    }

    /// Applies the recorded tombstones; once it returns, no write that
    /// began before is still going.
    pub async fn replace(&self, mut recorded: Vec<Tombstone>) {
        recorded.sort_by(|a, b| a.id.cmp(&b.id));
        let newest = recorded.iter().map(|t| t.at).max().unwrap_or(i64::MIN);
        if *self.set.read().await != recorded {
            *self.set.write().await = recorded;
        }
        self.seen.fetch_max(newest, Ordering::AcqRel);
    }

    pub(super) async fn add(&self, t: Tombstone) {
        let at = t.at;
        let mut set = self.set.write().await;
        if !set.iter().any(|x| x.id == t.id) {
            set.push(t);
            set.sort_by(|a, b| a.id.cmp(&b.id));
        }
        drop(set);
        self.seen.fetch_max(at, Ordering::AcqRel);
        self.taken.notify_one();
    }

    pub fn seen(&self) -> i64 {
        self.seen.load(Ordering::Acquire)
    }
}
