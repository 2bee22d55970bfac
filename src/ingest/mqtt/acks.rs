//! Acknowledgements: a pure state machine and the task that drives it.
//!
//! Messages are acknowledged in arrival order, as MQTT 3.1.1 asks of QoS 1,
//! and only once settled: their readings safe (in the journal, or stored when
//! it is off), dead-lettered, or the message found unusable. A message whose
//! connection is gone is not
//! acknowledged: the broker delivers it again on the new connection, and that
//! copy gets the PUBACK. A message left unstored at shutdown is not
//! acknowledged either, so the broker delivers it again after the restart.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tracing::warn;

use super::shared::Shared;
use crate::journal::{Ack, NotSafe};

/// What to do with a settled message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Stored, dead-lettered or unusable: the broker may forget it.
    Ack,
    /// Not stored: leave it to the broker to deliver again.
    Leave,
}

#[derive(Debug)]
struct Entry {
    pkid: u16,
    epoch: u64,
    settled: Option<Settle>,
}

/// The pure core: messages in arrival order, each received on a connection
/// epoch, settled in any order, acknowledged in arrival order.
#[derive(Debug, Default)]
pub struct Acks {
    queue: VecDeque<Entry>,
    /// Sequence number of the queue's front entry.
    front: u64,
}

impl Acks {
    /// A message arrived on connection `epoch`; returns its sequence number.
    pub fn received(&mut self, pkid: u16, epoch: u64) -> u64 {
        self.queue.push_back(Entry {
            pkid,
            epoch,
            settled: None,
        });
        self.front + self.queue.len() as u64 - 1
    }

    /// The message `seq` is settled. Unknown or repeated sequence numbers
    /// change nothing.
    pub fn settle(&mut self, seq: u64, settle: Settle) {
        let Some(offset) = seq.checked_sub(self.front) else {
            return;
        };
        if let Some(entry) = usize::try_from(offset)
            .ok()
            .and_then(|i| self.queue.get_mut(i))
        {
            entry.settled.get_or_insert(settle);
        }
    }

    /// Removes the settled messages at the front, in order, and pushes the
    /// packet ids to acknowledge now (on connection `epoch`) into `out`.
    /// Returns how many messages left the queue.
    pub fn ready(&mut self, epoch: u64, out: &mut Vec<u16>) -> usize {
        let mut left = 0;
        while let Some(Entry {
            settled: Some(settle),
            ..
        }) = self.queue.front()
        {
            let settle = *settle;
            let Some(entry) = self.queue.pop_front() else {
                break;
            };
            self.front += 1;
            left += 1;
            if settle == Settle::Ack && entry.epoch == epoch {
                out.push(entry.pkid);
            }
        }
        left
    }

