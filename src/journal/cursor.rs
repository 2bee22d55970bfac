//! The journal's decisions, pure: where the reader is, whether a fresh
//! commit goes straight to the batcher, what to read back from disk next,
//! and which segments may go. Time and I/O stay with the task
//! ([`super::JournalTask`]), which tells this core what happened.
//!
//! Records are offered to the batcher in the order they were committed, each
//! exactly once: while caught up, right after their fsync, from the
//! readings the writer already decoded; once the batcher refused one (it is
//! full: storage is down, or memory at its bound), from disk, in order, as
//! room frees up, until the reader reaches the end again.

/// A position in the journal: segment id and byte offset.
pub type Position = (u64, u64);

/// What to do next to feed the batcher from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read records of `segment` from `offset` and offer them in order.
    Read { segment: u64, offset: u64 },
    /// The reader is at the end: fresh commits go straight to the batcher.
    CaughtUp,
}

/// Where the reader is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The next record to offer.
    at: Position,
    caught_up: bool,
    /// Where a segment's records start (after its header).
    header: u64,
}

impl Cursor {
    /// A reader at the start of `first` (the oldest segment), behind until
    /// it has read everything a previous run left.
    pub fn new(first: u64, header: u64) -> Self {
        Self {
            at: (first, header),
            caught_up: false,
            header,
        }
    }

    pub fn at(&self) -> Position {
        self.at
    }

    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// A commit landed at `at` in `segment`: whether its records go straight
    /// to the batcher (only when nothing older waits on disk).
    pub fn offer_fresh(&self) -> bool {
        self.caught_up
    }

    /// The batcher took the record of `segment` ending at `end`.
    pub fn offered(&mut self, segment: u64, end: u64) {
        self.at = (segment, end);
    }

    /// The batcher refused the record of `segment` at `offset`: it and
    /// everything after is read back from disk later. Answers whether the
    /// reader just fell behind.
    pub fn refused(&mut self, segment: u64, offset: u64) -> bool {
        self.at = (segment, offset);
        std::mem::replace(&mut self.caught_up, false)
    }

    /// What to read next, given the journal's end, the length of the
    /// reader's segment (if it still exists) and the segment after it.
    pub fn next(&mut self, end: Position, len: Option<u64>, next_after: Option<u64>) -> Step {
        loop {
            if self.at >= end {
                self.caught_up = true;
                return Step::CaughtUp;
            }
            match len {
                Some(len) if self.at.1 < len => {
                    return Step::Read {
                        segment: self.at.0,
                        offset: self.at.1,
                    };
                }
                // Read to its end (or gone): the next segment.
                _ => {
                    self.at = (next_after.unwrap_or(end.0), self.header);
                    if next_after.is_none() || self.at >= end {
                        continue;
                    }
                    return Step::Read {
                        segment: self.at.0,
                        offset: self.at.1,
                    };
                }
            }
        }
    }

    /// Nothing whole is left past the reader in its segment (a torn tail
    /// was cut): on to the next one.
    pub fn skip_segment(&mut self, next_after: Option<u64>, end: Position) {
        self.at = (next_after.unwrap_or(end.0), self.header);
    }

    /// The segments that may be deleted: read past, not the one being
    /// appended to, and below the lowest segment with readings the batcher
    /// has not settled (stored or dead-lettered).
    pub fn retirable(
        &self,
        segments: impl IntoIterator<Item = u64>,
        end: u64,
        lowest_unsettled: Option<u64>,
    ) -> Vec<u64> {
        segments
            .into_iter()
            .filter(|&id| id < self.at.0 && id != end && lowest_unsettled.is_none_or(|l| id < l))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    const HEADER: u64 = 8;

    /// A journal on a model disk: segments of records (their lengths), the
    /// batcher's room, and what it has been offered and has settled.
    #[derive(Debug, Default)]
    struct Model {
        segments: BTreeMap<u64, Vec<u64>>,
        end: u64,
        /// Records in commit order: (segment, offset).
        committed: Vec<Position>,
        offered: Vec<Position>,
        settled: BTreeSet<Position>,
        retired: BTreeSet<u64>,
    }

    impl Model {
        fn len(&self, s: u64) -> Option<u64> {
            self.segments
                .get(&s)
                .map(|r| HEADER + r.iter().sum::<u64>())
        }

        fn end_pos(&self) -> Position {
            (self.end, self.len(self.end).unwrap_or(HEADER))
        }

        fn append(&mut self, len: u64, roll: bool) -> Position {
            if roll || self.segments.is_empty() {
                self.end += u64::from(!self.segments.is_empty());
                self.segments.insert(self.end, Vec::new());
            }
            let at = self.len(self.end).unwrap_or(HEADER);
            self.segments.get_mut(&self.end).expect("end").push(len);
            self.committed.push((self.end, at));
            (self.end, at)
        }

        /// The records of segment `s` from `offset`: (offset, end).
        fn read(&self, s: u64, offset: u64) -> Vec<(u64, u64)> {
            let mut at = HEADER;
            let mut out = Vec::new();
            for &len in self.segments.get(&s).into_iter().flatten() {
                if at >= offset {
                    out.push((at, at + len));
                }
                at += len;
            }
            out
        }

        fn lowest_unsettled(&self) -> Option<u64> {
            self.offered
                .iter()
                .filter(|p| !self.settled.contains(p))
                .map(|p| p.0)
                .min()
        }
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// A commit of a record of this length, maybe in a new segment.
        Commit(u64, bool),
        /// The batcher has room for this many offers (0: it is full).
        Room(usize),
        /// The batcher settles the oldest offered records.
        Settle(usize),
        /// The task feeds from disk and retires.
        Tick,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (1u64..50, any::<bool>()).prop_map(|(l, r)| Event::Commit(l, r)),
            (0usize..4).prop_map(Event::Room),
            (0usize..5).prop_map(Event::Settle),
            Just(Event::Tick),
        ]
    }

