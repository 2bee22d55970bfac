//! Records of acknowledged readings a stop could not store (the journal off
//! and the shutdown's deadline passed). The stopping process cannot be
//! scraped any more, so it leaves a record and the next instance to start
//! on the database claims it, once, and reports it (see `startup::losses`).

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, DateTime, doc};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::store::StoreError;

const PREFIX: &str = "unstored:";

/// One stop's loss, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    pub readings: u64,
    /// When the stop recorded it (epoch ms).
    pub at: i64,
}

impl MongoStore {
    /// Records that a stop left `readings` acknowledged readings unstored.
    pub async fn record_loss(&self, loss: &Loss) -> Result<(), StoreError> {
        let id = format!("{PREFIX}{}", uuid::Uuid::new_v4());
        self.metadata
            .insert_one(doc! {
                "_id": id,
                "readings": i64::try_from(loss.readings).unwrap_or(i64::MAX),
                "at": DateTime::from_millis(loss.at),
            })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "losses", 1));
        Ok(())
    }

    /// Takes every recorded loss: each is deleted by the one instance whose
    /// delete removed it, so several starting at once report each once.
    pub async fn claim_losses(&self) -> Result<Vec<Loss>, StoreError> {
        let pattern = format!("^{}", regex::escape(PREFIX));
        let docs: Vec<_> = self
            .metadata
            .find(doc! { "_id": { "$regex": pattern } })
            .await
            .map_err(classify_read)?
            .try_collect()
            .await
            .map_err(classify_read)?;
        self.count(|m| m.db_documents("read", "metadata", "losses", docs.len() as u64));
        let mut claimed = Vec::new();
        for d in docs {
            let Some(id) = d.get("_id").cloned() else {
                continue;
            };
            let deleted = self
                .metadata
                .delete_one(doc! { "_id": id })
                .await
                .map_err(classify)?
                .deleted_count;
            if deleted == 1 {
                self.count(|m| m.db_documents("written", "metadata", "losses", 1));
                let readings = match d.get("readings") {
                    Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
                    Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
                    _ => 0,
                };
                let at = d.get_datetime("at").map_or(0, |at| at.timestamp_millis());
                claimed.push(Loss { readings, at });
            }
        }
        Ok(claimed)
    }
}
