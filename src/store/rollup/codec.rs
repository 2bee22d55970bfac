//! A rollup slot's bytes (rollup schema 3): one binary value per slot,
//! either **its readings** or **its summary**, whichever is shorter.
//!
//! A slot of few readings (a minute of readings every 10 s) is stored as
//! the readings: every figure of the slot (count, sum, extremes, moments,
//! integrals, its rest, its sketch at any accuracy) is computed from them on
//! read by the very function the roll-up used ([`Slot::of`]), so the answer
//! is the same to the bit, and six readings take about 12 bytes where their
//! 25 named fields took 300. A slot of many readings, or one merged from
//! slots below it (which keeps no readings), is stored as its summary:
//! the same fields as before, packed by position instead of named.
//!
//! Values are stored as decimals where they are decimals: `v = m / 10^e`
//! for the smallest `e ≤ 9` at which every reading of the slot round-trips
//! bit for bit (sensors report a fixed number of decimals), `m` as zigzag
//! varint deltas; else as raw little-endian doubles. Times are offsets from
//! the slot's start: a first offset and a step when regular, else deltas.
//!
//! No crate does this layout (it is Hourglass' own, like Gorilla's or
//! VictoriaMetrics' encodings are theirs); varints are `prost`'s.
//!
//! Layout (every integer a LEB128 varint unless said):
//! - readings: a byte, the form in its high half (`1` regular times, `2`
//!   listed times) and the scale in its low half (`0..=9`, or `15` for raw
//!   doubles); the count; times: first offset and step (regular) or first
//!   offset and `count - 1` deltas; values: first (zigzag `m`, or 8 bytes
//!   raw) and `count - 1` zigzag deltas of `m` (or 8 bytes each).
//! - summary: `0x30`, count, first value (8 bytes), its offset; with two or
//!   more readings: sum, min, max, last value (8 bytes each), last offset, a
//!   flags byte, then what the flags say (see [`Flags`]).

use prost::bytes::Buf;
use prost::encoding::{decode_varint, encode_varint};

use crate::domain::{Integrals, Moments, Rest, Sample, Sketch, Slot, Summary};

