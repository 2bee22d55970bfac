//! A command's shape (its structure with values replaced by their types)
//! and the commands the service sent, read back from the profiler.

use std::collections::BTreeSet;

use crate::helpers::all_documents;
use mongodb::bson::{Bson, Document, doc};

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

pub(super) fn numbers_as_hash(s: &str) -> String {
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

pub(super) fn document_shape(d: &Document) -> String {
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
pub(super) const OURS: &str = "conformance test";

/// One command the service sent, as the profiler recorded it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub kind: String,
    pub collection: String,
    pub command: Document,
}

impl Sent {
    pub(super) fn shape(&self) -> String {
        let mut c = self.command.clone();
        for f in FRAMING {
            c.remove(*f);
        }
        format!("{} {}: {}", self.kind, self.collection, document_shape(&c))
    }
}

/// The commands in a database's `system.profile`, update statements one
/// by one (as MongoDB records them; the stand-in records whole commands).
pub(super) async fn sent(db: &mongodb::Database) -> Vec<Sent> {
    let entries = all_documents(&db.collection::<Document>("system.profile")).await;
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

#[test]
pub(super) fn shapes_keep_structure_and_drop_values() {
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
