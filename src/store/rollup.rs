//! Rollups, MongoDB's computed pattern: one document per (sensor, metric,
//! period) for hours (minute buckets only), days and thirty days, each
//! holding a [`Slot`] per sub-period that has readings (minutes of an hour,
//! hours of a day, days of thirty), so a range of any length is answered
//! from a few documents.
//!
//! **Upkeep follows the work.** An hour is rolled up once it has ended: its
//! buckets are read, every level's slots computed here from their values
//! (`domain::Summary`), and each touched document updated by one pipeline
//! statement. A flush that stores a bucket of an hour that has ended marks
//! that hour late before the batch counts as stored (late readings, a
//! backfill, the held buckets written just after their window), and the
//! hour is rolled up once writes into it pause ([`super::late`]); the hours
//! still open are remembered ([`super::upkeep`]) and rolled up once they
//! end. So a live series costs one hour document and one day document a
//! hour, plus a 30-day document a day, and a flush of `k` buckets does
//! `O(k)` upkeep work whatever the fleet's size.
//!
//! **Completeness.** Each document's `complete` is a bitmask of the slots
//! that hold every reading of their span (or none, if the slot has no
//! entry): a slot becomes complete when its span is rolled up after it
//! ended, and every later write into it is marked late before it counts as
//! stored. Queries use only complete slots over buckets not marked late and
//! read one level down for the rest (`query::plan`), so an answer is exact
//! whatever the upkeep has done so far; the upkeep only decides how few
//! documents it takes.
//!
//! **Many writers.** Every slot carries `w`, the write count of the sources
//! it was computed from (buckets count their writes in `n`), and a slot is
//! replaced only by one computed from at least as many writes. A rollup
//! computed from an older read never overwrites a newer one, whichever
//! instance (or rebuild) lands last.
//!
//! Pure: this encodes slots and builds statements; `mongo::rollups` reads
//! and writes.

use std::sync::LazyLock;

use mongodb::bson::{RawDocumentBuf, rawdoc};

use super::raw_writer::{Writer, index_key};
pub use super::rollup_read::read_rollup;
use crate::domain::{Period, Slot};

/// The rollup document layout: slots with every field a window needs, and
/// the completeness bitmask. Version 1 (per-slot count, sum, min, max and
/// write count, with totals) is read as holding nothing complete: the
/// planner reads below it until `hourglass rebuild-rollups` or the upkeep
/// replaces it.
pub const ROLLUP_SCHEMA_VERSION: i32 = 2;

