//! The `ranges` rows of a sensor reporting by exception: bursts of readings
//! while its value moves, holds of one to six hours between them. Its
//! time-weighted averages over 1, 30 and 400 days with staleness limits
//! that take every slot whole (a day), read the days holding longer holds
//! again by the hour (an hour), and read those hours reading by reading
//! (15 minutes, up to 31 days), against the mean of its readings and a
//! model of the held time.

use std::collections::BTreeMap;

use crate::ctx::{Ctx, Target};
use crate::dataset::{Dataset, Row};
use crate::report::{Section, f, percentiles};

/// The sensor's index: outside the fleet's `lt-000*` glob.
pub const SENSOR: u32 = 90_000;

/// A value held for one to six hours, then a burst of 5 to 20 readings 5 to
/// 60 seconds apart while it moves; over `[start, end)`.
pub fn readings(start: i64, end: i64, seed: u64) -> BTreeMap<i64, f64> {
    let mut x = seed;
    let mut next = move |n: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % n.max(1)
    };
    let mut out = BTreeMap::new();
    let mut t = start;
    // Multiples of 1/8: sums stay exact.
    let mut v = 400.0;
    while t < end {
        for _ in 0..5 + next(16) {
            if t >= end {
                break;
            }
            out.insert(t, v / 8.0);
            v += next(17) as f64 - 8.0;
            t += 5 + next(56) as i64;
        }
        t += 3600 + next(5 * 3600) as i64;
    }
    out
}

/// Writes the readings, then measures; rows into `s` and figures into
/// `json`; whether every answer was exact.
pub async fn measure_all(
    ctx: &Ctx,
    target: &Target,
    (start, end): (i64, i64),
    days: u32,
    repeats: usize,
    s: &mut Section,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<bool> {
    // Long: writes, then one query and its truth per row, in the order the report reads.
    let truth = readings(start, end, 66);
    let rows: Vec<Row> = truth.iter().map(|(&t, &v)| (SENSOR, 0, t, v)).collect();
    crate::send::send_rows(ctx, target, &rows, 5000, 2).await?;
    crate::waits::rolled_up(ctx, &target.database, std::time::Duration::from_secs(3600)).await?;
    let sensor = Dataset::sensor(SENSOR);
    let metric = Dataset::metric(0);
    let end = end - 7;
    let mut ok = true;
    for span in [1u32, 30, 400].into_iter().filter(|&d| d <= days) {
        let from = crate::range_probe::span_from(end, span);
        let mean = crate::range_probe::average_path(&sensor, &metric, from, end, "");
        let (ms, docs, got) = crate::range_probe::measure(&target.url, &mean, repeats).await?;
        let inside: Vec<f64> = truth.range(from..end).map(|(_, v)| *v).collect();
        let exact = got["count"].as_u64() == Some(inside.len() as u64)
            && got["sum"].as_f64() == Some(inside.iter().sum());
        ok &= exact;
        let (p50, p99, _) = percentiles(ms.clone());
        let name = format!("by exception: mean {span}d ({} readings)", inside.len());
        s.row(crate::range_probe::timing_row(
            name,
            &ms,
            (p50, p99),
            "-".into(),
            f(docs),
            exact.to_string(),
        ));
        json.insert(
            format!("exception_mean_{span}d"),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact }),
        );
        // Reading by reading is refused past 31 days of hours: not asked.
        let limits: &[(&str, i64)] = if span <= 31 {
            &[("1d", 86_400), ("1h", 3600), ("15m", 900)]
        } else {
            &[("1d", 86_400), ("1h", 3600)]
        };
        for &(limit, seconds) in limits {
            let extra = format!("&weighting=time&staleness={limit}");
            let path = crate::range_probe::average_path(&sensor, &metric, from, end, &extra);
            let (ms, docs, got) = crate::range_probe::measure(&target.url, &path, repeats).await?;
            let (held, integral) = crate::range_probe::held_time(&truth, from, end, seconds);
            let want = integral / held.max(1) as f64;
            let exact = got["held_seconds"].as_i64() == Some(held)
                && got["avg"]
                    .as_f64()
                    .is_some_and(|a| (a - want).abs() <= 1e-9 * want.abs().max(1.0));
            ok &= exact;
            let (p50, p99, _) = percentiles(ms.clone());
            s.row(crate::range_probe::timing_row(
                format!("by exception: time-weighted {span}d, staleness {limit}"),
                &ms,
                (p50, p99),
                "-".into(),
                f(docs),
                exact.to_string(),
            ));
            json.insert(
                format!("exception_time_weighted_{span}d_{limit}"),
                serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact }),
            );
        }
    }
    let spans: Vec<u32> = [1u32, 30, 400].into_iter().filter(|&d| d <= days).collect();
    ok &= crate::percentile::measure(
        &target.url,
        (&sensor, &metric),
        &truth,
        (&spans, end),
        repeats,
        ("by exception: p50, p95, p99", "exception_quantiles"),
        s,
        json,
    )
    .await?;
    Ok(ok)
}
