//! The bucket document format: update pipelines that write it, and (in
//! `read`) the reader that parses it back. See
//! docs/src/internals/buckets.md.

use std::sync::LazyLock;

use mongodb::bson::{DateTime, RawBson, RawDocumentBuf, rawdoc};

use super::errors::StoreError;
use super::raw_writer::Writer;
use crate::domain::{BucketUpdate, Granularity, SECOND_FIELDS, field_name};

/// The current bucket document layout, recorded in the database's metadata
/// (an older instance refuses to start on a newer one). 2: values may carry
/// versions (`a`, `amax`) that every writer must respect, so an instance
/// that writes 1 must not write beside it. 3: buckets no longer carry the
/// version themselves (20 bytes each, a tenth of a minute bucket of six
/// readings); those written before keep theirs.
pub const SCHEMA_VERSION: i32 = 3;

mod dead_letter;
mod read;

pub use dead_letter::dead_letter_document;
pub use read::read_bucket;
pub(crate) use read::{elements, raw_number, raw_seconds};

// Statements are written as raw BSON straight into the buffer of their
// `update` command (see `raw_writer`), with the parts that never change
// encoded once and copied in, so the driver has nothing left to serialize.
// This is the hot path of every flush.

/// `"$v.0"` … `"$v.59"`: the paths of an hour bucket's minutes.
static MINUTE_PATHS: LazyLock<Vec<String>> =
    LazyLock::new(|| SECOND_FIELDS.iter().map(|m| format!("$v.{m}")).collect());

/// The aggregates of each minute `v.<m>` of an hour bucket: the value
/// alone for a minute of one reading (count 1, and sum, min and max all
/// that value: 11 bytes where the document takes 59, which at a reading a
/// minute was most of the bucket), else `{count, sum, min, max}`. The
/// minute's values are listed once (`$let`): 306 bytes a touched minute,
/// where the four fields each listing them took 320.
static MINUTE_AGGREGATES: LazyLock<Vec<RawDocumentBuf>> = LazyLock::new(|| {
    MINUTE_PATHS
        .iter()
        .map(|p| {
            rawdoc! { "$let": {
                "vars": { "x": values_of(p) },
                "in": { "$cond": [
                    { "$eq": [ { "$size": "$$x" }, 1 ] },
                    { "$min": "$$x" },
                    {
                        "count": { "$size": "$$x" },
                        "sum": { "$sum": "$$x" },
                        "min": { "$min": "$$x" },
                        "max": { "$max": "$$x" },
                    },
                ]},
            }}
        })
        .collect()
});

/// A minute bucket's stages after the first: the aggregates of all of `v`.
/// The values are listed once into a field of their own, dropped again in
/// the same update, rather than once per aggregate: a statement ~80 bytes
/// shorter, and one `$objectToArray` of the bucket for the server instead of
/// four. (An hour bucket's totals stay one stage: they need paths into an
/// array of documents, which the local stand-in server does not resolve.)
static MINUTE_TOTALS: LazyLock<[RawDocumentBuf; 3]> = LazyLock::new(|| {
    [
        rawdoc! { "$set": { "_t": values_of("$v") } },
        rawdoc! { "$set": {
            "count": { "$size": "$_t" },
            "sum": { "$sum": "$_t" },
            "min": { "$min": "$_t" },
            "max": { "$max": "$_t" },
        }},
        rawdoc! { "$unset": "_t" },
    ]
});

/// An hour bucket's third stage: the aggregates of the minutes' aggregates.
/// A minute stored as its one value has no fields, so a path into it is
/// missing and `$ifNull` takes count 1 and the value itself.
static HOUR_TOTALS: LazyLock<RawDocumentBuf> = LazyLock::new(|| {
    let of_minutes = |field: &str, alone: RawBson| {
        let entry = format!("$$this.v.{field}");
        rawdoc! { "$map": {
            "input": { "$objectToArray": "$m" },
            "in": { "$ifNull": [entry, alone] },
        }}
    };
    let value = || RawBson::String("$$this.v".to_owned());
    rawdoc! { "$set": {
        "count": { "$sum": of_minutes("count", RawBson::Int32(1)) },
        "sum": { "$sum": of_minutes("sum", value()) },
        "min": { "$min": of_minutes("min", value()) },
        "max": { "$max": of_minutes("max", value()) },
    }}
});

