//! Percentiles from rollups (`quantiles=0.5,0.95,0.99`) over 1, 30 and 400
//! days: latency and documents beside the plain average's, each answer
//! checked against the exact percentiles of the truth within the sketches'
//! accuracy (`buckets.sketch_accuracy`, 1 % by default).

use std::collections::BTreeMap;

use crate::report::{Section, f, percentiles};

/// The accuracy the target keeps its sketches at (the shipped default).
const ACCURACY: f64 = 0.01;
const ASKED: [f64; 3] = [0.5, 0.95, 0.99];

/// Measures `quantiles=` of one series over each span ending at `end`;
/// rows into `s` (named `{what} {span}d`), figures into `json` (keys
/// `{key}_{span}d`); whether every answer was within the bound.
#[allow(clippy::too_many_arguments)]
pub async fn measure(
    url: &str,
    (sensor, metric): (&str, &str),
    truth: &BTreeMap<i64, f64>,
    (spans, end): (&[u32], i64),
    repeats: usize,
    (what, key): (&str, &str),
    s: &mut Section,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<bool> {
    let mut ok = true;
    for &span in spans {
        let from = crate::range_probe::span_from(end, span);
        let path =
            crate::range_probe::average_path(sensor, metric, from, end, "&quantiles=0.5,0.95,0.99");
        let (ms, docs, got) = crate::range_probe::measure(url, &path, repeats).await?;
        let mut values: Vec<f64> = truth.range(from..end).map(|(_, v)| *v).collect();
        values.sort_by(f64::total_cmp);
        let within = !values.is_empty()
            && ASKED.iter().all(|q| {
                let want = values[(q * (values.len() - 1) as f64).floor() as usize];
                got["quantiles"][q.to_string()]
                    .as_f64()
                    .is_some_and(|g| (g - want).abs() <= ACCURACY * want.abs() + 1e-9)
            });
        ok &= within;
        let (p50, p99, _) = percentiles(ms.clone());
        s.row(crate::range_probe::timing_row(
            format!("{what} {span}d"),
            &ms,
            (p50, p99),
            "-".into(),
            f(docs),
            within.to_string(),
        ));
        json.insert(
            format!("{key}_{span}d"),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "within_accuracy": within }),
        );
    }
    Ok(ok)
}

/// Bytes of one series' rollup documents, and what their slots' sketches
/// and time integrals take in them: in a slot stored as its summary, the
/// bytes the summary loses without them (a slot stored as its readings
/// derives both and stores neither).
#[derive(Debug, Default, Clone, Copy)]
pub struct RollupBytes {
    pub documents: u64,
    pub total: u64,
    pub sketches: u64,
    pub integrals: u64,
}

/// The first byte of a slot stored as its summary (`store::rollup::codec`).
const SUMMARY: u8 = 0x30;

/// [`RollupBytes`] of `(sensor, metric)` in the target's `database`.
pub async fn rollup_bytes(
    ctx: &crate::ctx::Ctx,
    database: &str,
    (sensor, metric): (&str, &str),
) -> anyhow::Result<RollupBytes> {
    use futures_util::TryStreamExt;
    use hourglass::pure::{rollup_slot_decode, rollup_slot_encode};
    use mongodb::bson::{RawBsonRef, RawDocumentBuf, doc};
    let mongo = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let rollups = mongo
        .database(database)
        .collection::<RawDocumentBuf>("rollups");
    let mut cursor = rollups
        .find(doc! { "sensor": sensor, "metric": metric })
        .await?;
    let mut out = RollupBytes::default();
    let len = |slot: &hourglass::pure::Slot| {
        let mut b = Vec::new();
        rollup_slot_encode(slot, &mut b);
        b.len() as u64
    };
    while let Some(d) = cursor.try_next().await? {
        out.documents += 1;
        out.total += d.as_bytes().len() as u64;
        let Ok(Some(RawBsonRef::Document(slots))) = d.get("s") else {
            continue;
        };
        for slot in slots.iter() {
            let Ok((_, RawBsonRef::Binary(b))) = slot else {
                continue;
            };
            if b.bytes.first() != Some(&SUMMARY) {
                continue;
            }
            // Times do not matter to the sizes: any start will do.
            let Ok(whole) = rollup_slot_decode(b.bytes, 0, 1, Some(0.01)) else {
                continue;
            };
            let full = len(&whole);
            let mut bare = whole.clone();
            bare.sketch = None;
            out.sketches += full.saturating_sub(len(&bare));
            let mut bare = whole;
            if let Some(s) = bare.summary.as_mut() {
                s.integrals = None;
            }
            out.integrals += full.saturating_sub(len(&bare));
        }
    }
    Ok(out)
}

/// A row of bytes per reading for `readings` readings of a series.
pub fn bytes_row(name: &str, b: RollupBytes, readings: usize) -> Vec<String> {
    let per = |x: u64| format!("{:.2}", x as f64 / readings.max(1) as f64);
    vec![
        name.to_owned(),
        readings.to_string(),
        b.documents.to_string(),
        b.total.to_string(),
        per(b.total),
        per(b.sketches),
        per(b.integrals),
    ]
}
