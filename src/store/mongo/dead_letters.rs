//! `hourglass redrive`: dead letters written into their buckets again, once
//! whatever refused them is fixed.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use tracing::{info, warn};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::batcher::{Outcome, Sink};
use crate::domain::{BucketKey, BucketUpdate, MetricName, SensorId};
use crate::store::StoreError;

/// Dead letters an operator lists at most: the newest few are what a console shows.
pub const MAX_LISTED: usize = 100;

/// Dead letters re-driven at a time.
const BATCH: usize = 500;

/// What a re-drive did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Redriven {
    /// Dead letters whose readings are now in their buckets (and deleted).
    pub letters: u64,
    pub readings: u64,
    /// Dead letters refused again (kept, with the new reason).
    pub refused: u64,
    /// Dead letters that do not read as readings (kept, named in the log).
    pub unreadable: u64,
}

/// The readings of a dead letter, as bucket updates of `granularity`.
fn updates_of(
    d: &Document,
    granularity: crate::domain::Granularity,
) -> Result<Vec<BucketUpdate>, String> {
    let sensor = d.get_str("sensor").map_err(|e| format!("sensor: {e}"))?;
    let metric = d.get_str("metric").map_err(|e| format!("metric: {e}"))?;
    let sensor = SensorId::parse(sensor.to_owned())
        .map_err(|e| e.to_string())?
        .into_owned();
    let metric = MetricName::parse(metric.to_owned())
        .map_err(|e| e.to_string())?
        .into_owned();
    let mut by_bucket: BTreeMap<i64, BTreeMap<u16, (f64, i64)>> = BTreeMap::new();
    for r in d
        .get_array("readings")
        .map_err(|e| format!("readings: {e}"))?
    {
        let r = r.as_document().ok_or("a reading is not a document")?;
        let ts = r
            .get_datetime("ts")
            .map_err(|e| format!("ts: {e}"))?
            .timestamp_millis()
            .div_euclid(1000);
        let value = match r.get("value") {
            Some(Bson::Double(v)) if v.is_finite() => *v,
            Some(Bson::Int32(v)) => f64::from(*v),
            Some(Bson::Int64(v)) => *v as f64,
            other => return Err(format!("value {other:?}")),
        };
        // Written back with its own acknowledgement time, so a correction
        // acknowledged since still wins; a letter from before versions, 0.
        let ack = match r.get("ack") {
            Some(Bson::Int64(a)) => *a,
            Some(Bson::Int32(a)) => i64::from(*a),
            _ => 0,
        };
        let slot = by_bucket
            .entry(granularity.bucket_start(ts))
            .or_default()
            .entry(granularity.offset(ts))
            .or_insert((value, ack));
        if ack >= slot.1 {
            *slot = (value, ack);
        }
    }
    Ok(by_bucket
        .into_iter()
        .map(|(start, values)| BucketUpdate {
            key: BucketKey {
                sensor: sensor.clone(),
                metric: metric.clone(),
                start,
            },
            acks: values.values().map(|&(_, a)| a).collect(),
            values: values.into_iter().map(|(o, (v, _))| (o, v)).collect(),
        })
        .collect())
}

impl MongoStore {
    /// Writes the readings of the dead letters of sensors starting with
    /// `prefix` (`exact`: the sensor `prefix`) into their buckets, with their
    /// rollups and registry entries, and deletes each dead letter once all
    /// its readings are stored. One refused again stays, with the new reason.
    /// `dry_run`: only counts. An outage stops the re-drive (run it again:
    /// it is idempotent).
    pub async fn redrive(
        &self,
        prefix: &str,
        exact: bool,
        dry_run: bool,
    ) -> Result<Redriven, StoreError> {
        let filter = if exact {
            doc! { "sensor": prefix }
        } else if prefix.is_empty() {
            doc! {}
        } else {
            doc! { "sensor": { "$gte": prefix, "$lt": format!("{prefix}\u{7f}") } }
        };
        let mut cursor = self
            .dead_letters
            .find(filter)
            .sort(doc! { "at": 1 })
            .await
            .map_err(classify)?;
        let mut out = Redriven::default();
        let mut batch: Vec<(Bson, Vec<BucketUpdate>)> = Vec::new();
        loop {
            let next = cursor.try_next().await.map_err(classify)?;
            if let Some(d) = &next {
                let id = d.get("_id").cloned().unwrap_or(Bson::Null);
                match updates_of(d, self.granularity) {
                    Ok(updates) => batch.push((id, updates)),
                    Err(reason) => {
                        warn!(id = %id, reason, "A dead letter does not read as readings; it stays.");
                        out.unreadable += 1;
                    }
                }
            }
            if batch.len() >= BATCH || (next.is_none() && !batch.is_empty()) {
                self.redrive_batch(std::mem::take(&mut batch), dry_run, &mut out)
                    .await?;
            }
            if next.is_none() {
                break;
            }
        }
        info!(
            letters = out.letters,
            readings = out.readings,
            refused = out.refused,
            unreadable = out.unreadable,
            dry_run,
            "Re-drove the dead letters."
        );
        Ok(out)
    }