/// `n + 1`: every write of a bucket counts, so rollups can tell a newer
/// figure from an older one (see `rollup`).
static WRITE_COUNTER: LazyLock<RawDocumentBuf> =
    LazyLock::new(|| rawdoc! { "$add": [ { "$ifNull": ["$n", 0] }, 1 ] });

/// The update pipeline that removes the values at `removed` (offsets in
/// seconds) from a bucket with their versions, recomputes its aggregates
/// (and an hour bucket's minutes') from the values `left`, and counts the
/// write (see `store::delete`). `left` must not be empty: a bucket left
/// with nothing is deleted instead.
pub fn removal_pipeline(
    granularity: Granularity,
    removed: &[u16],
    left: &[u16],
) -> Vec<RawDocumentBuf> {
    let mut unset = mongodb::bson::RawArrayBuf::new();
    let mut stages = Vec::new();
    match granularity {
        Granularity::Minute => {
            for &o in removed {
                unset.push(format!("v.{}", field_name(o)));
            }
        }
        Granularity::Hour => {
            let minute_left = |m: u16| left.iter().any(|&o| o / 60 == m);
            let mut touched: Vec<u16> = removed.iter().map(|&o| o / 60).collect();
            touched.dedup();
            for &o in removed {
                if minute_left(o / 60) {
                    unset.push(format!("v.{}.{}", field_name(o / 60), field_name(o % 60)));
                }
            }
            let mut minutes = RawDocumentBuf::new();
            for &m in &touched {
                if minute_left(m) {
                    minutes.append_ref(field_name(m), &*MINUTE_AGGREGATES[usize::from(m)]);
                } else {
                    unset.push(format!("v.{}", field_name(m)));
                    unset.push(format!("m.{}", field_name(m)));
                }
            }
            if !minutes.is_empty() {
                stages.push(rawdoc! { "$set": {
                    "m": { "$mergeObjects": [ { "$ifNull": ["$m", {}] }, minutes ] },
                }});
            }
        }
    }
    for &o in removed {
        unset.push(format!("a.{o}"));
    }
    let mut out = vec![rawdoc! { "$unset": unset }];
    out.extend(stages);
    match granularity {
        Granularity::Minute => out.extend(MINUTE_TOTALS.iter().cloned()),
        Granularity::Hour => out.push(HOUR_TOTALS.clone()),
    }
    out.push(rawdoc! { "$set": { "n": WRITE_COUNTER.clone() } });
    out
}

pub fn start_date(start: i64) -> DateTime {
    DateTime::from_millis(start.saturating_mul(1000))
}

/// `[value, …]` of an object of values, as an aggregation expression.
fn values_of(path: &str) -> RawDocumentBuf {
    rawdoc! { "$map": { "input": { "$objectToArray": path }, "in": "$$this.v" } }
}

/// `{"$ifNull": ["$v", {}]}`: the stored values, or none.
static STORED_VALUES: LazyLock<RawDocumentBuf> =
    LazyLock::new(|| rawdoc! { "$ifNull": ["$v", {}] });

/// `{"$ifNull": ["$a", {}]}`: the stored versions, or none.
static STORED_VERSIONS: LazyLock<RawDocumentBuf> =
    LazyLock::new(|| rawdoc! { "$ifNull": ["$a", {}] });

/// `{"$ifNull": ["$m", {}]}`: an hour bucket's stored minute aggregates.
static STORED_MINUTES: LazyLock<RawDocumentBuf> =
    LazyLock::new(|| rawdoc! { "$ifNull": ["$m", {}] });

