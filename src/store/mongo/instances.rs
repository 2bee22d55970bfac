//! Instances publish their floor: the earliest acknowledgement they still
//! hold unstored (`now` when none). The earliest floor of the others decides
//! whether a value this instance stores keeps its version, and the earliest
//! of all when a stored version can be dropped (see the README's "Last write
//! wins"). One small document per instance in the metadata collection,
//! written and read once a second.

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document, doc};

use super::{MongoStore, classify, classify_read};
use crate::store::StoreError;

const PREFIX: &str = "instance:";

/// An instance without a journal that has not published for this long has
/// stopped: what it held unstored died with it, so its floor no longer counts.
const VOLATILE_AFTER_MS: i64 = 30_000;

/// The earliest floor among the published documents other than `own`, at
/// `now` (epoch ms); `i64::MAX` if there are none.
pub fn others_floor(docs: &[Document], own: &str, now: i64) -> i64 {
    docs.iter()
        .filter(|d| d.get_str("_id").is_ok_and(|id| id != own))
        .filter(|d| {
            // A journaled instance's floor holds until it comes back and
            // drains: its journal still owes those readings.
            d.get_bool("durable").unwrap_or(true)
                || d.get_datetime("at")
                    .is_ok_and(|at| now - at.timestamp_millis() < VOLATILE_AFTER_MS)
        })
        .map(|d| match d.get("floor") {
            Some(Bson::Int64(f)) => *f,
            Some(Bson::Int32(f)) => i64::from(*f),
            // Unreadable: assume the worst, everything keeps its version.
            _ => i64::MIN,
        })
        .min()
        .unwrap_or(i64::MAX)
}

/// When each other instance last published (its own clock, epoch ms).
pub fn beats(docs: &[Document], own: &str) -> Vec<(String, i64)> {
    docs.iter()
        .filter_map(|d| {
            let id = d.get_str("_id").ok()?;
            let at = d.get_datetime("at").ok()?.timestamp_millis();
            (id != own).then(|| (id.to_owned(), at))
        })
        .collect()
}

/// What one publish learnt of the other instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Others {
    /// Their earliest floor (`i64::MAX` if none).
    pub floor: i64,
    /// When each last published.
    pub beats: Vec<(String, i64)>,
}

impl MongoStore {
    /// Publishes this instance's `floor` and reads the others'. Two round
    /// trips.
    pub async fn publish_floor(
        &self,
        id: &str,
        floor: i64,
        durable: bool,
        now: i64,
    ) -> Result<Others, StoreError> {
        let own = format!("{PREFIX}{id}");
        self.metadata
            .update_one(
                doc! { "_id": &own },
                doc! { "$set": { "floor": floor, "durable": durable, "at": DateTime::from_millis(now) } },
            )
            .upsert(true)
            .await
            .map_err(classify)?;
        let pattern = format!("^{}", regex::escape(PREFIX));
        let docs: Vec<Document> = self
            .metadata
            .find(doc! { "_id": { "$regex": pattern } })
            .await
            .map_err(classify_read)?
            .try_collect()
            .await
            .map_err(classify_read)?;
        self.count(|m| {
            m.db_documents("written", "metadata", "instance_floor", 1);
            m.db_documents("read", "metadata", "instance_floor", docs.len() as u64);
        });
        Ok(Others {
            floor: others_floor(&docs, &own, now),
            beats: beats(&docs, &own),
        })
    }

    /// Removes this instance's document: it holds nothing unstored and stops.
    pub async fn forget_instance(&self, id: &str) -> Result<(), StoreError> {
        self.metadata
            .delete_one(doc! { "_id": format!("{PREFIX}{id}") })
            .await
            .map_err(classify)?;
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
        assert_eq!(others_floor(&docs[..1], "instance:me", now), i64::MAX);
        let odd = vec![doc! { "_id": "instance:x", "floor": "soon" }];
        assert_eq!(others_floor(&odd, "instance:me", now), i64::MIN);
    }
}
