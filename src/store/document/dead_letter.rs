//! Dead-letter documents: the readings of a bucket update that can never
//! be applied, under an id that makes dead-lettering them again a no-op.

use mongodb::bson::{Bson, DateTime, Document, doc};

use super::start_date;
use crate::batcher::DeadLetter;
use crate::domain::{BucketUpdate, Granularity};

/// A dead letter's id: the SHA-256 of its series, bucket and readings, so
/// the same readings dead-lettered again (a journal replayed after a crash,
/// a message redelivered) are one document, not two.
pub fn dead_letter_id(update: &BucketUpdate) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let key = &update.key;
    for part in [key.sensor.as_str(), key.metric.as_str()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(key.start.to_le_bytes());
    for &(offset, value) in &update.values {
        h.update(offset.to_le_bytes());
        h.update(value.to_bits().to_le_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// A dead-letter document: the readings of one bucket update that can never
/// be applied, each with its own timestamp, and why.
pub fn dead_letter_document(letter: &DeadLetter<'_>, granularity: Granularity) -> Document {
    let key = &letter.update.key;
    let acks = letter
        .update
        .acks
        .iter()
        .map(|&a| Some(a))
        .chain(std::iter::repeat(None));
    let readings: Vec<Bson> = letter
        .update
        .values
        .iter()
        .zip(acks)
        .map(|(&(offset, value), ack)| {
            let mut d = doc! {
                "ts": start_date(key.start.saturating_add(i64::from(offset))),
                "value": value,
            };
            if let Some(ack) = ack {
                d.insert("ack", ack);
            }
            Bson::Document(d)
        })
        .collect();
    doc! {
        "_id": dead_letter_id(letter.update),
        "sensor": key.sensor.as_str(),
        "metric": key.metric.as_str(),
        "bucket_start": start_date(key.start),
        "granularity": match granularity {
            Granularity::Minute => "minute",
            Granularity::Hour => "hour",
        },
        "readings": readings,
        "reason": letter.reason,
        "at": DateTime::now(),
    }
}