/// `{"$ifNull": ["$v.<m>", {}]}` for each minute of an hour bucket.
static STORED_MINUTE_VALUES: LazyLock<Vec<RawDocumentBuf>> = LazyLock::new(|| {
    MINUTE_PATHS
        .iter()
        .map(|p| rawdoc! { "$ifNull": [p.as_str(), {}] })
        .collect()
});

/// `"$a.0"` … `"$a.3599"`: the paths of the versions of a bucket's seconds,
/// keyed by offset from the bucket start.
static VERSION_PATHS: LazyLock<Vec<String>> =
    LazyLock::new(|| (0..3600).map(|o| format!("$a.{o}")).collect());

/// `"$v.<m>.<s>"`: the path of each second of an hour bucket, by offset.
static HOUR_SECOND_PATHS: LazyLock<Vec<String>> = LazyLock::new(|| {
    (0..3600)
        .map(|o| format!("$v.{}.{}", o / 60, o % 60))
        .collect()
});

/// How a statement treats the versions a bucket may already hold (see
/// docs/src/internals/last-write-wins.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Matches only a bucket that holds no versions, and merges plainly:
    /// every stored value is then older than any still unstored. On a
    /// bucket that does hold versions the upsert fails on the unique index,
    /// and the statement goes again [`Form::Guarded`].
    Plain,
    /// Compares each second's acknowledgement with the stored version and
    /// keeps the later.
    Guarded,
}

/// How one write treats versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versioning {
    pub form: Form,
    /// Values acknowledged at or after this (epoch ms) keep their version:
    /// an older value of the same second may still be unstored somewhere.
    pub keep_from: i64,
}

impl Versioning {
    /// No versions kept: one writer that has nothing older unstored.
    pub const PLAIN: Versioning = Versioning {
        form: Form::Plain,
        keep_from: i64::MAX,
    };
}

/// A version as stored: milliseconds from the bucket start (short, and an
/// int32 for anything acknowledged within 24 days of its bucket).
fn relative_ack(start: i64, ack: i64) -> i64 {
    ack.saturating_sub(start.saturating_mul(1000))
}

/// The offset key of `offset` (`"0"` … `"3599"`).
fn offset_key(offset: u16, buf: &mut [u8; 20]) -> &str {
    super::raw_writer::index_key(usize::from(offset), buf)
}

/// `{"$literal": {<second>: value, …}}` as element `key` of an array.
fn write_literal_seconds<'a>(
    w: &mut Writer,
    key: &str,
    values: impl Iterator<Item = &'a (u16, f64)>,
) {
    let element = w.document(key);
    let literal = w.document("$literal");
    for &(second, value) in values {
        w.double(field_name(second % 60), value);
    }
    w.end(literal);
    w.end(element);
}

/// Writes the upsert statement of one bucket as element `key` of an
/// `update` command's `updates` array: `{q: <key filter>, u: <pipeline>,
/// upsert: true}`.
///
/// The pipeline sets the values (last write wins) and recomputes the
/// aggregates from the stored values in the same atomic document update, so
/// duplicates, overwrites, late readings and concurrent writers all leave
/// them exact; applying the same update twice changes nothing. Every
/// user-supplied value sits inside `$literal` or a filter value, never in a
/// field name or operator position.
pub fn write_statement(
    w: &mut Writer,
    key: &str,
    update: &BucketUpdate,
    granularity: Granularity,
    versioning: Versioning,
) {
    let statement = w.document(key);
    statement_fields(w, update, granularity, versioning);
    w.end(statement);
}

/// The acknowledgement of the `i`th value; 0 (older than anything) if the
/// update carries none.
fn ack_of(update: &BucketUpdate, i: usize) -> i64 {
    update.acks.get(i).copied().unwrap_or(0)
}

