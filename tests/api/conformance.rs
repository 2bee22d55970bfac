//! The storage server against an independent evaluation, for every command
//! shape the service sends.
//!
//! A workload drives the service through everything that reaches storage
//! (ingest at both granularities, wide and narrow flushes, late writes,
//! labels, every query route, PromQL, rebuilds, dead letters) with the
//! server's profiler on. Every command it sent is read back from
//! `system.profile` and grouped by shape (the command with its values
//! replaced by their types). Then:
//! - every read (`find`) is run again and its answer compared with a
//!   brute-force evaluation of the same filter, projection, sort and limit
//!   over all documents of the collection, read by a plain scan;
//! - every write (`update`, `insert`, `findAndModify`, `aggregate` with
//!   `$merge`) is judged by what it left: buckets whose aggregates equal
//!   their values and whose values equal what was written, rollups equal to
//!   their buckets, a registry that knows every series and label, the
//!   dead letters that were due;
//! - a command of a kind not listed here fails the test, so a new shape
//!   cannot go unchecked.
//!
//! A divergence names the shape. The stand-in's known divergences are
//! listed in docs/src/operating/storage-server.md beside it. The same test runs against a real
//! MongoDB (`MONGODB_URI`), whose profiler records the same commands.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::TryStreamExt;
use hourglass::Granularity;
use mongodb::bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::rollup_checks::assert_rollups_match_buckets;

// ---------------------------------------------------------------------------
// Shapes

/// A command's shape: its structure with values replaced by their types.
/// Documents whose keys are all numbers (seconds, minutes, slots) are one
/// `{#: …}`, arrays the set of their elements' shapes, label names `*`.
pub fn shape(b: &Bson) -> String {
    match b {
        Bson::Document(d) => document_shape(d),
        // In order (a pipeline's stages), runs of one shape as one (`$in` lists).
        Bson::Array(a) => {
            let mut items: Vec<String> = a.iter().map(shape).collect();
            items.dedup();
            format!("[{}]", items.join(","))
        }
        // Operators and field paths are structure; other strings are data.
        Bson::String(s) if s.starts_with('$') => numbers_as_hash(s),
        Bson::String(_) => "str".into(),
        Bson::Double(_) | Bson::Int32(_) | Bson::Int64(_) => "num".into(),
        Bson::DateTime(_) => "date".into(),
        Bson::Boolean(x) => x.to_string(),
        Bson::Null => "null".into(),
        other => format!("{:?}", other.element_type()),
    }
}

