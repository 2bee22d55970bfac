//! The queue from the event loop to the processor, bounded in bytes.
//!
//! The rule that keeps MQTT ingestion free of wait cycles (see the MQTT
//! page): **no task awaits a queue whose consumer can be waiting on that
//! task.** The event loop may wait here, for a QoS 1 or 2 message, because
//! the processor never waits on the event loop: it hands dead letters and
//! acknowledgements to rumqttc without waiting ([`super::letters`],
//! [`super::acks`]), so the room it frees here always comes. A QoS 0 message
//! never waits: when the queue is full it is dropped and counted, as MQTT
//! allows (nothing was acknowledged). The broker's in-flight window bounds
//! the QoS 1 messages behind a full queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rumqttc::Publish;
use tokio::sync::{Notify, mpsc};

/// What a queued message is counted as besides its topic and payload.
const OVERHEAD: usize = 128;

/// The bytes a message holds in the queue.
pub(super) fn size(publish: &Publish) -> usize {
    publish
        .payload
        .len()
        .saturating_add(publish.topic.len())
        .saturating_add(OVERHEAD)
}

struct Room {
    bytes: AtomicUsize,
    max: usize,
    freed: Notify,
}

impl Room {
    /// Takes `n` bytes if they fit (a message alone always fits, so one
    /// larger than the bound still passes).
    fn take(&self, n: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(n) <= self.max).then(|| held.saturating_add(n))
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        // Saturating: a release is never more than what was taken.
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
        self.freed.notify_one();
    }
}

/// The event loop's end.
pub(super) struct Sender {
    tx: mpsc::UnboundedSender<(u64, Publish, usize)>,
    room: Arc<Room>,
}

/// The processor's end.
pub(super) struct Receiver {
    rx: mpsc::UnboundedReceiver<(u64, Publish, usize)>,
    room: Arc<Room>,
}

/// The processor is gone (it stopped at shutdown).
#[derive(Debug)]
pub(super) struct Closed;

/// A queue holding at most `max_bytes` (see [`size`]).
pub(super) fn queue(max_bytes: usize) -> (Sender, Receiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Room {
        bytes: AtomicUsize::new(0),
        max: max_bytes,
        freed: Notify::new(),
    });
    (
        Sender {
            tx,
            room: room.clone(),
        },
        Receiver { rx, room },
    )
}

impl Sender {
    /// Queues `publish` if it fits now; gives it back otherwise.
    pub(super) fn try_send(&self, epoch: u64, publish: Publish) -> Result<(), Publish> {
        let n = size(&publish);
        if !self.room.take(n) {
            return Err(publish);
        }
        self.tx.send((epoch, publish, n)).map_err(|e| {
            self.room.give_back(n);
            e.0.1
        })
    }

    /// Queues `publish` once it fits.
    pub(super) async fn send(&self, epoch: u64, publish: Publish) -> Result<(), Closed> {
        let n = size(&publish);
        loop {
            // Registered before the check, so a release between the two is
            // not missed.
            let freed = self.room.freed.notified();
            if self.room.take(n) {
                break;
            }
            if self.tx.is_closed() {
                return Err(Closed);
            }
            freed.await;
        }
        self.tx.send((epoch, publish, n)).map_err(|_| {
            self.room.give_back(n);
            Closed
        })
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.room.bytes.load(Ordering::Acquire)
    }
}

impl Receiver {
    /// The next message and its connection epoch; its bytes are free again.
    pub(super) async fn recv(&mut self) -> Option<(u64, Publish)> {
        let (epoch, publish, n) = self.rx.recv().await?;
        self.room.give_back(n);
        Some((epoch, publish))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // A sender waiting for room learns that none will come.
        self.rx.close();
        self.room.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::QoS;

    fn message(bytes: usize) -> Publish {
        Publish::new("t", QoS::AtLeastOnce, vec![b'x'; bytes])
    }

    #[tokio::test]
    async fn a_full_queue_refuses_without_waiting_and_takes_again_once_read() {
        let one = size(&message(1000));
        let (tx, mut rx) = queue(2 * one);
        assert!(tx.try_send(1, message(1000)).is_ok());
        assert!(tx.try_send(1, message(1000)).is_ok());
        assert!(tx.try_send(1, message(1000)).is_err(), "full");
        assert_eq!(tx.bytes(), 2 * one);
        let (epoch, _) = rx.recv().await.expect("a message");
        assert_eq!(epoch, 1);
        assert!(tx.try_send(2, message(1000)).is_ok(), "room again");
    }

    #[tokio::test]
    async fn a_message_larger_than_the_bound_passes_alone() {
        let (tx, mut rx) = queue(10);
        assert!(tx.try_send(1, message(5000)).is_ok());
        assert!(tx.try_send(1, message(1)).is_err());
        rx.recv().await.expect("a message");
        assert_eq!(tx.bytes(), 0);
    }

    #[tokio::test]
    async fn a_waiting_sender_goes_on_when_the_processor_reads_or_stops() {
        let one = size(&message(100));
        let (tx, mut rx) = queue(one);
        tx.try_send(1, message(100)).expect("fits");
        let tx = Arc::new(tx);
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(1, message(100)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        rx.recv().await.expect("the first");
        waiting.await.expect("joins").expect("queued once read");
        let blocked = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(1, message(100)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        assert!(blocked.await.expect("joins").is_err(), "closed, not stuck");
    }
}
