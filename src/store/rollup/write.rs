//! A rollup document's update statement (see the folder's page): each
//! slot encoded (`codec`) under `s.<k>` with its write count, replaced only
//! by one computed from at least as many writes.

use std::sync::LazyLock;

use mongodb::bson::{RawDocumentBuf, rawdoc};

use super::codec;
use crate::domain::{Period, Slot};
use crate::store::raw_writer::{Writer, index_key};

/// The rollup document layout: each slot one binary value (its readings
/// or its summary: `codec`) under `s.<k>`, its write count under
/// `w.<k>`, and the completeness bitmask. Versions 1 and 2 (slots as
/// documents of named fields, several times the bytes) are read as holding
/// nothing complete: the planner reads below them until the upkeep or
/// `hourglass rebuild-rollups` (run by the service itself after an upgrade)
/// replaces them.
pub const ROLLUP_SCHEMA_VERSION: i32 = 3;

/// The slot numbers of a document of `period`: all of them complete.
pub fn all_slots(period: Period) -> u64 {
    let n = period.seconds() / period.slot_seconds();
    if n >= 64 { u64::MAX } else { (1 << n) - 1 }
}

/// Writes, as element `key` of the document open in `w` (the upkeep writes
/// each statement straight into its command), the update statement that
/// writes `slots` (all in the `period` document starting at `start`) and
/// marks them complete: each replaces the stored slot unless that one
/// counts more writes; a slot without readings only sets its bit (a stored
/// one stays: rollups outlive their buckets). Everything from the data is a
/// binary value, a number or a filter value: nothing the server evaluates.
///
/// Except the slots starting at `replaced`: those are written whatever is
/// stored, and removed when they hold nothing: spans rolled up again while
/// marked late, whose readings a delete may have removed (see
/// `store::delete`), so that their write counts went down. No write can be
/// racing unseen: one after the read marks the hour again, and it is rolled
/// up once more.
#[allow(clippy::too_many_arguments)]
pub fn write_statement(
    w: &mut Writer,
    key: &str,
    sensor: &str,
    metric: &str,
    period: Period,
    start: i64,
    slots: &[Slot],
    replaced: &[i64],
) {
    // Written in place, in order (see `raw_writer`): each slot was a
    // document of its own, copied into a `$cond`, copied into the statement,
    // and each statement copied into its command.
    let statement = w.document(key);
    statement_fields(w, sensor, metric, period, start, slots, replaced);
    w.end(statement);
}

