use std::hash::{Hash, Hasher};

use serde::Deserialize;

use super::{MetricName, SensorId};

/// How much time one bucket document covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    /// `v.<sec>`: up to 60 values a document.
    Minute,
    /// `v.<min>.<sec>` plus per-minute aggregates in `m.<min>`: up to 3600 values.
    Hour,
}

impl Granularity {
    /// As written in settings and the metadata document.
    pub fn name(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
        }
    }

    /// The bucket's length in seconds.
    pub const fn seconds(self) -> i64 {
        match self {
            Granularity::Minute => 60,
            Granularity::Hour => 3600,
        }
    }

    /// The start (epoch seconds) of the bucket holding `ts`, also before 1970.
    pub const fn bucket_start(self, ts: i64) -> i64 {
        ts - ts.rem_euclid(self.seconds())
    }

    /// The second offset of `ts` inside its bucket: 0..60 or 0..3600.
    pub const fn offset(self, ts: i64) -> u16 {
        ts.rem_euclid(self.seconds()) as u16
    }
}

/// Field names "0" to "59", so building update documents allocates no keys.
pub const SECOND_FIELDS: [&str; 60] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59",
];

/// The field name for a second or minute number (0..60).
pub fn field_name(n: u16) -> &'static str {
    SECOND_FIELDS[usize::from(n) % 60]
}

/// Identifies one bucket document: exactly one exists per key (a unique index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKey {
    pub sensor: SensorId<'static>,
    pub metric: MetricName<'static>,
    /// Bucket start, epoch seconds, aligned to the granularity.
    pub start: i64,
}

/// A borrowed view of a [`BucketKey`], so the batcher can look a bucket up
/// without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketKeyRef<'a> {
    pub sensor: &'a str,
    pub metric: &'a str,
    pub start: i64,
}

impl Hash for BucketKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state)
    }
}

impl BucketKey {
    pub fn as_ref(&self) -> BucketKeyRef<'_> {
        BucketKeyRef {
            sensor: self.sensor.as_str(),
            metric: self.metric.as_str(),
            start: self.start,
        }
    }
}

impl Hash for BucketKeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.sensor.hash(state);
        self.metric.hash(state);
        self.start.hash(state);
    }
}

impl hashbrown::Equivalent<BucketKey> for BucketKeyRef<'_> {
    fn equivalent(&self, key: &BucketKey) -> bool {
        self.start == key.start
            && self.sensor == key.sensor.as_str()
            && self.metric == key.metric.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_align_to_minutes_and_hours() {
        // 2013-10-16T22:07:38Z
        let ts = 1_381_961_258;
        assert_eq!(Granularity::Minute.bucket_start(ts), 1_381_961_220);
        assert_eq!(Granularity::Minute.offset(ts), 38);
        assert_eq!(Granularity::Hour.bucket_start(ts), 1_381_960_800);
        assert_eq!(Granularity::Hour.offset(ts), 7 * 60 + 38);
    }

    #[test]
    fn field_names_are_the_decimal_numbers() {
        for (i, name) in SECOND_FIELDS.iter().enumerate() {
            assert_eq!(name.parse::<usize>().ok(), Some(i));
        }
    }

    proptest! {
        #[test]
        fn every_timestamp_falls_inside_its_bucket(ts in -10_000_000_000i64..10_000_000_000) {
            for g in [Granularity::Minute, Granularity::Hour] {
                let start = g.bucket_start(ts);
                prop_assert!(start <= ts && ts < start + g.seconds());
                prop_assert_eq!(start.rem_euclid(g.seconds()), 0);
                prop_assert_eq!(start + i64::from(g.offset(ts)), ts);
            }
        }
    }
}

/// What one flush writes to one bucket: the second offsets (sorted, unique)
/// and their latest values.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketUpdate {
    pub key: BucketKey,
    /// `(offset in seconds from the bucket start, value)`, sorted by offset.
    pub values: Vec<(u16, f64)>,
    /// When each value was acknowledged (epoch ms), beside `values`: its
    /// version, so the write acknowledged last wins wherever it was taken.
    pub acks: Vec<i64>,
}
