//! Late markers: what a write into an hour that has ended leaves behind, so
//! that rolling the hour up again can wait until writes into it pause.
//!
//! A bucket written into an ended hour (late readings, a backfill, the held
//! buckets of an hour's last minutes) makes that hour's complete rollup
//! slots stale. Rolling the hour up before each such flush counts as stored
//! costs a read of its buckets and rollup documents and three rollup writes
//! per series and flush: a backfill sent in requests of a few seconds each
//! rolled its hours up once per request. Instead the flush records, after
//! its buckets and before it counts as stored, one *marker* entry per
//! series and ended hour it wrote, and the upkeep rolls a marked hour up
//! once no write has marked it for `buckets.late_rollup_after` (and at most
//! a minute after its first mark), however many flushes marked it.
//!
//! **Documents** (`mongodb.late_collection`): one per hour and partition of
//! the series (a hash of the key, so that no document outgrows the size
//! limit: about 150 000 series per partition, 2.4 million an hour; few
//! partitions, so that a small fleet's flush writes few documents),
//! `{_id: hour · 16 + partition, at: last mark, first: first mark,
//! t: token, e: {<series key>: {g0: {w, q}, g1: {w, q}}}}`. A mark writes
//! the *generation* of its minute (`g0` in even minutes of the clock, `g1`
//! in odd ones): `w` gains a bit per minute of the hour written late (bit 0
//! for an hour bucket), `q` and the document's `t` name the flush that
//! marked it last. (Markers of older versions, `{w, q}` without
//! generations, are read and cleared too.)
//!
//! **Queries** read the markers of their range and treat each marked bucket
//! as one with readings not stored yet: no rollup slot over it answers, the
//! bucket is read. So answers stay exact while a marker waits.
//!
//! **Races.** The upkeep reads the markers first, then the buckets, then
//! writes the slots. Then it deletes each document whose `t` is still the
//! one it read; in a document marked again meanwhile it removes each
//! generation whose `q` is still the one it read. A flush that wrote a
//! bucket after that read marks with a new token (after writing the
//! bucket), so its generation stays and the hour is rolled up again; any
//! instance's upkeep may roll up any marker. Generations keep that
//! re-reading to what was marked since the last pass: with one field per
//! entry, a backfill that went on through every pass kept every entry, and
//! each pass read the hour's marked minutes from the first again.

use mongodb::bson::{Bson, Document, doc, oid::ObjectId};

use super::schedule::HOUR;
use crate::domain::{BucketUpdate, Granularity};
use crate::store::raw_writer::Writer;

/// Partitions of an hour's markers.
pub const PARTITIONS: i64 = 16;

/// A series' field name in a marker document: the sensor with `.` (which
/// a field path would split) as `~`, then `|` and the metric; neither `~`
/// nor `|` is allowed in a name, so the key reads back unambiguously.
pub fn key(sensor: &str, metric: &str) -> String {
    let mut k = String::with_capacity(sensor.len() + metric.len() + 1);
    k.extend(sensor.chars().map(|c| if c == '.' { '~' } else { c }));
    k.push('|');
    k.push_str(metric);
    k
}

/// The series of a [`key`].
pub fn parse_key(key: &str) -> Option<(String, String)> {
    let (sensor, metric) = key.split_once('|')?;
    Some((sensor.replace('~', "."), metric.to_owned()))
}

/// FNV-1a: stable across processes and versions, unlike std's hasher.
fn partition(key: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % PARTITIONS as u64) as i64
}

/// The marker document of `hour` (a multiple of an hour) holding `key`.
pub fn doc_id(hour: i64, key: &str) -> i64 {
    hour / HOUR * PARTITIONS + partition(key)
}

/// The `_id` range of the markers of the hours in `[from, to)`.
pub fn id_range(from: i64, to: i64) -> (i64, i64) {
    let first = from.div_euclid(HOUR);
    let last = (to + HOUR - 1).div_euclid(HOUR);
    (first * PARTITIONS, last * PARTITIONS)
}

/// The hour of a marker document.
pub fn hour_of(id: i64) -> i64 {
    id.div_euclid(PARTITIONS) * HOUR
}

/// The bit of a bucket in its hour's `w`.
fn bit(start: i64) -> u64 {
    1 << ((start.rem_euclid(HOUR) / 60) as u32)
}

