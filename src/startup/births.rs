//! Sparkplug birth certificates kept in the metadata collection, for the
//! host to read back after a restart.

use std::sync::Arc;

use crate::store::MongoStore;

/// Sparkplug birth certificates, kept in the metadata collection by one
/// writer task (so a node's births are written in the order they came).
pub(super) struct StoredBirths {
    store: Arc<MongoStore>,
    queue: tokio::sync::mpsc::Sender<crate::ingest::sparkplug::Birth>,
}

impl StoredBirths {
    pub(super) fn new(store: Arc<MongoStore>) -> Self {
        let (queue, mut births) =
            tokio::sync::mpsc::channel::<crate::ingest::sparkplug::Birth>(1024);
        let writer = store.clone();
        tokio::spawn(async move {
            while let Some(birth) = births.recv().await {
                if let Err(e) = writer.put_metadata(&birth.id(), &birth).await {
                    tracing::warn!(id = birth.id(), error = %e,
                        "Could not keep a Sparkplug birth certificate; after a restart its node is asked to rebirth.");
                }
            }
        });
        Self { store, queue }
    }
}

impl crate::ingest::sparkplug::BirthBook for StoredBirths {
    fn save(&self, birth: crate::ingest::sparkplug::Birth) {
        if self.queue.try_send(birth).is_err() {
            tracing::warn!("Sparkplug births arrive faster than they are kept; one was not kept.");
        }
    }

    fn load(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<crate::ingest::sparkplug::Birth>, String>>
    {
        Box::pin(async move {
            self.store
                .metadata_under(crate::ingest::sparkplug::BIRTH_PREFIX)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