fn numbers_as_hash(s: &str) -> String {
    s.split('.')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "#"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn document_shape(d: &Document) -> String {
    if !d.is_empty() && d.keys().all(|k| k.bytes().all(|b| b.is_ascii_digit())) {
        let items: BTreeSet<String> = d.values().map(shape).collect();
        return format!("{{#:{}}}", items.into_iter().collect::<Vec<_>>().join("|"));
    }
    let fields: Vec<String> = d
        .iter()
        .map(|(k, v)| {
            let k = if k.starts_with("labels.") {
                "labels.*".to_owned()
            } else {
                numbers_as_hash(k)
            };
            format!("{k}:{}", shape(v))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// Fields of a command that do not change what it does to the data.
pub const FRAMING: &[&str] = &[
    "$db",
    "lsid",
    "$clusterTime",
    "$readPreference",
    "maxTimeMS",
    "batchSize",
    "writeConcern",
    "ordered",
    "cursor",
    "allowDiskUse",
    "singleBatch",
    "comment",
    "txnNumber",
    "bypassDocumentValidation",
    "readConcern",
];

/// The comment on the test's own commands, which are not the service's.
const OURS: &str = "conformance test";

/// One command the service sent, as the profiler recorded it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub kind: String,
    pub collection: String,
    pub command: Document,
}

impl Sent {
    fn shape(&self) -> String {
        let mut c = self.command.clone();
        for f in FRAMING {
            c.remove(*f);
        }
        format!("{} {}: {}", self.kind, self.collection, document_shape(&c))
    }
}

/// The commands in a database's `system.profile`, update statements one
/// by one (as MongoDB records them; the stand-in records whole commands).
async fn sent(db: &mongodb::Database) -> Vec<Sent> {
    let entries: Vec<Document> = db
        .collection::<Document>("system.profile")
        .find(doc! {})
        .await
        .expect("the profile is readable")
        .try_collect()
        .await
        .expect("profile entries");
    let mut out = Vec::new();
    for e in entries {
        let Ok(command) = e.get_document("command") else {
            continue;
        };
        if command.get_str("comment") == Ok(OURS) {
            continue;
        }
        let ns = e.get_str("ns").unwrap_or_default();
        let collection = ns.split_once('.').map_or("", |(_, c)| c).to_owned();
        if let Ok(updates) = command.get_array("updates") {
            for u in updates.iter().filter_map(Bson::as_document) {
                out.push(Sent {
                    kind: "update".into(),
                    collection: collection.clone(),
                    command: u.clone(),
                });
            }
            continue;
        }
        if command.contains_key("q") && command.contains_key("u") {
            out.push(Sent {
                kind: "update".into(),
                collection,
                command: command.clone(),
            });
            continue;
        }
        let kind = command.keys().next().cloned().unwrap_or_default();
        out.push(Sent {
            kind,
            collection,
            command: command.clone(),
        });
    }
    out
}

// ---------------------------------------------------------------------------
// A brute-force evaluation of the reads

fn number(b: &Bson) -> Option<f64> {
    match b {
        Bson::Double(x) => Some(*x),
        Bson::Int32(x) => Some(f64::from(*x)),
        Bson::Int64(x) => Some(*x as f64),
        _ => None,
    }
}

/// Compares two values of the same BSON type class; `None` across classes
/// (a range operator never matches across types in MongoDB).
fn compare(a: &Bson, b: &Bson) -> Option<std::cmp::Ordering> {
    if let (Some(x), Some(y)) = (number(a), number(b)) {
        return x.partial_cmp(&y);
    }
    match (a, b) {
        (Bson::String(x), Bson::String(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (Bson::DateTime(x), Bson::DateTime(y)) => Some(x.cmp(y)),
        (Bson::Boolean(x), Bson::Boolean(y)) => Some(x.cmp(y)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => Some(x.cmp(y)),
        (Bson::Null, Bson::Null) => Some(std::cmp::Ordering::Equal),
        _ => None,
    }
}

/// The values at a dotted path (an array on the way yields its elements).
fn at_path<'a>(d: &'a Document, path: &str) -> Vec<&'a Bson> {
    let mut current: Vec<&Bson> = Vec::new();
    let mut parts = path.split('.');
    let Some(first) = parts.next() else {
        return current;
    };
    if let Some(v) = d.get(first) {
        current.push(v);
    }
    for part in parts {
        let mut next = Vec::new();
        for v in current {
            match v {
                Bson::Document(d) => next.extend(d.get(part)),
                Bson::Array(a) => {
                    for x in a {
                        if let Bson::Document(d) = x {
                            next.extend(d.get(part));
                        }
                    }
                }
                _ => {}
            }
        }
        current = next;
    }
    // An array matches through any of its elements, and as itself.
    let mut out = Vec::new();
    for v in current {
        if let Bson::Array(a) = v {
            out.extend(a.iter());
        }
        out.push(v);
    }
    out
}

fn condition(values: &[&Bson], cond: &Bson, shape: &str) -> bool {
    let ops = match cond {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => d,
        plain => {
            return values
                .iter()
                .any(|v| compare(v, plain) == Some(std::cmp::Ordering::Equal));
        }
    };
    ops.iter().all(|(op, arg)| {
        use std::cmp::Ordering::*;
        let any = |f: &dyn Fn(std::cmp::Ordering) -> bool| {
            values.iter().any(|v| compare(v, arg).is_some_and(f))
        };
        match op.as_str() {
            "$eq" => any(&|o| o == Equal),
            "$gt" => any(&|o| o == Greater),
            "$gte" => any(&|o| o != Less),
            "$lt" => any(&|o| o == Less),
            "$lte" => any(&|o| o != Greater),
            "$in" => arg
                .as_array()
                .expect("$in takes an array")
                .iter()
                .any(|x| values.iter().any(|v| compare(v, x) == Some(Equal))),
            "$exists" => arg.as_bool() == Some(!values.is_empty()),
            "$regex" => {
                let re = regex::Regex::new(arg.as_str().expect("$regex takes a string"))
                    .expect("a valid pattern");
                values
                    .iter()
                    .any(|v| v.as_str().is_some_and(|s| re.is_match(s)))
            }
            other => panic!("the evaluator does not know {other} (in {shape}): extend it"),
        }
    })
}

fn matches(d: &Document, filter: &Document, shape: &str) -> bool {
    filter.iter().all(|(field, cond)| match field.as_str() {
        "$and" => cond
            .as_array()
            .expect("$and takes an array")
            .iter()
            .all(|f| matches(d, f.as_document().expect("a filter"), shape)),
        "$or" => cond
            .as_array()
            .expect("$or takes an array")
            .iter()
            .any(|f| matches(d, f.as_document().expect("a filter"), shape)),
        op if op.starts_with('$') => {
            panic!("the evaluator does not know {op} (in {shape}): extend it")
        }
        path => condition(&at_path(d, path), cond, shape),
    })
}

/// An inclusion projection, or one that only leaves fields out.
fn project(d: &Document, projection: Option<&Document>) -> Document {
    let Some(p) = projection else {
        return d.clone();
    };
    let excluded = |b: &Bson| matches!(b, Bson::Int32(0) | Bson::Int64(0) | Bson::Boolean(false));
    if p.values().all(excluded) {
        let mut out = d.clone();
        for path in p.keys() {
            out.remove(path);
        }
        return out;
    }
    let mut out = Document::new();
    if !p.get("_id").is_some_and(excluded)
        && let Some(id) = d.get("_id")
    {
        out.insert("_id", id.clone());
    }
    for (path, keep) in p {
        if path == "_id" {
            continue;
        }
        assert!(
            !excluded(keep),
            "the evaluator mixes no inclusions and exclusions"
        );
        include(d, &mut out, path);
    }
    out
}

fn include(from: &Document, into: &mut Document, path: &str) {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let Some(value) = from.get(head) else {
        return;
    };
    match (rest, value) {
        (None, v) => {
            into.insert(head, v.clone());
        }
        (Some(rest), Bson::Document(inner)) => {
            if !into.contains_key(head) {
                into.insert(head, Document::new());
            }
            if let Some(Bson::Document(target)) = into.get_mut(head) {
                include(inner, target, rest);
            }
        }
        _ => {}
    }
}

/// A document with its fields (at every level) in key order: MongoDB keeps a
/// document's order through a projection, the evaluator its own.
fn canonical(b: &Bson) -> Bson {
    match b {
        Bson::Document(d) => {
            let sorted: BTreeMap<&String, Bson> =
                d.iter().map(|(k, v)| (k, canonical(v))).collect();
            Bson::Document(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Bson::Array(a) => Bson::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

fn sort_key(d: &Document, sort: &Document) -> Vec<Bson> {
    sort.keys()
        .map(|k| at_path(d, k).first().map_or(Bson::Null, |v| (*v).clone()))
        .collect()
}

fn ordered(sort: &Document, a: &[Bson], b: &[Bson]) -> std::cmp::Ordering {
    for ((x, y), dir) in a.iter().zip(b).zip(sort.values()) {
        let o = compare(x, y).unwrap_or(std::cmp::Ordering::Equal);
        let o = if number(dir).is_some_and(|d| d < 0.0) {
            o.reverse()
        } else {
            o
        };
        if o != std::cmp::Ordering::Equal {
            return o;
        }
    }
    std::cmp::Ordering::Equal
}

/// Every document of each collection, read once by a plain scan: the
/// evaluator's input (nothing writes while the reads are checked).
#[derive(Default)]
struct Scans(BTreeMap<String, Vec<Document>>);

impl Scans {
    async fn of(&mut self, db: &mongodb::Database, collection: &str) -> &[Document] {
        if !self.0.contains_key(collection) {
            let all: Vec<Document> = db
                .collection::<Document>(collection)
                .find(doc! {})
                .await
                .expect("a scan")
                .try_collect()
                .await
                .expect("documents");
            self.0.insert(collection.to_owned(), all);
        }
        &self.0[collection]
    }
}

/// Runs a recorded `find` again and checks it against the evaluator; answers
/// what differs, if anything.
/// The one aggregation that reads (`hourglass_rollup_late_hours`): the
/// entries of every marker document counted, run again over what the
/// collection holds and two documents planted for it (a stopped service
/// leaves no marker), and compared with a count over a plain scan.
async fn check_entry_count(db: &mongodb::Database, s: &Sent) -> Option<String> {
    let pipeline: Vec<Document> = s
        .command
        .get_array("pipeline")
        .expect("a pipeline")
        .iter()
        .filter_map(|b| b.as_document().cloned())
        .collect();
    let collection = db.collection::<Document>(&s.collection);
    let planted = [
        doc! { "_id": -1_i64, "e": { "a|m": { "g0": { "w": 1_i64 } }, "b|m": { "g1": { "w": 2_i64 } } } },
        doc! { "_id": -2_i64, "at": 0_i64 },
    ];
    // Replaced, not inserted: a retried insert (the driver retries a write
    // whose reply was lost) met its own first attempt as a duplicate key.
    for d in planted {
        let id = d.get("_id").cloned().expect("an _id");
        collection
            .replace_one(doc! { "_id": id }, d)
            .upsert(true)
            .await
            .expect("planted");
    }
    let got: Vec<Document> = match collection.aggregate(pipeline).await {
        Ok(cursor) => match cursor.try_collect().await {
            Ok(docs) => docs,
            Err(e) => return Some(format!("failed: {e}")),
        },
        Err(e) => return Some(format!("failed: {e}")),
    };
    let got: f64 = got.iter().filter_map(|d| d.get("n").and_then(number)).sum();
    let all: Vec<Document> = collection
        .find(doc! {})
        .await
        .expect("a scan")
        .try_collect()
        .await
        .expect("a scan");
    let want: usize = all
        .iter()
        .map(|d| d.get_document("e").map_or(0, Document::len))
        .sum();
    collection
        .delete_many(doc! { "_id": { "$lt": 0 } })
        .await
        .expect("planted removed");
    (got != want as f64 || want < 2).then(|| format!("counted {got} entries, a scan holds {want}"))
}

async fn check_find(
    db: &mongodb::Database,
    scans: &mut Scans,
    s: &Sent,
    shape: &str,
) -> Option<String> {
    let c = &s.command;
    let collection = db.collection::<Document>(&s.collection);
    let filter = c.get_document("filter").cloned().unwrap_or_default();
    let projection = c.get_document("projection").ok().cloned();
    let sort = c.get_document("sort").ok().cloned();
    let limit = c
        .get("limit")
        .and_then(number)
        .map(|l| l as usize)
        .filter(|&l| l > 0);
    let mut find = collection.find(filter.clone());
    if let Some(p) = &projection {
        find = find.projection(p.clone());
    }
    if let Some(s) = &sort {
        find = find.sort(s.clone());
    }
    if let Some(l) = limit {
        find = find.limit(l as i64);
    }
    let got: Vec<Document> = match find.await {
        Ok(cursor) => match cursor.try_collect().await {
            Ok(docs) => docs,
            Err(e) => return Some(format!("failed: {e}")),
        },
        Err(e) => return Some(format!("failed: {e}")),
    };
    let all = scans.of(db, &s.collection).await;
    let mut want: Vec<&Document> = all.iter().filter(|d| matches(d, &filter, shape)).collect();
    let empty = Document::new();
    let sort = sort.unwrap_or(empty);
    want.sort_by(|a, b| ordered(&sort, &sort_key(a, &sort), &sort_key(b, &sort)));
    let expected_len = limit.map_or(want.len(), |l| l.min(want.len()));
    if got.len() != expected_len {
        return Some(format!(
            "answered {} documents, the evaluation {expected_len}",
            got.len()
        ));
    }
    // Sorted as asked, and each answer one of the matching documents with
    // its sort key in the same place (ties may come in any order).
    let want_keys: Vec<Vec<Bson>> = want
        .iter()
        .take(expected_len)
        .map(|d| sort_key(d, &sort))
        .collect();
    let want_docs: Vec<Bson> = want
        .iter()
        .map(|d| canonical(&Bson::Document(project(d, projection.as_ref()))))
        .collect();
    for (k, g) in got.iter().enumerate() {
        let g_bson = canonical(&Bson::Document(g.clone()));
        if !want_docs.contains(&g_bson) {
            return Some(format!("answered a document the evaluation does not: {g}"));
        }
        if !sort.is_empty() {
            let projected_key: Vec<Bson> = sort
                .keys()
                .map(|f| g.get(f).cloned().unwrap_or(Bson::Null))
                .collect();
            if ordered(&sort, &projected_key, &want_keys[k]) != std::cmp::Ordering::Equal
                && sort.keys().all(|f| g.contains_key(f))
            {
                return Some(format!("document {k} is out of order: {g}"));
            }
        }
    }
    if limit.is_none() {
        let mut g: Vec<String> = got
            .iter()
            .map(|d| canonical(&Bson::Document(d.clone())).to_string())
            .collect();
        let mut w: Vec<String> = want_docs.iter().map(ToString::to_string).collect();
        g.sort();
        w.sort();
        if g != w {
            return Some("the answers differ from the evaluation".into());
        }
    }
    None
}

// ---------------------------------------------------------------------------
// The workload

const DAY: i64 = 86_400;

fn conformance_settings(g: Granularity) -> hourglass::Settings {
    let mut s = settings_with(g);
    s.ingest.max_age = Duration::from_secs(400 * DAY as u64);
    // Correctness, not speed: right after the writes a long range reads
    // every bucket until late markers clear (issue 77), which on the
    // stand-in beside five other tests passed a minute.
    s.query.timeout = Duration::from_secs(300);
    s.http.request_timeout = Duration::from_secs(330);
    s
}

async fn profiled(settings: &hourglass::Settings) -> Option<mongodb::Database> {
    use secrecy::ExposeSecret;
    let client = crate::helpers::mongo_client(settings.mongodb.uri.expose_secret()).await;
    let db = client.database(&settings.mongodb.database);
    match db.run_command(doc! { "profile": 2 }).await {
        Ok(_) => Some(db),
        Err(e) => {
            // A mongos has no profiler: the checks need one.
            eprintln!("skipped: the server keeps no profile of commands ({e})");
            None
        }
    }
}

async fn post(app: &TestApp, readings: &[Value]) -> u16 {
    let mut status = 200;
    for chunk in readings.chunks(2000) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        status = status.max(r.status().as_u16());
    }
    status
}

/// Everything that reaches storage; answers the readings written, by
/// `(sensor, metric, ts)`, last write winning.
async fn workload(app: &TestApp, g: Granularity) -> BTreeMap<(String, String, i64), f64> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let t = now - 40 * DAY;
    let t = t - t.rem_euclid(3600);
    let mut truth = BTreeMap::new();
    let mut put = |batch: &mut Vec<Value>, s: &str, m: &str, ts: i64, v: f64| {
        truth.insert((s.to_owned(), m.to_owned(), ts), v);
        batch.push(reading(s, m, ts, v));
    };
    // A wide backfill (80 sensors in one flush, over 38 days and a 30-day
    // boundary), readings on whole minutes, hours and days among them.
    let mut batch = Vec::new();
    for i in 0..80 {
        for k in 0..12i64 {
            let ts = t + k * (3 * DAY + 3600) + i * 61 - if k % 4 == 0 { i * 61 } else { 0 };
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                ts,
                (k * 7 + i) as f64,
            );
        }
    }
    assert_eq!(post(app, &batch).await, 200);
    // Narrow flushes: a few sensors, late readings and overwrites, a second metric.
    for round in 0..3i64 {
        let mut batch = Vec::new();
        for i in 0..3 {
            let ts = t + round * DAY + 7 * 3600 + i * 17;
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                ts,
                (round * 100 + i) as f64,
            );
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "hum",
                ts + 1,
                round as f64 / 2.0,
            );
        }
        // Overwrite a second of the backfill.
        put(
            &mut batch,
            "c-05",
            "temp",
            t + 3 * DAY + 3600 + 5 * 61,
            1000.0 + round as f64,
        );
        assert_eq!(post(app, &batch).await, 200);
    }
    // Live readings.
    let mut batch = Vec::new();
    for i in 0..5 {
        for k in 0..10 {
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                now - 200 + k * 20 + i,
                k as f64,
            );
        }
    }
    assert_eq!(post(app, &batch).await, 200);
    // Labels: replaced by PUT, merged from line protocol tags.
    for i in 0..6 {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/c-{i:02}/labels", app.address))
            .json(&json!({ "site": if i % 2 == 0 { "north" } else { "south" } }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
    let line = format!(
        "power,sensor=c-07,room=r1 value=5 {}\n",
        (now - 100) * 1_000_000_000
    );
    truth.insert(("c-07".into(), "power".into(), now - 100), 5.0);
    let r = app
        .client
        .post(format!("{}/api/v2/write", app.address))
        .body(line)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    // The labels of line protocol are written in the background.
    eventually(Duration::from_secs(30), "the line's labels", || async {
        let c07 = app.get_json("/api/v1/sensors?prefix=c-07").await;
        c07["sensors"][0]["labels"]["room"] == "r1"
    })
    .await;
    // A bucket not in the expected shape: its readings are dead-lettered.
    // (The test's own commands carry a comment and are left out.)
    let buckets = app
        .db
        .collection::<Document>(&app.settings.mongodb.collection);
    let start = g.bucket_start(t + 10 * DAY);
    let broken = doc! {
        "sensor": "c-broken", "metric": "temp",
        "start": mongodb::bson::DateTime::from_millis(start * 1000),
    };
    let mut bad = broken.clone();
    bad.insert("v", "not a document");
    buckets
        .insert_one(bad)
        .comment(OURS)
        .await
        .expect("inserted");
    let r = app
        .post_readings(&json!([reading("c-broken", "temp", start + 3, 1.0)]))
        .await;
    assert_eq!(r.status(), 422);
    // Gone again, so the rest of the workload reads only good buckets.
    buckets
        .delete_one(broken)
        .comment(OURS)
        .await
        .expect("deleted");
    // Every query route.
    let range = |from: i64, to: i64| format!("from={}&to={}", rfc3339(from), rfc3339(to));
    for (from, to) in [
        (t + 5, t + 50),
        (t + 61, t + 3 * 3600 + 7),
        (t, t + 36 * DAY),
        (t - DAY, now + 60),
        (now - 3600, now),
    ] {
        for sensor in ["c-00", "c-05", "c-79", "c-nobody"] {
            app.get_json(&format!(
                "/api/v1/sensors/{sensor}/average?metric=temp&{}",
                range(from, to)
            ))
            .await;
        }
        app.get_json(&format!(
            // Ten sensors are as many shapes as eighty, and quicker.
            "/api/v1/average?metric=temp&sensor=c-0*&group_by=label.site&{}",
            range(from, to)
        ))
        .await;
        app.get_json(&format!(
            "/api/v1/average?metric=temp&label.site=north&{}",
            range(from, to)
        ))
        .await;
    }
    for step in ["1m", "1h", "1d"] {
        app.get_json(&format!(
            "/api/v1/sensors/c-01/series?metric=temp&step={step}&{}",
            range(t + 59, t + if step == "1m" { 7200 } else { 36 * DAY })
        ))
        .await;
    }
    app.get_json(&format!(
        "/api/v1/series?metric=temp&sensor=c-0?&step=1d&tz=Europe/Berlin&{}",
        range(t, t + 35 * DAY)
    ))
    .await;
    app.get_json("/api/v1/sensors/c-00/latest?metric=temp")
        .await;
    app.get_json("/api/v1/sensors?prefix=c-0&limit=3").await;
    app.get_json("/api/v1/sensors?after=c-03&limit=2&label.site=north")
        .await;
    app.get_json("/api/v1/sensors?prefix=c-&label.room=r1")
        .await;
    for q in [
        "temp{sensor=~\"c-0.\"}",
        "last_over_time(temp{sensor=~\"c-0.\"}[1h])",
        "last_over_time(temp{sensor=~\"c-0.\"}[40d])",
        "avg by (site) (avg_over_time(temp{sensor=~\"c-0.\"}[1d]))",
        "count_over_time(temp{sensor=~\"c-0.\"}[2h])",
    ] {
        let q: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
        app.get_json(&format!("/prometheus/api/v1/query?query={q}&time={now}"))
            .await;
        app.get_json(&format!(
            "/prometheus/api/v1/query_range?query={q}&start={}&end={now}&step=3h",
            now - 3 * DAY
        ))
        .await;
    }
    app.get_json("/prometheus/api/v1/labels").await;
    app.get_json("/prometheus/api/v1/label/sensor/values").await;
    app.get_json("/prometheus/api/v1/series?match[]=temp{site=\"north\"}")
        .await;
    truth
}

/// Rebuilds: all, a prefix, one sensor.
async fn rebuilds(app: &TestApp) {
    let t = time::OffsetDateTime::now_utc().unix_timestamp() - 38 * DAY;
    for sensor in [None, Some("c-1*"), Some("c-02")] {
        hourglass::rebuild_rollups(&app.settings, sensor, Some(t), None)
            .await
            .expect("rebuilt");
    }
}

/// The write shapes sent so far (named when what they left is wrong).
async fn write_shapes(db: &mongodb::Database) -> String {
    let shapes: BTreeSet<String> = sent(db)
        .await
        .iter()
        .filter(|s| {
            matches!(
                s.kind.as_str(),
                "update" | "insert" | "findAndModify" | "aggregate" | "delete"
            )
        })
        .map(Sent::shape)
        .collect();
    shapes.into_iter().collect::<Vec<_>>().join("\n  ")
}

/// What the writes left: buckets exact and equal to what was written,
/// rollups equal to their buckets, a registry with every series and label,
/// the one dead letter. A failure names the write shapes sent.
async fn check_writes(
    app: &TestApp,
    db: &mongodb::Database,
    g: Granularity,
    truth: &BTreeMap<(String, String, i64), f64>,
    when: &str,
) {
    let docs = app.buckets().await;
    let outcome = std::panic::AssertUnwindSafe(async {
        assert_invariants(&docs, g);
        assert_eq!(
            &all_values(&docs, g),
            truth,
            "buckets against what was written"
        );
        assert_rollups_match_buckets(app, g).await;
        let want: BTreeSet<(String, String)> = truth
            .keys()
            .map(|(s, m, _)| (s.clone(), m.clone()))
            .collect();
        // The registrar runs beside the flushes: on a loaded machine it
        // may register a series a moment after its buckets are stored.
        eventually(
            Duration::from_secs(30),
            "the registry knows every series",
            || async {
                let listed = app.get_json("/api/v1/sensors?prefix=c-&limit=1000").await;
                let mut series: BTreeSet<(String, String)> = BTreeSet::new();
                for s in listed["sensors"].as_array().expect("sensors") {
                    for m in s["metrics"].as_array().expect("metrics") {
                        series.insert((
                            s["sensor"].as_str().expect("id").to_owned(),
                            m.as_str().expect("metric").to_owned(),
                        ));
                    }
                }
                want.is_subset(&series)
            },
        )
        .await;
        let c07 = app.get_json("/api/v1/sensors?prefix=c-07").await;
        assert_eq!(c07["sensors"][0]["labels"], json!({ "room": "r1" }));
        let c01 = app.get_json("/api/v1/sensors?prefix=c-01").await;
        assert_eq!(c01["sensors"][0]["labels"], json!({ "site": "south" }));
        let dead = app
            .documents(
                &app.settings.mongodb.dead_letter_collection,
                doc! { "sensor": 1 },
            )
            .await;
        assert_eq!(dead.len(), 1, "one dead letter: {dead:?}");
    });
    if let Err(e) = futures_util::FutureExt::catch_unwind(outcome).await {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        panic!(
            "{when}: {message}\nthe write shapes sent:\n  {}",
            write_shapes(db).await
        );
    }
}

async fn conforms(g: Granularity) {
    let settings = conformance_settings(g);
    let Some(db) = profiled(&settings).await else {
        return;
    };
    let app = spawn_app_with(settings).await;
    let truth = workload(&app, g).await;
    // The test's own reads are not the service's: profiling is off for them.
    let profile = |level: i32| {
        let db = db.clone();
        async move {
            db.run_command(doc! { "profile": level })
                .await
                .expect("profiling set");
        }
    };
    profile(0).await;
    check_writes(&app, &db, g, &truth, "after the flushes").await;
    // What the service sent; the rebuilds below are an operator's command.
    let mut service: BTreeMap<String, Vec<Sent>> = BTreeMap::new();
    for s in sent(&db).await {
        service.entry(s.shape()).or_default().push(s);
    }
    profile(2).await;
    rebuilds(&app).await;
    profile(0).await;
    check_writes(&app, &db, g, &truth, "after the rebuilds").await;
    app.stop().await.expect("clean stop");

    let all = sent(&db).await;
    let mut by_shape: BTreeMap<String, Vec<Sent>> = BTreeMap::new();
    for s in all {
        by_shape.entry(s.shape()).or_default().push(s);
    }
    if std::env::var_os("CONFORMANCE_SHAPES").is_some() {
        for (shape, commands) in &by_shape {
            eprintln!("{:>6} × {shape}", commands.len());
        }
    }
    let mut failures = Vec::new();
    let mut scans = Scans::default();
    for (shape, commands) in &by_shape {
        let kind = commands[0].kind.as_str();
        match kind {
            "find" => {
                // The first, last and a few between: each against the evaluator.
                let step = (commands.len() / 8).max(1);
                for s in commands.iter().step_by(step).chain(commands.last()) {
                    if let Some(diff) = check_find(&db, &mut scans, s, shape).await {
                        failures.push(format!("{shape}\n  {diff}\n  command: {}", s.command));
                        break;
                    }
                }
            }
            // Judged by what they left, above.
            "update" | "insert" | "findAndModify" | "delete" => {}
            "aggregate" => {
                let pipeline = commands[0]
                    .command
                    .get_array("pipeline")
                    .expect("a pipeline");
                let merges = pipeline
                    .last()
                    .and_then(Bson::as_document)
                    .is_some_and(|s| s.contains_key("$merge"));
                if !merges {
                    assert!(
                        shape.contains("$objectToArray"),
                        "an aggregation that reads is not checked yet: {shape}"
                    );
                    if let Some(diff) = check_entry_count(&db, &commands[0]).await {
                        failures.push(format!("{shape}\n  {diff}"));
                    }
                }
            }
            // Indexes and their settings: checked by what queries answer.
            "createIndexes" | "listIndexes" | "collMod" | "dropIndexes" | "killCursors" => {}
            // The startup's probes of what the server answers from its
            // indexes (see `store::mongo::shapes`): plans and a scratch
            // collection, no data.
            "explain" | "drop" => {}
            // The collections, created with their block compressor: checked
            // by what `listCollections` answers (`buckets.rs`).
            "create" | "listCollections" => {}
            other => failures.push(format!(
                "a command this suite does not check: {other} ({shape})"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "shapes the server answers differently from the evaluation:\n{}",
        failures.join("\n\n")
    );
    let unbounded = crate::plans::check(&db, &service, g, &conformance_settings(g)).await;
    assert!(
        unbounded.is_empty(),
        "shapes that examine more than they return over a long history:\n{}",
        unbounded.join("\n\n")
    );
}

#[tokio::test]
async fn every_command_shape_conforms_to_an_independent_evaluation_with_minute_buckets() {
    conforms(Granularity::Minute).await;
}

#[tokio::test]
async fn every_command_shape_conforms_to_an_independent_evaluation_with_hour_buckets() {
    conforms(Granularity::Hour).await;
}

#[test]
fn shapes_keep_structure_and_drop_values() {
    let a = doc! { "find": "buckets", "filter": { "sensor": "x", "start": { "$gte": mongodb::bson::DateTime::from_millis(0) } }, "projection": { "v.5": 1, "v.7": 1 } };
    let b = doc! { "find": "buckets", "filter": { "sensor": "y", "start": { "$gte": mongodb::bson::DateTime::from_millis(9) } }, "projection": { "v.12": 1 } };
    assert_eq!(
        document_shape(&a),
        document_shape(&b).replace("v.#:num}", "v.#:num,v.#:num}")
    );
    let c = doc! { "filter": { "start": { "$lt": mongodb::bson::DateTime::from_millis(0) } } };
    assert_ne!(document_shape(&a), document_shape(&c));
    assert_eq!(shape(&Bson::String("$v.17".into())), "$v.#");
    let labels = doc! { "labels.site": "a" };
    assert_eq!(document_shape(&labels), "{labels.*:str}");
}

#[test]
fn the_evaluator_matches_as_mongodb_does() {
    let d = doc! { "a": 5, "t": mongodb::bson::DateTime::from_millis(1000), "m": ["x", "y"], "n": { "k": "v" } };
    let s = "test";
    assert!(matches(&d, &doc! { "a": 5.0 }, s));
    assert!(
        matches(&d, &doc! { "m": "y" }, s),
        "an array holds the value"
    );
    assert!(matches(&d, &doc! { "n.k": { "$in": ["v", "w"] } }, s));
    let t = |ms| mongodb::bson::DateTime::from_millis(ms);
    assert!(matches(
        &d,
        &doc! { "t": { "$gte": t(1000), "$lte": t(1000) } },
        s
    ));
    assert!(!matches(
        &d,
        &doc! { "t": { "$gte": t(1000), "$lt": t(1000) } },
        s
    ));
    assert!(
        !matches(&d, &doc! { "a": { "$gt": "4" } }, s),
        "no match across types"
    );
    assert!(matches(&d, &doc! { "$or": [ { "a": 1 }, { "a": 5 } ] }, s));
    let p = project(&d, Some(&doc! { "_id": 0, "n.k": 1, "a": 1 }));
    assert_eq!(p, doc! { "a": 5, "n": { "k": "v" } });
}

/// The stand-in's known divergence (see docs/src/operating/storage-server.md): a closed range on a
/// field that another follows in a compound index misses the documents at
/// its upper bound. The read check names it there, and finds nothing on a
/// server without the divergence; either way it shows the check can fail.
#[tokio::test]
async fn the_read_check_names_the_stand_ins_closed_range_divergence() {
    let client = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .expect("a client");
    let db = client.database(&format!("hg_test_{}", uuid::Uuid::new_v4().simple()));
    let info = db
        .run_command(doc! { "buildInfo": 1 })
        .await
        .expect("build info");
    let stand_in = info.contains_key("secantusVersion");
    let c = db.collection::<Document>("rollups");
    c.create_index(
        mongodb::IndexModel::builder()
            .keys(doc! { "period": 1, "start": 1, "sensor": 1 })
            .build(),
    )
    .await
    .expect("an index");
    let at = |h: i64| mongodb::bson::DateTime::from_millis(h * 3_600_000);
    let docs: Vec<Document> = (0..4)
        .flat_map(|h| {
            ["a", "b"]
                .into_iter()
                .map(move |s| doc! { "period": "hour", "start": at(h), "sensor": s })
        })
        .collect();
    c.insert_many(docs).await.expect("inserted");
    let closed = Sent {
        kind: "find".into(),
        collection: "rollups".into(),
        command: doc! {
            "find": "rollups",
            "filter": { "period": "hour", "start": { "$gte": at(1), "$lte": at(2) } },
        },
    };
    let half_open = Sent {
        command: doc! {
            "find": "rollups",
            "filter": { "period": "hour", "start": { "$gte": at(1), "$lt": at(3) } },
        },
        ..closed.clone()
    };
    let mut scans = Scans::default();
    let diff = check_find(&db, &mut scans, &closed, &closed.shape()).await;
    assert_eq!(diff.is_some(), stand_in, "{diff:?}");
    let diff = check_find(&db, &mut scans, &half_open, &half_open.shape()).await;
    assert_eq!(diff, None, "half-open ranges are answered right everywhere");
    db.drop().await.expect("dropped");
}
