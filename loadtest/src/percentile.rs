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
        let from = super::ranges::span_from(end, span);
        let path =
            super::ranges::average_path(sensor, metric, from, end, "&quantiles=0.5,0.95,0.99");
        let (ms, docs, got) = super::ranges::measure(url, &path, repeats).await?;
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
        s.row(super::ranges::timing_row(
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