fn statement_fields(
    w: &mut Writer,
    update: &BucketUpdate,
    granularity: Granularity,
    versioning: Versioning,
) {
    // Long: the statement written field by field, in document order.
    // Exactly the fields of the unique index, so an upsert that loses a race
    // fails with a duplicate key and can be retried.
    let q = w.document("q");
    w.string("sensor", update.key.sensor.as_str());
    w.string("metric", update.key.metric.as_str());
    w.datetime("start", start_date(update.key.start).timestamp_millis());
    if versioning.form == Form::Plain {
        // No versions: `amax` is written and unset with `a`, so it is
        // missing exactly when `a` is, and `{$lte: null}` matches only a
        // missing (or null) field. Unlike `a: {$exists: false}`, a server
        // can answer it from an index holding `amax` after the key (the
        // stand-in does, with the `guard` index: see `indexes`), and an
        // upsert does not copy it into the document it inserts.
        let amax = w.document("amax");
        w.null("$lte");
        w.end(amax);
    }
    w.end(q);
    let u = w.array("u");
    if versioning.form == Form::Guarded {
        guarded_values_stage(w, update, granularity, versioning.keep_from);
        match granularity {
            Granularity::Minute => {
                for (key, stage) in ["1", "2", "3"].into_iter().zip(MINUTE_TOTALS.iter()) {
                    w.raw_document(key, stage);
                }
            }
            Granularity::Hour => {
                hour_minutes_stage(w, update);
                w.raw_document("2", &HOUR_TOTALS);
            }
        }
        w.end(u);
        w.boolean("upsert", true);
        return;
    }
    let keep_from = versioning.keep_from;
    match granularity {
        Granularity::Minute => {
            // {$set: {v: {$mergeObjects: [stored, {$literal: new}]}, n}}
            values_stage(
                w,
                |w| write_literal_seconds(w, "1", update.values.iter()),
                |w| plain_versions(w, update, keep_from),
            );
            for (key, stage) in ["1", "2", "3"].into_iter().zip(MINUTE_TOTALS.iter()) {
                w.raw_document(key, stage);
            }
        }
        Granularity::Hour => {
            let minutes = || update.values.chunk_by(|a, b| a.0 / 60 == b.0 / 60);
            let minute_of = |values: &[(u16, f64)]| usize::from(values[0].0 / 60 % 60);
            // {$set: {v: {$mergeObjects: [stored, {<m>: {$mergeObjects:
            //   [stored minute, {$literal: new}]}, …}]}, n}}
            values_stage(
                w,
                |w| {
                    let changed = w.document("1");
                    for values in minutes() {
                        let minute = minute_of(values);
                        let element = w.document(SECOND_FIELDS[minute]);
                        let inner = w.array("$mergeObjects");
                        w.raw_document("0", &STORED_MINUTE_VALUES[minute]);
                        write_literal_seconds(w, "1", values.iter());
                        w.end(inner);
                        w.end(element);
                    }
                    w.end(changed);
                },
                |w| plain_versions(w, update, keep_from),
            );
            hour_minutes_stage(w, update);
            w.raw_document("2", &HOUR_TOTALS);
        }
    }
    w.end(u);
    w.boolean("upsert", true);
}

/// An hour bucket's second stage: `{$set: {m: {$mergeObjects: [stored,
/// {<m>: <aggregates of v.<m>>, …}]}}}` for the minutes the update touches.
fn hour_minutes_stage(w: &mut Writer, update: &BucketUpdate) {
    let stage = w.document("1");
    let set = w.document("$set");
    let m = w.document("m");
    let merge = w.array("$mergeObjects");
    w.raw_document("0", &STORED_MINUTES);
    let changed = w.document("1");
    let mut last = None;
    for &(offset, _) in &update.values {
        let minute = usize::from(offset / 60 % 60);
        if last != Some(minute) {
            w.raw_document(SECOND_FIELDS[minute], &MINUTE_AGGREGATES[minute]);
            last = Some(minute);
        }
    }
    w.end(changed);
    w.end(merge);
    w.end(m);
    w.end(set);
    w.end(stage);
}

