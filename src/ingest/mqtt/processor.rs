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
use super::intake::{FULL_RETRY, Submit, Submitted, check_size};
use super::sparkplug;
use super::topics::parse_topic;
use super::{Shared, Unusable};
use bumpalo::Bump;

use crate::domain::Reading;
use crate::ingest::decode::{DecodeContext, DecodeError, decode_payload};
use crate::ingest::line_protocol::{Precision, decode};
use crate::journal::{IntakeError, Wait};
use crate::telemetry::metrics::Rejection;
use crate::telemetry::metrics::Source;

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

/// A dead-lettered message: its payload as text, or in base64 when it is
/// not UTF-8 (Sparkplug's protobuf), so it can be published again as it was.
#[derive(Serialize)]
struct DeadLetter<'a> {
    topic: &'a str,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
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
    let mut host = sparkplug::host(&shared).await;
    let mut ticks = tokio::time::interval(sparkplug::TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (epoch, publish) = tokio::select! {
            biased;
            _ = shutdown.triggered() => break,
            next = publishes.recv() => match next {
                Some(next) => next,
                None => break,
            },
            _ = ticks.tick(), if host.is_some() => {
                if let Some(host) = host.as_mut() {
                    sparkplug::tick(&shared, host);
                }
                continue;
            }
        };
        let stored = if publish.retain && !shared.settings.ingest_retained {
            // Delivered because we subscribed, not because it was published
            // now: its reading was delivered before.
            shared.metrics.mqtt_skipped_retained.inc();
            None
        } else {
            let submitted = match host.as_mut() {
                Some(host) if publish.topic.starts_with("spBv1.0/") => {
                    sparkplug::submit(&shared, host, &publish).await
                }
                _ => submit(&shared, &publish).await,
            };
            match submitted {
                Ok((stored, None)) => stored,
                // Line protocol: the valid lines are stored, the message
                // (with the refused lines' numbers) dead-lettered.
                Ok((stored, Some(u))) | Err(Submit::Unusable(u, stored)) => {
                    shared.stats.unusable.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.rejected(Source::Mqtt, u.kind, u.readings);
                    drops.log(&publish.topic, &u.reason);
                    dead_letter(&shared, &publish, &u.reason).await;
                    stored
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

async fn submit(shared: &Shared, publish: &Publish) -> Result<Submitted, Submit> {
    let settings = &shared.settings;
    let unusable = |u| Submit::Unusable(u, None);
    check_size(shared, publish)?;
    let line_protocol = settings
        .line_protocol()
        .is_some_and(|filter| rumqttc::matches(&publish.topic, filter));
    let implied = if line_protocol {
        None
    } else {
        Some(parse_topic(&settings.topic_prefix, &publish.topic).map_err(unusable)?)
    };
    loop {
        let ctx = shared
            .ingest
            .decode_context(OffsetDateTime::now_utc().unix_timestamp());
        let arena = Bump::new();
        let (readings, refused) = match implied {
            Some(implied) => {
                let readings = decode_payload(&publish.payload, implied, &ctx).map_err(|e| {
                    let (kind, readings) = e.rejection();
                    unusable(Unusable {
                        reason: describe(&e),
                        kind,
                        readings,
                    })
                })?;
                (readings, None)
            }
            None => line_protocol_readings(shared, &publish.payload, &ctx, &arena)?,
        };
        if readings.is_empty() {
            return match refused {
                Some(u) => Err(unusable(u)),
                None => Ok((None, None)),
            };
        }
        let n = readings.len();
        match shared.intake.submit(readings, Wait::Safe) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                return Ok((Some(ack), refused));
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

/// A line-protocol payload's readings (timestamps in nanoseconds, as
/// Telegraf sends them), its tags offered as labels, and its refused lines.
fn line_protocol_readings<'a>(
    shared: &Shared,
    payload: &'a [u8],
    ctx: &DecodeContext,
    arena: &'a Bump,
) -> Result<(Vec<Reading<'a>>, Option<Unusable>), Submit> {
    let lp = &shared.line_protocol;
    let mut decoded = decode(
        payload,
        Precision::Nanoseconds,
        ctx,
        &lp.settings.sensor_tags,
        arena,
    )
    .map_err(|e| Submit::Unusable(Unusable::new(Rejection::TooLarge, e.to_string()), None))?;
    lp.labels.offer(&decoded.labels);
    shared
        .metrics
        .line_protocol_strings
        .inc_by(decoded.strings as u64);
    let refused = (decoded.refused > 0).then(|| Unusable {
        reason: decoded.partial_write_message(),
        kind: Rejection::Invalid,
        readings: decoded.refused,
    });
    Ok((decoded.take_grouped(), refused))
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
    let Some(topic) = shared.settings.dead_letters() else {
        return;
    };
    let text = std::str::from_utf8(&publish.payload).ok();
    let letter = DeadLetter {
        topic: &publish.topic,
        reason,
        payload: text,
        payload_base64: text.is_none().then(|| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(&publish.payload)
        }),
    };
    let Ok(body) = serde_json::to_vec(&letter) else {
        return;
    };
    if let Err(e) = shared
        .client
        .publish(topic, QoS::AtLeastOnce, false, body)
        .await
    {
        warn!(error = %e, "Could not queue a dead letter.");
    }
}