    /// Messages received and not yet out of the queue.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// A message on its way to its acknowledgement: its packet id only, never
/// its payload.
pub(super) struct Pending {
    pub pkid: u16,
    /// The connection it arrived on: a PUBACK only means something there.
    pub epoch: u64,
    /// Resolves when its readings are settled; `None` for a message that is
    /// acknowledged without storing anything (unusable, retained, empty).
    pub stored: Option<Ack>,
    /// Not to be acknowledged whatever becomes of `stored` (its letter could
    /// not be queued): the broker delivers it again on a renewed connection.
    pub leave: bool,
}

/// How soon the acker tries again when rumqttc's request queue is full.
const QUEUE_FULL_RETRY: std::time::Duration = std::time::Duration::from_millis(5);

/// The acker task: settles messages as their readings are settled and sends
/// the PUBACKs the core releases. Ends when the processor is gone and every
/// message has left the queue, or at the shutdown deadline.
///
/// It never waits on rumqttc's request queue: the event loop that drains that
/// queue may itself be waiting for the processor, which may be waiting for
/// this task. PUBACKs that do not fit wait here (with their connection epoch)
/// and are tried again shortly, while settling goes on.
pub(super) async fn acknowledge(shared: Arc<Shared>, mut pending: mpsc::Receiver<Pending>) {
    let mut acks = Acks::default();
    let mut waiting = FuturesUnordered::new();
    let mut open = true;
    let mut out = Vec::new();
    let mut unsent: VecDeque<(u64, u16)> = VecDeque::new();
    loop {
        tokio::select! {
            next = pending.recv(), if open => match next {
                Some(p) => {
                    let seq = acks.received(p.pkid, p.epoch);
                    match p.stored {
                        _ if p.leave => {
                            shared.left_on.store(p.epoch, Ordering::Release);
                            acks.settle(seq, Settle::Leave);
                        }
                        None => acks.settle(seq, Settle::Ack),
                        Some(stored) => waiting.push(async move { (seq, stored.safe().await) }),
                    }
                }
                None => open = false,
            },
            Some((seq, result)) = waiting.next(), if !waiting.is_empty() => {
                let settle = match result {
                    // Stored, or in the dead-letter collection: either way
                    // the message is dealt with for good.
                    Ok(()) | Err(NotSafe::DeadLettered(_)) => Settle::Ack,
                    Err(NotSafe::Stopped) => Settle::Leave,
                    Err(NotSafe::Journal(_)) => {
                        shared
                            .left_on
                            .store(shared.epoch.load(Ordering::Acquire), Ordering::Release);
                        Settle::Leave
                    }
                };
                acks.settle(seq, settle);
            }
            _ = tokio::time::sleep(QUEUE_FULL_RETRY), if !unsent.is_empty() => {}
            _ = shared.shutdown.deadline_passed() => break,
            else => break,
        }
        let epoch = shared.epoch.load(Ordering::Acquire);
        let left = acks.ready(epoch, &mut out);
        shared.unacked.fetch_sub(left, Ordering::AcqRel);
        unsent.extend(out.drain(..).map(|pkid| (epoch, pkid)));
        send(&shared, &mut unsent);
        if !open && acks.is_empty() && unsent.is_empty() {
            break;
        }
    }
    if !acks.is_empty() || !unsent.is_empty() {
        warn!(
            messages = acks.len() + unsent.len(),
            "Not every MQTT acknowledgement was sent before the shutdown deadline; the broker will deliver those messages again."
        );
    }
}

/// Queues as many PUBACKs as rumqttc takes now; the rest wait in `unsent`.
/// One of a connection that is gone is dropped: the broker delivers its
/// message again on the new one.
fn send(shared: &Shared, unsent: &mut VecDeque<(u64, u16)>) {
    if unsent.is_empty() {
        return;
    }
    let client = shared.client();
    while let Some(&(epoch, pkid)) = unsent.front() {
        if epoch != shared.epoch.load(Ordering::Acquire) {
            unsent.pop_front();
            continue;
        }
        if client.try_ack(pkid).is_err() {
            // Full (or the event loop is gone at shutdown): try again soon.
            return;
        }
        unsent.pop_front();
        shared.stats.acked.fetch_add(1, Ordering::Relaxed);
        shared.metrics.mqtt_acks.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn acknowledgements_follow_arrival_order_whatever_the_settling_order() {
        let mut acks = Acks::default();
        let a = acks.received(10, 1);
        let b = acks.received(11, 1);
        let c = acks.received(12, 1);
        let mut out = Vec::new();
        acks.settle(c, Settle::Ack);
        acks.settle(b, Settle::Ack);
        assert_eq!(acks.ready(1, &mut out), 0, "a still waits");
        assert!(out.is_empty());
        acks.settle(a, Settle::Ack);
        assert_eq!(acks.ready(1, &mut out), 3);
        assert_eq!(out, vec![10, 11, 12]);
        assert!(acks.is_empty());
    }

    #[test]
    fn messages_of_an_old_connection_and_unstored_ones_are_not_acknowledged() {
        let mut acks = Acks::default();
        let old = acks.received(1, 1);
        let left = acks.received(2, 2);
        let fine = acks.received(3, 2);
        for (seq, settle) in [
            (old, Settle::Ack),
            (left, Settle::Leave),
            (fine, Settle::Ack),
        ] {
            acks.settle(seq, settle);
        }
        let mut out = Vec::new();
        assert_eq!(acks.ready(2, &mut out), 3);
        assert_eq!(out, vec![3]);
    }

    #[test]
    fn settling_twice_or_unknown_sequences_changes_nothing() {
        let mut acks = Acks::default();
        let a = acks.received(5, 1);
        acks.settle(a, Settle::Leave);
        acks.settle(a, Settle::Ack);
        acks.settle(a + 7, Settle::Ack);
        let mut out = Vec::new();
        assert_eq!(acks.ready(1, &mut out), 1);
        assert!(out.is_empty(), "the first settlement stands");
        acks.settle(a, Settle::Ack);
        assert!(acks.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Receive(u16),
        Settle(usize, bool),
        Reconnect,
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => any::<u16>().prop_map(Op::Receive),
            3 => (any::<usize>(), any::<bool>()).prop_map(|(i, ack)| Op::Settle(i, ack)),
            1 => Just(Op::Reconnect),
            2 => Just(Op::Drain),
        ]
    }

    proptest! {
        /// Against a brute-force model: a message is acknowledged at most once,
        /// only when settled Ack and received on the current connection, only
        /// after every earlier message left the queue, and everything settled
        /// eventually leaves.
        #[test]
        fn acks_match_a_brute_force_model(ops in prop::collection::vec(op(), 1..200)) {
            let mut acks = Acks::default();
            let mut epoch = 1u64;
            // The model: every message ever received, in order.
            let mut model: Vec<(u16, u64, Option<Settle>, bool)> = Vec::new();
            let mut gone = 0usize; // messages that left the queue
            for op in ops {
                match op {
                    Op::Receive(pkid) => {
                        let seq = acks.received(pkid, epoch);
                        prop_assert_eq!(seq as usize, model.len());
                        model.push((pkid, epoch, None, false));
                    }
                    Op::Settle(i, ack) => if !model.is_empty() {
                        let i = i % model.len();
                        let settle = if ack { Settle::Ack } else { Settle::Leave };
                        acks.settle(i as u64, settle);
                        if i >= gone && model[i].2.is_none() { model[i].2 = Some(settle); }
                    },
                    Op::Reconnect => epoch += 1,
                    Op::Drain => {
                        let mut out = Vec::new();
                        let left = acks.ready(epoch, &mut out);
                        let mut expected = Vec::new();
                        let mut n = 0;
                        while gone + n < model.len() {
                            let (pkid, e, settled, _) = model[gone + n];
                            match settled {
                                Some(s) => {
                                    if s == Settle::Ack && e == epoch { expected.push(pkid); }
                                    model[gone + n].3 = true;
                                    n += 1;
                                }
                                None => break,
                            }
                        }
                        gone += n;
                        prop_assert_eq!(left, n);
                        prop_assert_eq!(out, expected);
                    }
                }
                prop_assert_eq!(acks.len(), model.len() - gone);
            }
            // Settle the rest as not stored: everything leaves, and only what
            // was settled Ack before on this connection is acknowledged.
            for i in gone..model.len() { acks.settle(i as u64, Settle::Leave); }
            let expected: Vec<u16> = model[gone..]
                .iter()
                .filter(|(_, e, s, _)| *s == Some(Settle::Ack) && *e == epoch)
                .map(|(pkid, ..)| *pkid)
                .collect();
            let mut out = Vec::new();
            acks.ready(epoch, &mut out);
            prop_assert_eq!(out, expected);
            prop_assert!(acks.is_empty());
        }
    }
}
