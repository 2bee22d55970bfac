//! Sparkplug birth certificates kept in the metadata collection, for the
//! host to read back after a restart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::ingest::sparkplug::Birth;
use crate::store::MongoStore;

/// Births waiting to be written, one per node or device: a newer birth
/// replaces the one waiting (only the latest is read back), so what waits
/// is at most the host's own state, whatever edge nodes send.
#[derive(Default)]
struct Pending {
    births: HashMap<String, Birth>,
    /// Ids in the order their first waiting birth came.
    order: VecDeque<String>,
    bytes: usize,
}

impl Pending {
    /// Keeps `birth`, replacing the one waiting for its node or device, if
    /// all that waits stays within `max_bytes`; false if it does not.
    fn put(&mut self, birth: Birth, max_bytes: usize) -> bool {
        let id = birth.id();
        let bytes = birth_bytes(&birth);
        let had = self.births.get(&id).map_or(0, birth_bytes);
        if self.bytes.saturating_sub(had).saturating_add(bytes) > max_bytes {
            return false;
        }
        self.bytes = self.bytes.saturating_sub(had).saturating_add(bytes);
        if self.births.insert(id.clone(), birth).is_none() {
            self.order.push_back(id);
        }
        true
    }

    /// The oldest waiting node's (or device's) latest birth.
    fn take(&mut self) -> Option<Birth> {
        let id = self.order.pop_front()?;
        let birth = self.births.remove(&id)?;
        self.bytes = self.bytes.saturating_sub(birth_bytes(&birth));
        Some(birth)
    }
}

/// What a waiting birth holds in memory.
fn birth_bytes(b: &Birth) -> usize {
    b.metrics
        .iter()
        .map(|(_, name, _)| name.len().saturating_add(64))
        .fold(b.group.len() + b.node.len() + 256, usize::saturating_add)
}

/// Sparkplug birth certificates, kept in the metadata collection by one
/// writer task (so a node's births are written in the order they came).
pub(super) struct StoredBirths {
    store: Arc<MongoStore>,
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
    /// Bytes of births that may wait (`mqtt.sparkplug.max_state_bytes`).
    max_bytes: usize,
}

impl StoredBirths {
    pub(super) fn new(store: Arc<MongoStore>, max_bytes: usize) -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let wake = Arc::new(Notify::new());
        let (writer, queue, woken) = (store.clone(), pending.clone(), wake.clone());
        tokio::spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).take();
                let Some(birth) = next else {
                    woken.notified().await;
                    continue;
                };
                if let Err(e) = writer.put_metadata(&birth.id(), &birth).await {
                    tracing::warn!(id = birth.id(), error = %e,
                        "Could not keep a Sparkplug birth certificate; after a restart its node is asked to rebirth.");
                }
            }
        });
        Self {
            store,
            pending,
            wake,
            max_bytes,
        }
    }
}

impl crate::ingest::sparkplug::BirthBook for StoredBirths {
    fn save(&self, birth: Birth) {
        let id = birth.id();
        let kept = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(birth, self.max_bytes);
        if kept {
            self.wake.notify_one();
        } else {
            tracing::warn!(
                id,
                "Sparkplug births arrive faster than they are kept; one was not kept (its node is asked to rebirth after a restart)."
            );
        }
    }

    fn load(&self) -> futures_util::future::BoxFuture<'_, Result<Vec<Birth>, String>> {
        Box::pin(async move {
            self.store
                .metadata_under(crate::ingest::sparkplug::BIRTH_PREFIX)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn birth(node: &str, metrics: usize) -> Birth {
        Birth {
            group: "g".into(),
            node: node.into(),
            device: None,
            bd_seq: Some(0),
            metrics: (0..metrics)
                .map(|i| (Some(i as u64), "a".into(), 10))
                .collect(),
        }
    }

    /// The review's crash loop: 200 births of one node, each 1 MB, queued
    /// faster than the stand-in keeps them. One waits, the latest.
    #[test]
    fn births_of_one_node_wait_as_one_the_latest_and_all_within_the_bound() {
        let mut p = Pending::default();
        let max = 64 << 20;
        for k in 0..200 {
            assert!(p.put(birth("big", 1000 + k), max));
        }
        assert!(p.put(birth("other", 10), max));
        assert_eq!(p.births.len(), 2);
        let first = p.take().expect("a birth");
        assert_eq!((first.node.as_str(), first.metrics.len()), ("big", 1199));
        assert_eq!(p.take().expect("a birth").node, "other");
        assert!(p.take().is_none());
        assert_eq!(p.bytes, 0);
        // Past the bound, a birth is not kept and the others stay.
        assert!(p.put(birth("a", 10), 4096));
        assert!(!p.put(birth("b", 1000), 4096));
        assert_eq!(p.births.len(), 1);
    }
}