/// The fields of [`write_statement`]'s statement, into the document open in `w`.
fn statement_fields(
    w: &mut Writer,
    sensor: &str,
    metric: &str,
    period: Period,
    start: i64,
    slots: &[Slot],
    replaced: &[i64],
) {
    // Long: the statement written field by field, in document order.
    let q = w.document("q");
    w.string("sensor", sensor);
    w.string("metric", metric);
    w.string("period", period.name());
    w.datetime("start", start.saturating_mul(1000));
    w.end(q);
    let u = w.array("u");
    let set_stage = w.document("0");
    let set = w.document("$set");
    let mut removed = Vec::new();
    // Forced slots of one write: a stored count goes.
    let mut uncounted = Vec::new();
    let mut bits: u64 = 0;
    // Each slot with readings: its number, whether it is forced, its write
    // count and where its bytes are in `bytes`.
    let mut encoded: Vec<(usize, bool, u64, std::ops::Range<usize>)> =
        Vec::with_capacity(slots.len());
    let mut bytes = Vec::with_capacity(64 * slots.len());
    for slot in slots {
        let k = (slot.start - start) / period.slot_seconds();
        bits |= 1 << k;
        let forced = replaced.contains(&slot.start);
        if slot.summary.is_none() {
            if forced {
                removed.push(k);
            }
            continue;
        }
        let at = bytes.len();
        codec::encode(slot, &mut bytes);
        encoded.push((k as usize, forced, slot.n, at..bytes.len()));
    }
    // `s` before `w`: each guard reads the stored `w` (a stage's fields
    // are computed from its input, and written in this order by any server).
    for (field, stored) in [("s", &*STORED_SLOTS), ("w", &*STORED_COUNTS)] {
        let s_field = w.document(field);
        let merge = w.array("$mergeObjects");
        w.raw_document("0", stored);
        let written = w.document("1");
        for (k, forced, n, range) in &encoded {
            let Some((key, path, wpath)) = SLOT_PATHS.get(*k) else {
                continue;
            };
            // A write count of 1 (the commonest: a bucket written once) is
            // not stored: a guard reads a missing count as -1, and a slot
            // with readings counts 1 write at least, so it decides alike.
            if field == "w" && *n == 1 {
                if *forced {
                    uncounted.push(*k);
                }
                continue;
            }
            let n = i64::try_from(*n).unwrap_or(i64::MAX);
            let value = |w: &mut Writer, key: &str| match bytes.get(range.clone()) {
                Some(b) if field == "s" => w.binary(key, b),
                _ => w.integer(key, n),
            };
            if *forced {
                value(w, key);
                continue;
            }
            let entry = w.document(key);
            let cond = w.array("$cond");
            let gt_doc = w.document("0");
            let gt = w.array("$gt");
            let if_null_doc = w.document("0");
            let if_null = w.array("$ifNull");
            w.string("0", wpath);
            w.int32("1", -1);
            w.end(if_null);
            w.end(if_null_doc);
            w.integer("1", n);
            w.end(gt);
            w.end(gt_doc);
            w.string("1", if field == "s" { path } else { wpath });
            value(w, "2");
            w.end(cond);
            w.end(entry);
        }
        w.end(written);
        w.end(merge);
        w.end(s_field);
    }
    let complete = w.document("complete");
    let bit_or = w.array("$bitOr");
    w.raw_document("0", &STORED_COMPLETE);
    w.int64("1", bits as i64);
    w.end(bit_or);
    w.end(complete);
    w.int32("schema_version", ROLLUP_SCHEMA_VERSION);
    w.end(set);
    w.end(set_stage);
    // What version 1 kept beside the slots.
    let unset_stage = w.document("1");
    let unset = w.array("$unset");
    let mut key = [0; 20];
    for (i, f) in ["count", "sum", "min", "max", "n"].iter().enumerate() {
        w.string(index_key(i, &mut key), f);
    }
    w.end(unset);
    w.end(unset_stage);
    if !removed.is_empty() || !uncounted.is_empty() {
        let stage = w.document("2");
        let paths = w.array("$unset");
        let mut i = 0;
        for k in &removed {
            w.string(index_key(i, &mut key), &format!("s.{k}"));
            w.string(index_key(i + 1, &mut key), &format!("w.{k}"));
            i += 2;
        }
        for k in &uncounted {
            w.string(index_key(i, &mut key), &format!("w.{k}"));
            i += 1;
        }
        w.end(paths);
        w.end(stage);
    }
    w.end(u);
    w.boolean("upsert", true);
}

/// Per slot number: the key, `$s.<k>` and `$w.<k>` (at most 60 slots).
static SLOT_PATHS: LazyLock<Vec<(String, String, String)>> = LazyLock::new(|| {
    (0..60)
        .map(|k| (k.to_string(), format!("$s.{k}"), format!("$w.{k}")))
        .collect()
});

/// The stored slots, kept only from a document of this layout.
static STORED_SLOTS: LazyLock<RawDocumentBuf> = LazyLock::new(|| {
    rawdoc! { "$cond": [
        { "$eq": ["$schema_version", ROLLUP_SCHEMA_VERSION] },
        { "$ifNull": ["$s", {}] },
        {},
    ]}
});

/// The stored write counts, kept only from a document of this layout.
static STORED_COUNTS: LazyLock<RawDocumentBuf> = LazyLock::new(|| {
    rawdoc! { "$cond": [
        { "$eq": ["$schema_version", ROLLUP_SCHEMA_VERSION] },
        { "$ifNull": ["$w", {}] },
        {},
    ]}
});

