//! Runs `store::rollup`'s recomputations after each flush and for
//! `hourglass rebuild-rollups`.

use mongodb::bson::{Document, doc};
use tracing::info;

use super::{MongoStore, classify};
use crate::domain::{BucketUpdate, Period};
use crate::store::StoreError;
use crate::store::document::start_date;
use crate::store::rollup::{Mode, Source, Touched, flush_filters, pipeline};

impl MongoStore {
    fn source_collection(&self, source: Source) -> &mongodb::Collection<Document> {
        match source {
            Source::Buckets => &self.buckets,
            Source::Rollups(_) => &self.rollups,
        }
    }

    /// Runs one `$merge` aggregation as a raw command. Through the driver's
    /// `aggregate`, the pipeline was cloned into the command, dropped twice
    /// and followed by a cursor: with three aggregations a flush, that was
    /// several per cent of the service's CPU.
    async fn run(&self, source: Source, stages: Vec<Document>) -> Result<(), StoreError> {
        let collection = self.source_collection(source).name();
        let command = doc! {
            "aggregate": collection,
            "pipeline": stages,
            "cursor": {},
            "allowDiskUse": true,
        };
        let reply = self.run_write(command, "a rollup update").await?;
        // `$merge` answers no documents; a server that left a cursor open
        // anyway gets it closed rather than timing out on it.
        if let Some(id) = open_cursor(&reply) {
            let _ = self
                .db
                .run_command(doc! { "killCursors": collection, "cursors": [id] })
                .await;
        }
        Ok(())
    }

    /// Recomputes the rollups of what a flush stored, level by level; answers
    /// the commands sent.
    pub(super) async fn roll_up(&self, stored: &[&BucketUpdate]) -> Result<usize, StoreError> {
        if stored.is_empty() {
            return Ok(0);
        }
        let mut touched = Touched::of_updates(stored.iter().copied());
        let mut commands = 0;
        for &level in Period::levels(self.granularity) {
            let source = Source::of(level, self.granularity);
            for filter in flush_filters(&touched, source.len(self.granularity)) {
                let stages = pipeline(level, source, filter, self.rollups.name(), Mode::Merge);
                self.run(source, stages).await?;
                commands += 1;
            }
            touched = touched.lifted(level);
        }
        Ok(commands)
    }

    /// The first and last bucket starts, if there are buckets.
    async fn bucket_span(&self) -> Result<Option<(i64, i64)>, StoreError> {
        let mut ends = Vec::new();
        for order in [1, -1] {
            let doc = self
                .buckets
                .find_one(doc! {})
                .projection(doc! { "_id": 0, "start": 1 })
                .sort(doc! { "start": order })
                .await
                .map_err(classify)?;
            if let Some(d) = doc {
                let start = d
                    .get_datetime("start")
                    .map_err(|e| StoreError::Unreadable(format!("start: {e}")))?;
                ends.push(start.timestamp_millis().div_euclid(1000));
            }
        }
        Ok(match ends[..] {
            [first, last] => Some((first, last)),
            _ => None,
        })
    }

    /// Recomputes every rollup of the whole 30-day periods (see
    /// `Period::Days30`) holding `[from, to)` (epoch seconds; all buckets when
    /// not given) from the buckets, for sensors whose id starts with `prefix`,
    /// replacing what was there, and registers their sensors (`exact`: only
    /// the sensor `prefix`). One period at a time, so no one aggregation grows
    /// with the data, and each replaced document is recomputed whole. Answers
    /// the days rebuilt.
    pub async fn rebuild_rollups(
        &self,
        prefix: &str,
        exact: bool,
        from: Option<i64>,
        to: Option<i64>,
    ) -> Result<i64, StoreError> {
        let Some((first, last)) = self.bucket_span().await? else {
            return Ok(0);
        };
        let top = Period::Days30.seconds();
        let from = from.unwrap_or(first).max(first);
        let to = to.unwrap_or(last + 1).min(last + 1);
        let from = from - from.rem_euclid(top);
        let to = to + (top - to.rem_euclid(top)) % top;
        let mut window = from;
        while window < to {
            let end = window + top;
            let mut filter =
                doc! { "start": { "$gte": start_date(window), "$lt": start_date(end) } };
            if exact {
                filter.insert("sensor", prefix);
            } else if !prefix.is_empty() {
                filter.insert(
                    "sensor",
                    doc! { "$gte": prefix, "$lt": format!("{prefix}\u{7f}") },
                );
            }
            for &level in Period::levels(self.granularity) {
                let source = Source::of(level, self.granularity);
                // The same filter serves rollups of every level: same fields.
                let stages = pipeline(
                    level,
                    source,
                    filter.clone(),
                    self.rollups.name(),
                    Mode::Replace,
                );
                self.run(source, stages).await?;
            }
            self.run(
                Source::Buckets,
                registry_pipeline(filter, self.sensors.name()),
            )
            .await?;
            info!(
                from = window,
                to = end,
                "Rebuilt the rollups and registry entries of thirty days of buckets."
            );
            window = end;
        }
        Ok(((to - from) / Period::Day.seconds()).max(0))
    }
}

/// Registers the sensors of the buckets matched by `filter`: their metrics
/// joined to the known ones, the newest hour kept, labels left alone.
fn registry_pipeline(filter: Document, into: &str) -> Vec<Document> {
    vec![
        doc! { "$match": filter },
        doc! { "$group": { "_id": "$sensor", "metrics": { "$addToSet": "$metric" }, "last": { "$max": "$start" } } },
        doc! { "$project": {
            "metrics": 1,
            "last_seen": { "$dateTrunc": { "date": "$last", "unit": "hour" } },
        }},
        doc! { "$merge": {
            "into": into,
            "on": "_id",
            "whenMatched": [ { "$set": {
                "metrics": { "$setUnion": [ { "$ifNull": ["$metrics", []] }, "$$new.metrics" ] },
                "last_seen": { "$max": ["$last_seen", "$$new.last_seen"] },
            }}],
            "whenNotMatched": "insert",
        }},
    ]
}

/// The id of the cursor a reply left open, if any.
fn open_cursor(reply: &Document) -> Option<i64> {
    reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_i64("id").ok())
        .filter(|&id| id != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_a_reply_left_open_is_found() {
        let closed =
            doc! { "cursor": { "firstBatch": [], "id": 0_i64, "ns": "db.buckets" }, "ok": 1 };
        assert_eq!(open_cursor(&closed), None);
        let open =
            doc! { "cursor": { "firstBatch": [], "id": 42_i64, "ns": "db.buckets" }, "ok": 1 };
        assert_eq!(open_cursor(&open), Some(42));
    }
}
