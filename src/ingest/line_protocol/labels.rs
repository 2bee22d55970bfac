//! Tags become sensor labels in the background: a line's readings never wait
//! for the registry. A cache of what the registry holds keeps the steady
//! state free of writes; only a tag set not seen before costs one update.
//!
//! What is offered here is already validated ([`SensorLabels`]) and
//! authorised: callers offer a sensor's labels only once its readings were
//! taken (a token's sensors, past the new-series guard), or once the guard
//! admitted the sensor itself (Sparkplug births).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;
use tokio::sync::mpsc;
use tracing::warn;

use crate::domain::SensorLabels;
use crate::shutdown::Shutdown;
use crate::store::MongoStore;

/// Updates waiting for the registry; past this, offers are dropped and made
/// again by the next line that carries the same tags.
const QUEUE: usize = 1024;
/// Past this many sensors the cache starts over: it only saves writes.
const CACHE_LIMIT: usize = 100_000;

type Update = SensorLabels<'static>;

/// The ingestors' side: offers tag sets, sends only those the registry lacks.
pub struct LabelSync {
    known: Mutex<HashMap<String, BTreeMap<String, String>>>,
    queue: mpsc::Sender<Update>,
}

/// The writer's side: drives updates into the store.
pub struct LabelWriter {
    sync: Arc<LabelSync>,
    updates: mpsc::Receiver<Update>,
}

impl LabelSync {
    pub fn new() -> (Arc<Self>, LabelWriter) {
        let (queue, updates) = mpsc::channel(QUEUE);
        let sync = Arc::new(Self {
            known: Mutex::new(HashMap::new()),
            queue,
        });
        let writer = LabelWriter {
            sync: sync.clone(),
            updates,
        };
        (sync, writer)
    }

    fn holds(&self, set: &SensorLabels<'_>) -> bool {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.get(set.sensor().as_str()).is_some_and(|have| {
            set.labels()
                .iter()
                .all(|(k, v)| have.get(k.as_ref()).map(String::as_str) == Some(v.as_ref()))
        })
    }

    /// Queues the sets the registry is not known to hold.
    pub fn offer(&self, sets: &[SensorLabels<'_>]) {
        for set in sets {
            if set.is_empty() || self.holds(set) {
                continue;
            }
            // Full: the same tags come with the sensor's next line.
            let _ = self.queue.try_send(set.clone().into_owned());
        }
    }

    fn learn(&self, set: &SensorLabels<'_>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let sensor = set.sensor().as_str();
        if known.len() >= CACHE_LIMIT && !known.contains_key(sensor) {
            known.clear();
        }
        known.entry(sensor.to_owned()).or_default().extend(
            set.labels()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
    }
}

impl LabelWriter {
    /// Writes queued tag sets until shutdown.
    pub async fn run(mut self, store: Arc<MongoStore>, shutdown: Shutdown) {
        loop {
            let set = tokio::select! {
                _ = shutdown.triggered() => return,
                next = self.updates.recv() => match next {
                    Some(next) => next,
                    None => return,
                },
            };
            // Offered twice before the first was written.
            if self.sync.holds(&set) {
                continue;
            }
            let sensor = set.sensor().as_str();
            match store.merge_labels(&set).await {
                Ok(true) => self.sync.learn(&set),
                Ok(false) => {
                    warn!(
                        sensor,
                        "A sensor's line-protocol tags would give it more than the allowed number of labels; they were not added."
                    );
                    // Remembered anyway, so that every line does not retry.
                    self.sync.learn(&set);
                }
                Err(e) => warn!(
                    sensor,
                    error = %e,
                    "Could not add line-protocol tags to the sensor registry; the sensor's next line offers them again."
                ),
            }
        }
    }
}
