//! `verify`: the database against the dataset's truth, bucket by bucket.

use std::collections::HashMap;

use futures_util::TryStreamExt;
use hourglass::{Agg, Granularity};
use mongodb::bson::{Bson, DateTime, Document, doc};

use crate::ctx::Ctx;
use crate::dataset::Dataset;
use crate::report::{Report, Section};

fn number(d: &Document, k: &str) -> f64 {
    match d.get(k) {
        Some(Bson::Double(x)) => *x,
        Some(Bson::Int32(x)) => f64::from(*x),
        Some(Bson::Int64(x)) => *x as f64,
        _ => f64::NAN,
    }
}

/// Compares every bucket of the dataset's range; returns the report and
/// whether everything matched.
pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    granularity: &str,
    database: &str,
) -> anyhow::Result<(Report, bool)> {
    // Long: reads every stored bucket of the range and compares it with the dataset's, field by field.
    let g = if granularity == "hour" {
        Granularity::Hour
    } else {
        Granularity::Minute
    };
    let client = mongodb::Client::with_uri_str(ctx.mongodb_uri()?).await?;
    let coll = client.database(database).collection::<Document>("buckets");
    let sensors: Vec<String> = (0..data.args.sensors).map(Dataset::sensor).collect();
    let filter = doc! {
        "sensor": { "$in": &sensors },
        "start": { "$gte": DateTime::from_millis(g.bucket_start(data.start) * 1000), "$lt": DateTime::from_millis(data.end() * 1000) },
    };
    let projection =
        doc! { "sensor": 1, "metric": 1, "start": 1, "count": 1, "sum": 1, "min": 1, "max": 1 };
    let mut found: HashMap<(u32, u32, i64), Agg> = HashMap::new();
    let mut cursor = coll.find(filter).projection(projection).await?;
    let mut unknown = 0u64;
    while let Some(d) = cursor.try_next().await? {
        let sensor = d.get_str("sensor").unwrap_or_default();
        let metric = d.get_str("metric").unwrap_or_default();
        let (Some(i), Some(j)) = (
            sensor
                .strip_prefix("lt-")
                .and_then(|s| s.parse::<u32>().ok()),
            metric.strip_prefix('m').and_then(|m| m.parse::<u32>().ok()),
        ) else {
            unknown += 1;
            continue;
        };
        let start = d
            .get_datetime("start")
            .map(|s| s.timestamp_millis() / 1000)
            .unwrap_or_default();
        let agg = Agg {
            count: number(&d, "count") as u64,
            sum: number(&d, "sum"),
            min: number(&d, "min"),
            max: number(&d, "max"),
        };
        found.insert((i, j, start), agg);
    }
    let truth = data.truth(g);
    let (mut missing, mut extra, mut over, mut under, mut wrong) =
        (0u64, unknown, 0u64, 0u64, 0u64);
    for (key, want) in &truth {
        match found.get(key) {
            None => missing += 1,
            Some(got) if got.count > want.count => over += 1,
            Some(got) if got.count < want.count => under += 1,
            Some(got) if got.sum != want.sum || got.min != want.min || got.max != want.max => {
                wrong += 1
            }
            Some(_) => {}
        }
    }
    for key in found.keys() {
        if !truth.contains_key(key) && key.0 < data.args.sensors && key.1 < data.args.metrics {
            extra += 1;
        }
    }
    let ok = missing + extra + over + under + wrong == 0;
    let mut s = Section::new(
        &format!(
            "Verify: {} buckets of {} readings ({granularity})",
            truth.len(),
            data.len()
        ),
        &["check", "buckets"],
    );
    for (name, n) in [
        ("missing", missing),
        ("extra", extra),
        ("double-counted (count too high)", over),
        ("readings lost (count too low)", under),
        ("aggregates differ", wrong),
    ] {
        s.row(vec![name.into(), n.to_string()]);
    }
    s.row(vec![
        "verdict".into(),
        if ok {
            "exact".into()
        } else {
            "MISMATCH".into()
        },
    ]);
    let mut report = Report::new("Hourglass verify");
    report.sections.push(s);
    report.set(
        "verify",
        serde_json::json!({
            "buckets": truth.len(), "missing": missing, "extra": extra, "double_counted": over,
            "lost": under, "differ": wrong, "exact": ok,
        }),
    );
    Ok((report, ok))
}
