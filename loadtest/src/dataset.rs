//! A deterministic, seeded dataset: every value is a function of (seed,
//! sensor, metric, second), so any subcommand can know the truth without
//! storing it. Values are multiples of 1/8, so sums are exact in f64.

use std::collections::HashMap;
use std::fmt::Write as _;

use hourglass::{Agg, Granularity};
use serde::Serialize;

/// RFC 3339 of epoch seconds, for query parameters.
pub fn rfc3339(ts: i64) -> String {
    jiff::Timestamp::from_second(ts)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct DatasetArgs {
    /// Simulated sensors.
    #[arg(long, default_value_t = 20)]
    pub sensors: u32,
    /// Metrics per sensor.
    #[arg(long, default_value_t = 2)]
    pub metrics: u32,
    /// Seconds of data per series.
    #[arg(long, default_value_t = 600)]
    pub seconds: u32,
    /// Seconds between two readings of one series.
    #[arg(long, default_value_t = 1)]
    pub interval: u32,
    /// Seed of the values.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Dataset {
    pub args: DatasetArgs,
    /// Epoch seconds of the first reading.
    pub start: i64,
}

/// One reading: (sensor index, metric index, epoch second, value).
pub type Row = (u32, u32, i64, f64);

pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Dataset {
    pub fn new(args: DatasetArgs, start: i64) -> Self {
        Self { args, start }
    }

    /// Ends `lag` seconds ago, starting on a whole hour when it can.
    pub fn recent(args: DatasetArgs, lag: i64) -> Self {
        let now = jiff::Timestamp::now().as_second();
        let start = now - lag - i64::from(args.seconds);
        Self::new(args, start - start.rem_euclid(60))
    }

    pub fn sensor(i: u32) -> String {
        format!("lt-{i:05}")
    }

    pub fn metric(j: u32) -> String {
        format!("m{j}")
    }

    pub fn ticks(&self) -> u32 {
        self.args.seconds.div_ceil(self.args.interval.max(1))
    }

    pub fn series(&self) -> u64 {
        u64::from(self.args.sensors) * u64::from(self.args.metrics)
    }

    pub fn len(&self) -> u64 {
        self.series() * u64::from(self.ticks())
    }

    pub fn end(&self) -> i64 {
        self.start + i64::from(self.ticks()) * i64::from(self.args.interval.max(1))
    }

    pub fn value(&self, i: u32, j: u32, ts: i64) -> f64 {
        let x = splitmix(self.args.seed ^ (u64::from(i) << 40) ^ (u64::from(j) << 32) ^ ts as u64);
        ((x % 16_001) as f64 - 8000.0) / 8.0
    }

    /// Every reading of tick `k` (all series at one time).
    pub fn tick(&self, k: u32) -> impl Iterator<Item = Row> + '_ {
        let ts = self.start + i64::from(k) * i64::from(self.args.interval.max(1));
        (0..self.args.sensors).flat_map(move |i| {
            (0..self.args.metrics).map(move |j| (i, j, ts, self.value(i, j, ts)))
        })
    }

    /// Every reading, in time order.
    pub fn rows(&self) -> impl Iterator<Item = Row> + '_ {
        (0..self.ticks()).flat_map(|k| self.tick(k))
    }

    /// The true aggregates of every bucket.
    pub fn truth(&self, g: Granularity) -> HashMap<(u32, u32, i64), Agg> {
        let mut out: HashMap<(u32, u32, i64), Agg> = HashMap::new();
        for (i, j, ts, v) in self.rows() {
            out.entry((i, j, g.bucket_start(ts))).or_default().add(v);
        }
        out
    }

    /// A JSON array of readings for `POST /api/v1/readings`.
    pub fn json(rows: &[Row]) -> Vec<u8> {
        let mut s = String::with_capacity(rows.len() * 72);
        s.push('[');
        for (n, (i, j, ts, v)) in rows.iter().enumerate() {
            if n > 0 {
                s.push(',');
            }
            let _ = write!(
                s,
                r#"{{"sensor":"lt-{i:05}","metric":"m{j}","ts":{},"value":{v}}}"#,
                ts * 1000
            );
        }
        s.push(']');
        s.into_bytes()
    }

    /// Influx line protocol, seconds precision.
    pub fn line_protocol(rows: &[Row]) -> Vec<u8> {
        let mut s = String::with_capacity(rows.len() * 48);
        for (i, j, ts, v) in rows {
            let _ = writeln!(s, "m{j},sensor=lt-{i:05} value={v} {ts}");
        }
        s.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Dataset {
        Dataset::new(
            DatasetArgs {
                sensors: 3,
                metrics: 2,
                seconds: 120,
                interval: 2,
                seed: 7,
            },
            600,
        )
    }

    #[test]
    fn the_same_seed_gives_the_same_values_in_eighths() {
        let d = small();
        assert_eq!(d.value(1, 1, 602), small().value(1, 1, 602));
        for (_, _, _, v) in d.rows() {
            assert_eq!((v * 8.0).fract(), 0.0);
        }
        assert_eq!(d.rows().count() as u64, d.len());
        assert_eq!(d.len(), 3 * 2 * 60);
    }

    #[test]
    fn the_truth_counts_every_reading_once() {
        let d = small();
        let total: u64 = d.truth(Granularity::Minute).values().map(|a| a.count).sum();
        assert_eq!(total, d.len());
    }

    #[test]
    fn json_batches_decode_as_readings() {
        let d = small();
        let rows: Vec<Row> = d.tick(0).collect();
        let v: serde_json::Value =
            serde_json::from_slice(&Dataset::json(&rows)).expect("valid JSON");
        assert_eq!(v.as_array().map(Vec::len), Some(6));
        assert_eq!(v[0]["sensor"], "lt-00000");
    }
}
