//! Reading rollup documents back (`rollup` writes them): each slot's
//! fields in one pass over its bytes, and its sketch at the accuracy asked.

use mongodb::bson::{RawBsonRef, RawDocument};

use super::StoreError;
use super::document::{elements, raw_number, raw_seconds};
use crate::domain::{Integrals, Moments, Period, Rest, RollupRead, Sample, Sketch, Slot, Summary};

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
