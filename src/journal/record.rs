//! The journal's bytes: segment headers, checksummed record frames, and the
//! readings inside a record. Pure: no files here.
//!
//! A segment is [`SEGMENT_MAGIC`] followed by frames. A frame is
//! `len: u32 LE`, `crc: u32 LE` (CRC-32C over the length bytes, then the
//! payload), `payload: len bytes`. A payload is a version byte, a count, the
//! acknowledgement time (`ack_ms: i64 LE`, epoch milliseconds; version 2 on),
//! and per reading `sensor_len: u8, sensor, metric_len: u8, metric, ts: i64
//! LE, value: f64 LE bits`. A version 1 record (no acknowledgement time)
//! reads back acknowledged at 0: older than anything acknowledged since.

use crate::domain::{MetricName, Reading, SensorId};

pub const SEGMENT_MAGIC: &[u8; 8] = b"HGJRNL01";
pub const HEADER: usize = SEGMENT_MAGIC.len();
pub const FRAME_HEADER: usize = 8;
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;
/// No record is larger: a length beyond it is corruption, not a record.
pub const MAX_RECORD: usize = 1 << 30;

/// Why a payload could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a journal record is malformed: {0}")]
pub struct Malformed(pub &'static str);

fn checksum(len: [u8; 4], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len), payload)
}

