//! Query answers read in place in the server's replies.
//!
//! The driver's `Cursor` copies every document of a reply into a buffer of
//! its own before handing it out, and each `advance` is a poll of its own
//! (timed as the driver's CPU: two reads of the thread's clock, a system
//! call each). Reading the reply's batch in place (`find(..).batch()`)
//! does neither, and counts the round trips exactly: one per reply.

use std::future::IntoFuture;

use futures_util::StreamExt;
use mongodb::bson::RawDocument;
use mongodb::raw_batch_cursor::RawBatchCursor;

use super::connection::MongoStore;
use super::driver_cpu;
use crate::store::StoreError;

impl MongoStore {
    /// Hands every document `query` answers to `each`, in order, and
    /// answers the replies it took (the query's and each `getMore`'s).
    /// `upkeep`: a read of the rollup upkeep, whose driver CPU is counted
    /// (see `driver_cpu`) and which gives way to queries before each
    /// `getMore` (see `give_way`).
    pub(super) async fn each_document(
        &self,
        query: impl IntoFuture<Output = mongodb::error::Result<RawBatchCursor>>,
        upkeep: bool,
        classify: fn(mongodb::error::Error) -> StoreError,
        mut each: impl FnMut(&RawDocument) -> Result<(), StoreError>,
    ) -> Result<usize, StoreError> {
        let counter = self
            .metrics
            .as_deref()
            .filter(|_| upkeep)
            .map(|m| &m.driver_cpu);
        let mut cursor = driver_cpu::timed(query, counter).await.map_err(classify)?;
        let mut replies = 0;
        loop {
            if upkeep && replies > 0 {
                self.traffic.give_way().await;
            }
            let Some(batch) = driver_cpu::timed(cursor.next(), counter).await else {
                break;
            };
            replies += 1;
            let batch = batch.map_err(classify)?;
            for d in batch.doc_slices().map_err(classify)? {
                let d = d.map_err(|e| StoreError::Unreadable(e.to_string()))?;
                let d = d.as_document().ok_or_else(|| {
                    StoreError::Unreadable(
                        "a reply's batch holds a value that is not a document".into(),
                    )
                })?;
                each(d)?;
            }
        }
        Ok(replies.max(1))
    }
}