/// The versions a [`Form::Plain`] statement stores, on a bucket that holds
/// none: `a: {$literal: {<offset>: <ms from start>}}` and `amax`, the latest
/// (epoch ms), for the values acknowledged at or after `keep_from`.
fn plain_versions(w: &mut Writer, update: &BucketUpdate, keep_from: i64) {
    let start = update.key.start;
    let kept = || (0..update.values.len()).filter(|&i| ack_of(update, i) >= keep_from);
    let Some(latest) = kept().map(|i| ack_of(update, i)).max() else {
        return;
    };
    let mut buf = [0; 20];
    let a = w.document("a");
    let literal = w.document("$literal");
    for i in kept() {
        let key = offset_key(update.values[i].0, &mut buf);
        w.integer(key, relative_ack(start, ack_of(update, i)));
    }
    w.end(literal);
    w.end(a);
    w.int64("amax", latest);
}

/// A [`Form::Guarded`] statement's first stage: each second takes the new
/// value unless the stored version is later,
/// `<s>: {$cond: [{$gt: ["$a.<offset>", <ack>]}, "$v.<s>", <value>]}`
/// (a second without a version compares as missing: older than any), and
/// the versions kept move forward, `a.<offset>: {$max: ["$a.<offset>", <ack>]}`.
fn guarded_values_stage(
    w: &mut Writer,
    update: &BucketUpdate,
    granularity: Granularity,
    keep_from: i64,
) {
    // Long: the pipeline stage written expression by expression.
    let start = update.key.start;
    let hour = granularity == Granularity::Hour;
    let value_path = |offset: u16| -> &str {
        if hour {
            &HOUR_SECOND_PATHS[usize::from(offset % 3600)]
        } else {
            &MINUTE_PATHS[usize::from(offset % 60)]
        }
    };
    let second = |w: &mut Writer, i: usize| {
        let (offset, value) = update.values[i];
        let cell = w.document(field_name(offset % 60));
        let cond = w.array("$cond");
        let gt = w.document("0");
        let args = w.array("$gt");
        w.string("0", &VERSION_PATHS[usize::from(offset % 3600)]);
        w.integer("1", relative_ack(start, ack_of(update, i)));
        w.end(args);
        w.end(gt);
        w.string("1", value_path(offset));
        w.double("2", value);
        w.end(cond);
        w.end(cell);
    };
    let stage = w.document("0");
    let set = w.document("$set");
    let v = w.document("v");
    let merge = w.array("$mergeObjects");
    w.raw_document("0", &STORED_VALUES);
    let changed = w.document("1");
    if hour {
        let mut i = 0;
        while i < update.values.len() {
            let minute = usize::from(update.values[i].0 / 60 % 60);
            let element = w.document(SECOND_FIELDS[minute]);
            let inner = w.array("$mergeObjects");
            w.raw_document("0", &STORED_MINUTE_VALUES[minute]);
            let seconds = w.document("1");
            while i < update.values.len() && usize::from(update.values[i].0 / 60 % 60) == minute {
                second(w, i);
                i += 1;
            }
            w.end(seconds);
            w.end(inner);
            w.end(element);
        }
    } else {
        for i in 0..update.values.len() {
            second(w, i);
        }
    }
    w.end(changed);
    w.end(merge);
    w.end(v);
    let kept: Vec<usize> = (0..update.values.len())
        .filter(|&i| ack_of(update, i) >= keep_from)
        .collect();
    if let Some(latest) = kept.iter().map(|&i| ack_of(update, i)).max() {
        let mut buf = [0; 20];
        let a = w.document("a");
        let merge = w.array("$mergeObjects");
        w.raw_document("0", &STORED_VERSIONS);
        let changed = w.document("1");
        for &i in &kept {
            let offset = update.values[i].0;
            let cell = w.document(offset_key(offset, &mut buf));
            let max = w.array("$max");
            w.string("0", &VERSION_PATHS[usize::from(offset % 3600)]);
            w.integer("1", relative_ack(start, ack_of(update, i)));
            w.end(max);
            w.end(cell);
        }
        w.end(changed);
        w.end(merge);
        w.end(a);
        let amax = w.document("amax");
        let max = w.array("$max");
        w.string("0", "$amax");
        w.int64("1", latest);
        w.end(max);
        w.end(amax);
    }
    w.raw_document("n", &WRITE_COUNTER);
    w.end(set);
    w.end(stage);
}

