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

use mongodb::bson::{RawBsonRef, RawDocument, RawDocumentBuf, rawdoc};

use super::StoreError;
use super::document::{elements, raw_number, raw_seconds};
use super::raw_writer::{Writer, index_key};
use crate::domain::{Integrals, Moments, Period, Rest, RollupRead, Sample, Sketch, Slot, Summary};

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
    // Up to three readings, the sketch follows from `f`, `p` and `l`.
    if s.count >= 4
        && let Some(k) = &slot.sketch
    {
        w.binary("qs", &k.encode());
    }
}

/// The fields a stored slot may hold, in the order of [`SlotFields`].
const SLOT_KEYS: [&str; 27] = [
    "w", "c", "f", "ft", "s", "lo", "hi", "l", "lt", "p", "pt", "i", "r", "x", "m1", "m2", "m3",
    "q", "b", "bt", "rs", "rl", "rh", "ts", "tl", "tg", "rg",
];

/// A stored slot's numbers by key, and its sketch's bytes, read in one
/// pass over its bytes.
struct SlotFields<'a>([Option<f64>; SLOT_KEYS.len()], Option<&'a [u8]>);

impl<'a> SlotFields<'a> {
    fn read(d: &'a RawDocument) -> Result<Self, StoreError> {
        let mut fields = [None; SLOT_KEYS.len()];
        let mut sketch = None;
        for e in elements(d) {
            let (key, value) = e?;
            if let Some(i) = SLOT_KEYS.iter().position(|k| *k == key) {
                fields[i] = Some(raw_number(value, &format_args!("rollup slot field {key}"))?);
            } else if key == "qs" {
                match value {
                    RawBsonRef::Binary(b) => sketch = Some(b.bytes),
                    other => {
                        return Err(StoreError::Unreadable(format!(
                            "rollup slot field qs is {:?}, not binary",
                            other.element_type()
                        )));
                    }
                }
            }
        }
        Ok(Self(fields, sketch))
    }

    fn get(&self, key: &str) -> Option<f64> {
        SLOT_KEYS
            .iter()
            .position(|k| *k == key)
            .and_then(|i| self.0[i])
    }

    fn number(&self, key: &str) -> Result<f64, StoreError> {
        self.get(key).ok_or_else(|| {
            StoreError::Unreadable(format!("rollup slot field {key} is missing, not a number"))
        })
    }

    fn number_or(&self, key: &str, default: f64) -> f64 {
        self.get(key).unwrap_or(default)
    }

    fn count(&self, key: &str) -> Result<u64, StoreError> {
        let x = self.number_or(key, 0.0);
        if x < 0.0 || x.fract() != 0.0 {
            return Err(StoreError::Unreadable(format!(
                "rollup slot field {key} is {x}, not a count"
            )));
        }
        Ok(x as u64)
    }
}

/// The sketch of a stored slot at `accuracy`: derived from its first,
/// penultimate and last readings up to three, else its `qs` if kept at that
/// accuracy (none otherwise: the slot answers no percentile).
fn slot_sketch(
    accuracy: f64,
    stored: Option<&[u8]>,
    readings: Option<&[f64]>,
) -> Result<Option<Sketch>, StoreError> {
    if let Some(bytes) = stored {
        let k = Sketch::decode(bytes)
            .map_err(|e| StoreError::Unreadable(format!("rollup slot field qs: {e}")))?;
        return Ok((k.accuracy().to_bits() == accuracy.to_bits()).then_some(k));
    }
    let Some(values) = readings else {
        return Ok(None);
    };
    Ok(Sketch::new(accuracy).ok().map(|mut k| {
        for &v in values {
            k.add(v);
        }
        k
    }))
}

