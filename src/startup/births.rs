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
                let next = {
                    let mut p = queue.lock().unwrap_or_else(|e| e.into_inner());
                    let id = p.order.pop_front();
                    let birth = id.and_then(|id| p.births.remove(&id));
                    if let Some(b) = &birth {
                        p.bytes = p.bytes.saturating_sub(birth_bytes(b));
                    }
                    birth
                };
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
        let bytes = birth_bytes(&birth);
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let had = p.births.get(&id).map_or(0, birth_bytes);
            if p.bytes.saturating_sub(had).saturating_add(bytes) > self.max_bytes {
                tracing::warn!(
                    id,
                    "Sparkplug births arrive faster than they are kept; one was not kept (its node is asked to rebirth after a restart)."
                );
                return;
            }
            p.bytes = p.bytes.saturating_sub(had).saturating_add(bytes);
            if p.births.insert(id.clone(), birth).is_none() {
                p.order.push_back(id);
            }
        }
        self.wake.notify_one();
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
