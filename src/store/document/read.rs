//! Reading bucket documents back, straight from their bytes.

use mongodb::bson::{RawBsonRef, RawDocument};

use crate::domain::{Agg, BucketRead, Granularity};
use crate::store::StoreError;

/// A stored number of any numeric type as `f64`.
pub(crate) fn raw_number(
    value: RawBsonRef<'_>,
    what: &dyn std::fmt::Display,
) -> Result<f64, StoreError> {
    match value {
        RawBsonRef::Double(x) => Ok(x),
        RawBsonRef::Int32(x) => Ok(f64::from(x)),
        RawBsonRef::Int64(x) => Ok(x as f64),
        other => Err(StoreError::Unreadable(format!(
            "field {what} is {:?}, not a number",
            other.element_type()
        ))),
    }
}

/// The elements of a stored document, an unreadable one an error.
pub(crate) fn elements(
    doc: &RawDocument,
) -> impl Iterator<Item = Result<(&str, RawBsonRef<'_>), StoreError>> {
    doc.iter()
        .map(|e| e.map_err(|e| StoreError::Unreadable(format!("a stored document: {e}"))))
}

/// The epoch seconds of a stored date.
pub(crate) fn raw_seconds(value: RawBsonRef<'_>, what: &str) -> Result<i64, StoreError> {
    match value {
        RawBsonRef::DateTime(d) => Ok(d.timestamp_millis().div_euclid(1000)),
        other => Err(StoreError::Unreadable(format!(
            "{what} is {:?}, not a date",
            other.element_type()
        ))),
    }
}

fn sub_document<'a>(
    value: RawBsonRef<'a>,
    what: &dyn std::fmt::Display,
) -> Result<&'a RawDocument, StoreError> {
    match value {
        RawBsonRef::Document(d) => Ok(d),
        other => Err(StoreError::Unreadable(format!(
            "{what} is {:?}, not a document",
            other.element_type()
        ))),
    }
}

/// `count`, `sum`, `min`, `max` of a bucket or of a minute of an hour
/// bucket, in one pass over its fields.
fn aggregates(doc: &RawDocument) -> Result<Agg, StoreError> {
    let mut figures = [None; 4];
    for e in elements(doc) {
        let (key, value) = e?;
        let i = match key {
            "count" => 0,
            "sum" => 1,
            "min" => 2,
            "max" => 3,
            _ => continue,
        };
        figures[i] = Some(raw_number(value, &key)?);
    }
    aggregates_of_figures(figures)
}

fn aggregates_of_figures(figures: [Option<f64>; 4]) -> Result<Agg, StoreError> {
    let field = |i: usize| {
        figures[i].ok_or_else(|| {
            StoreError::Unreadable(format!(
                "field {} is missing",
                ["count", "sum", "min", "max"][i]
            ))
        })
    };
    let count = field(0)?;
    if count == 0.0 {
        return Ok(Agg::default());
    }
    Ok(Agg {
        count: count as u64,
        sum: field(1)?,
        min: field(2)?,
        max: field(3)?,
    })
}

fn small_key(key: &str) -> Result<u16, StoreError> {
    key.parse::<u16>()
        .ok()
        .filter(|&n| n < 60)
        .ok_or_else(|| StoreError::Unreadable(format!("unexpected key {key:?}")))
}

/// The `(second, value)` pairs of a bucket's values (or of one minute of
/// an hour bucket's), offset by `base`.
fn seconds_into(doc: &RawDocument, base: u16, out: &mut Vec<(u16, f64)>) -> Result<(), StoreError> {
    let before = out.len();
    if plain_seconds(doc.as_bytes(), base, out).is_some() {
        return Ok(());
    }
    out.truncate(before);
    checked_seconds_into(doc, base, out)
}