/// A stored slot starting at `start`; with `sketches`, its sketch at that
/// accuracy where it has one.
pub fn decode_slot(d: &RawDocument, start: i64, sketches: Option<f64>) -> Result<Slot, StoreError> {
    let d = SlotFields::read(d)?;
    let n = d.count("w")?;
    let c = d.count("c")?;
    let at = |key: &str| -> Result<i64, StoreError> { Ok(start + d.count(key)? as i64) };
    let first = Sample {
        t: at("ft")?,
        v: d.number("f")?,
    };
    if c <= 1 {
        let sketch = match sketches {
            Some(a) if c == 1 => slot_sketch(a, d.1, Some(&[first.v]))?,
            _ => None,
        };
        return Ok(Slot {
            start,
            summary: (c == 1).then(|| Summary::one(first)),
            n,
            rest: None,
            sketch,
        });
    }
    let last = Sample {
        t: at("lt")?,
        v: d.number("l")?,
    };
    let penult = if c >= 3 {
        Sample {
            t: at("pt")?,
            v: d.number("p")?,
        }
    } else {
        first
    };
    let moments = Moments {
        st: d.number("m1")?,
        stt: d.number("m2")?,
        stv: d.number("m3")?,
        svv: d.number("q")?,
    };
    let summary = Summary {
        count: c,
        sum: d.number("s")?,
        min: d.number("lo")?,
        max: d.number("hi")?,
        first,
        penult: Some(penult),
        last,
        inc: d.number_or("i", 0.0),
        resets: u32::try_from(d.count("r")?).unwrap_or(u32::MAX),
        changes: u32::try_from(d.count("x")?).unwrap_or(u32::MAX),
        moments,
        // Two readings make one segment; a slot stored before integrals
        // were kept has none.
        integrals: if c == 2 {
            Some(Integrals::segment(first, last))
        } else {
            match (d.get("ts"), d.get("tl"), d.get("tg")) {
                (Some(step), Some(linear), Some(_)) => Some(Integrals {
                    step,
                    linear,
                    gap: i64::try_from(d.count("tg")?).unwrap_or(i64::MAX),
                }),
                _ => None,
            }
        },
    };
    let rest = if first.t != start {
        None
    } else if c == 2 {
        Some(Rest {
            second: last,
            sum: last.v,
            min: last.v,
            max: last.v,
            gap: Some(0),
        })
    } else {
        let second = Sample {
            t: at("bt")?,
            v: d.number("b")?,
        };
        Some(Rest {
            second,
            sum: d.number("rs")?,
            min: d.number("rl")?,
            max: d.number("rh")?,
            gap: if c == 3 {
                Some(last.t - second.t)
            } else if d.get("rg").is_some() {
                Some(i64::try_from(d.count("rg")?).unwrap_or(i64::MAX))
            } else {
                None
            },
        })
    };
    let sketch = match sketches {
        Some(a) if c == 2 => slot_sketch(a, d.1, Some(&[first.v, last.v]))?,
        Some(a) if c == 3 => slot_sketch(a, d.1, Some(&[first.v, penult.v, last.v]))?,
        Some(a) => slot_sketch(a, d.1, None)?,
        None => None,
    };
    Ok(Slot {
        start,
        summary: Some(summary),
        n,
        rest,
        sketch,
    })
}

/// Parses a rollup document of `period`, with its slots' sketches at the
/// accuracy `sketches` if given. A version-1 document holds nothing
/// complete; a newer version is refused rather than misread.
pub fn read_rollup(
    d: &RawDocument,
    period: Period,
    sketches: Option<f64>,
) -> Result<RollupRead, StoreError> {
    let (mut start, mut version, mut complete, mut stored) = (None, None, None, None);
    for e in elements(d) {
        let (key, value) = e?;
        match key {
            "start" => start = Some(raw_seconds(value, "rollup start")?),
            "schema_version" => version = Some(value),
            "complete" => complete = Some(value),
            "s" => stored = Some(value),
            _ => {}
        }
    }
    let start =
        start.ok_or_else(|| StoreError::Unreadable("rollup start is missing".to_owned()))?;
    match version {
        Some(RawBsonRef::Int32(2)) | Some(RawBsonRef::Int64(2)) => {}
        Some(RawBsonRef::Int32(1)) | Some(RawBsonRef::Int64(1)) => {
            return Ok(RollupRead {
                start,
                ..RollupRead::default()
            });
        }
        other => {
            return Err(StoreError::Unreadable(format!(
                "unknown rollup schema_version {other:?}"
            )));
        }
    }
    let complete = match complete {
        Some(RawBsonRef::Int64(x)) => x as u64,
        Some(RawBsonRef::Int32(x)) => x as u32 as u64,
        None => 0,
        Some(other) => {
            return Err(StoreError::Unreadable(format!(
                "rollup complete is {:?}",
                other.element_type()
            )));
        }
    };
    let mut slots = Vec::new();
    if let Some(RawBsonRef::Document(s)) = stored {
        for e in elements(s) {
            let (k, v) = e?;
            let index: i64 = k
                .parse()
                .ok()
                .filter(|&i| i >= 0 && i < period.seconds() / period.slot_seconds())
                .ok_or_else(|| StoreError::Unreadable(format!("rollup slot key {k:?}")))?;
            let RawBsonRef::Document(v) = v else {
                return Err(StoreError::Unreadable(format!(
                    "rollup slot {k} is no document"
                )));
            };
            slots.push(decode_slot(
                v,
                start + index * period.slot_seconds(),
                sketches,
            )?);
        }
    }
    slots.sort_by_key(|s| s.start);
    Ok(RollupRead {
        start,
        complete,
        slots,
    })
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
    use super::*;
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