/// A flush's marks: per marker document, its entries' keys and minutes.
pub type Marks = std::collections::BTreeMap<i64, Vec<(String, u64)>>;

/// The marks of `stored` updates whose hour has ended by `now`.
///
/// A flush holds a series' minutes of one hour as several updates: they are
/// merged by the borrowed names first, so each series-hour's key is built
/// once, not once per minute.
pub fn marks<'a>(stored: impl IntoIterator<Item = &'a BucketUpdate>, now: i64) -> Marks {
    let mut by_series: std::collections::HashMap<(i64, &'a str, &'a str), u64> = Default::default();
    for u in stored {
        let start = u.key.start;
        let hour = start - start.rem_euclid(HOUR);
        if hour + HOUR > now {
            continue;
        }
        *by_series
            .entry((hour, u.key.sensor.as_str(), u.key.metric.as_str()))
            .or_default() |= bit(start);
    }
    let mut out = Marks::new();
    for ((hour, sensor, metric), w) in by_series {
        let k = key(sensor, metric);
        out.entry(doc_id(hour, &k)).or_default().push((k, w));
    }
    // A document's entries in key order, as the command is written: the
    // same flush writes the same bytes whatever the map's order.
    for entries in out.values_mut() {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
    out
}

/// The generations a mark writes into, by the minute of its clock.
pub const GENERATIONS: [&str; 2] = ["g0", "g1"];

/// The generation of a mark made at `now` (epoch seconds).
pub fn generation(now: i64) -> &'static str {
    GENERATIONS[now.div_euclid(60).rem_euclid(2) as usize]
}

/// The upsert of one marker document's entries, by the flush `token`, at
/// `now` (epoch seconds), written as element `index` of a command's
/// `updates`: `{q: {_id}, u: {$set: {t, e.<key>.<g>.q…}, $bit: {e.<key>.<g>.w:
/// {or: w}…}, $max: {at}, $min: {first}}, upsert: true}`. Written in place:
/// a backfill's flush marks every series it wrote, and building these as
/// `Document`s (a formatted key and a tree node per field, then encoded
/// again) cost more than the flush's bucket statements.
pub fn write_mark_statement(
    w: &mut Writer,
    index: &str,
    id: i64,
    entries: &[(String, u64)],
    token: ObjectId,
    now: i64,
) {
    let at = now.saturating_mul(1000);
    let g = generation(now);
    let mut field = String::new();
    let statement = w.document(index);
    let q = w.document("q");
    w.int64("_id", id);
    w.end(q);
    let u = w.document("u");
    let set = w.document("$set");
    w.object_id("t", &token);
    for (k, _) in entries {
        w.object_id(entry_path(&mut field, k, g, "q"), &token);
    }
    w.end(set);
    let bit = w.document("$bit");
    for (k, minutes) in entries {
        let or = w.document(entry_path(&mut field, k, g, "w"));
        w.int64("or", *minutes as i64);
        w.end(or);
    }
    w.end(bit);
    let max = w.document("$max");
    w.datetime("at", at);
    w.end(max);
    let min = w.document("$min");
    w.datetime("first", at);
    w.end(min);
    w.end(u);
    w.boolean("upsert", true);
    w.end(statement);
}

/// `e.<key>.<generation>.<last>`, written into `buf`.
fn entry_path<'b>(buf: &'b mut String, key: &str, generation: &str, last: &str) -> &'b str {
    buf.clear();
    for part in ["e.", key, ".", generation, ".", last] {
        buf.push_str(part);
    }
    buf
}

/// One series' marker, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: i64,
    pub key: String,
    pub sensor: String,
    pub metric: String,
    pub hour: i64,
    /// Bits of the minutes written late (bit 0 for an hour bucket), over
    /// every generation.
    pub minutes: u64,
    /// What the upkeep may remove once it has rolled the entry up.
    pub parts: Vec<Part>,
}

/// A generation of an entry as read, with the token it was read with.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// `None`: an older version's entry without generations.
    pub generation: Option<&'static str>,
    pub token: Bson,
}

