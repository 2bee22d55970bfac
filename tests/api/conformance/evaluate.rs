//! A brute-force evaluation of the reads: every `find` the service sent
//! run again and compared with the same filter, projection, sort and limit
//! evaluated over a plain scan of the collection.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use crate::helpers::*;

use super::shapes::Sent;

pub(super) fn number(b: &Bson) -> Option<f64> {
    match b {
        Bson::Double(x) => Some(*x),
        Bson::Int32(x) => Some(f64::from(*x)),
        Bson::Int64(x) => Some(*x as f64),
        _ => None,
    }
}

/// Compares two values of the same BSON type class; `None` across classes
/// (a range operator never matches across types in MongoDB).
pub(super) fn compare(a: &Bson, b: &Bson) -> Option<std::cmp::Ordering> {
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
pub(super) fn at_path<'a>(d: &'a Document, path: &str) -> Vec<&'a Bson> {
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

pub(super) fn condition(values: &[&Bson], cond: &Bson, shape: &str) -> bool {
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

pub(super) fn matches(d: &Document, filter: &Document, shape: &str) -> bool {
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
pub(super) fn project(d: &Document, projection: Option<&Document>) -> Document {
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

pub(super) fn include(from: &Document, into: &mut Document, path: &str) {
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
pub(super) fn canonical(b: &Bson) -> Bson {
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

pub(super) fn sort_key(d: &Document, sort: &Document) -> Vec<Bson> {
    sort.keys()
        .map(|k| at_path(d, k).first().map_or(Bson::Null, |v| (*v).clone()))
        .collect()
}

pub(super) fn ordered(sort: &Document, a: &[Bson], b: &[Bson]) -> std::cmp::Ordering {
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
pub(super) struct Scans(BTreeMap<String, Vec<Document>>);

impl Scans {
    pub(super) async fn of(&mut self, db: &mongodb::Database, collection: &str) -> &[Document] {
        if !self.0.contains_key(collection) {
            let all = all_documents(&db.collection::<Document>(collection)).await;
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
pub(super) async fn check_entry_count(db: &mongodb::Database, s: &Sent) -> Option<String> {
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
    let all = all_documents(&collection).await;
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

pub(super) async fn check_find(
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

#[test]
pub(super) fn the_evaluator_matches_as_mongodb_does() {
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
pub(super) async fn the_read_check_names_the_stand_ins_closed_range_divergence() {
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
