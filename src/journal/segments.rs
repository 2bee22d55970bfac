//! Segment files on disk: recovery at start, appends with one fsync per
//! group, reads for the backlog, and deletion of segments that are done.
//! Blocking I/O throughout: the journal task calls it from `spawn_blocking`.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::record::{self, FRAME_HEADER, Frame, HEADER, SEGMENT_MAGIC};

/// One segment file.
#[derive(Debug, Clone)]
pub struct Segment {
    pub id: u64,
    pub len: u64,
    pub created: SystemTime,
    /// Ranges recovery found damaged, `(start, end)`: reads skip them.
    pub damaged: Vec<(u64, u64)>,
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    pub segments: usize,
    pub records: usize,
    pub readings: u64,
    /// Damaged ranges skipped (each lost at least one frame), kept in
    /// `<segment>.<offset>.corrupt` files.
    pub damaged_ranges: usize,
    pub damaged_bytes: u64,
    /// Bytes cut off the newest segment's torn tail (never acknowledged: an
    /// acknowledgement waits for the fsync that would have made them whole).
    pub truncated_bytes: u64,
}

/// A record read back for the backlog.
#[derive(Debug)]
pub struct ReadRecord {
    pub offset: u64,
    /// Offset just past it.
    pub end: u64,
    /// `None` when its checksum failed: skip it.
    pub payload: Option<Vec<u8>>,
    /// A range recovery found damaged and reported already.
    pub known_damage: bool,
}

#[derive(Debug)]
pub struct Segments {
    dir: PathBuf,
    segment_bytes: u64,
    /// Oldest first; the last is the one appended to.
    list: VecDeque<Segment>,
    /// The last segment, open for appends; `None` after a failed write so the
    /// next append starts a fresh file.
    file: Option<File>,
    _lock: File,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.log"))
}

