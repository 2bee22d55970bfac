//! The readings the batcher holds that storage does not have yet, per
//! bucket: what queries lay over the stored buckets.

use hashbrown::HashMap;

use super::batch::Unstored;
use super::coalesce::Batcher;
use crate::domain::BucketKeyRef;

impl<W> Batcher<W> {
    /// The pending values of one series in buckets starting in `[from, to)`,
    /// per bucket start: what queries merge over the stored buckets.
    pub fn pending_values_of(&self, sensor: &str, metric: &str, from: i64, to: i64) -> Unstored {
        self.pending_values_of_many(&[sensor], metric, from, to)
            .pop()
            .unwrap_or_default()
    }

    /// [`Self::pending_values_of`] for many sensors at once: one look per
    /// bucket start when the range is short, one scan of what is pending
    /// when it is long. Each sensor's buckets come sorted by start.
    pub fn pending_values_of_many(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
    ) -> Vec<Unstored> {
        let len = self.granularity.seconds();
        let first = self.granularity.bucket_start(from);
        let span = (i128::from(to) - i128::from(first)).max(0) / i128::from(len);
        let probes = u64::try_from(span)
            .unwrap_or(u64::MAX)
            .saturating_mul(sensors.len() as u64);
        let mut out = vec![Vec::new(); sensors.len()];
        if self.pending.is_empty() {
            return out;
        }
        if probes <= self.pending.len() as u64 {
            for (i, &sensor) in sensors.iter().enumerate() {
                let mut start = first;
                while start < to {
                    let key = BucketKeyRef {
                        sensor,
                        metric,
                        start,
                    };
                    if let Some(open) = self.pending.get(&key) {
                        out[i].push((start, open.values.clone()));
                    }
                    start += len;
                }
            }
        } else {
            let index: HashMap<&str, usize> =
                sensors.iter().enumerate().map(|(i, &s)| (s, i)).collect();
            for (k, open) in &self.pending {
                if k.metric.as_str() == metric
                    && k.start >= first
                    && k.start < to
                    && let Some(&i) = index.get(k.sensor.as_str())
                {
                    out[i].push((k.start, open.values.clone()));
                }
            }
            for o in &mut out {
                o.sort_by_key(|(s, _)| *s);
            }
        }
        out
    }
}