    async fn redrive_batch(
        &self,
        batch: Vec<(Bson, Vec<BucketUpdate>)>,
        dry_run: bool,
        out: &mut Redriven,
    ) -> Result<(), StoreError> {
        if dry_run {
            for (_, updates) in &batch {
                out.letters += 1;
                out.readings += updates.iter().map(|u| u.values.len() as u64).sum::<u64>();
            }
            return Ok(());
        }
        let all: Vec<&BucketUpdate> = batch.iter().flat_map(|(_, u)| u.iter()).collect();
        let written = self.write(&all).await;
        let mut outcomes = written.outcomes.into_iter();
        for (id, updates) in &batch {
            let mine: Vec<Outcome> = outcomes.by_ref().take(updates.len()).collect();
            if let Some(Outcome::Outage(e)) = mine.iter().find(|o| matches!(o, Outcome::Outage(_)))
            {
                return Err(StoreError::Outage(e.clone()));
            }
            match mine.iter().find_map(|o| match o {
                Outcome::Poison(e) => Some(e.clone()),
                _ => None,
            }) {
                None => {
                    self.dead_letters
                        .delete_one(doc! { "_id": id.clone() })
                        .await
                        .map_err(classify)?;
                    out.letters += 1;
                    out.readings += updates.iter().map(|u| u.values.len() as u64).sum::<u64>();
                }
                Some(reason) => {
                    self.dead_letters
                        .update_one(
                            doc! { "_id": id.clone() },
                            doc! { "$set": { "reason": reason, "redriven_at": mongodb::bson::DateTime::now() } },
                        )
                        .await
                        .map_err(classify)?;
                    out.refused += 1;
                }
            }
        }
        Ok(())
    }
}

impl MongoStore {
    /// The newest dead letters whose sensor `keep` accepts (at most
    /// [`MAX_LISTED`] are read, newest first, on the `at` index), and the
    /// collection's size.
    pub(super) async fn list_dead_letters<F: FnMut(&str) -> bool + Send>(
        &self,
        limit: usize,
        mut keep: F,
    ) -> Result<(Vec<crate::store::DeadLetterInfo>, u64), StoreError> {
        let total = self
            .dead_letters
            .estimated_document_count()
            .await
            .map_err(classify_read)?;
        let mut cursor = self
            .dead_letters
            .find(doc! {})
            .sort(doc! { "at": -1 })
            .projection(doc! { "sensor": 1, "metric": 1, "bucket_start": 1, "readings.ts": 1, "reason": 1, "at": 1 })
            .limit(MAX_LISTED as i64)
            .await
            .map_err(classify_read)?;
        let seconds = |d: &Document, k: &str| {
            d.get_datetime(k)
                .map(|t| t.timestamp_millis().div_euclid(1000))
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        while out.len() < limit.min(MAX_LISTED) {
            let Some(d) = cursor.try_next().await.map_err(classify_read)? else {
                break;
            };
            let sensor = d.get_str("sensor").unwrap_or_default();
            if !keep(sensor) {
                continue;
            }
            out.push(crate::store::DeadLetterInfo {
                sensor: sensor.to_owned(),
                metric: d.get_str("metric").unwrap_or_default().to_owned(),
                bucket_start: seconds(&d, "bucket_start"),
                readings: d.get_array("readings").map(Vec::len).unwrap_or_default(),
                reason: d.get_str("reason").unwrap_or_default().to_owned(),
                at: seconds(&d, "at"),
            });
        }
        Ok((out, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Granularity;
    use crate::store::document::start_date;

    #[test]
    fn a_dead_letter_reads_back_as_updates_of_the_current_granularity() {
        let d = doc! {
            "sensor": "s", "metric": "m",
            "readings": [
                { "ts": start_date(3600 + 5), "value": 1.5 },
                { "ts": start_date(3600 + 65), "value": 2 },
            ],
        };
        let minute = updates_of(&d, Granularity::Minute).expect("readable");
        assert_eq!(minute.len(), 2);
        assert_eq!(minute[1].values, vec![(5, 2.0)]);
        let hour = updates_of(&d, Granularity::Hour).expect("readable");
        assert_eq!(hour.len(), 1);
        assert_eq!(hour[0].values, vec![(5, 1.5), (65, 2.0)]);
        let bad = doc! { "sensor": "a b", "metric": "m", "readings": [] };
        assert!(updates_of(&bad, Granularity::Minute).is_err());
    }
}