/// The pipeline's first stage: `{$set: {v: {$mergeObjects: [stored,
/// <changed>]}, <versions>, n}}`, with `changed` written as
/// element "1".
fn values_stage(
    w: &mut Writer,
    changed: impl FnOnce(&mut Writer),
    versions: impl FnOnce(&mut Writer),
) {
    let stage = w.document("0");
    let set = w.document("$set");
    let v = w.document("v");
    let merge = w.array("$mergeObjects");
    w.raw_document("0", &STORED_VALUES);
    changed(w);
    w.end(merge);
    w.end(v);
    versions(w);
    w.raw_document("n", &WRITE_COUNTER);
    w.end(set);
    w.end(stage);
}

/// About the bytes of a bucket's statement, rounded up: enough room to write
/// it without growing the buffer (an hour bucket's touched minutes add more,
/// and the buffer then grows).
pub fn estimated_len(update: &BucketUpdate) -> usize {
    512 + update.key.sensor.as_str().len()
        + update.key.metric.as_str().len()
        + 24 * update.values.len()
}

/// One bucket's statement as a document of its own: what
/// [`write_statement`] writes into a command.
pub fn update_statement(
    update: &BucketUpdate,
    granularity: Granularity,
    versioning: Versioning,
) -> Result<RawDocumentBuf, StoreError> {
    let mut w = Writer::with_capacity(estimated_len(update));
    let root = w.root();
    statement_fields(&mut w, update, granularity, versioning);
    w.end(root);
    w.finish()
        .map_err(|e| StoreError::Poison(format!("a statement was not encoded: {e}")))
}

#[cfg(test)]
mod tests {
    use mongodb::bson::{Document, RawArrayBuf, doc};

    use super::*;
    use crate::domain::{BucketKey, MetricName, SensorId};

    fn raw(d: &Document) -> RawDocumentBuf {
        RawDocumentBuf::from_document(d).expect("encodes")
    }

    /// The filter of a plain statement: the fields of the unique index, so an
    /// upsert that loses a race (or finds versions) fails with a duplicate
    /// key and is sent again, and no versions.
    fn key_filter(key: &BucketKey) -> RawDocumentBuf {
        rawdoc! {
            "sensor": key.sensor.as_str(),
            "metric": key.metric.as_str(),
            "start": start_date(key.start),
            "amax": { "$lte": null },
        }
    }