/// [`seconds_into`] straight from the bytes, for values as this service
/// writes them: doubles under decimal keys below 60. Anything else answers
/// nothing, and the bson crate's iteration reads (or refuses) it. The
/// upkeep reads every value of an hour back; through the generic iterator
/// (key checked as UTF-8, parsed, value matched) this was about 60 ns a
/// value, a twentieth of the service's CPU in a backfill.
fn plain_seconds(bytes: &[u8], base: u16, out: &mut Vec<(u16, f64)>) -> Option<()> {
    // A document: its length (checked when it was read), its elements, a 0.
    let body = bytes.get(4..bytes.len().checked_sub(1)?)?;
    // A value takes at least 11 bytes (type, a digit, its 0, a double): room
    // for all of them at once, not the doublings from empty.
    out.reserve(body.len() / 11);
    let mut at = 0;
    while at < body.len() {
        const DOUBLE: u8 = 0x01;
        if body[at] != DOUBLE {
            return None;
        }
        at += 1;
        let (mut key, mut digits) = (0_u16, 0);
        loop {
            let b = *body.get(at)?;
            at += 1;
            match b {
                0 => break,
                b'0'..=b'9' if digits < 2 => {
                    key = key * 10 + u16::from(b - b'0');
                    digits += 1;
                }
                _ => return None,
            }
        }
        if digits == 0 || key >= 60 {
            return None;
        }
        let value = f64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?);
        at += 8;
        out.push((base + key, value));
    }
    Some(())
}

fn checked_seconds_into(
    doc: &RawDocument,
    base: u16,
    out: &mut Vec<(u16, f64)>,
) -> Result<(), StoreError> {
    for e in elements(doc) {
        let (second, value) = e?;
        out.push((base + small_key(second)?, raw_number(value, &second)?));
    }
    Ok(())
}

