//! Instances publish their floor: the earliest acknowledgement they still
//! hold unstored (`now` when none). The earliest floor of the others decides
//! whether a value this instance stores keeps its version, and the earliest
//! of all when a stored version can be dropped (see
//! docs/src/internals/last-write-wins.md). One small document per instance in the metadata collection,
//! read and written once a second while other instances run; a lone one
//! reads every three seconds and writes once a minute. Each write says how
//! soon the next comes (`every`), and readers judge by it (see
//! `store::floor`).

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document, doc};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::store::StoreError;

const PREFIX: &str = "instance:";

/// An instance without a journal that has not published for this long has
/// stopped: what it held unstored died with it, so its floor no longer counts.
const VOLATILE_AFTER_MS: i64 = 30_000;

/// How often an instance that did not say writes its document (ms).
const EVERY_MS: i64 = 1_000;

/// How often the instance of `d` promised to write its document (ms).
fn every_of(d: &Document) -> i64 {
    match d.get("every") {
        Some(Bson::Int64(e)) => *e,
        Some(Bson::Int32(e)) => i64::from(*e),
        _ => EVERY_MS,
    }
}

/// The instance of `d` published within `window` ms of `now`, or within
/// two of its promised intervals if those are longer: one that writes once
/// a minute is not taken for stopped after 5 s of quiet.
pub(super) fn published_within(d: &Document, now: i64, window: i64) -> bool {
    d.get_datetime("at")
        .is_ok_and(|at| now - at.timestamp_millis() < window.max(2 * every_of(d)))
}

/// A published floor; `None` if unreadable.
fn floor_of(d: &Document) -> Option<i64> {
    match d.get("floor") {
        Some(Bson::Int64(f)) => Some(*f),
        Some(Bson::Int32(f)) => Some(i64::from(*f)),
        _ => None,
    }
}

/// The earliest floor among the published documents other than `own`, at
/// `now` (epoch ms); `i64::MAX` if there are none.
pub fn others_floor(docs: &[Document], own: &str, now: i64) -> i64 {
    docs.iter()
        .filter(|d| d.get_str("_id").is_ok_and(|id| id != own))
        .filter(|d| {
            // A journaled instance's floor holds until it comes back and
            // drains: its journal still owes those readings.
            d.get_bool("durable").unwrap_or(true) || published_within(d, now, VOLATILE_AFTER_MS)
        })
        // Unreadable: assume the worst, everything keeps its version.
        .map(|d| floor_of(d).unwrap_or(i64::MIN))
        .min()
        .unwrap_or(i64::MAX)
}

/// One other instance's last publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    pub id: String,
    /// When it published (its own clock, epoch ms).
    pub at: i64,
    /// It published recently enough, by its promise, to be running.
    pub running: bool,
}

/// When each other instance last published, at `now` (epoch ms).
pub fn beats(docs: &[Document], own: &str, now: i64) -> Vec<Beat> {
    docs.iter()
        .filter_map(|d| {
            let id = d.get_str("_id").ok()?;
            let at = d.get_datetime("at").ok()?.timestamp_millis();
            (id != own).then(|| Beat {
                id: id.to_owned(),
                at,
                running: published_within(d, now, VOLATILE_AFTER_MS),
            })
        })
        .collect()
}

/// Whether `own` rolls up the hours marked late: no other instance running
/// by its promise has a lower id, so exactly one does while they agree on
/// who runs.
pub fn rolls_up_late(docs: &[Document], own: &str, now: i64) -> bool {
    docs.iter().all(|d| {
        d.get_str("_id").map_or(true, |id| {
            id >= own || !published_within(d, now, VOLATILE_AFTER_MS)
        })
    })
}

/// The instance (id without the prefix) whose floor is the earliest of the
/// others', the one that holds versions back.
pub fn holder(docs: &[Document], own: &str, now: i64) -> Option<String> {
    let floor = others_floor(docs, own, now);
    docs.iter()
        .filter(|d| d.get_str("_id").is_ok_and(|id| id != own))
        .find(|d| floor_of(d).unwrap_or(i64::MIN) == floor)
        .and_then(|d| d.get_str("_id").ok())
        .map(|id| id.trim_start_matches(PREFIX).to_owned())
}

/// What one publish learnt of the other instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Others {
    /// Their earliest floor (`i64::MAX` if none).
    pub floor: i64,
    /// Whose floor that is.
    pub holder: Option<String>,
    /// When each last published.
    pub beats: Vec<Beat>,
}