    fn update(values: Vec<(u16, f64)>) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse("s".to_owned()).expect("valid").into_owned(),
                metric: MetricName::default_metric(),
                start: 3600,
            },
            values,
            acks: Vec::new(),
        }
    }

    /// The statement as first written, with the `bson` crate's builders:
    /// the oracle of [`write_statement`]'s bytes.
    fn reference_statement(update: &BucketUpdate, granularity: Granularity) -> RawDocumentBuf {
        rawdoc! {
            "q": key_filter(&update.key),
            "u": update_pipeline(update, granularity),
            "upsert": true,
        }
    }

    fn literal_seconds<'a>(values: impl Iterator<Item = &'a (u16, f64)>) -> RawDocumentBuf {
        let mut d = RawDocumentBuf::new();
        for &(second, value) in values {
            d.append(field_name(second % 60), value);
        }
        d
    }

    fn update_pipeline(update: &BucketUpdate, granularity: Granularity) -> RawArrayBuf {
        let mut pipeline = RawArrayBuf::new();
        match granularity {
            Granularity::Minute => {
                let new = literal_seconds(update.values.iter());
                pipeline.push(rawdoc! { "$set": {
                    "v": { "$mergeObjects": [ { "$ifNull": ["$v", {}] }, { "$literal": new } ] },
                    "n": WRITE_COUNTER.clone(),
                }});
                pipeline.push(rawdoc! { "$set": { "_t": values_of("$v") } });
                pipeline.push(rawdoc! { "$set": {
                    "count": { "$size": "$_t" },
                    "sum": { "$sum": "$_t" },
                    "min": { "$min": "$_t" },
                    "max": { "$max": "$_t" },
                }});
                pipeline.push(rawdoc! { "$unset": "_t" });
            }
            Granularity::Hour => {
                let mut v = RawDocumentBuf::new();
                let mut m = RawDocumentBuf::new();
                for minute_values in update.values.chunk_by(|a, b| a.0 / 60 == b.0 / 60) {
                    let minute = usize::from(minute_values[0].0 / 60 % 60);
                    let path = MINUTE_PATHS[minute].as_str();
                    v.append(
                        SECOND_FIELDS[minute],
                        rawdoc! { "$mergeObjects": [
                            { "$ifNull": [path, {}] },
                            { "$literal": literal_seconds(minute_values.iter()) },
                        ]},
                    );
                    m.append_ref(SECOND_FIELDS[minute], &*MINUTE_AGGREGATES[minute]);
                }
                pipeline.push(rawdoc! { "$set": {
                    "v": { "$mergeObjects": [ { "$ifNull": ["$v", {}] }, v ] },
                    "n": WRITE_COUNTER.clone(),
                }});
                pipeline.push(
                    rawdoc! { "$set": { "m": { "$mergeObjects": [ { "$ifNull": ["$m", {}] }, m ] } } },
                );
                pipeline.push(HOUR_TOTALS.clone());
            }
        }
        pipeline
    }

    proptest::proptest! {
        #[test]
        fn statements_are_byte_for_byte_those_of_the_bson_builders(
            hour in proptest::bool::ANY,
            seconds in proptest::collection::btree_map(0u16..3600, -1e9f64..1e9, 1..200),
            sensor in "[a-z0-9_.-]{1,40}",
            start in 0i64..4_000_000_000,
        ) {
            let g = if hour { Granularity::Hour } else { Granularity::Minute };
            let values: Vec<(u16, f64)> = seconds
                .into_iter()
                .map(|(o, v)| (if hour { o } else { o % 60 }, v))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_iter()
                .collect();
            let u = BucketUpdate {
                key: BucketKey {
                    sensor: SensorId::parse(sensor).expect("valid").into_owned(),
                    metric: MetricName::default_metric(),
                    start: g.bucket_start(start),
                },
                values,
            acks: Vec::new(),
        };
            let built = update_statement(&u, g, Versioning::PLAIN).expect("encoded");
            let reference = reference_statement(&u, g);
            proptest::prop_assert_eq!(built.as_bytes(), reference.as_bytes());
        }
    }

    proptest::proptest! {
        #[test]
        fn a_minute_statement_fits_in_its_estimated_length(
            seconds in proptest::collection::btree_map(0u16..60, -1e9f64..1e9, 1..=60),
            sensor in "[a-z0-9_.-]{1,128}",
        ) {
            let u = BucketUpdate {
                key: BucketKey {
                    sensor: SensorId::parse(sensor).expect("valid").into_owned(),
                    metric: MetricName::default_metric(),
                    start: 60,
                },
                values: seconds.into_iter().collect(),
            acks: Vec::new(),
        };
            let built = update_statement(&u, Granularity::Minute, Versioning::PLAIN).expect("encoded");
            proptest::prop_assert!(built.as_bytes().len() <= estimated_len(&u));
        }
    }

    fn pipeline_of(update: &BucketUpdate, granularity: Granularity) -> RawArrayBuf {
        update_statement(update, granularity, Versioning::PLAIN)
            .expect("encoded")
            .get_array("u")
            .expect("a pipeline")
            .to_owned()
    }

    fn stages(p: RawArrayBuf) -> Vec<Document> {
        p.into_iter()
            .map(|stage| {
                Document::try_from(
                    stage
                        .expect("valid BSON")
                        .as_document()
                        .expect("a document"),
                )
                .expect("decodes")
            })
            .collect()
    }

    #[test]
    fn minute_updates_set_values_as_literals_under_second_fields() {
        let p = stages(pipeline_of(
            &update(vec![(5, 1.5), (38, 63.0)]),
            Granularity::Minute,
        ));
        let set = p[0].get_document("$set").expect("$set");
        let merge = set
            .get_document("v")
            .expect("v")
            .get_array("$mergeObjects")
            .expect("merge");
        let literal = merge[1]
            .as_document()
            .expect("doc")
            .get_document("$literal")
            .expect("literal");
        assert_eq!(literal, &doc! { "5": 1.5, "38": 63.0 });
        assert_eq!(
            set.get("schema_version"),
            None,
            "named by the metadata only"
        );
    }

    #[test]
    fn hour_updates_touch_only_the_minutes_they_write() {
        let p = stages(pipeline_of(
            &update(vec![(61, 1.0), (62, 2.0), (3599, 3.0)]),
            Granularity::Hour,
        ));
        let m = p[1]
            .get_document("$set")
            .expect("$set")
            .get_document("m")
            .expect("m")
            .get_array("$mergeObjects")
            .expect("merge")[1]
            .as_document()
            .expect("doc")
            .clone();
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["1", "59"]);
    }

    #[test]
    fn statements_name_the_bucket_and_upsert() {
        let s = update_statement(
            &update(vec![(1, 2.0)]),
            Granularity::Minute,
            Versioning::PLAIN,
        )
        .expect("encoded")
        .to_document()
        .expect("decodes");
        assert_eq!(
            s.get_document("q").expect("q"),
            &doc! { "sensor": "s", "metric": "value", "start": start_date(3600), "amax": { "$lte": null } }
        );
        assert_eq!(s.get_bool("upsert"), Ok(true));
        assert_eq!(s.get_array("u").expect("u").len(), 4);
        let h = update_statement(
            &update(vec![(1, 2.0)]),
            Granularity::Hour,
            Versioning::PLAIN,
        )
        .expect("encoded")
        .to_document()
        .expect("decodes");
        assert_eq!(h.get_array("u").expect("u").len(), 3);
    }

    #[test]
    fn buckets_of_an_unknown_schema_version_are_refused() {
        let d = doc! { "start": start_date(60), "count": 0, "schema_version": 4 };
        assert!(matches!(
            read_bucket(&raw(&d), Granularity::Minute),
            Err(StoreError::Unreadable(_))
        ));
    }

    #[test]
    fn versions_read_back_as_acknowledgement_times() {
        let d = doc! {
            "start": start_date(3600), "schema_version": 2,
            "count": 2, "sum": 3.0, "min": 1.0, "max": 2.0,
            "v": { "1": { "2": 2.0, "1": 1.0 } },
            "a": { "62": 1_500_i32, "61": 3_600_000_000_i64 },
        };
        let read = read_bucket(&raw(&d), Granularity::Hour).expect("reads");
        assert_eq!(
            read.versions,
            vec![(61, 3_600_000 + 3_600_000_000), (62, 3_600_000 + 1_500)]
        );
        let odd =
            doc! { "start": start_date(0), "schema_version": 2, "count": 0, "a": { "60": 1 } };
        assert!(read_bucket(&raw(&odd), Granularity::Minute).is_err());
    }

    #[test]
    fn hour_buckets_read_back_with_offsets_in_the_hour() {
        let d = doc! {
            "start": start_date(3600), "schema_version": 1,
            "count": 2, "sum": 3.0, "min": 1.0, "max": 2.0,
            "m": { "1": { "count": 2, "sum": 3.0, "min": 1.0, "max": 2.0 } },
            "v": { "1": { "2": 2.0, "1": 1 } },
        };
        let r = read_bucket(&raw(&d), Granularity::Hour).expect("readable");
        assert_eq!(r.start, 3600);
        assert_eq!(r.agg.count, 2);
        assert_eq!(r.values, vec![(61, 1.0), (62, 2.0)]);
        assert_eq!(r.slots.len(), 1);
    }
}