/// The stored completeness bits, kept only from a document of this layout.
static STORED_COMPLETE: LazyLock<RawDocumentBuf> = LazyLock::new(|| {
    rawdoc! { "$cond": [
        { "$eq": ["$schema_version", ROLLUP_SCHEMA_VERSION] },
        { "$ifNull": ["$complete", 0_i64] },
        0_i64,
    ]}
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Sample;
    use crate::store::document::start_date;
    use crate::store::rollup::read_rollup;
    use mongodb::bson::{Bson, doc};
    use mongodb::bson::{RawArrayBuf, RawBson};
    use proptest::prelude::*;

    /// [`write_statement`]'s statement as a document of its own.
    fn statement_removing(
        sensor: &str,
        metric: &str,
        period: Period,
        start: i64,
        slots: &[Slot],
        replaced: &[i64],
    ) -> RawDocumentBuf {
        let mut w = Writer::default();
        let root = w.root();
        write_statement(&mut w, "0", sensor, metric, period, start, slots, replaced);
        w.end(root);
        let command = w.finish().expect("closed");
        let statement = command.get_document("0").expect("the statement");
        statement.to_raw_document_buf()
    }

    /// [`statement_removing`] replacing nothing.
    fn statement(
        sensor: &str,
        metric: &str,
        period: Period,
        start: i64,
        slots: &[Slot],
    ) -> RawDocumentBuf {
        statement_removing(sensor, metric, period, start, slots, &[])
    }

    fn small(n: u64) -> RawBson {
        match i32::try_from(n) {
            Ok(x) => RawBson::Int32(x),
            Err(_) => RawBson::Int64(i64::try_from(n).unwrap_or(i64::MAX)),
        }
    }

    // The statement as the bson crate builds it, level by level: what the
    // in-place writer must reproduce byte for byte.
    fn reference_statement_removing(
        sensor: &str,
        metric: &str,
        period: Period,
        start: i64,
        slots: &[Slot],
        replaced: &[i64],
    ) -> RawDocumentBuf {
        let (mut removed, mut uncounted) = (Vec::new(), Vec::new());
        let (mut written, mut counts) = (RawDocumentBuf::new(), RawDocumentBuf::new());
        let mut bits: u64 = 0;
        for slot in slots {
            let k = (slot.start - start) / period.slot_seconds();
            bits |= 1 << k;
            let forced = replaced.contains(&slot.start);
            if slot.summary.is_none() {
                if forced {
                    removed.push(k);
                }
                continue;
            }
            let mut bytes = Vec::new();
            codec::encode(slot, &mut bytes);
            let encoded = RawBson::Binary(mongodb::bson::Binary {
                subtype: mongodb::bson::spec::BinarySubtype::Generic,
                bytes,
            });
            let Some((key, path, w)) = SLOT_PATHS.get(k as usize) else {
                continue;
            };
            let (key, path, w) = (key.as_str(), path.as_str(), w.as_str());
            if forced {
                written.append(key, encoded);
                if slot.n == 1 {
                    uncounted.push(k);
                } else {
                    counts.append(key, small(slot.n));
                }
                continue;
            }
            let guard = rawdoc! { "$gt": [ { "$ifNull": [w, -1] }, small(slot.n) ] };
            written.append(key, rawdoc! { "$cond": [guard.clone(), path, encoded] });
            if slot.n != 1 {
                counts.append(key, rawdoc! { "$cond": [guard, w, small(slot.n)] });
            }
        }
        let mut statement = RawDocumentBuf::new();
        statement.append(
            "q",
            rawdoc! { "sensor": sensor, "metric": metric, "period": period.name(), "start": start_date(start) },
        );
        let merged = |stored: &RawDocumentBuf, new: RawDocumentBuf| {
            let mut merge = RawArrayBuf::new();
            merge.push(stored.clone());
            merge.push(new);
            rawdoc! { "$mergeObjects": merge }
        };
        let mut bit_or = RawArrayBuf::new();
        bit_or.push(STORED_COMPLETE.clone());
        bit_or.push(bits as i64);
        let mut pipeline = RawArrayBuf::new();
        pipeline.push(rawdoc! { "$set": {
            "s": merged(&STORED_SLOTS, written),
            "w": merged(&STORED_COUNTS, counts),
            "complete": { "$bitOr": bit_or },
            "schema_version": ROLLUP_SCHEMA_VERSION,
        }});
        // What version 1 kept beside the slots.
        pipeline.push(rawdoc! { "$unset": ["count", "sum", "min", "max", "n"] });
        if !removed.is_empty() || !uncounted.is_empty() {
            let mut paths = RawArrayBuf::new();
            for k in removed {
                paths.push(format!("s.{k}"));
                paths.push(format!("w.{k}"));
            }
            for k in uncounted {
                paths.push(format!("w.{k}"));
            }
            pipeline.push(rawdoc! { "$unset": paths });
        }
        statement.append("u", pipeline);
        statement.append("upsert", true);
        statement
    }

    fn samples_in(span: i64) -> impl Strategy<Value = Vec<Sample>> {
        let t = prop_oneof![0..span, Just(0), Just(1)];
        prop::collection::btree_map(t, -1000i32..1000, 0..20).prop_map(|m| {
            m.into_iter()
                .map(|(t, v)| Sample {
                    t: 3600 + t,
                    v: f64::from(v) / 8.0,
                })
                .collect()
        })
    }

    proptest! {
        /// The statement written in place is the bson crate's, byte for
        /// byte: guarded and forced slots, empty ones removed, write counts
        /// past 32 bits, slots of readings and of summaries, every level.
        #[test]
        fn statements_written_in_place_are_the_bson_crates(
            spans in prop::collection::btree_map(0i64..24, (samples_in(60), prop_oneof![Just(1u64), 0u64..5_000_000_000], any::<bool>(), any::<bool>()), 0..6),
            period in prop_oneof![Just(Period::Hour), Just(Period::Day), Just(Period::Days30)],
        ) {
            let start = 86_400 * 30 * 20;
            let step = period.slot_seconds();
            let slots: Vec<Slot> = spans
                .iter()
                .map(|(&k, (xs, n, _, keep))| {
                    let at = start + k * step;
                    let xs: Vec<Sample> = xs.iter().map(|x| Sample { t: at + (x.t - 3600) * step / 60, v: x.v }).collect();
                    let slot = Slot::of(at, &xs, *n).sketched(0.01, &xs);
                    if *keep { slot.keeping(&xs) } else { slot }
                })
                .collect();
            let replaced: Vec<i64> = spans
                .iter()
                .filter(|(_, (_, _, r, _))| *r)
                .map(|(&k, _)| start + k * step)
                .collect();
            let built = statement_removing("s-1 é", "m", period, start, &slots, &replaced);
            let reference = reference_statement_removing("s-1 é", "m", period, start, &slots, &replaced);
            prop_assert_eq!(built.as_bytes(), reference.as_bytes());
        }
    }

    #[test]
    fn a_statement_guards_each_slot_by_its_write_count_and_keeps_data_literal() {
        let xs = [Sample { t: 3600, v: 1.5 }, Sample { t: 3661, v: 2.0 }];
        let slot = Slot::of(3600, &xs, 7);
        let empty = Slot::of(3600 + 3 * 60, &[], 0);
        let s = statement("a$b", "m", Period::Hour, 3600, &[slot, empty])
            .to_document()
            .expect("decodes");
        let set = s.get_array("u").expect("pipeline")[0]
            .as_document()
            .and_then(|d| d.get_document("$set").ok())
            .expect("$set");
        for field in ["s", "w"] {
            let merge = set
                .get_document(field)
                .and_then(|s| s.get_array("$mergeObjects"))
                .expect("merge");
            let written = merge[1].as_document().expect("written");
            assert_eq!(
                written.keys().collect::<Vec<_>>(),
                ["0"],
                "an empty slot writes no entry"
            );
            let cond = written.get_document("0").and_then(|c| c.get_array("$cond"));
            assert_eq!(
                cond.ok().and_then(|c| c.first()).map(ToString::to_string),
                Some(r#"{ "$gt": [{ "$ifNull": ["$w.0", -1] }, 7] }"#.to_owned()),
            );
        }
        let bits = set
            .get_document("complete")
            .and_then(|c| c.get_array("$bitOr"))
            .expect("bits");
        assert_eq!(bits[1], Bson::Int64(0b1001));
        assert_eq!(
            s.get_document("q").and_then(|q| q.get_str("sensor")),
            Ok("a$b")
        );
    }

    #[test]
    fn documents_of_older_versions_hold_nothing_complete() {
        for v1 in [
            doc! {
                "start": start_date(3600), "schema_version": 1,
                "s": { "0": { "count": 1, "sum": 1.0, "min": 1.0, "max": 1.0, "n": 1 } },
                "count": 1,
            },
            doc! {
                "start": start_date(3600), "schema_version": 2, "complete": 1_i64,
                "s": { "0": { "w": 1, "c": 1, "f": 1.0, "ft": 0 } },
            },
        ] {
            let r = read_rollup(
                &mongodb::bson::RawDocumentBuf::from_document(&v1).expect("encodes"),
                Period::Hour,
                None,
            )
            .expect("readable");
            assert_eq!((r.complete, r.slots.len()), (0, 0));
        }
        let v4 = doc! { "start": start_date(3600), "schema_version": 4 };
        assert!(
            read_rollup(
                &mongodb::bson::RawDocumentBuf::from_document(&v4).expect("encodes"),
                Period::Hour,
                None
            )
            .is_err()
        );
    }
}
