//! Every command the service sends examines about what it returns, over a
//! long history: the conformance workload's commands, one of each shape,
//! are explained (`executionStats`) on a copy of its database padded with
//! 50 000 more buckets of one of its series, a fleet of other sensors
//! beside it, and 5 000 more rollups of that series. A plan that walks the
//! unique key examines the few documents it needs whatever the history; a
//! plan that scans a series, the listed sensors or the collection examines
//! tens of thousands. Explain runs nothing: no write lands. Checked: what
//! the service sends to the collections that hold history (buckets and
//! rollups) while it ingests, answers and keeps rollups, deletes; not the
//! operators' commands (`hourglass rebuild-rollups` reads whole periods).

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use hourglass::Granularity;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::{Database, IndexModel};

use crate::conformance::{FRAMING, Sent};
use crate::helpers::all_documents;

/// Buckets added to one series, and sensors of the fleet beside it (with
/// 100 buckets each), and rollups added to the series.
const HISTORY: i64 = 50_000;
const FLEET: i64 = 100;
const ROLLUPS: i64 = 5_000;

/// Shapes that examine more by design, and why.
const EXEMPT: &[(&str, &str)] = &[(
    "projection:{v:num,m:num},filter:{}",
    "the format check of a database from before its format document: one bucket read once, at its first start",
)];

/// What a command may examine: a few documents beyond what it returns (the
/// versions of an upsert's key, a page boundary).
fn allowed(returned: i64) -> i64 {
    4 * returned.max(1) + 50
}

/// Copies `from`'s collections (documents and indexes) into `to`.
async fn copy(from: &Database, to: &Database) {
    for name in from.list_collection_names().await.expect("collections") {
        if name.starts_with("system.") {
            continue;
        }
        let source = from.collection::<Document>(&name);
        let target = to.collection::<Document>(&name);
        let docs = all_documents(&source).await;
        for chunk in docs.chunks(5000) {
            target.insert_many(chunk.to_vec()).await.expect("copied");
        }
        let indexes: Vec<IndexModel> = source
            .list_indexes()
            .await
            .expect("indexes")
            .try_collect()
            .await
            .expect("indexes");
        for index in indexes {
            if index.options.as_ref().and_then(|o| o.name.as_deref()) == Some("_id_") {
                continue;
            }
            target.create_index(index).await.expect("index copied");
        }
    }
}

/// The series with the most buckets, and its earliest bucket start.
async fn busiest(db: &Database, buckets: &str) -> ((String, String), DateTime) {
    let docs: Vec<Document> = db
        .collection::<Document>(buckets)
        .find(doc! {})
        .projection(doc! { "sensor": 1, "metric": 1, "start": 1 })
        .await
        .expect("read")
        .try_collect()
        .await
        .expect("buckets");
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut earliest = i64::MAX;
    for d in &docs {
        let key = (
            d.get_str("sensor").unwrap_or_default().to_owned(),
            d.get_str("metric").unwrap_or_default().to_owned(),
        );
        *counts.entry(key).or_default() += 1;
        if let Ok(t) = d.get_datetime("start") {
            earliest = earliest.min(t.timestamp_millis());
        }
    }
    let series = counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(k, _)| k)
        .expect("buckets were written");
    (series, DateTime::from_millis(earliest))
}

/// Pads `db` with the long history (see the module's doc).
async fn pad(db: &Database, g: Granularity, buckets: &str, rollups: &str) -> String {
    let ((sensor, metric), earliest) = busiest(db, buckets).await;
    let step = g.seconds() * 1000;
    let before = |i: i64| DateTime::from_millis(earliest.timestamp_millis() - (i + 1) * step);
    let mut docs: Vec<Document> = (0..HISTORY)
        .map(|i| doc! { "sensor": &sensor, "metric": &metric, "start": before(i), "count": 1, "schema_version": 2 })
        .collect();
    for f in 0..FLEET {
        docs.extend((0..100).map(|i| {
            doc! { "sensor": format!("pad-{f:03}"), "metric": &metric, "start": before(i), "count": 1, "schema_version": 2 }
        }));
    }
    let c = db.collection::<Document>(buckets);
    for chunk in docs.chunks(10_000) {
        c.insert_many(chunk.to_vec()).await.expect("padded");
    }
    let hour = |i: i64| DateTime::from_millis(earliest.timestamp_millis() - (i + 1) * 3_600_000);
    let r: Vec<Document> = (0..ROLLUPS)
        .map(|i| doc! { "sensor": &sensor, "metric": &metric, "period": "hour", "start": hour(i), "s": {} })
        .collect();
    db.collection::<Document>(rollups)
        .insert_many(r)
        .await
        .expect("padded");
    sensor
}

