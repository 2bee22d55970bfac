//! The processor: decodes each message and submits its readings to the
//! journal, or to the batcher when the journal is off (waiting for room when
//! either is full: MQTT pauses, the broker keeps the backlog), and hands
//! unusable ones to the dead-letter topic.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rumqttc::{Publish, QoS};
use serde::Serialize;
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::acks::Pending;
use super::topics::parse_topic;
use super::{Shared, Unusable};
use crate::ingest::decode::{DecodeError, decode_payload};
use crate::journal::{Ack, IntakeError, Wait};
use crate::telemetry::metrics::Source;

/// How long the processor waits before offering to a full journal or batcher again.
const FULL_RETRY: Duration = Duration::from_millis(50);
/// At most one "unusable message" warning per this interval; the rest are counted.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Logs unusable messages at most once per interval, counting the rest.
struct DropLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl DropLog {
    fn log(&mut self, topic: &str, reason: &str) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < DROP_LOG_INTERVAL)
        {
            self.suppressed += 1;
            return;
        }
        warn!(
            topic,
            reason,
            suppressed = self.suppressed,
            "Acknowledged and dropped an unusable MQTT message."
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}

#[derive(Serialize)]
struct DeadLetter<'a> {
    topic: &'a str,
    reason: &'a str,
    payload: std::borrow::Cow<'a, str>,
}

enum Submit {
    Unusable(Unusable),
    Stopped,
}

pub(super) async fn process(
    shared: Arc<Shared>,
    mut publishes: mpsc::Receiver<(u64, Publish)>,
    acks: mpsc::Sender<Pending>,
) {
    let mut drops = DropLog {
        last: None,
        suppressed: 0,
    };
    let flush_at = (shared.settings.max_unacked / 2).max(1);
    let shutdown = shared.shutdown.clone();
    loop {
        let (epoch, publish) = tokio::select! {
            biased;
            _ = shutdown.triggered() => break,
            next = publishes.recv() => match next {
                Some(next) => next,
                None => break,
            },
        };
        let stored = if publish.retain && !shared.settings.ingest_retained {
            // Delivered because we subscribed, not because it was published
            // now: its reading was delivered before.
            shared.metrics.mqtt_skipped_retained.inc();
            None
        } else {
            match submit(&shared, &publish).await {
                Ok(stored) => stored,
                Err(Submit::Unusable(u)) => {
                    shared.stats.unusable.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.rejected(Source::Mqtt, u.kind, u.readings);
                    drops.log(&publish.topic, &u.reason);
                    dead_letter(&shared, &publish, &u.reason).await;
                    None
                }
                // Shutting down: leave this message (and the rest) to the broker.
                Err(Submit::Stopped) => break,
            }
        };
        if publish.qos == QoS::AtMostOnce {
            continue;
        }
        let pending = Pending {
            pkid: publish.pkid,
            epoch,
            stored,
        };
        drop(publish);
        shared.unacked.fetch_add(1, Ordering::AcqRel);
        // Bounded: with the acker behind, this waits, and so does the broker.
        if acks.send(pending).await.is_err() {
            break;
        }
        // Acks wait for the flush: with much of the broker's window waiting,
        // flush now instead of letting the window cap throughput.
        if shared.unacked.load(Ordering::Acquire) >= flush_at {
            shared.intake.flush_soon();
        }
    }
}

async fn submit(shared: &Shared, publish: &Publish) -> Result<Option<Ack>, Submit> {
    let settings = &shared.settings;
    if publish.payload.len() > settings.max_payload_bytes {
        return Err(Submit::Unusable(Unusable::new(
            crate::telemetry::metrics::Rejection::TooLarge,
            format!(
                "payload of {} bytes is over mqtt.max_payload_bytes ({})",
                publish.payload.len(),
                settings.max_payload_bytes
            ),
        )));
    }
    let implied = parse_topic(&settings.topic_prefix, &publish.topic).map_err(Submit::Unusable)?;
    let ctx = shared
        .ingest
        .decode_context(OffsetDateTime::now_utc().unix_timestamp());
    loop {
        let readings = decode_payload(&publish.payload, implied, &ctx).map_err(|e| {
            let (kind, readings) = e.rejection();
            Submit::Unusable(Unusable {
                reason: describe(&e),
                kind,
                readings,
            })
        })?;
        if readings.is_empty() {
            return Ok(None);
        }
        let n = readings.len();
        match shared.intake.submit(readings, Wait::Safe) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                return Ok(Some(ack));
            }
            Err(IntakeError::Closed) => return Err(Submit::Stopped),
            Err(IntakeError::Full(_) | IntakeError::JournalFull { .. } | IntakeError::Busy) => {
                // Pause consuming: unacknowledged messages hold the broker's
                // window, so it stops sending and keeps the backlog.
                tokio::select! {
                    _ = tokio::time::sleep(FULL_RETRY) => {}
                    _ = shared.shutdown.triggered() => return Err(Submit::Stopped),
                }
            }
        }
    }
}

fn describe(e: &DecodeError) -> String {
    match e {
        DecodeError::Invalid { details, .. } => {
            let first = details
                .first()
                .map(|d| format!(": reading {}: {}", d.index, d.reason))
                .unwrap_or_default();
            format!("{e}{first}")
        }
        other => other.to_string(),
    }
}

async fn dead_letter(shared: &Shared, publish: &Publish, reason: &str) {
    let Some(topic) = &shared.settings.dead_letter_topic else {
        return;
    };
    let letter = DeadLetter {
        topic: &publish.topic,
        reason,
        payload: String::from_utf8_lossy(&publish.payload),
    };
    let Ok(body) = serde_json::to_vec(&letter) else {
        return;
    };
    if let Err(e) = shared
        .client
        .publish(topic.clone(), QoS::AtLeastOnce, false, body)
        .await
    {
        warn!(error = %e, "Could not queue a dead letter.");
    }
}