/// Where a damaged range's bytes are kept for inspection.
pub fn corrupt_path(dir: &Path, id: u64, offset: u64) -> PathBuf {
    dir.join(format!("{id:020}.{offset}.corrupt"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Records in a record's payload, read from its count without decoding.
fn readings_in(payload: &[u8]) -> u64 {
    payload.get(1..5).map_or(0, |c| {
        u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    })
}

impl Segments {
    /// Opens (creating) the journal in `dir`, checks every segment, truncates
    /// torn tails, and starts a new segment for appends. Fails if another
    /// process holds the directory.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<(Self, Recovered)> {
        // Long: recovery's steps in order: lock, list, check every segment, cut torn tails, start the next.
        fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        lock.try_lock().map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                "another process uses this journal directory",
            )
        })?;
        let mut ids: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                let id = name.strip_suffix(".log")?;
                (id.len() == 20).then(|| id.parse().ok())?
            })
            .collect();
        ids.sort_unstable();
        let newest = ids.last().copied();
        let mut recovered = Recovered::default();
        let mut list = VecDeque::new();
        for id in ids {
            let path = segment_path(dir, id);
            let buf = fs::read(&path)?;
            let scan = record::scan(&buf);
            let created = fs::metadata(&path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::now());
            let mut damaged = scan.damaged.clone();
            let mut len = buf.len();
            if scan.end < buf.len() {
                if Some(id) == newest {
                    // A torn tail: the write in progress at a crash, never
                    // acknowledged (that waits for its fsync).
                    recovered.truncated_bytes += (buf.len() - scan.end) as u64;
                    len = scan.end;
                } else {
                    // An older segment was synced whole before the next was
                    // started: what does not check out here is damage.
                    damaged.push((scan.end, buf.len()));
                }
            }
            for &(start, end) in &damaged {
                fs::write(corrupt_path(dir, id, start as u64), &buf[start..end])?;
                recovered.damaged_ranges += 1;
                recovered.damaged_bytes += (end - start) as u64;
            }
            if scan.records.is_empty() && (scan.bad_header || len <= HEADER) {
                // Nothing readable: created but never written, or all damaged
                // (its bytes kept above).
                fs::remove_file(&path)?;
                continue;
            }
            if len < buf.len() {
                let file = OpenOptions::new().write(true).open(&path)?;
                file.set_len(len as u64)?;
                file.sync_all()?;
            }
            recovered.segments += 1;
            recovered.records += scan.records.len();
            recovered.readings += scan
                .records
                .iter()
                .map(|&(at, len)| readings_in(&buf[at + FRAME_HEADER..at + FRAME_HEADER + len]))
                .sum::<u64>();
            list.push_back(Segment {
                id,
                len: len as u64,
                created,
                damaged: damaged.iter().map(|&(a, b)| (a as u64, b as u64)).collect(),
            });
        }
        let mut segments = Self {
            dir: dir.to_owned(),
            segment_bytes,
            list,
            file: None,
            _lock: lock,
        };
        segments.roll()?;
        Ok((segments, recovered))
    }

    /// Starts a new segment for appends.
    fn roll(&mut self) -> io::Result<()> {
        let id = self.list.back().map_or(1, |s| s.id + 1);
        let path = segment_path(&self.dir, id);
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)?;
        file.write_all(SEGMENT_MAGIC)?;
        file.sync_all()?;
        // The new name must survive a crash too.
        sync_dir(&self.dir)?;
        self.list.push_back(Segment {
            id,
            len: HEADER as u64,
            created: SystemTime::now(),
            damaged: Vec::new(),
        });
        self.file = Some(file);
        Ok(())
    }

    /// Appends whole frames and waits for them to reach the disk. Returns the
    /// segment and offset they start at. After a failure nothing of them
    /// counts (the next append goes to a new segment).
    pub fn append(&mut self, frames: &[u8]) -> io::Result<(u64, u64)> {
        let full = self.list.back().is_none_or(|s| s.len >= self.segment_bytes);
        if self.file.is_none() || full {
            self.file = None;
            self.roll()?;
        }
        let (Some(file), Some(current)) = (self.file.as_mut(), self.list.back_mut()) else {
            return Err(io::Error::other("no segment open for appends"));
        };
        let at = current.len;
        let written = file.write_all(frames).and_then(|()| file.sync_data());
        if let Err(e) = written {
            // Best effort: cut the partial frames off. If that fails too, the
            // checksum finds them at the next start.
            let _ = file.set_len(at);
            self.file = None;
            return Err(e);
        }
        current.len += frames.len() as u64;
        Ok((current.id, at))
    }

    /// Reads records of segment `id` from `offset`, about `max_bytes` of them
    /// (at least one whole record), up to the segment's known length.
    pub fn read(&self, id: u64, offset: u64, max_bytes: usize) -> io::Result<Vec<ReadRecord>> {
        // Long: the records of one read, framed and checked in one pass.
        let Some(segment) = self.list.iter().find(|s| s.id == id) else {
            return Ok(Vec::new());
        };
        if offset >= segment.len {
            return Ok(Vec::new());
        }
        if let Some(&(_, end)) = segment
            .damaged
            .iter()
            .find(|&&(start, end)| start <= offset && offset < end)
        {
            return Ok(vec![ReadRecord {
                offset,
                end,
                payload: None,
                known_damage: true,
            }]);
        }
        // Read up to the next damaged range: it is skipped on its own.
        let seg_len = segment
            .damaged
            .iter()
            .map(|&(start, _)| start)
            .filter(|&start| start > offset)
            .min()
            .unwrap_or(segment.len);
        let mut file = File::open(segment_path(&self.dir, id))?;
        file.seek(SeekFrom::Start(offset))?;
        let available = usize::try_from(seg_len - offset).unwrap_or(usize::MAX);
        let mut buf = vec![0; available.min(max_bytes.max(FRAME_HEADER))];
        file.read_exact(&mut buf)?;
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            match record::frame_at(&buf, at) {
                Frame::Valid { len } => {
                    out.push(ReadRecord {
                        offset: offset + at as u64,
                        end: offset + (at + FRAME_HEADER + len) as u64,
                        payload: Some(buf[at + FRAME_HEADER..at + FRAME_HEADER + len].to_vec()),
                        known_damage: false,
                    });
                    at += FRAME_HEADER + len;
                }
                Frame::Corrupt { len: Some(len) }
                    if offset + ((at + FRAME_HEADER + len) as u64) <= seg_len =>
                {
                    out.push(ReadRecord {
                        offset: offset + at as u64,
                        end: offset + (at + FRAME_HEADER + len) as u64,
                        payload: None,
                        known_damage: false,
                    });
                    at += FRAME_HEADER + len;
                }
                Frame::Corrupt { .. } => {
                    // The length itself is bad: nothing after it can be found.
                    out.push(ReadRecord {
                        offset: offset + at as u64,
                        end: seg_len,
                        payload: None,
                        known_damage: false,
                    });
                    return Ok(out);
                }
                Frame::Incomplete if out.is_empty() && at == 0 => {
                    // One record larger than the read: read exactly it.
                    let head = &buf[..FRAME_HEADER.min(buf.len())];
                    if head.len() < FRAME_HEADER {
                        return Ok(out);
                    }
                    let need = FRAME_HEADER
                        + u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
                    if need > available {
                        out.push(ReadRecord {
                            offset,
                            end: seg_len,
                            payload: None,
                            known_damage: false,
                        });
                        return Ok(out);
                    }
                    let mut whole = vec![0; need];
                    file.seek(SeekFrom::Start(offset))?;
                    file.read_exact(&mut whole)?;
                    buf = whole;
                }
                Frame::Incomplete => return Ok(out),
            }
            if at >= buf.len() {
                return Ok(out);
            }
        }
    }

    /// Deletes segment `id` (never the one appended to).
    pub fn remove(&mut self, id: u64) -> io::Result<()> {
        if self.list.back().is_some_and(|s| s.id == id) {
            return Ok(());
        }
        fs::remove_file(segment_path(&self.dir, id))?;
        self.list.retain(|s| s.id != id);
        Ok(())
    }

    /// Deletes every segment, the one appended to included: at a clean stop
    /// with everything stored, so the next start has nothing to replay.
    pub fn clear(&mut self) -> io::Result<()> {
        self.file = None;
        while let Some(s) = self.list.front() {
            fs::remove_file(segment_path(&self.dir, s.id))?;
            self.list.pop_front();
        }
        sync_dir(&self.dir)
    }

    pub fn list(&self) -> &VecDeque<Segment> {
        &self.list
    }

    pub fn bytes(&self) -> u64 {
        self.list.iter().map(|s| s.len).sum()
    }

    /// The end of the log: the segment appended to and its length.
    pub fn end(&self) -> (u64, u64) {
        self.list.back().map_or((0, 0), |s| (s.id, s.len))
    }

    pub fn len_of(&self, id: u64) -> Option<u64> {
        self.list.iter().find(|s| s.id == id).map(|s| s.len)
    }

    /// The segment after `id`, if any.
    pub fn next_after(&self, id: u64) -> Option<u64> {
        self.list.iter().map(|s| s.id).find(|&s| s > id)
    }

    pub fn first(&self) -> Option<u64> {
        self.list.front().map(|s| s.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{MetricName, Reading, SensorId};

    fn frame(sensor: &str, ts: i64) -> Vec<u8> {
        record::encode(
            &[Reading {
                sensor: SensorId::parse(sensor.to_owned()).expect("valid"),
                metric: MetricName::default_metric(),
                ts,
                value: 1.0,
            }],
            1,
        )
    }

    /// Every record `read` gives back, segment by segment, as the journal
    /// task walks them: `(sensor, known damage)` per record.
    fn read_all(segs: &Segments) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for s in segs.list().clone() {
            let mut at = HEADER as u64;
            while at < s.len {
                let records = segs.read(s.id, at, 64).expect("read");
                assert!(
                    !records.is_empty(),
                    "a read at {at} of {} found nothing",
                    s.id
                );
                for r in records {
                    out.push(r.payload.as_ref().map(|p| {
                        record::decode(p).expect("decodes").readings[0]
                            .sensor
                            .as_str()
                            .to_owned()
                    }));
                    at = r.end;
                }
            }
        }
        out
    }

    #[test]
    fn damage_in_an_older_segment_or_mid_newest_loses_only_its_frame_and_is_kept_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut segs, _) = Segments::open(dir.path(), 100).expect("open");
        let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
        let mut placed = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let f = frame(name, i as i64);
            let (id, at) = segs.append(&f).expect("append");
            placed.push((id, at, f.len()));
        }
        drop(segs);
        let ids: Vec<u64> = placed.iter().map(|p| p.0).collect();
        let (oldest, newest) = (ids[0], ids[ids.len() - 1]);
        assert!(oldest < newest, "several segments: {ids:?}");
        let patch = |id: u64, at: u64, bytes: &[u8]| {
            let mut f = OpenOptions::new()
                .write(true)
                .open(segment_path(dir.path(), id))
                .expect("open");
            f.seek(SeekFrom::Start(at)).expect("seek");
            f.write_all(bytes).expect("write");
        };
        // A bad sector over the oldest segment's first frame's length...
        patch(oldest, placed[0].1, &[0xff; 4]);
        // ...and a payload byte in the middle of the newest segment...
        let in_newest: Vec<usize> = (0..placed.len())
            .filter(|&i| placed[i].0 == newest)
            .collect();
        let middle = in_newest[0];
        assert!(in_newest.len() >= 2, "the newest segment holds two frames");
        patch(newest, placed[middle].1 + 12, &[0xee]);
        // ...and a torn write at its end.
        let mut f = OpenOptions::new()
            .append(true)
            .open(segment_path(dir.path(), newest))
            .expect("open");
        f.write_all(&frame("torn", 99)[..11]).expect("write");
        drop(f);
        let (segs, rec) = Segments::open(dir.path(), 100).expect("reopen");
        assert_eq!(rec.damaged_ranges, 2, "{rec:?}");
        assert_eq!(rec.truncated_bytes, 11);
        assert_eq!(rec.records, names.len() - 2);
        let read: Vec<Option<String>> = read_all(&segs);
        let expected: Vec<Option<String>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (i != 0 && i != middle).then(|| n.clone()))
            .collect();
        assert_eq!(read, expected);
        for (id, i) in [(oldest, 0), (newest, middle)] {
            let kept = fs::read(corrupt_path(dir.path(), id, placed[i].1)).expect("kept aside");
            assert_eq!(kept.len(), placed[i].2, "the damaged frame's bytes");
        }
        // The damage is still there at the next start: found and skipped again.
        drop(segs);
        let (segs, rec) = Segments::open(dir.path(), 100).expect("reopen");
        assert_eq!((rec.damaged_ranges, rec.truncated_bytes), (2, 0));
        assert_eq!(read_all(&segs), expected);
    }

    #[test]
    fn appends_survive_a_reopen_and_torn_tails_are_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut segs, rec) = Segments::open(dir.path(), 1 << 20).expect("open");
        assert_eq!(rec, Recovered::default());
        let (id, at) = segs.append(&frame("a", 1)).expect("append");
        assert_eq!(at, HEADER as u64);
        let mut two = frame("b", 2);
        two.extend(frame("c", 3));
        segs.append(&two).expect("append");
        drop(segs);
        // A torn write: half a frame at the end.
        let path = segment_path(dir.path(), id);
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&frame("d", 4)[..10]).expect("write");
        drop(f);
        let (segs, rec) = Segments::open(dir.path(), 1 << 20).expect("reopen");
        assert_eq!(
            (rec.segments, rec.records, rec.readings, rec.truncated_bytes),
            (1, 3, 3, 10)
        );
        let records = segs.read(id, HEADER as u64, 1 << 20).expect("read");
        assert_eq!(records.len(), 3);
        assert!(records.iter().all(|r| r.payload.is_some()));
        assert_eq!(segs.end().0, id + 1, "appends go to a new segment");
    }

    #[test]
    fn a_full_disk_fails_the_append_and_the_next_one_starts_a_fresh_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut segs, _) = Segments::open(dir.path(), 1 << 20).expect("open");
        let (before, at) = segs.append(&frame("a", 1)).expect("append");
        // The kernel's always-full device: every write fails with ENOSPC.
        segs.file = Some(
            OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .expect("/dev/full"),
        );
        let err = segs.append(&frame("b", 2)).expect_err("disk full");
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(
            segs.len_of(before),
            Some(at + frame("a", 1).len() as u64),
            "the failed append counts for nothing"
        );
        let (after, _) = segs.append(&frame("c", 3)).expect("append");
        assert!(after > before, "a fresh segment after the failure");
        let records: usize = segs
            .list()
            .iter()
            .map(|s| segs.read(s.id, HEADER as u64, 1 << 20).expect("read").len())
            .sum();
        assert_eq!(records, 2);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_journal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = Segments::open(dir.path(), 1 << 20).expect("open");
        let second = Segments::open(dir.path(), 1 << 20).expect_err("locked");
        assert_eq!(second.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn segments_roll_at_their_size_and_old_ones_can_be_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut segs, _) = Segments::open(dir.path(), 64).expect("open");
        let mut ids = Vec::new();
        for i in 0..5 {
            ids.push(segs.append(&frame("s", i)).expect("append").0);
        }
        assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
        assert!(ids[4] >= ids[0] + 2, "rolled more than once: {ids:?}");
        let before = segs.list().len();
        let first = segs.first().expect("a segment");
        segs.remove(first).expect("remove");
        assert_eq!(segs.list().len(), before - 1);
        let last = segs.end().0;
        segs.remove(last).expect("no-op");
        assert_eq!(segs.end().0, last, "the segment appended to stays");
    }

    #[test]
    fn reads_return_whole_records_of_any_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut segs, _) = Segments::open(dir.path(), 1 << 20).expect("open");
        let big: Vec<Reading<'static>> = (0..1000)
            .map(|i| Reading {
                sensor: SensorId::parse(format!("sensor-{i}")).expect("valid"),
                metric: MetricName::default_metric(),
                ts: i,
                value: 2.0,
            })
            .collect();
        let (id, at) = segs.append(&record::encode(&big, 1)).expect("append");
        segs.append(&frame("after", 1)).expect("append");
        let first = segs.read(id, at, 100).expect("read");
        assert_eq!(first.len(), 1, "one record larger than the read size");
        let payload = first[0].payload.as_ref().expect("intact");
        assert_eq!(
            record::decode(payload).expect("decodes").readings.len(),
            1000
        );
        let rest = segs.read(id, first[0].end, 100).expect("read");
        assert_eq!(rest.len(), 1);
        assert!(segs.read(id, rest[0].end, 100).expect("read").is_empty());
    }
}