/// One instance as it last published, for operators (`hourglass instances`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InstanceInfo {
    pub id: String,
    /// The earliest acknowledgement it may hold unstored (epoch ms).
    pub floor: Option<i64>,
    /// It has a journal: its floor counts until it comes back.
    pub durable: bool,
    /// When it last published (epoch ms, its own clock).
    pub at: Option<i64>,
    /// How often it promised to publish (ms).
    pub every_ms: i64,
}

/// Why an instance's document was not removed.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("no instance {0:?} is recorded")]
    Unknown(String),
    #[error("instance {id:?} published {seconds} s ago: it is running; stop it instead")]
    Running { id: String, seconds: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An instance that published this recently is taken to be running and is
/// never forgotten by hand.
const RUNNING_WITHIN_MS: i64 = 30_000;

impl MongoStore {
    /// Publishes this instance's `floor`, promising to publish again within
    /// `every_ms`, and reads the others'. Two round trips.
    pub async fn publish_floor(
        &self,
        id: &str,
        floor: i64,
        durable: bool,
        every_ms: i64,
        now: i64,
    ) -> Result<Others, StoreError> {
        let own = format!("{PREFIX}{id}");
        let _ = self.instance_id.set(own.clone());
        let published = self
            .metadata
            .update_one(
                doc! { "_id": &own },
                doc! { "$set": {
                    "floor": floor,
                    "durable": durable,
                    "at": DateTime::from_millis(now),
                    "every": every_ms,
                    // The newest delete applied: a delete waits for it.
                    "seen": self.deletes_seen(),
                } },
            )
            .upsert(true);
        self.driver(published).await.map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "instance_floor", 1));
        self.read_floors(id, now).await
    }

    /// Reads the other instances' floors and the deletes' tombstones (and
    /// applies those): one round trip.
    pub async fn read_floors(&self, id: &str, now: i64) -> Result<Others, StoreError> {
        let own = format!("{PREFIX}{id}");
        // The instances' documents and the deletes' tombstones, in one read.
        let pattern = format!(
            "^({}|{})",
            regex::escape(PREFIX),
            regex::escape(crate::store::delete::PREFIX)
        );
        let cursor = self
            .driver(self.metadata.find(doc! { "_id": { "$regex": pattern } }))
            .await
            .map_err(classify_read)?;
        let all: Vec<Document> = self
            .driver(cursor.try_collect())
            .await
            .map_err(classify_read)?;
        let (docs, tombstones): (Vec<Document>, Vec<Document>) = all
            .into_iter()
            .partition(|d| d.get_str("_id").is_ok_and(|id| id.starts_with(PREFIX)));
        self.apply_tombstones(&tombstones).await;
        self.count(|m| m.db_documents("read", "metadata", "instance_floor", docs.len() as u64));
        self.late_roller.store(
            rolls_up_late(&docs, &own, now),
            std::sync::atomic::Ordering::Release,
        );
        Ok(Others {
            floor: others_floor(&docs, &own, now),
            holder: holder(&docs, &own, now),
            beats: beats(&docs, &own, now),
        })
    }

    /// Every instance's published document.
    pub(super) async fn instance_documents(&self) -> Result<Vec<Document>, StoreError> {
        let pattern = format!("^{}", regex::escape(PREFIX));
        self.metadata
            .find(doc! { "_id": { "$regex": pattern } })
            .await
            .map_err(classify_read)?
            .try_collect()
            .await
            .map_err(classify_read)
    }

    /// This instance's document id, once it has published.
    pub(super) fn instance_id(&self) -> Option<String> {
        self.instance_id.get().cloned()
    }

    /// Every instance recorded, as it last published.
    pub async fn instances(&self) -> Result<Vec<InstanceInfo>, StoreError> {
        let docs = self.instance_documents().await?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                Some(InstanceInfo {
                    id: d.get_str("_id").ok()?.trim_start_matches(PREFIX).to_owned(),
                    floor: floor_of(d),
                    durable: d.get_bool("durable").unwrap_or(true),
                    at: d.get_datetime("at").ok().map(|at| at.timestamp_millis()),
                    every_ms: every_of(d),
                })
            })
            .collect())
    }

    /// Removes the record of an instance that is gone for good (its journal
    /// lost), so that its floor stops holding versions back. Refuses one
    /// that published within the last 30 s, or two of its promised intervals
    /// if longer (at `now`, epoch ms).
    pub async fn forget_stopped_instance(&self, id: &str, now: i64) -> Result<(), ForgetError> {
        let known = self.instances().await?;
        let Some(info) = known.iter().find(|i| i.id == id) else {
            return Err(ForgetError::Unknown(id.to_owned()));
        };
        if let Some(at) = info.at
            && now - at < RUNNING_WITHIN_MS.max(2 * info.every_ms)
        {
            return Err(ForgetError::Running {
                id: id.to_owned(),
                seconds: (now - at).max(0) / 1000,
            });
        }
        self.forget_instance(id).await?;
        Ok(())
    }

    /// Removes this instance's document: it holds nothing unstored and stops.
    pub async fn forget_instance(&self, id: &str) -> Result<(), StoreError> {
        let r = self
            .metadata
            .delete_one(doc! { "_id": format!("{PREFIX}{id}") })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "instance_floor", r.deleted_count));
        Ok(())
    }

    /// Drops the versions no write can contest any more: those of buckets
    /// whose latest version is before `floor`, the earliest acknowledgement
    /// still unstored anywhere. Returns the buckets rewritten.
    pub async fn prune_versions(&self, floor: i64) -> Result<u64, StoreError> {
        let result = self
            .buckets
            .update_many(
                doc! { "amax": { "$lt": floor } },
                doc! { "$unset": { "a": "", "amax": "" } },
            )
            .await
            .map_err(classify)?;
        let pruned = result.modified_count;
        self.count(|m| m.db_documents("written", "buckets", "version_prune", pruned));
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, floor: i64, durable: bool, at: i64) -> Document {
        doc! { "_id": format!("{PREFIX}{id}"), "floor": floor, "durable": durable, "at": DateTime::from_millis(at) }
    }

    #[test]
    fn the_floor_of_the_others_is_their_earliest_and_leaves_out_stopped_volatile_ones() {
        let now = 1_000_000;
        let docs = vec![
            instance("me", 5, true, now),
            instance("a", 900_000, true, now),
            instance("b", 800_000, true, 1),
            instance("c", 700_000, false, now - VOLATILE_AFTER_MS - 1),
            instance("d", 950_000, false, now - 10),
        ];
        assert_eq!(others_floor(&docs, "instance:me", now), 800_000);
        assert_eq!(holder(&docs, "instance:me", now).as_deref(), Some("b"));
        assert_eq!(holder(&docs[..1], "instance:me", now), None);
        assert_eq!(others_floor(&docs[..1], "instance:me", now), i64::MAX);
        let odd = vec![doc! { "_id": "instance:x", "floor": "soon" }];
        assert_eq!(others_floor(&odd, "instance:me", now), i64::MIN);
    }

    #[test]
    fn the_running_instance_with_the_lowest_id_rolls_up_late_hours() {
        let now = 1_000_000;
        let docs = vec![
            instance("b", 5, true, now),
            instance("c", 5, false, now),
            // Stopped by its promise: no longer in the running.
            instance("a", 5, true, now - VOLATILE_AFTER_MS - 1),
        ];
        assert!(rolls_up_late(&docs, "instance:b", now));
        assert!(!rolls_up_late(&docs, "instance:c", now));
        assert!(rolls_up_late(&docs[..0], "instance:c", now), "alone");
        let mut a = docs[2].clone();
        a.insert("at", DateTime::from_millis(now));
        assert!(!rolls_up_late(&[a], "instance:b", now));
    }

    #[test]
    fn an_instance_is_judged_stopped_by_the_interval_it_promised() {
        let now = 1_000_000;
        let mut quiet = instance("q", 700_000, false, now - 50_000);
        // Without a promise: a second, so 50 s of quiet is stopped.
        assert!(!published_within(&quiet, now, 5_000));
        assert_eq!(
            others_floor(std::slice::from_ref(&quiet), "instance:me", now),
            i64::MAX
        );
        quiet.insert("every", 60_000i64);
        assert!(published_within(&quiet, now, 5_000));
        assert_eq!(
            others_floor(std::slice::from_ref(&quiet), "instance:me", now),
            700_000
        );
        assert!(!published_within(&quiet, now + 70_001, 5_000));
        let beat = &beats(&[quiet], "instance:me", now)[0];
        assert_eq!((beat.id.as_str(), beat.running), ("instance:q", true));
    }
}