/// A slot as stored, its times in seconds from the slot's start, into the
/// document open in `w`; fields that follow from others are left out (see
/// docs/src/internals/rollups.md). The upkeep writes one per rolled-up span,
/// straight into its command.
fn slot_fields(w: &mut Writer, slot: &Slot) {
    let Some(s) = slot.summary.as_ref() else {
        return;
    };
    let at = slot.start;
    let small = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let offset = |t: i64| small(u64::try_from(t - at).unwrap_or(0));
    w.integer("w", small(slot.n));
    w.integer("c", small(s.count));
    w.double("f", s.first.v);
    w.integer("ft", offset(s.first.t));
    if s.count == 1 {
        return;
    }
    w.double("s", s.sum);
    w.double("lo", s.min);
    w.double("hi", s.max);
    w.double("l", s.last.v);
    w.integer("lt", offset(s.last.t));
    if s.count >= 3
        && let Some(p) = s.penult
    {
        w.double("p", p.v);
        w.integer("pt", offset(p.t));
    }
    if s.inc != 0.0 {
        w.double("i", s.inc);
    }
    if s.resets != 0 {
        w.integer("r", i64::from(s.resets));
    }
    if s.changes != 0 {
        w.integer("x", i64::from(s.changes));
    }
    w.double("m1", s.moments.st);
    w.double("m2", s.moments.stt);
    w.double("m3", s.moments.stv);
    w.double("q", s.moments.svv);
    if s.count >= 3
        && let Some(i) = s.integrals
    {
        w.double("ts", i.step);
        w.double("tl", i.linear);
        w.integer("tg", i.gap);
    }
    if s.count >= 3
        && let Some(r) = &slot.rest
    {
        w.double("b", r.second.v);
        w.integer("bt", offset(r.second.t));
        w.double("rs", r.sum);
        w.double("rl", r.min);
        w.double("rh", r.max);
        if s.count >= 4
            && let Some(gap) = r.gap
        {
            w.integer("rg", gap);
        }
    }
    // Up to three readings, the sketch follows from `f`, `p` and `l`. At most
    // 2 × 2048 bins of 15 bytes: 60 slots stay far below 16 MiB.
    if s.count >= 4
        && let Some(k) = &slot.sketch
    {
        w.binary("qs", &k.encode());
    }
}

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
/// `$literal` or a filter value.
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
    let q = w.document("q");
    w.string("sensor", sensor);
    w.string("metric", metric);
    w.string("period", period.name());
    w.datetime("start", start.saturating_mul(1000));
    w.end(q);
    let u = w.array("u");
    let set_stage = w.document("0");
    let set = w.document("$set");
    let s_field = w.document("s");
    let merge = w.array("$mergeObjects");
    w.raw_document("0", &STORED_SLOTS);
    let written = w.document("1");
    let mut removed = Vec::new();
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
        let Some((key, path, wpath)) = SLOT_PATHS.get(k as usize) else {
            continue;
        };
        let entry = w.document(key);
        if forced {
            let literal = w.document("$literal");
            slot_fields(w, slot);
            w.end(literal);
        } else {
            let cond = w.array("$cond");
            let gt_doc = w.document("0");
            let gt = w.array("$gt");
            let if_null_doc = w.document("0");
            let if_null = w.array("$ifNull");
            w.string("0", wpath);
            w.int32("1", -1);
            w.end(if_null);
            w.end(if_null_doc);
            w.integer("1", i64::try_from(slot.n).unwrap_or(i64::MAX));
            w.end(gt);
            w.end(gt_doc);
            w.string("1", path);
            let literal_doc = w.document("2");
            let literal = w.document("$literal");
            slot_fields(w, slot);
            w.end(literal);
            w.end(literal_doc);
            w.end(cond);
        }
        w.end(entry);
    }
    w.end(written);
    w.end(merge);
    w.end(s_field);
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
    if !removed.is_empty() {
        let stage = w.document("2");
        let paths = w.array("$unset");
        for (i, k) in removed.iter().enumerate() {
            w.string(index_key(i, &mut key), &format!("s.{k}"));
        }
        w.end(paths);
        w.end(stage);
    }
    w.end(u);
    w.boolean("upsert", true);
}