fn number(d: &Document, key: &str) -> Option<i64> {
    match d.get(key)? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(n) => Some(*n as i64),
        _ => None,
    }
}

/// The find to explain for a recorded command: itself, or the find of a
/// write's filter (a write selects its documents as a find with that filter
/// does, and explain of a write is not what every server runs: the
/// stand-in's reports a collection scan whatever it does).
fn explainable(s: &Sent) -> Option<Document> {
    let mut c = s.command.clone();
    for f in FRAMING {
        c.remove(*f);
    }
    let find = |filter: &Document, one: bool| {
        let mut f = doc! { "find": &s.collection, "filter": filter.clone() };
        if one {
            f.insert("limit", 1);
        }
        f
    };
    match s.kind.as_str() {
        "find" => Some(c),
        "update" => Some(find(
            c.get_document("q").ok()?,
            !c.get_bool("multi").unwrap_or(false),
        )),
        "delete" => {
            let first = c.get_array("deletes").ok()?.first()?.as_document()?.clone();
            let one = first.get_i32("limit").unwrap_or(0) == 1;
            Some(find(first.get_document("q").ok()?, one))
        }
        "findAndModify" => Some(find(c.get_document("query").ok()?, true)),
        _ => None,
    }
}

/// Explains one command of each reading shape on the padded copy of `db`;
/// answers the shapes that examine more than they return.
pub async fn check(
    db: &Database,
    by_shape: &BTreeMap<String, Vec<Sent>>,
    g: Granularity,
    settings: &hourglass::Settings,
) -> Vec<String> {
    let padded = db.client().database(&format!("{}_plans", db.name()));
    padded.drop().await.expect("dropped");
    copy(db, &padded).await;
    let m = &settings.mongodb;
    let sensor = pad(&padded, g, &m.collection, &m.rollup_collection).await;
    let mut failures = Vec::new();
    for (shape, commands) in by_shape {
        // The collections that hold series history.
        if commands[0].collection != m.collection && commands[0].collection != m.rollup_collection {
            continue;
        }
        // One that names the padded series, if any does.
        let sample = commands
            .iter()
            .find(|s| s.command.to_string().contains(&format!("\"{sensor}\"")))
            .unwrap_or(&commands[0]);
        if EXEMPT.iter().any(|(part, _)| shape.contains(part)) {
            continue;
        }
        let reads = matches!(
            sample.kind.as_str(),
            "find" | "update" | "delete" | "findAndModify"
        );
        let Some(command) = explainable(sample) else {
            if reads {
                failures.push(format!("{shape}: not explained"));
            }
            continue;
        };
        // A server may report every document its plan holds before a
        // limit applies (the stand-in materializes them all).
        let limit = command.get_i32("limit").ok().map(i64::from);
        let reply = padded
            .run_command(doc! { "explain": command, "verbosity": "executionStats" })
            .await;
        let stats = match reply {
            Ok(r) => r
                .get_document("executionStats")
                .cloned()
                .unwrap_or_default(),
            Err(e) => {
                failures.push(format!("{shape}: explain failed: {e}"));
                continue;
            }
        };
        let examined = number(&stats, "totalDocsExamined").unwrap_or(0);
        let keys = number(&stats, "totalKeysExamined").unwrap_or(0);
        let returned = number(&stats, "nReturned")
            .unwrap_or(0)
            .min(limit.filter(|&l| l > 0).unwrap_or(i64::MAX));
        if std::env::var_os("CONFORMANCE_SHAPES").is_some() {
            eprintln!("{examined:>7} examined {keys:>7} keys {returned:>6} returned: {shape}");
        }
        if examined.max(keys) > allowed(returned) {
            failures.push(format!(
                "{shape}\n  examines {examined} documents and {keys} keys to return {returned} over a history of {HISTORY} buckets\n  command: {}",
                sample.command
            ));
        }
    }
    padded.drop().await.expect("dropped");
    failures
}