/// Parses a (projected) bucket document of any schema version this service has
/// written, straight from its bytes (the upkeep reads every bucket of an
/// hour back: no `Document` is built). Parts that were not projected come
/// back empty.
pub fn read_bucket(doc: &RawDocument, granularity: Granularity) -> Result<BucketRead, StoreError> {
    // Long: the bucket document read field by field from its bytes.
    let mut version = None;
    let mut start = None;
    let mut figures = [None; 4];
    let mut read = BucketRead::default();
    let mut minutes = None;
    let mut values = None;
    let mut versions = None;
    for e in elements(doc) {
        let (key, value) = e?;
        match key {
            "schema_version" => version = Some(value),
            "start" => start = Some(raw_seconds(value, "start")?),
            "count" => figures[0] = Some(raw_number(value, &key)?),
            "sum" => figures[1] = Some(raw_number(value, &key)?),
            "min" => figures[2] = Some(raw_number(value, &key)?),
            "max" => figures[3] = Some(raw_number(value, &key)?),
            "n" => {
                read.n = match value {
                    RawBsonRef::Int32(x) => u64::try_from(x).unwrap_or(0),
                    RawBsonRef::Int64(x) => u64::try_from(x).unwrap_or(0),
                    RawBsonRef::Double(x) if x >= 0.0 => x as u64,
                    _ => 0,
                }
            }
            "m" => minutes = Some(value),
            "v" => values = Some(value),
            "a" => versions = Some(value),
            _ => {}
        }
    }
    // Versions 1 to 3 read the same (2 adds versions, which reads skip; 3
    // leaves the field out, the database's metadata naming it); a newer one
    // is refused rather than misread.
    match version {
        None => {}
        Some(RawBsonRef::Int32(1..=3)) | Some(RawBsonRef::Int64(1..=3)) => {}
        Some(RawBsonRef::Double(x)) if x == 1.0 || x == 2.0 || x == 3.0 => {}
        other => {
            return Err(StoreError::Unreadable(format!(
                "unknown schema_version {:?}",
                other.map(|v| v.element_type())
            )));
        }
    }
    read.start = start.ok_or_else(|| StoreError::Unreadable("start is missing".to_owned()))?;
    read.agg = aggregates_of_figures(figures)?;
    // An hour bucket's minute aggregates.
    if let Some(m) = minutes
        && let RawBsonRef::Document(m) = m
    {
        for e in elements(m) {
            let (minute, entry) = e?;
            let path = format_args!("m.{minute}");
            let agg = match entry {
                // A minute of one reading is stored as that value.
                RawBsonRef::Double(_) | RawBsonRef::Int32(_) | RawBsonRef::Int64(_) => {
                    let x = raw_number(entry, &path)?;
                    Agg {
                        count: 1,
                        sum: x,
                        min: x,
                        max: x,
                    }
                }
                _ => aggregates(sub_document(entry, &path)?)?,
            };
            read.slots.push((small_key(minute)?, agg));
        }
        read.slots.sort_by_key(|&(minute, _)| minute);
    }
    if let Some(v) = values
        && let RawBsonRef::Document(v) = v
    {
        match granularity {
            Granularity::Minute => seconds_into(v, 0, &mut read.values)?,
            Granularity::Hour => {
                for e in elements(v) {
                    let (minute, seconds) = e?;
                    let seconds = sub_document(seconds, &format_args!("v.{minute}"))?;
                    seconds_into(seconds, small_key(minute)? * 60, &mut read.values)?;
                }
            }
        }
        read.values.sort_by_key(|&(offset, _)| offset);
    }
    if let Some(RawBsonRef::Document(a)) = versions {
        let base = read.start.saturating_mul(1000);
        for e in elements(a) {
            let (offset, ack) = e?;
            let offset = offset
                .parse::<u16>()
                .ok()
                .filter(|&o| i64::from(o) < granularity.seconds())
                .ok_or_else(|| {
                    StoreError::Unreadable(format!("unexpected version key {offset:?}"))
                })?;
            let relative = match ack {
                RawBsonRef::Int32(x) => i64::from(x),
                RawBsonRef::Int64(x) => x,
                _ => {
                    return Err(StoreError::Unreadable(format!(
                        "version a.{offset} is not an integer"
                    )));
                }
            };
            read.versions.push((offset, base.saturating_add(relative)));
        }
        read.versions.sort_by_key(|&(offset, _)| offset);
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{RawBson, RawDocumentBuf};
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = RawBson> {
        prop_oneof![
            8 => any::<f64>().prop_map(RawBson::Double),
            1 => any::<i32>().prop_map(RawBson::Int32),
            1 => any::<i64>().prop_map(RawBson::Int64),
            1 => Just(RawBson::String("x".to_owned())),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => (0u16..60).prop_map(|k| k.to_string()),
            1 => "[0-9+a-]{0,3}",
        ]
    }

    proptest! {
        /// Read from the bytes or through the bson crate, the same values,
        /// or the same refusal.
        #[test]
        fn values_read_from_the_bytes_are_the_checked_ones(
            fields in prop::collection::vec((key(), value()), 0..70),
            base in prop_oneof![Just(0u16), Just(600u16)],
        ) {
            let plain = fields.iter().all(|(k, v)| {
                matches!(v, RawBson::Double(_))
                    && (1..=2).contains(&k.len())
                    && k.bytes().all(|b| b.is_ascii_digit())
                    && k.parse::<u16>().is_ok_and(|n| n < 60)
            });
            let mut doc = RawDocumentBuf::new();
            for (k, v) in fields {
                doc.append(k, v);
            }
            // Values as this service writes them take the fast way.
            prop_assert_eq!(plain_seconds(doc.as_bytes(), base, &mut Vec::new()).is_some(), plain);
            let (mut fast, mut checked) = (vec![(1, 1.0)], vec![(1, 1.0)]);
            let got = seconds_into(&doc, base, &mut fast);
            let want = checked_seconds_into(&doc, base, &mut checked);
            prop_assert_eq!(got.is_ok(), want.is_ok());
            if want.is_ok() {
                let bits = |v: &[(u16, f64)]| v.iter().map(|&(k, x)| (k, x.to_bits())).collect::<Vec<_>>();
                prop_assert_eq!(bits(&fast), bits(&checked));
            }
        }
    }
}