fn bits(w: &Bson) -> Option<u64> {
    match w {
        Bson::Int64(w) => Some(*w as u64),
        Bson::Int32(w) => Some(u64::from(*w as u32)),
        _ => None,
    }
}

/// The entries of a marker document (unreadable parts are skipped: a query
/// then reads their rollups as if unmarked, as before markers existed).
pub fn entries(d: &Document) -> Vec<Entry> {
    let Some(id) = doc_id_of(d) else {
        return Vec::new();
    };
    let Ok(e) = d.get_document("e") else {
        return Vec::new();
    };
    e.iter()
        .filter_map(|(k, v)| {
            let v = v.as_document()?;
            let (sensor, metric) = parse_key(k)?;
            let mut minutes = 0;
            let mut parts = Vec::new();
            for g in GENERATIONS {
                let Ok(part) = v.get_document(g) else {
                    continue;
                };
                if let (Some(w), Some(q)) = (part.get("w").and_then(bits), part.get("q")) {
                    minutes |= w;
                    parts.push(Part {
                        generation: Some(g),
                        token: q.clone(),
                    });
                }
            }
            if let (Some(w), Some(q)) = (v.get("w").and_then(bits), v.get("q")) {
                minutes |= w;
                // Removable only whole, so only while it has no generations
                // (else its document goes once no flush marks it).
                if parts.is_empty() {
                    parts.push(Part {
                        generation: None,
                        token: q.clone(),
                    });
                }
            }
            (!parts.is_empty()).then(|| Entry {
                id,
                key: k.clone(),
                sensor,
                metric,
                hour: hour_of(id),
                minutes,
                parts,
            })
        })
        .collect()
}

/// A marker document's `_id`.
pub fn doc_id_of(d: &Document) -> Option<i64> {
    match d.get("_id") {
        Some(Bson::Int64(x)) => Some(*x),
        Some(Bson::Int32(x)) => Some(i64::from(*x)),
        _ => None,
    }
}

/// The condition that `part` of `e` is as read, and the field removing it.
fn part_clear(e: &Entry, part: &Part, q: &mut Document, unset: &mut Document) {
    match part.generation {
        Some(g) => {
            q.insert(format!("e.{}.{g}.q", e.key), part.token.clone());
            unset.insert(format!("e.{}.{g}", e.key), "");
        }
        None => {
            q.insert(format!("e.{}.q", e.key), part.token.clone());
            for g in GENERATIONS {
                q.insert(format!("e.{}.{g}", e.key), doc! { "$exists": false });
            }
            unset.insert(format!("e.{}", e.key), "");
        }
    }
}

/// Removes each part of `e` that no flush marked again since it was read:
/// one statement per part.
pub fn clear_statements(e: &Entry) -> impl Iterator<Item = Document> + '_ {
    e.parts.iter().map(|part| {
        let mut q = doc! { "_id": e.id };
        let mut unset = Document::new();
        part_clear(e, part, &mut q, &mut unset);
        doc! { "q": q, "u": { "$unset": unset } }
    })
}

/// Removes the parts of the entries `es` of one document, if no flush
/// marked any of them again since they were read (else the statement
/// matches nothing).
pub fn clear_all_statement(es: &[&Entry]) -> Document {
    let mut q = doc! { "_id": es.first().map_or(0, |e| e.id) };
    let mut unset = Document::new();
    for e in es {
        for part in &e.parts {
            part_clear(e, part, &mut q, &mut unset);
        }
    }
    doc! { "q": q, "u": { "$unset": unset } }
}