const REGULAR: u8 = 0x10;
const LISTED: u8 = 0x20;
const SUMMARY: u8 = 0x30;
/// The scale of values stored as raw doubles.
const RAW: u8 = 0x0F;
/// The largest decimal scale tried: nano-units.
const MAX_SCALE: u8 = 9;
/// `10^e` for each scale: exact doubles.
const POWERS: [f64; MAX_SCALE as usize + 1] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9];
/// Mantissas past this are not exact doubles.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// A stored slot's bytes that do not decode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rollup slot bytes: {0}")]
pub struct CodecError(&'static str);

/// The optional parts of a summary, one bit each, in the order they follow.
struct Flags;

impl Flags {
    const PENULT: u8 = 1;
    const INC: u8 = 1 << 1;
    const RESETS: u8 = 1 << 2;
    const CHANGES: u8 = 1 << 3;
    const INTEGRALS: u8 = 1 << 4;
    const REST: u8 = 1 << 5;
    const REST_GAP: u8 = 1 << 6;
    const SKETCH: u8 = 1 << 7;
}

fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

fn unzigzag(x: u64) -> i64 {
    ((x >> 1) as i64) ^ -((x & 1) as i64)
}

fn offset(t: i64, start: i64) -> u64 {
    u64::try_from(t - start).unwrap_or(0)
}

/// The bytes of `slot` (of its readings if it kept them and they are
/// shorter) appended to `out`; nothing for a slot without readings.
pub fn encode(slot: &Slot, out: &mut Vec<u8>) {
    let Some(summary) = slot.summary.as_ref() else {
        return;
    };
    let at = out.len();
    encode_summary(slot, summary, out);
    if slot.readings.len() as u64 == summary.count {
        let mut readings = Vec::with_capacity(8 + 3 * slot.readings.len());
        encode_readings(slot.start, &slot.readings, &mut readings);
        if readings.len() <= out.len() - at {
            out.truncate(at);
            out.extend_from_slice(&readings);
        }
    }
}

/// The smallest decimal scale at which every value round-trips.
fn scale_of(values: impl Iterator<Item = f64> + Clone) -> Option<u8> {
    (0..=MAX_SCALE).find(|&e| {
        let p = POWERS[usize::from(e)];
        values.clone().all(|v| {
            // As decoded: through an integer (-0.0 is no decimal).
            let m = (v * p).round();
            m.abs() < EXACT && ((m as i64) as f64 / p).to_bits() == v.to_bits()
        })
    })
}

fn encode_readings(start: i64, samples: &[Sample], out: &mut Vec<u8>) {
    let step = match samples {
        [a, b, ..] => Some(b.t - a.t),
        _ => None,
    };
    let regular = step.is_some_and(|d| samples.windows(2).all(|w| w[1].t - w[0].t == d));
    let scale = scale_of(samples.iter().map(|s| s.v));
    out.push(if regular { REGULAR } else { LISTED } | scale.unwrap_or(RAW));
    encode_varint(samples.len() as u64, out);
    let first = samples.first().map_or(start, |s| s.t);
    encode_varint(offset(first, start), out);
    if regular {
        encode_varint(step.map_or(0, |d| offset(d, 0)), out);
    } else {
        for w in samples.windows(2) {
            encode_varint(offset(w[1].t, w[0].t), out);
        }
    }
    match scale {
        Some(e) => {
            let p = POWERS[usize::from(e)];
            let mut last = 0i64;
            for s in samples {
                let m = (s.v * p).round() as i64;
                encode_varint(zigzag(m.wrapping_sub(last)), out);
                last = m;
            }
        }
        None => {
            for s in samples {
                out.extend_from_slice(&s.v.to_le_bytes());
            }
        }
    }
}

fn encode_summary(slot: &Slot, s: &Summary, out: &mut Vec<u8>) {
    let at = slot.start;
    out.push(SUMMARY);
    encode_varint(s.count, out);
    out.extend_from_slice(&s.first.v.to_le_bytes());
    encode_varint(offset(s.first.t, at), out);
    if s.count == 1 {
        return;
    }
    for x in [s.sum, s.min, s.max, s.last.v] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    encode_varint(offset(s.last.t, at), out);
    let many = s.count >= 3;
    let penult = s.penult.filter(|_| many);
    // Kept for two readings too: the segment they make is not always the
    // one computed (the sign of a zero).
    let integrals = s.integrals;
    let rest = slot.rest.as_ref().filter(|_| many);
    let rest_gap = rest.and_then(|r| r.gap).filter(|_| s.count >= 4);
    let sketch = slot.sketch.as_ref().filter(|_| s.count >= 4);
    let mut flags = 0;
    for (present, bit) in [
        (penult.is_some(), Flags::PENULT),
        (s.inc != 0.0, Flags::INC),
        (s.resets != 0, Flags::RESETS),
        (s.changes != 0, Flags::CHANGES),
        (integrals.is_some(), Flags::INTEGRALS),
        (rest.is_some(), Flags::REST),
        (rest_gap.is_some(), Flags::REST_GAP),
        (sketch.is_some(), Flags::SKETCH),
    ] {
        if present {
            flags |= bit;
        }
    }
    out.push(flags);
    if let Some(p) = penult {
        out.extend_from_slice(&p.v.to_le_bytes());
        encode_varint(offset(p.t, at), out);
    }
    if s.inc != 0.0 {
        out.extend_from_slice(&s.inc.to_le_bytes());
    }
    if s.resets != 0 {
        encode_varint(u64::from(s.resets), out);
    }
    if s.changes != 0 {
        encode_varint(u64::from(s.changes), out);
    }
    let m = s.moments;
    for x in [m.st, m.stt, m.stv, m.svv] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    if let Some(i) = integrals {
        out.extend_from_slice(&i.step.to_le_bytes());
        out.extend_from_slice(&i.linear.to_le_bytes());
        encode_varint(zigzag(i.gap), out);
    }
    if let Some(r) = rest {
        out.extend_from_slice(&r.second.v.to_le_bytes());
        encode_varint(offset(r.second.t, at), out);
        for x in [r.sum, r.min, r.max] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    if let Some(gap) = rest_gap {
        encode_varint(zigzag(gap), out);
    }
    if let Some(k) = sketch {
        let bytes = k.encode();
        encode_varint(bytes.len() as u64, out);
        out.extend_from_slice(&bytes);
    }
}

/// Reads a slot's bytes front to back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, CodecError> {
        let (&b, rest) = self.0.split_first().ok_or(CodecError("cut short"))?;
        self.0 = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        decode_varint(&mut self.0).map_err(|_| CodecError("a bad varint"))
    }

    fn double(&mut self) -> Result<f64, CodecError> {
        if self.0.remaining() < 8 {
            return Err(CodecError("cut short"));
        }
        Ok(self.0.get_f64_le())
    }

    fn time(&mut self, start: i64) -> Result<i64, CodecError> {
        i64::try_from(self.varint()?)
            .ok()
            .and_then(|o| start.checked_add(o))
            .ok_or(CodecError("a time out of range"))
    }

    fn count(&mut self) -> Result<u32, CodecError> {
        u32::try_from(self.varint()?).map_err(|_| CodecError("a count out of range"))
    }

    fn take(&mut self, n: u64) -> Result<&[u8], CodecError> {
        let n = usize::try_from(n).map_err(|_| CodecError("cut short"))?;
        if self.0.len() < n {
            return Err(CodecError("cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

/// The slot starting at `start` stored as `bytes`, computed from `n`
/// writes; with `sketches`, its sketch at that accuracy where it has one.
pub fn decode(bytes: &[u8], start: i64, n: u64, sketches: Option<f64>) -> Result<Slot, CodecError> {
    let mut r = Reader(bytes);
    let first = r.byte()?;
    let slot = match first & 0xF0 {
        kind @ (REGULAR | LISTED) => {
            let samples = decode_readings(&mut r, kind == REGULAR, first & 0x0F, start)?;
            let slot = Slot::of(start, &samples, n);
            match sketches {
                Some(a) => slot.sketched(a, &samples),
                None => slot,
            }
        }
        SUMMARY if first == SUMMARY => decode_summary(&mut r, start, n, sketches)?,
        _ => return Err(CodecError("an unknown form")),
    };
    if !r.0.is_empty() {
        return Err(CodecError("bytes past the end"));
    }
    Ok(slot)
}

fn decode_readings(
    r: &mut Reader,
    regular: bool,
    scale: u8,
    start: i64,
) -> Result<Vec<Sample>, CodecError> {
    let count = r.varint()?;
    // Each reading takes a byte at least: a count past the bytes is damage,
    // not an allocation to make.
    if count == 0 || count > r.0.len() as u64 {
        return Err(CodecError("a count out of range"));
    }
    let count = count as usize;
    let mut times = Vec::with_capacity(count);
    let mut t = r.time(start)?;
    times.push(t);
    let step = if regular { r.varint()? } else { 0 };
    for _ in 1..count {
        let d = if regular { step } else { r.varint()? };
        // Readings are one per second, in time order: a step of 0 is damage.
        t = i64::try_from(d)
            .ok()
            .filter(|&d| d > 0)
            .and_then(|d| t.checked_add(d))
            .ok_or(CodecError("a time out of order or range"))?;
        times.push(t);
    }
    let mut out = Vec::with_capacity(count);
    if scale == RAW {
        for t in times {
            out.push(Sample { t, v: r.double()? });
        }
        return Ok(out);
    }
    let p = *POWERS
        .get(usize::from(scale))
        .ok_or(CodecError("an unknown scale"))?;
    let mut m = 0i64;
    for t in times {
        m = m.wrapping_add(unzigzag(r.varint()?));
        out.push(Sample { t, v: m as f64 / p });
    }
    Ok(out)
}

/// The sketch at `accuracy` of a slot's first, penultimate and last
/// readings (up to three readings make it).
fn derived_sketch(accuracy: f64, values: &[f64]) -> Option<Sketch> {
    Sketch::new(accuracy).ok().map(|mut k| {
        for &v in values {
            k.add(v);
        }
        k
    })
}

fn decode_summary(
    r: &mut Reader,
    start: i64,
    n: u64,
    sketches: Option<f64>,
) -> Result<Slot, CodecError> {
    // Long: the packed summary read field by field, in the order `encode` writes it.
    let c = r.varint()?;
    let first = Sample {
        v: r.double()?,
        t: 0,
    };
    let first = Sample {
        t: r.time(start)?,
        ..first
    };
    if c == 0 {
        return Err(CodecError("a summary of no readings"));
    }
    if c == 1 {
        return Ok(Slot {
            sketch: sketches.and_then(|a| derived_sketch(a, &[first.v])),
            ..Slot::of(start, &[first], n)
        });
    }
    let (sum, min, max) = (r.double()?, r.double()?, r.double()?);
    let last_v = r.double()?;
    let last = Sample {
        t: r.time(start)?,
        v: last_v,
    };
    let flags = r.byte()?;
    let has = |bit: u8| flags & bit != 0;
    let penult = if has(Flags::PENULT) {
        let v = r.double()?;
        Sample {
            t: r.time(start)?,
            v,
        }
    } else {
        first
    };
    let inc = if has(Flags::INC) { r.double()? } else { 0.0 };
    let resets = if has(Flags::RESETS) { r.count()? } else { 0 };
    let changes = if has(Flags::CHANGES) { r.count()? } else { 0 };
    let moments = Moments {
        st: r.double()?,
        stt: r.double()?,
        stv: r.double()?,
        svv: r.double()?,
    };
    let integrals = if has(Flags::INTEGRALS) {
        Some(Integrals {
            step: r.double()?,
            linear: r.double()?,
            gap: unzigzag(r.varint()?),
        })
    } else {
        None
    };
    let stored_rest = if has(Flags::REST) {
        let v = r.double()?;
        let second = Sample {
            t: r.time(start)?,
            v,
        };
        Some((second, r.double()?, r.double()?, r.double()?))
    } else {
        None
    };
    let rest_gap = if has(Flags::REST_GAP) {
        Some(unzigzag(r.varint()?))
    } else {
        None
    };
    let stored_sketch = if has(Flags::SKETCH) {
        let len = r.varint()?;
        Some(r.take(len)?)
    } else {
        None
    };
    // Merging slots assumes their readings in time order: damage is refused.
    if !(first.t <= penult.t && penult.t <= last.t && first.t < last.t) {
        return Err(CodecError("readings out of order"));
    }
    let summary = Summary {
        count: c,
        sum,
        min,
        max,
        first,
        penult: Some(penult),
        last,
        inc,
        resets,
        changes,
        moments,
        integrals,
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
        let (second, sum, min, max) = stored_rest.ok_or(CodecError("no rest"))?;
        Some(Rest {
            second,
            sum,
            min,
            max,
            gap: if c == 3 {
                Some(last.t - second.t)
            } else {
                rest_gap
            },
        })
    };
    let sketch = match sketches {
        None => None,
        Some(a) if c == 2 => derived_sketch(a, &[first.v, last.v]),
        Some(a) if c == 3 => derived_sketch(a, &[first.v, penult.v, last.v]),
        Some(a) => match stored_sketch {
            Some(bytes) => {
                let k = Sketch::decode(bytes).map_err(|_| CodecError("a bad sketch"))?;
                (k.accuracy().to_bits() == a.to_bits()).then_some(k)
            }
            None => None,
        },
    };
    Ok(Slot {
        start,
        summary: Some(summary),
        n,
        rest,
        sketch,
        readings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Part;
    use proptest::prelude::*;

    /// Readings inside a minute starting at 3600: times strictly rising,
    /// values at `decimals` decimals (or any double with `None`).
    fn readings(decimals: Option<u32>) -> impl Strategy<Value = Vec<Sample>> {
        let value = match decimals {
            Some(d) => (-100_000i64..100_000)
                .prop_map(move |m| m as f64 / 10f64.powi(d as i32))
                .boxed(),
            None => any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .boxed(),
        };
        prop::collection::btree_map(0i64..60, value, 0..20).prop_map(|m| {
            m.into_iter()
                .map(|(t, v)| Sample { t: 3600 + t, v })
                .collect()
        })
    }

    fn decoded(slot: &Slot, sketches: Option<f64>) -> Option<Slot> {
        let mut bytes = Vec::new();
        encode(slot, &mut bytes);
        (!bytes.is_empty()).then(|| decode(&bytes, slot.start, slot.n, sketches).expect("decodes"))
    }

    /// Equal to the bit (as printed: a NaN of a part equals itself).
    fn same_parts(a: &Slot, b: &Slot) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.n, b.n);
        for part in [Part::Whole, Part::Rest, Part::First] {
            prop_assert_eq!(format!("{:?}", a.part(part)), format!("{:?}", b.part(part)));
        }
        prop_assert_eq!(format!("{:?}", a.summary), format!("{:?}", b.summary));
        prop_assert_eq!(a.rest, b.rest);
        Ok(())
    }

    proptest! {
        /// A slot that kept its readings reads back as computed, every part
        /// and its sketch at the accuracy asked, whatever its values.
        #[test]
        fn a_slot_of_readings_reads_back_as_computed(
            xs in prop_oneof![readings(Some(2)), readings(Some(0)), readings(None)],
            n in 0u64..5_000_000_000,
        ) {
            let slot = Slot::of(3600, &xs, n).keeping(&xs).sketched(0.01, &xs);
            match decoded(&slot, Some(0.01)) {
                None => prop_assert!(xs.is_empty()),
                Some(back) => {
                    same_parts(&back, &slot)?;
                    prop_assert_eq!(&back.sketch, &slot.sketch);
                    let other = decoded(&slot, Some(0.02)).expect("decodes");
                    let want = Slot::of(3600, &xs, n).sketched(0.02, &xs).sketch;
                    // Read at another accuracy: computed from the readings
                    // when stored as them, else only up to three readings.
                    prop_assert!(other.sketch == want || (xs.len() > 3 && other.sketch.is_none()));
                    prop_assert_eq!(decoded(&slot, None).expect("decodes").sketch, None);
                }
            }
        }

        /// A slot without its readings (merged from slots below) reads back
        /// as computed.
        #[test]
        fn a_summarised_slot_reads_back_as_computed(
            xs in prop_oneof![readings(Some(2)), readings(None)],
            n in 0u64..5_000_000_000,
        ) {
            let slot = Slot::of(3600, &xs, n).sketched(0.01, &xs);
            match decoded(&slot, Some(0.01)) {
                None => prop_assert!(xs.is_empty()),
                Some(back) => {
                    same_parts(&back, &slot)?;
                    prop_assert_eq!(&back.sketch, &slot.sketch);
                }
            }
        }

        /// Whatever the bytes, decoding answers (an error or a slot),
        /// never a panic or a huge allocation; readings always in time order.
        #[test]
        fn any_bytes_decode_or_are_refused(
            bytes in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                // Readings forms, so that most get past the first byte.
                (prop_oneof![Just(0x12u8), Just(0x22), Just(0x1F), Just(0x2F)], prop::collection::vec(any::<u8>(), 0..64))
                    .prop_map(|(head, rest)| std::iter::once(head).chain(rest).collect()),
            ],
        ) {
            let _ = decode(&bytes, 3600, 1, Some(0.01));
        }
    }

    #[test]
    fn a_minute_of_readings_every_ten_seconds_at_two_decimals_takes_a_dozen_bytes() {
        let xs: Vec<Sample> = [20.19, 20.19, 20.16, 20.19, 20.22, 20.19]
            .iter()
            .enumerate()
            .map(|(i, &v)| Sample {
                t: 3600 + 10 * i as i64,
                v,
            })
            .collect();
        let slot = Slot::of(3600, &xs, 1).keeping(&xs).sketched(0.01, &xs);
        let mut bytes = Vec::new();
        encode(&slot, &mut bytes);
        // Form and scale, count, first offset, step, 2 bytes of 2019, 5
        // deltas: the example of docs/src/internals/rollups.md.
        assert_eq!(bytes, [0x12, 6, 0, 10, 0xC6, 0x1F, 0, 5, 6, 6, 5]);
        let mut summary = Vec::new();
        encode(&Slot::of(3600, &xs, 1).sketched(0.01, &xs), &mut summary);
        assert_eq!(summary.first(), Some(&SUMMARY));
    }

    #[test]
    fn values_that_are_no_short_decimals_are_stored_raw_and_exact() {
        let xs = [
            Sample { t: 3600, v: -0.0 },
            Sample {
                t: 3601,
                v: std::f64::consts::PI,
            },
        ];
        assert_eq!(scale_of(xs.iter().map(|s| s.v)), None);
        let back = decoded(&Slot::of(3600, &xs, 1).keeping(&xs), None).expect("decodes");
        let s = back.summary.expect("readings");
        assert_eq!(s.first.v.to_bits(), (-0.0f64).to_bits());
        assert_eq!(s.last.v, std::f64::consts::PI);
    }
}
