//! Many series' documents in the shape this server reads them best (see
//! `shapes`): one find of them all, or one per series, a few at once.

use mongodb::Collection;
use mongodb::bson::{Document, RawDocument, RawDocumentBuf, doc};

use super::classify::classify;
use super::connection::MongoStore;
use super::give_way::UPKEEP_BATCH_DOCUMENTS;
use super::shapes::{CONCURRENT_FINDS, ReadShape, Series, series_filter};
use crate::store::StoreError;

impl MongoStore {
    /// Hands `each` every document of `collection` that `rest` (the filter
    /// beside the series) selects of `series`: one find of the series'
    /// sensors and metrics in `$in`s (whose product may hold series nobody
    /// asked for, which the caller skips), or, where the server would scan
    /// for those (see `shapes`), one find per series, a few at once.
    /// Answers the replies it took.
    pub(super) async fn each_series_document(
        &self,
        collection: &Collection<Document>,
        series: &[&Series],
        rest: &Document,
        projection: &Document,
        mut each: impl FnMut(&RawDocument) -> Result<(), StoreError>,
    ) -> Result<usize, StoreError> {
        if self.read_shape != ReadShape::PerSeries || series.len() < 2 {
            let mut filter = series_filter(series.iter().copied());
            filter.extend(rest.clone());
            let query = collection
                .find(filter)
                .projection(projection.clone())
                .batch_size(UPKEEP_BATCH_DOCUMENTS)
                .batch();
            return self.each_document(query, true, classify, each).await;
        }
        use futures_util::StreamExt;
        let mut finds = Vec::with_capacity(series.len());
        for &(sensor, metric) in series {
            let mut filter = doc! { "sensor": sensor.as_str(), "metric": metric.as_str() };
            filter.extend(rest.clone());
            let query = collection
                .find(filter)
                .projection(projection.clone())
                .batch_size(UPKEEP_BATCH_DOCUMENTS)
                .batch();
            finds.push(async move {
                let mut docs: Vec<RawDocumentBuf> = Vec::new();
                let replies = self
                    .each_document(query, true, classify, |d| {
                        docs.push(d.to_raw_document_buf());
                        Ok(())
                    })
                    .await?;
                Ok::<_, StoreError>((docs, replies))
            });
        }
        let mut finds = futures_util::stream::iter(finds).buffered(CONCURRENT_FINDS);
        let mut replies = 0;
        while let Some(found) = finds.next().await {
            let (docs, r) = found?;
            replies += r;
            for d in &docs {
                each(d)?;
            }
        }
        Ok(replies)
    }
}
