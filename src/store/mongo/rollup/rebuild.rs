//! `hourglass rebuild-rollups`: every rollup of whole 30-day periods
//! recomputed from the buckets by the upkeep's own roll-up, a few series at
//! a time, and the registry entries of their sensors merged in.

use std::collections::BTreeSet;

use futures_util::TryStreamExt;
use mongodb::bson::{Document, doc};
use tracing::info;

use crate::domain::Period;
use crate::store::StoreError;
use crate::store::document::start_date;
use crate::store::mongo::MongoStore;
use crate::store::mongo::classify::classify;
use crate::store::rollup::schedule::{HOUR, Job};

const DAY: i64 = 86_400;

type Series = (String, String);

impl MongoStore {
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
    /// not given) from the buckets, for sensors whose id starts with `prefix`
    /// (`exact`: only the sensor `prefix`), and registers their sensors. One
    /// period at a time; each slot written only if no newer figure is stored,
    /// so it is safe while instances write. Answers the days rebuilt.
    pub async fn rebuild_rollups(
        &self,
        prefix: &str,
        exact: bool,
        from: Option<i64>,
        to: Option<i64>,
        now: i64,
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
            // The series with buckets in the window.
            let mut series: BTreeSet<Series> = BTreeSet::new();
            let mut cursor = self
                .buckets
                .find(filter.clone())
                .projection(doc! { "_id": 0, "sensor": 1, "metric": 1 })
                .await
                .map_err(classify)?;
            while let Some(d) = cursor.try_next().await.map_err(classify)? {
                series.insert((
                    d.get_str("sensor").unwrap_or_default().to_owned(),
                    d.get_str("metric").unwrap_or_default().to_owned(),
                ));
            }
            let series: Vec<Series> = series.into_iter().collect();
            // Every hour of the window that has ended, a few series at a time.
            for chunk in series.chunks(16) {
                let jobs: Vec<Job> = chunk
                    .iter()
                    .flat_map(|(sensor, metric)| {
                        (window..end.min(now - now.rem_euclid(HOUR)))
                            .step_by(HOUR as usize)
                            .map(|hour| Job {
                                sensor: sensor.clone(),
                                metric: metric.clone(),
                                hour,
                            })
                    })
                    .collect();
                self.roll_up(&jobs, now, None, false).await?;
            }
            self.run_rollup_aggregation(registry_pipeline(filter, self.sensors.name()))
                .await?;
            info!(
                from = window,
                to = end,
                series = series.len(),
                "Rebuilt the rollups and registry entries of thirty days of buckets."
            );
            window = end;
        }
        // Rollups rewritten: what the query caches kept of them goes.
        self.record_change(None, from, to).await?;
        Ok(((to - from) / DAY).max(0))
    }

    /// Runs a `$merge` aggregation on the buckets as a raw command.
    async fn run_rollup_aggregation(&self, stages: Vec<Document>) -> Result<(), StoreError> {
        let command = doc! {
            "aggregate": self.buckets.name(),
            "pipeline": stages,
            "cursor": {},
            "allowDiskUse": true,
        };
        let reply = self.run_write(command, "a registry rebuild").await?;
        // `$merge` answers no documents; a server that left a cursor open
        // anyway gets it closed rather than timing out on it.
        if let Some(id) = open_cursor(&reply) {
            let _ = self
                .db
                .run_command(doc! { "killCursors": self.buckets.name(), "cursors": [id] })
                .await;
        }
        Ok(())
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