/// One framed record holding `readings`, acknowledged at `ack_ms`, ready
/// to append.
pub fn encode(readings: &[Reading<'_>], ack_ms: i64) -> Vec<u8> {
    let size: usize = readings
        .iter()
        .map(|r| 18 + r.sensor.as_str().len() + r.metric.as_str().len())
        .sum();
    let mut out = Vec::with_capacity(FRAME_HEADER + 13 + size);
    out.extend_from_slice(&[0; FRAME_HEADER]);
    out.push(VERSION);
    out.extend_from_slice(&(readings.len() as u32).to_le_bytes());
    out.extend_from_slice(&ack_ms.to_le_bytes());
    for r in readings {
        // Names are validated to at most 128 bytes, so a byte holds the length.
        for name in [r.sensor.as_str(), r.metric.as_str()] {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
        out.extend_from_slice(&r.ts.to_le_bytes());
        out.extend_from_slice(&r.value.to_bits().to_le_bytes());
    }
    let len = ((out.len() - FRAME_HEADER) as u32).to_le_bytes();
    let crc = checksum(len, &out[FRAME_HEADER..]);
    out[..4].copy_from_slice(&len);
    out[4..FRAME_HEADER].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Sets the acknowledgement time of a framed record [`encode`] made, and
/// its checksum again: the journal task stamps each group as it commits it,
/// so a reading's version is never earlier than the moment it could be
/// found unstored in this process.
pub fn stamp(frame: &mut [u8], ack_ms: i64) {
    const AT: usize = FRAME_HEADER + 5;
    if frame.len() < AT + 8 || frame[FRAME_HEADER] != VERSION {
        return;
    }
    frame[AT..AT + 8].copy_from_slice(&ack_ms.to_le_bytes());
    let len = [frame[0], frame[1], frame[2], frame[3]];
    let crc = checksum(len, &frame[FRAME_HEADER..]);
    frame[4..FRAME_HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// A record read back: its readings and when they were acknowledged.
#[derive(Debug)]
pub struct Decoded<'a> {
    pub readings: Vec<Reading<'a>>,
    pub ack_ms: i64,
}

/// The readings of a record's payload, borrowing their names from it.
pub fn decode(payload: &[u8]) -> Result<Decoded<'_>, Malformed> {
    read_payload(payload, true)
}

/// The readings of a payload this process encoded a moment ago from
/// readings it had validated: their names are not checked again.
pub fn decode_trusted(payload: &[u8]) -> Result<Decoded<'_>, Malformed> {
    read_payload(payload, false)
}

fn read_payload(payload: &[u8], check: bool) -> Result<Decoded<'_>, Malformed> {
    let mut at = Cursor { buf: payload };
    let version = at.take(1)?[0];
    if version != VERSION && version != VERSION_1 {
        return Err(Malformed("unknown version"));
    }
    let count = u32::from_le_bytes(at.array()?) as usize;
    let ack_ms = if version == VERSION_1 {
        0
    } else {
        i64::from_le_bytes(at.array()?)
    };
    // Each reading takes at least 20 bytes: a count beyond that is corruption.
    if count > payload.len() / 20 + 1 {
        return Err(Malformed("count beyond the payload"));
    }
    let mut out: Vec<Reading<'_>> = Vec::with_capacity(count);
    for _ in 0..count {
        let sensor = at.name()?;
        let metric = at.name()?;
        let ts = i64::from_le_bytes(at.array()?);
        let value = f64::from_bits(u64::from_le_bytes(at.array()?));
        // A name equal to the previous reading's was checked with it.
        let last = out.last();
        let sensor = match last {
            Some(r) if r.sensor.as_str() == sensor => r.sensor.clone(),
            _ if !check => SensorId::trusted(sensor),
            _ => SensorId::parse(sensor).map_err(|_| Malformed("sensor"))?,
        };
        let metric = match last {
            Some(r) if r.metric.as_str() == metric => r.metric.clone(),
            _ if !check => MetricName::trusted(metric),
            _ => MetricName::parse(metric).map_err(|_| Malformed("metric"))?,
        };
        out.push(Reading {
            sensor,
            metric,
            ts,
            value,
        });
    }
    if !at.buf.is_empty() {
        return Err(Malformed("bytes after the readings"));
    }
    Ok(Decoded {
        readings: out,
        ack_ms,
    })
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.buf.len() < n {
            return Err(Malformed("truncated"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn name(&mut self) -> Result<&'a str, Malformed> {
        let len = usize::from(self.take(1)?[0]);
        std::str::from_utf8(self.take(len)?).map_err(|_| Malformed("name is not UTF-8"))
    }
}

/// A frame header read from `buf` at `at`: the payload's length, if the
/// whole frame is there and its checksum matches.
pub fn frame_at(buf: &[u8], at: usize) -> Frame {
    let Some(header) = buf.get(at..at + FRAME_HEADER) else {
        return Frame::Incomplete;
    };
    let len_bytes = [header[0], header[1], header[2], header[3]];
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_RECORD {
        return Frame::Corrupt { len: None };
    }
    let Some(payload) = buf.get(at + FRAME_HEADER..at + FRAME_HEADER + len) else {
        return Frame::Incomplete;
    };
    if checksum(len_bytes, payload) == crc {
        Frame::Valid { len }
    } else {
        Frame::Corrupt { len: Some(len) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A whole frame with a matching checksum; `len` is the payload's.
    Valid { len: usize },
    /// The checksum does not match (`len` as written, if plausible).
    Corrupt { len: Option<usize> },
    /// The buffer ends inside the frame.
    Incomplete,
}

/// What a segment's bytes hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    /// `(offset, payload length)` of each intact record.
    pub records: Vec<(usize, usize)>,
    /// Damaged ranges `(start, end)` with an intact frame right after each:
    /// skipped, the frames past them kept.
    pub damaged: Vec<(usize, usize)>,
    /// Where the last intact frame ends: past it nothing checks out (a torn
    /// tail if this is the newest segment).
    pub end: usize,
    /// Whether the segment header itself is missing or wrong.
    pub bad_header: bool,
}

/// The payload length of an intact record at `at`: its checksum matches and
/// it decodes. Used to find frames again after damage, where a checksum
/// alone could match by chance once in 2³² positions.
fn intact_at(buf: &[u8], at: usize) -> Option<usize> {
    match frame_at(buf, at) {
        Frame::Valid { len } => decode(&buf[at + FRAME_HEADER..at + FRAME_HEADER + len])
            .ok()
            .map(|_| len),
        _ => None,
    }
}

/// The first intact record at or after `from`. Cheap tests (a plausible
/// length and version byte) come before the checksum, so damaged bytes are
/// passed over in about linear time.
pub fn resync(buf: &[u8], from: usize) -> Option<usize> {
    // A version byte and a count: the smallest payload.
    const MIN_PAYLOAD: usize = 5;
    let mut at = from;
    while at + FRAME_HEADER + MIN_PAYLOAD <= buf.len() {
        let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        let version = buf[at + FRAME_HEADER];
        if len >= MIN_PAYLOAD
            && len <= buf.len() - at - FRAME_HEADER
            && (version == VERSION || version == VERSION_1)
            && intact_at(buf, at).is_some()
        {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// Scans a whole segment. Damage (a bad length, payload or header) is
/// skipped to the next intact frame, found by its checksum; where none
/// follows, the intact data ends (`end`), and what comes after is for the
/// caller to judge: a torn write at the end of the newest segment, damage
/// anywhere else.
pub fn scan(buf: &[u8]) -> Scan {
    let mut scan = Scan::default();
    let mut at = if buf.len() >= HEADER && &buf[..HEADER] == SEGMENT_MAGIC {
        HEADER
    } else {
        scan.bad_header = true;
        match resync(buf, 0) {
            Some(first) => {
                scan.damaged.push((0, first));
                first
            }
            None => return scan,
        }
    };
    scan.end = at;
    while at < buf.len() {
        if let Frame::Valid { len } = frame_at(buf, at) {
            scan.records.push((at, len));
            at += FRAME_HEADER + len;
            scan.end = at;
            continue;
        }
        // The written length usually survives damage to the payload.
        let stated = match frame_at(buf, at) {
            Frame::Corrupt { len: Some(len) } => Some(at + FRAME_HEADER + len)
                .filter(|&next| next < buf.len() && intact_at(buf, next).is_some()),
            _ => None,
        };
        match stated.or_else(|| resync(buf, at + 1)) {
            Some(next) => {
                scan.damaged.push((at, next));
                at = next;
                scan.end = at;
            }
            None => break,
        }
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reading(sensor: &str, metric: &str, ts: i64, value: f64) -> Reading<'static> {
        Reading {
            sensor: SensorId::parse(sensor.to_owned()).expect("valid"),
            metric: MetricName::parse(metric.to_owned()).expect("valid"),
            ts,
            value,
        }
    }

    fn segment(records: &[Vec<Reading<'static>>]) -> (Vec<u8>, Vec<usize>) {
        let mut buf = SEGMENT_MAGIC.to_vec();
        let mut offsets = Vec::new();
        for r in records {
            offsets.push(buf.len());
            buf.extend(encode(r, 7));
        }
        (buf, offsets)
    }

    fn payload(buf: &[u8], (at, len): (usize, usize)) -> &[u8] {
        &buf[at + FRAME_HEADER..at + FRAME_HEADER + len]
    }

    #[test]
    fn records_read_back_exactly() {
        let rs = vec![
            reading("s-1", "temp", 1_700_000_000, 21.5),
            reading("x".repeat(128).as_str(), "m", -5, -0.0),
            reading("a:b.c", "value", i64::MAX, f64::MAX),
        ];
        let (buf, _) = segment(std::slice::from_ref(&rs));
        let scan = scan(&buf);
        assert_eq!(scan.records.len(), 1);
        assert_eq!(scan.end, buf.len());
        let back = decode(payload(&buf, scan.records[0])).expect("decodes");
        assert_eq!(back.ack_ms, 7);
        let back = back.readings;
        assert_eq!(back, rs);
        assert_eq!(back[1].value.to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn a_torn_tail_ends_the_log_at_the_last_whole_record() {
        let (buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0)],
            vec![reading("c", "m", 3, 3.0)],
        ]);
        for cut in offsets[2] + 1..buf.len() {
            let s = scan(&buf[..cut]);
            assert_eq!(s.records.len(), 2, "cut at {cut}");
            assert_eq!(s.end, offsets[2]);
            assert!(s.damaged.is_empty());
        }
    }

    #[test]
    fn a_flipped_byte_in_the_middle_loses_that_record_only() {
        let (mut buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0), reading("b", "m", 3, 2.0)],
            vec![reading("c", "m", 3, 3.0)],
        ]);
        buf[offsets[1] + FRAME_HEADER + 3] ^= 0x40;
        let s = scan(&buf);
        assert_eq!(s.records.len(), 2);
        assert_eq!(s.damaged, vec![(offsets[1], offsets[2])]);
        assert_eq!(s.end, buf.len());
        assert_eq!(
            decode(payload(&buf, s.records[1]))
                .expect("decodes")
                .readings[0]
                .sensor
                .as_str(),
            "c"
        );
    }

    #[test]
    fn a_flipped_byte_in_the_last_record_ends_the_log_before_it() {
        let (mut buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0)],
        ]);
        let last = buf.len() - 1;
        buf[last] ^= 1;
        let s = scan(&buf);
        assert_eq!((s.records.len(), s.end), (1, offsets[1]));
    }

    #[test]
    fn a_corrupt_length_is_skipped_to_the_next_frame_found_by_its_checksum() {
        let (mut buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0)],
            vec![reading("c", "m", 3, 3.0)],
            vec![reading("d", "m", 4, 4.0)],
        ]);
        buf[offsets[1]..offsets[1] + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let s = scan(&buf);
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.damaged, vec![(offsets[1], offsets[2])]);
        assert_eq!(s.end, buf.len());
        // A length pointing into the next frame: the same.
        let (mut buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0)],
            vec![reading("c", "m", 3, 3.0)],
        ]);
        buf[offsets[1]] ^= 0x03;
        let s = scan(&buf);
        assert_eq!(s.damaged, vec![(offsets[1], offsets[2])]);
        assert_eq!(s.records.len(), 2);
    }

    #[test]
    fn a_damaged_header_is_reported_and_the_frames_after_it_kept() {
        assert!(scan(b"HGJ").bad_header);
        assert!(scan(b"NOTMAGIC").bad_header);
        let s = scan(SEGMENT_MAGIC);
        assert!(!s.bad_header && s.records.is_empty());
        let (mut buf, offsets) = segment(&[
            vec![reading("a", "m", 1, 1.0)],
            vec![reading("b", "m", 2, 2.0)],
        ]);
        buf[..HEADER + 2].fill(0);
        let s = scan(&buf);
        assert!(s.bad_header);
        assert_eq!(s.damaged, vec![(0, offsets[1])]);
        assert_eq!((s.records.len(), s.end), (1, buf.len()));
    }

    #[test]
    fn malformed_payloads_are_errors_not_panics() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[2, 0, 0, 0, 0]).is_err());
        assert!(decode(&[1, 255, 255, 255, 255]).is_err());
        let mut ok = encode(&[reading("a", "m", 1, 1.0)], 5);
        ok.push(0);
        assert!(decode(&ok[FRAME_HEADER..]).is_err());
    }

    #[test]
    fn a_stamped_record_reads_back_with_its_new_time_and_a_valid_checksum() {
        let mut frame = encode(&[reading("a", "m", 1, 1.0)], 5);
        stamp(&mut frame, 1_700_000_000_123);
        let mut buf = SEGMENT_MAGIC.to_vec();
        buf.extend(&frame);
        let s = scan(&buf);
        assert_eq!(s.records.len(), 1);
        let back = decode(payload(&buf, s.records[0])).expect("decodes");
        assert_eq!(back.ack_ms, 1_700_000_000_123);
    }

    #[test]
    fn a_version_1_record_reads_back_acknowledged_at_zero() {
        // Version 1: no acknowledgement time after the count.
        let mut payload = vec![1u8];
        payload.extend(1u32.to_le_bytes());
        for name in ["s", "m"] {
            payload.push(1);
            payload.extend(name.as_bytes());
        }
        payload.extend(60i64.to_le_bytes());
        payload.extend(2.5f64.to_bits().to_le_bytes());
        let back = decode(&payload).expect("decodes");
        assert_eq!(back.ack_ms, 0);
        assert_eq!(back.readings, vec![reading("s", "m", 60, 2.5)]);
    }

    proptest! {
        /// Any bytes: scanning never panics, never reads past the end, and
        /// every record it reports checks out.
        #[test]
        fn scanning_arbitrary_bytes_is_safe(tail in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut buf = SEGMENT_MAGIC.to_vec();
            buf.extend(tail);
            let s = scan(&buf);
            prop_assert!(s.end <= buf.len());
            for &(start, end) in &s.damaged {
                prop_assert!(start < end && end <= s.end);
            }
            for &(at, _) in &s.records {
                let valid = matches!(frame_at(&buf, at), Frame::Valid { .. });
                prop_assert!(valid);
            }
            for &(at, len) in &s.records {
                let _ = decode(payload(&buf, (at, len)));
            }
        }

        /// Whatever run of bytes is overwritten, every frame wholly outside
        /// it is found again, and only a damaged range at the very end is
        /// left past `end`.
        #[test]
        fn damage_loses_only_the_frames_it_touches(
            sizes in prop::collection::vec(1..6usize, 2..12),
            from in any::<prop::sample::Index>(),
            span in 1..300usize,
            fill in any::<u8>(),
        ) {
            let records: Vec<Vec<Reading<'static>>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (0..n).map(|k| reading("s", "m", (i * 10 + k) as i64, 1.0)).collect())
                .collect();
            let (mut buf, offsets) = segment(&records);
            let start = HEADER + from.index(buf.len() - HEADER);
            let stop = (start + span).min(buf.len());
            buf[start..stop].fill(fill);
            let s = scan(&buf);
            let mut ends: Vec<usize> = offsets[1..].to_vec();
            ends.push(buf.len());
            for (&at, &end) in offsets.iter().zip(&ends) {
                let untouched = end <= start || at >= stop;
                let found = s.records.iter().any(|&(r, _)| r == at);
                // An untouched frame is found unless damage before it runs
                // to the end (then it is past `end`, which cannot happen for
                // a frame after the damage).
                if untouched {
                    prop_assert!(found, "frame at {} lost to damage {}..{}", at, start, stop);
                }
            }
        }

        /// Readings survive a round trip whatever their values.
        #[test]
        fn any_readings_round_trip(rs in prop::collection::vec((0..3usize, any::<i64>(), any::<f64>()), 0..50), ack in any::<i64>()) {
            let names = ["a", "sensor-7", "z.y:x"];
            let readings: Vec<_> = rs.iter().map(|&(s, ts, v)| reading(names[s], "m", ts, v)).collect();
            let frame = encode(&readings, ack);
            let back = decode(&frame[FRAME_HEADER..]).expect("decodes");
            prop_assert_eq!(back.ack_ms, ack);
            let back = back.readings;
            prop_assert_eq!(back.len(), readings.len());
            for (a, b) in back.iter().zip(&readings) {
                prop_assert_eq!((a.sensor.as_str(), a.ts, a.value.to_bits()), (b.sensor.as_str(), b.ts, b.value.to_bits()));
            }
        }
    }
}