/// The bucket starts an entry marks.
pub fn starts(hour: i64, minutes: u64, granularity: Granularity) -> Vec<i64> {
    match granularity {
        Granularity::Hour => {
            if minutes == 0 {
                Vec::new()
            } else {
                vec![hour]
            }
        }
        Granularity::Minute => (0..60)
            .filter(|k| minutes & (1 << k) != 0)
            .map(|k| hour + k * 60)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rollup::schedule::tests::update;
    use proptest::prelude::*;

    /// The statement [`write_mark_statement`] writes, as a `Document`.
    fn mark_statement(id: i64, entries: &[(String, u64)], token: ObjectId, now: i64) -> Document {
        let at = Bson::DateTime(mongodb::bson::DateTime::from_millis(
            now.saturating_mul(1000),
        ));
        let g = generation(now);
        let mut set = doc! { "t": token };
        let mut or = Document::new();
        for (k, w) in entries {
            set.insert(format!("e.{k}.{g}.q"), token);
            or.insert(format!("e.{k}.{g}.w"), doc! { "or": *w as i64 });
        }
        doc! {
            "q": { "_id": id },
            "u": { "$set": set, "$bit": or, "$max": { "at": at.clone() }, "$min": { "first": at } },
            "upsert": true,
        }
    }

    /// [`write_mark_statement`]'s bytes, read back as a `Document`.
    fn written_mark(id: i64, entries: &[(String, u64)], token: ObjectId, now: i64) -> Document {
        let mut w = Writer::default();
        let root = w.root();
        write_mark_statement(&mut w, "0", id, entries, token, now);
        w.end(root);
        let d = w
            .finish()
            .expect("closed")
            .to_document()
            .expect("valid BSON");
        d.get_document("0").expect("the statement").clone()
    }

    #[test]
    fn only_ended_hours_are_marked_with_their_minutes() {
        let h = 1000 * HOUR;
        let ups = [
            update("a.b:c", h),
            update("a.b:c", h + 120),
            update("d", h + 3540),
            update("d", h + HOUR),
        ];
        let m = marks(ups.iter(), h + HOUR + 10);
        let all: Vec<(String, u64)> = m.values().flatten().cloned().collect();
        assert_eq!(all.len(), 2, "the open hour is not marked: {m:?}");
        let ab = all
            .iter()
            .find(|(k, _)| k.starts_with("a~b:c|"))
            .expect("a.b:c");
        assert_eq!(ab.1, 0b101);
        let d = all.iter().find(|(k, _)| k.starts_with("d|")).expect("d");
        assert_eq!(d.1, 1 << 59);
        for (&id, es) in &m {
            assert_eq!(hour_of(id), h);
            for (k, _) in es {
                assert_eq!(doc_id(h, k), id);
            }
        }
    }

    #[test]
    fn a_marker_reads_back_as_written() {
        let h = 5 * HOUR;
        let k = key("x.y", "temp");
        let id = doc_id(h, &k);
        let (t0, t1) = (ObjectId::new(), ObjectId::new());
        let d = doc! { "_id": id, "t": t1, "e": { k.clone(): {
            "g0": { "w": 6_i64, "q": t0 },
            "g1": { "w": 8_i64, "q": t1 },
        } } };
        let e = entries(&d);
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].sensor.as_str(), e[0].metric.as_str()),
            ("x.y", "temp")
        );
        assert_eq!((e[0].hour, e[0].minutes), (h, 14));
        assert_eq!(starts(h, 6, Granularity::Minute), vec![h + 60, h + 120]);
        assert_eq!(starts(h, 6, Granularity::Hour), vec![h]);
        // Each generation goes only with the token it was read with.
        let clears: Vec<Document> = clear_statements(&e[0]).collect();
        assert_eq!(clears.len(), 2);
        for (c, (g, t)) in clears.iter().zip([("g0", t0), ("g1", t1)]) {
            let q = c.get_document("q").expect("q");
            assert_eq!(q.get(format!("e.{k}.{g}.q")), Some(&Bson::ObjectId(t)));
            let unset = c.get_document("u").and_then(|u| u.get_document("$unset"));
            assert_eq!(
                unset.expect("$unset").keys().collect::<Vec<_>>(),
                vec![&format!("e.{k}.{g}")]
            );
        }
        let all = clear_all_statement(&[&e[0]]);
        assert_eq!(all.get_document("q").expect("q").len(), 3);
    }

    #[test]
    fn an_older_versions_marker_is_read_and_removed_whole_only_without_generations() {
        let h = 9 * HOUR;
        let k = key("s", "m");
        let id = doc_id(h, &k);
        let t = ObjectId::new();
        let old = doc! { "_id": id, "e": { k.clone(): { "w": 3_i64, "q": t } } };
        let e = entries(&old);
        assert_eq!((e.len(), e[0].minutes), (1, 3));
        let clear: Vec<Document> = clear_statements(&e[0]).collect();
        let q = clear[0].get_document("q").expect("q");
        assert_eq!(q.get(format!("e.{k}.q")), Some(&Bson::ObjectId(t)));
        assert_eq!(
            q.get(format!("e.{k}.g0")),
            Some(&Bson::Document(doc! { "$exists": false }))
        );
        // Marked since by this version: its minutes count, and only the
        // generation can be removed (the document goes once unmarked).
        let mixed = doc! { "_id": id, "e": { k.clone(): {
            "w": 3_i64, "q": t, "g1": { "w": 4_i64, "q": ObjectId::new() },
        } } };
        let e = entries(&mixed);
        assert_eq!(e[0].minutes, 7);
        assert_eq!(e[0].parts.len(), 1);
        assert_eq!(e[0].parts[0].generation, Some("g1"));
    }

    #[test]
    fn marks_alternate_generations_by_the_minute() {
        let k = key("s", "m");
        let at = |now: i64| {
            let s = written_mark(1, &[(k.clone(), 1)], ObjectId::new(), now);
            let u = s.get_document("u").expect("u").clone();
            let set = u.get_document("$set").expect("$set").clone();
            assert!(set.contains_key("t"), "the document's token is set");
            set.keys()
                .find(|f| f.starts_with("e."))
                .cloned()
                .expect("entry")
        };
        assert_eq!(at(600), format!("e.{k}.g0.q"));
        assert_eq!(at(659), format!("e.{k}.g0.q"));
        assert_eq!(at(660), format!("e.{k}.g1.q"));
        assert_eq!(at(720), format!("e.{k}.g0.q"));
    }

    proptest! {
        #[test]
        fn keys_are_field_names_that_read_back(sensor in "[a-zA-Z0-9_.:-]{1,40}", metric in "[a-zA-Z0-9_-]{1,20}") {
            let k = key(&sensor, &metric);
            prop_assert!(!k.contains('.') && !k.starts_with('$'));
            prop_assert_eq!(parse_key(&k), Some((sensor, metric)));
        }

        #[test]
        fn a_mark_is_written_as_its_document_model(
            id in any::<i64>(),
            series in proptest::collection::btree_map("[a-zA-Z0-9_~:-]{1,30}[|][a-z0-9_]{1,10}", any::<u64>(), 1..20),
            now in 0i64..4_000_000_000,
        ) {
            let entries: Vec<(String, u64)> = series.into_iter().collect();
            let token = ObjectId::new();
            prop_assert_eq!(written_mark(id, &entries, token, now), mark_statement(id, &entries, token, now));
        }

        #[test]
        fn marks_are_each_ended_series_hours_minutes_in_key_order(
            ups in proptest::collection::vec((0usize..4, 0i64..180), 0..60),
            now_min in 0i64..240,
        ) {
            let base = 1000 * HOUR;
            let names = ["a", "a.b", "b:1", "a_b"];
            let stored: Vec<BucketUpdate> = ups
                .iter()
                .map(|&(s, m)| update(names[s], base + m * 60))
                .collect();
            let now = base + now_min * 60;
            // The model: one entry per series and ended hour, the union of
            // its minutes' bits, a document's entries sorted by key.
            let mut model: std::collections::BTreeMap<(i64, String), u64> = Default::default();
            for u in &stored {
                let hour = u.key.start - u.key.start.rem_euclid(HOUR);
                if hour + HOUR <= now {
                    *model.entry((hour, key(u.key.sensor.as_str(), u.key.metric.as_str()))).or_default() |=
                        1 << ((u.key.start - hour) / 60);
                }
            }
            let mut expected = Marks::new();
            for ((hour, k), w) in model {
                expected.entry(doc_id(hour, &k)).or_default().push((k, w));
            }
            prop_assert_eq!(marks(stored.iter(), now), expected);
        }

        #[test]
        fn a_range_holds_exactly_the_markers_of_its_hours(h in 0i64..1_000_000, from_off in 0i64..7200, len in 1i64..20_000, p in 0i64..PARTITIONS) {
            let hour = h * HOUR;
            let id = hour / HOUR * PARTITIONS + p;
            let from = hour - 3600 + from_off;
            let to = from + len;
            let (a, b) = id_range(from, to);
            let overlaps = from < hour + HOUR && to > hour;
            prop_assert_eq!(id >= a && id < b, overlaps);
        }
    }
}
