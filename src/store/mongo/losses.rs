//! Records of acknowledged readings a stop could not store (the journal off
//! and the shutdown's deadline passed). The stopping process cannot be
//! scraped any more, so it leaves a record and the next instance to start
//! on the database claims it, once, and reports it (see `startup::losses`).

use mongodb::bson::{Bson, DateTime, doc};

use super::classify::classify;
use super::connection::MongoStore;
use crate::store::StoreError;

const PREFIX: &str = "unstored:";

/// One stop's loss, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The record's id, the same in the database and beside the journal.
    pub id: String,
    pub readings: u64,
    /// When the stop recorded it (epoch ms).
    pub at: i64,
}

impl MongoStore {
    /// Records that a stop left `loss.readings` acknowledged readings unstored.
    pub async fn record_loss(&self, loss: &Loss) -> Result<(), StoreError> {
        self.metadata
            .insert_one(doc! {
                "_id": format!("{PREFIX}{}", loss.id),
                "readings": i64::try_from(loss.readings).unwrap_or(i64::MAX),
                "at": DateTime::from_millis(loss.at),
            })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "losses", 1));
        Ok(())
    }

    /// Removes the database's copy of a loss already reported from its
    /// record beside the journal (the stop wrote both when it could not
    /// tell whether the database took it).
    pub async fn forget_loss(&self, id: &str) -> Result<(), StoreError> {
        let deleted = self
            .metadata
            .delete_one(doc! { "_id": format!("{PREFIX}{id}") })
            .await
            .map_err(classify)?
            .deleted_count;
        self.count(|m| m.db_documents("written", "metadata", "losses", deleted));
        Ok(())
    }

    /// Takes every recorded loss, handing each to `claimed` as soon as its
    /// delete removed it: of several instances starting at once, exactly one
    /// takes each, and none taken is dropped by a later failure.
    pub async fn claim_losses(&self, mut claimed: impl FnMut(Loss)) -> Result<(), StoreError> {
        let docs = self.metadata_documents_under(PREFIX, "losses").await?;
        for d in docs {
            let Ok(id) = d.get_str("_id") else {
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
                claimed(Loss {
                    id: id.trim_start_matches(PREFIX).to_owned(),
                    readings,
                    at: d.get_datetime("at").map_or(0, |at| at.timestamp_millis()),
                });
            }
        }
        Ok(())
    }
}
