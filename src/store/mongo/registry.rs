//! The sensor registry on MongoDB (see `store::registry`).

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::ReturnDocument;

use super::classify::{classify, classify_read};
use super::connection::{MongoStore, Registering};
use crate::domain::{BucketUpdate, Labels, Reading, SensorLabels};
use crate::journal::Registrar;
use crate::store::StoreError;
use crate::store::registry::{self, SensorInfo, SensorQuery};
use tokio::sync::oneshot;

/// Past this many known series the cache starts over: it only saves round trips.
const CACHE_LIMIT: usize = 1_000_000;

/// A borrowed `(sensor, metric)` key of the registry cache, looked up
/// without building the owned pair (once per stored update).
#[derive(Hash)]
struct SeriesRef<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<(String, String)> for SeriesRef<'_> {
    fn equivalent(&self, key: &(String, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

impl MongoStore {
    /// Tells the registry about series and hours it has not seen; in the
    /// steady state every series is known and this sends nothing.
    /// Forgets that `sensor` has `metric`, so its next write registers it
    /// again (a delete took it out of the registry).
    pub(super) fn forget_series(&self, sensor: &str, metric: &str) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.remove(&(sensor.to_owned(), metric.to_owned()));
    }

    pub(super) async fn register(&self, stored: &[&BucketUpdate]) -> Result<usize, StoreError> {
        let news = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            registry::news(stored.iter().copied(), self.granularity, |s, m| {
                known.get(&SeriesRef(s, m)).copied()
            })
        };
        if news.is_empty() {
            return Ok(0);
        }
        let statements = registry::statements(&news);
        let mut commands = 0;
        // A few hundred bytes a statement: 10 000 stay far below the limits.
        for chunk in statements.chunks(10_000) {
            let command = doc! {
                "update": self.sensors.name(),
                "updates": chunk.iter().cloned().map(Bson::Document).collect::<Vec<_>>(),
                "ordered": false,
            };
            let reply = self.run_write(command, "a sensor registry update").await;
            // Counted even when it failed: some statements may have applied.
            self.registrations
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let reply = reply?;
            commands += 1;
            let refused = reply.get_array("writeErrors").map_or(0, Vec::len);
            // Every statement applied is a document written (an upsert of
            // the series' metrics and newest hour).
            let applied = chunk.len().saturating_sub(refused) as u64;
            self.count(|m| m.db_documents("written", "sensors", "registry_update", applied));
            if refused > 0 {
                return Err(StoreError::Poison(format!(
                    "the sensor registry refused {refused} updates"
                )));
            }
        }
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() > CACHE_LIMIT {
            known.clear();
        }
        for ((s, m), hour) in news {
            let e = known.entry((s.to_owned(), m.to_owned())).or_insert(hour);
            *e = (*e).max(hour);
        }
        Ok(commands)
    }

    pub(super) async fn list_sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        mut keep: F,
    ) -> Result<Vec<SensorInfo>, StoreError> {
        // Read before the listing: a registration after it changes the count.
        let registrations = self.registrations.load(std::sync::atomic::Ordering::SeqCst);
        let mut cursor = self
            .sensors
            .find(registry::filter(&query))
            .sort(doc! { "_id": 1 })
            .await
            .map_err(classify_read)?;
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(d) = cursor.try_next().await.map_err(classify_read)? else {
                break;
            };
            // One document that does not decode costs only itself: skipped,
            // counted and logged, never the listing.
            let mut info = match registry::read(&d) {
                Ok(info) => info,
                Err(e) => {
                    self.count(|m| m.unreadable_documents.inc());
                    tracing::warn!(
                        id = %d.get("_id").map(ToString::to_string).unwrap_or_default(),
                        error = %e,
                        "Skipped a sensor registry document that does not decode."
                    );
                    continue;
                }
            };
            info.registrations = registrations;
            if keep(&info) {
                out.push(info);
            }
        }
        Ok(out)
    }

    pub(super) async fn put_labels(&self, sensor: &str, labels: &Labels) -> Result<(), StoreError> {
        let labels: Document = labels
            .iter()
            .map(|(k, v)| (k.to_owned(), Bson::from(v)))
            .collect();
        let r = self
            .sensors
            .update_one(
                doc! { "_id": sensor },
                doc! { "$set": { "labels": labels }, "$setOnInsert": { "metrics": [] } },
            )
            .upsert(true)
            .await
            .map_err(classify)?;
        let written = r.modified_count + u64::from(r.upserted_id.is_some());
        self.count(|m| m.db_documents("written", "sensors", "labels", written));
        Ok(())
    }

    pub(super) async fn add_labels(&self, set: &SensorLabels<'_>) -> Result<bool, StoreError> {
        let labels = set.labels();
        let added: Document = labels
            .iter()
            .map(|(k, v)| (k.to_string(), Bson::from(v.as_ref())))
            .collect();
        let after = self
            .sensors
            .find_one_and_update(
                doc! { "_id": set.sensor().as_str() },
                registry::merge_labels(added),
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(doc! { "labels": 1 })
            .await
            .map_err(classify)?;
        // An upsert: one document written (or left as it was: not told apart).
        self.count(|m| m.db_documents("written", "sensors", "labels", 1));
        let now = after.as_ref().and_then(|d| d.get_document("labels").ok());
        Ok(labels
            .iter()
            .all(|(k, v)| now.and_then(|l| l.get_str(k.as_ref()).ok()) == Some(v.as_ref())))
    }
}