    proptest! {
        /// Against the model: every committed record is offered exactly
        /// once, in commit order, however often the batcher is full; a
        /// segment is deleted only once all its records are offered and
        /// settled; with room, the reader catches up and retires the rest.
        #[test]
        fn records_are_offered_once_in_order_and_segments_retire_when_settled(
            events in prop::collection::vec(event(), 1..80),
        ) {
            let mut m = Model::default();
            let mut c = Cursor::new(0, HEADER);
            m.segments.insert(0, Vec::new());
            let mut room = usize::MAX;
            let mut offer = |m: &mut Model, c: &mut Cursor, room: &mut usize, p: Position, len: u64| {
                if *room == 0 {
                    c.refused(p.0, p.1);
                    false
                } else {
                    *room = room.saturating_sub(1);
                    m.offered.push(p);
                    c.offered(p.0, p.1 + len);
                    true
                }
            };
            let feed = |m: &mut Model, c: &mut Cursor, room: &mut usize, offer: &mut dyn FnMut(&mut Model, &mut Cursor, &mut usize, Position, u64) -> bool| {
                for _ in 0..1000 {
                    let (s, o) = c.at();
                    match c.next(m.end_pos(), m.len(s), m.segments.range(s + 1..).next().map(|(&k, _)| k)) {
                        Step::CaughtUp => return,
                        Step::Read { segment, offset } => {
                            let records = m.read(segment, offset);
                            if records.is_empty() {
                                let next = m.segments.range(segment + 1..).next().map(|(&k, _)| k);
                                c.skip_segment(next, m.end_pos());
                                continue;
                            }
                            for (at, end) in records {
                                if !offer(m, c, room, (segment, at), end - at) {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = o;
                }
            };
            for e in events {
                match e {
                    Event::Commit(len, roll) => {
                        let p = m.append(len, roll);
                        if c.offer_fresh() {
                            offer(&mut m, &mut c, &mut room, p, len);
                        }
                    }
                    Event::Room(r) => {
                        room = if r == 0 { 0 } else { usize::MAX };
                    }
                    Event::Settle(k) => {
                        let todo: Vec<Position> = m.offered.iter().copied().filter(|p| !m.settled.contains(p)).take(k).collect();
                        m.settled.extend(todo);
                    }
                    Event::Tick => {
                        if !c.caught_up() {
                            feed(&mut m, &mut c, &mut room, &mut offer);
                        }
                        let lowest = m.lowest_unsettled();
                        let alive: Vec<u64> = m.segments.keys().copied().collect();
                        for id in c.retirable(alive, m.end, lowest) {
                            // Everything in it was offered and settled.
                            for (at, _) in m.read(id, 0) {
                                prop_assert!(m.offered.contains(&(id, at)), "retired unoffered {:?}", (id, at));
                                prop_assert!(m.settled.contains(&(id, at)), "retired unsettled {:?}", (id, at));
                            }
                            m.segments.remove(&id);
                            m.retired.insert(id);
                        }
                    }
                }
                // Offered exactly once, in commit order.
                let n = m.offered.len();
                prop_assert_eq!(&m.offered[..], &m.committed[..n]);
            }
            // With room and everything settled, it all catches up and retires.
            room = usize::MAX;
            feed(&mut m, &mut c, &mut room, &mut offer);
            prop_assert_eq!(&m.offered, &m.committed);
            let all: Vec<Position> = m.offered.clone();
            m.settled.extend(all);
            let alive: Vec<u64> = m.segments.keys().copied().collect();
            let retired = c.retirable(alive.clone(), m.end, m.lowest_unsettled());
            prop_assert_eq!(retired.len(), alive.len().saturating_sub(1), "all but the last");
        }
    }
}