/// Per slot number: the key, `$s.<k>` and `$s.<k>.w` (at most 60 slots).
static SLOT_PATHS: LazyLock<Vec<(String, String, String)>> = LazyLock::new(|| {
    (0..60)
        .map(|k| (k.to_string(), format!("$s.{k}"), format!("$s.{k}.w")))
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
    use super::super::rollup_read::decode_slot;
    use super::*;
    use crate::domain::Sample;
    use crate::store::document::start_date;
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

    /// A slot as stored, its times in seconds from the slot's start; fields
    /// that follow from others are left out (see docs/src/internals/rollups.md).
    pub fn encode_slot(slot: &Slot) -> Option<RawDocumentBuf> {
        slot.summary.as_ref()?;
        let mut w = Writer::with_capacity(256);
        let root = w.root();
        slot_fields(&mut w, slot);
        w.end(root);
        w.finish().ok()
    }

    fn small(n: u64) -> RawBson {
        match i32::try_from(n) {
            Ok(x) => RawBson::Int32(x),
            Err(_) => RawBson::Int64(i64::try_from(n).unwrap_or(i64::MAX)),
        }
    }

    fn offset(t: i64, start: i64) -> RawBson {
        small(u64::try_from(t - start).unwrap_or(0))
    }

    // The statement as the bson crate builds it, level by level: what the
    // in-place writer must reproduce byte for byte.
    /// A slot as stored, its times in seconds from the slot's start; fields
    /// that follow from others are left out (see docs/src/internals/rollups.md).
    /// Encoded straight to bytes: the upkeep writes one per rolled-up span.
    fn reference_encode_slot(slot: &Slot) -> Option<RawDocumentBuf> {
        let s = slot.summary.as_ref()?;
        let at = slot.start;
        let mut d = RawDocumentBuf::new();
        d.append("w", small(slot.n));
        d.append("c", small(s.count));
        d.append("f", s.first.v);
        d.append("ft", offset(s.first.t, at));
        if s.count == 1 {
            return Some(d);
        }
        d.append("s", s.sum);
        d.append("lo", s.min);
        d.append("hi", s.max);
        d.append("l", s.last.v);
        d.append("lt", offset(s.last.t, at));
        if s.count >= 3
            && let Some(p) = s.penult
        {
            d.append("p", p.v);
            d.append("pt", offset(p.t, at));
        }
        if s.inc != 0.0 {
            d.append("i", s.inc);
        }
        if s.resets != 0 {
            d.append("r", small(u64::from(s.resets)));
        }
        if s.changes != 0 {
            d.append("x", small(u64::from(s.changes)));
        }
        d.append("m1", s.moments.st);
        d.append("m2", s.moments.stt);
        d.append("m3", s.moments.stv);
        d.append("q", s.moments.svv);
        if s.count >= 3
            && let Some(i) = s.integrals
        {
            d.append("ts", i.step);
            d.append("tl", i.linear);
            d.append("tg", small(i.gap.unsigned_abs()));
        }
        if s.count >= 3
            && let Some(r) = &slot.rest
        {
            d.append("b", r.second.v);
            d.append("bt", offset(r.second.t, at));
            d.append("rs", r.sum);
            d.append("rl", r.min);
            d.append("rh", r.max);
            if s.count >= 4
                && let Some(gap) = r.gap
            {
                d.append("rg", small(gap.unsigned_abs()));
            }
        }
        if s.count >= 4
            && let Some(k) = &slot.sketch
        {
            d.append(
                "qs",
                RawBson::Binary(mongodb::bson::Binary {
                    subtype: mongodb::bson::spec::BinarySubtype::Generic,
                    bytes: k.encode(),
                }),
            );
        }
        Some(d)
    }

    fn reference_statement_removing(
        sensor: &str,
        metric: &str,
        period: Period,
        start: i64,
        slots: &[Slot],
        replaced: &[i64],
    ) -> RawDocumentBuf {
        let mut removed = Vec::new();
        let mut written = RawDocumentBuf::new();
        let mut bits: u64 = 0;
        for slot in slots {
            let k = (slot.start - start) / period.slot_seconds();
            bits |= 1 << k;
            let forced = replaced.contains(&slot.start);
            let Some(encoded) = reference_encode_slot(slot) else {
                if forced {
                    removed.push(slot.start);
                }
                continue;
            };
            let field = SLOT_PATHS.get(k as usize);
            let (key, path, w) = match field {
                Some((key, path, w)) => (key.as_str(), path.as_str(), w.as_str()),
                None => continue,
            };
            if forced {
                written.append(key, rawdoc! { "$literal": encoded });
                continue;
            }
            written.append(
                key,
                rawdoc! { "$cond": [
                    { "$gt": [ { "$ifNull": [w, -1] }, small(slot.n) ] },
                    path,
                    { "$literal": encoded },
                ]},
            );
        }
        let mut statement = RawDocumentBuf::new();
        statement.append(
            "q",
            rawdoc! { "sensor": sensor, "metric": metric, "period": period.name(), "start": start_date(start) },
        );
        let mut merge = RawArrayBuf::new();
        merge.push(STORED_SLOTS.clone());
        merge.push(written);
        let mut bit_or = RawArrayBuf::new();
        bit_or.push(STORED_COMPLETE.clone());
        bit_or.push(bits as i64);
        let mut pipeline = RawArrayBuf::new();
        pipeline.push(rawdoc! { "$set": {
            "s": { "$mergeObjects": merge },
            "complete": { "$bitOr": bit_or },
            "schema_version": ROLLUP_SCHEMA_VERSION,
        }});
        // What version 1 kept beside the slots.
        pipeline.push(rawdoc! { "$unset": ["count", "sum", "min", "max", "n"] });
        if !removed.is_empty() {
            let mut paths = RawArrayBuf::new();
            for at in removed {
                let k = (at - start) / period.slot_seconds();
                paths.push(format!("s.{k}"));
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
        /// past 32 bits, every level.
        #[test]
        fn statements_written_in_place_are_the_bson_crates(
            spans in prop::collection::btree_map(0i64..24, (samples_in(60), 0u64..5_000_000_000, any::<bool>()), 0..6),
            period in prop_oneof![Just(Period::Hour), Just(Period::Day), Just(Period::Days30)],
        ) {
            let start = 86_400 * 30 * 20;
            let step = period.slot_seconds();
            let slots: Vec<Slot> = spans
                .iter()
                .map(|(&k, (xs, n, _))| {
                    let at = start + k * step;
                    let xs: Vec<Sample> = xs.iter().map(|x| Sample { t: at + (x.t - 3600) * step / 60, v: x.v }).collect();
                    Slot::of(at, &xs, *n).sketched(0.01, &xs)
                })
                .collect();
            let replaced: Vec<i64> = spans
                .iter()
                .filter(|(_, (_, _, r))| *r)
                .map(|(&k, _)| start + k * step)
                .collect();
            let built = statement_removing("s-1 é", "m", period, start, &slots, &replaced);
            let reference = reference_statement_removing("s-1 é", "m", period, start, &slots, &replaced);
            prop_assert_eq!(built.as_bytes(), reference.as_bytes());
            for slot in &slots {
                prop_assert_eq!(
                    encode_slot(slot).map(|d| d.as_bytes().to_vec()),
                    reference_encode_slot(slot).map(|d| d.as_bytes().to_vec())
                );
            }
        }

        /// A slot reads back as it was written, every part of it.
        #[test]
        fn slots_read_back_as_written(xs in samples_in(60), n in 0u64..5_000_000_000) {
            let slot = Slot::of(3600, &xs, n).sketched(0.01, &xs);
            match encode_slot(&slot) {
                None => prop_assert!(slot.summary.is_none()),
                Some(d) => {
                    let back = decode_slot(&d, 3600, Some(0.01)).expect("decodes");
                    prop_assert_eq!(back.n, slot.n);
                    prop_assert_eq!(&back.sketch, &slot.sketch);
                    // Read at another accuracy: no sketch, unless derived.
                    let other = decode_slot(&d, 3600, Some(0.02)).expect("decodes");
                    if xs.len() > 3 {
                        prop_assert_eq!(other.sketch, None);
                    } else {
                        prop_assert_eq!(other.sketch.map(|k| k.count()), Some(xs.len() as u64));
                    }
                    prop_assert_eq!(decode_slot(&d, 3600, None).expect("decodes").sketch, None);
                    for part in [crate::domain::Part::Whole, crate::domain::Part::Rest, crate::domain::Part::First] {
                        prop_assert_eq!(back.part(part), slot.part(part));
                    }
                }
            }
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
        let merge = set
            .get_document("s")
            .and_then(|s| s.get_array("$mergeObjects"))
            .expect("merge");
        let written = merge[1].as_document().expect("written");
        assert_eq!(
            written.keys().collect::<Vec<_>>(),
            ["0"],
            "an empty slot writes no entry"
        );
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
    fn version_one_documents_hold_nothing_complete() {
        let v1 = doc! {
            "start": start_date(3600), "schema_version": 1,
            "s": { "0": { "count": 1, "sum": 1.0, "min": 1.0, "max": 1.0, "n": 1 } },
            "count": 1,
        };
        let r = read_rollup(
            &mongodb::bson::RawDocumentBuf::from_document(&v1).expect("encodes"),
            Period::Hour,
            None,
        )
        .expect("readable");
        assert_eq!((r.complete, r.slots.len()), (0, 0));
        let v3 = doc! { "start": start_date(3600), "schema_version": 3 };
        assert!(
            read_rollup(
                &mongodb::bson::RawDocumentBuf::from_document(&v3).expect("encodes"),
                Period::Hour,
                None
            )
            .is_err()
        );
    }
}