/// Series registered ahead of storage, waiting for the registrar task.
const REGISTER_QUEUE: usize = 1024;

impl Registrar for MongoStore {
    fn unseen(&self, readings: &[Reading<'_>]) -> Vec<(String, String)> {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, String)> = Vec::new();
        // A set, not a scan of `out`: a fleet's first requests hold
        // thousands of series not yet registered (a scan made that
        // quadratic, a tenth of an import's CPU).
        let mut fresh: hashbrown::HashSet<(&str, &str)> = hashbrown::HashSet::new();
        let mut last: Option<&Reading<'_>> = None;
        for r in readings {
            // Readings of one series mostly come together: look once.
            if last.is_some_and(|last| last.same_series(r)) {
                continue;
            }
            last = Some(r);
            let series = (r.sensor.as_str(), r.metric.as_str());
            if !known.contains_key(&SeriesRef(series.0, series.1)) && fresh.insert(series) {
                out.push((series.0.to_owned(), series.1.to_owned()));
            }
        }
        out
    }

    fn register(&self, series: Vec<(String, String)>) -> Option<oneshot::Receiver<()>> {
        let tx = self.registering.as_ref()?;
        let (done, registered) = oneshot::channel();
        // A full queue drops them: the flush that stores them registers them.
        tx.try_send((series, done)).ok()?;
        Some(registered)
    }
}

impl MongoStore {
    /// The queue of series to register ahead of storage, for [`Self::run_registrar`].
    pub fn registrar_queue(&mut self) -> tokio::sync::mpsc::Receiver<Registering> {
        let (tx, rx) = tokio::sync::mpsc::channel(REGISTER_QUEUE);
        self.registering = Some(tx);
        rx
    }

    /// Registers the series of accepted readings as they come (metrics
    /// added, labels and last seen left alone), until `stop` resolves.
    pub async fn run_registrar(
        self: std::sync::Arc<Self>,
        mut queue: tokio::sync::mpsc::Receiver<Registering>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        loop {
            let first = tokio::select! {
                _ = &mut stop => return,
                next = queue.recv() => match next {
                    Some(series) => series,
                    None => return,
                },
            };
            let (mut series, done) = first;
            let mut waiting = vec![done];
            while let Ok((more, done)) = queue.try_recv() {
                series.extend(more);
                waiting.push(done);
                if series.len() >= 10_000 {
                    break;
                }
            }
            series.sort_unstable();
            series.dedup();
            let mut by_sensor: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (s, m) in &series {
                by_sensor.entry(s).or_default().push(m);
            }
            let statements: Vec<Bson> = by_sensor
                .iter()
                .map(|(sensor, metrics)| {
                    Bson::Document(doc! {
                        "q": { "_id": *sensor },
                        "u": {
                            "$addToSet": { "metrics": { "$each": metrics.clone() } },
                            "$setOnInsert": { "labels": {} },
                        },
                        "upsert": true,
                    })
                })
                .collect();
            let command =
                doc! { "update": self.sensors.name(), "updates": statements, "ordered": false };
            match self.run_write(command, "a sensor registry update").await {
                Ok(_) => {
                    self.count(|m| {
                        m.db_documents(
                            "written",
                            "sensors",
                            "registry_update",
                            by_sensor.len() as u64,
                        )
                    });
                    let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                    for (s, m) in series {
                        // No hour yet: the flush that stores it sets last_seen.
                        known.entry((s, m)).or_insert(i64::MIN);
                    }
                }
                Err(e) => tracing::warn!(error = %e,
                    "Could not register new series ahead of storage; the flush that stores them will."),
            }
            for done in waiting {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrowed_series_finds_its_owned_entry_in_the_cache() {
        let mut known: hashbrown::HashMap<(String, String), i64> = hashbrown::HashMap::new();
        for i in 0..100 {
            known.insert((format!("s{i}"), format!("m{i}")), i);
        }
        assert_eq!(known.get(&SeriesRef("s42", "m42")), Some(&42));
        assert_eq!(known.get(&SeriesRef("s42", "m43")), None);
        // The split point is part of the key: ("ab", "c") is not ("a", "bc").
        known.insert(("ab".into(), "c".into()), 7);
        assert_eq!(known.get(&SeriesRef("a", "bc")), None);
        assert_eq!(known.get(&SeriesRef("ab", "c")), Some(&7));
    }
}
