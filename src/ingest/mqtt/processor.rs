//! The processor: decodes each message and submits its readings to the
//! journal, or to the batcher when the journal is off (waiting for room when
//! either is full: MQTT pauses, the broker keeps the backlog), and hands
//! unusable ones to the dead-letter topic.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rumqttc::{Publish, QoS};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::acks::Pending;
use super::intake::{FULL_RETRY, Submit, Submitted, check_size};
use super::shared::{Shared, Unusable};
use super::sparkplug;
use super::topics::parse_topic;
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
    /// Set when only the payload's start is kept: its length and SHA-256.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_sha256: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// The length of `text` as a JSON string's contents: a control character
/// escapes to six bytes, so such text may be longer than its base64.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// What a truncated letter keeps of the payload.
const EXCERPT_BYTES: usize = 1024;

/// The body of a dead letter for `payload`, at most `max` bytes: the whole
/// payload in its shorter form (text, or base64 when that is shorter or the
/// payload is not UTF-8, so it can be published again byte for byte), or
/// when that is too long its first KiB with its length and SHA-256. `None`
/// when even that does not fit (a topic of nearly `max` bytes).
pub(super) fn letter_body(
    topic: &str,
    reason: &str,
    payload: &[u8],
    max: usize,
) -> Option<Vec<u8>> {
    use base64::Engine;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let base64_len = payload.len().div_ceil(3).saturating_mul(4);
    let text = std::str::from_utf8(payload).ok();
    let escaped = text.map(escaped_len);
    // Only encode what can fit: a letter is larger than its payload's
    // shorter encoding.
    if escaped.unwrap_or(base64_len).min(base64_len) < max {
        let as_text = text.filter(|_| escaped.is_some_and(|e| e <= base64_len));
        let whole = DeadLetter {
            topic,
            reason,
            payload: as_text,
            payload_base64: as_text.is_none().then(|| encode(payload)),
            payload_bytes: None,
            payload_sha256: None,
            truncated: false,
        };
        let body = serde_json::to_vec(&whole).ok()?;
        if body.len() <= max {
            return Some(body);
        }
    }
    use sha2::Digest;
    let mut cut = payload.len().min(EXCERPT_BYTES);
    let excerpt_text = match text {
        Some(t) => {
            while !t.is_char_boundary(cut) {
                cut -= 1;
            }
            Some(&t[..cut]).filter(|e| escaped_len(e) <= cut.div_ceil(3) * 4)
        }
        None => None,
    };
    let letter = DeadLetter {
        topic,
        reason,
        payload: excerpt_text,
        payload_base64: excerpt_text.is_none().then(|| encode(&payload[..cut])),
        payload_bytes: Some(payload.len()),
        payload_sha256: Some(hex::encode(sha2::Sha256::digest(payload))),
        truncated: true,
    };
    serde_json::to_vec(&letter).ok().filter(|b| b.len() <= max)
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
            .decode_context(jiff::Timestamp::now().as_second());
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
        match shared.intake.submit(readings, Wait::Safe, None) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                return Ok((Some(ack), refused));
            }
            Err(IntakeError::Closed) => return Err(Submit::Stopped),
            Err(IntakeError::NewSeries(over)) => return Err(super::intake::new_series(over, n)),
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
    let Some(body) = letter_body(
        &publish.topic,
        reason,
        &publish.payload,
        shared.settings.max_dead_letter_bytes,
    ) else {
        warn!(
            topic_bytes = publish.topic.len(),
            "A dead letter would pass mqtt.max_dead_letter_bytes even without its payload; it is not published."
        );
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

#[cfg(test)]
mod tests {
    use super::letter_body;
    use proptest::prelude::*;
    use serde_json::Value;

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).expect("JSON")
    }

    #[test]
    fn a_letter_that_fits_carries_the_payload_byte_for_byte() {
        let v = parse(&letter_body("s/a/b", "bad JSON", b"{oops", 65_536).expect("fits"));
        assert_eq!(v["payload"], "{oops");
        assert!(v.get("truncated").is_none());
        // Control characters escape to six bytes each: base64 is shorter.
        let ones = vec![1u8; 3000];
        let v = parse(&letter_body("s/a/b", "bad", &ones, 65_536).expect("fits"));
        use base64::Engine;
        let back = base64::engine::general_purpose::STANDARD
            .decode(v["payload_base64"].as_str().expect("base64"))
            .expect("decodes");
        assert_eq!(back, ones);
    }

    #[test]
    fn the_issues_200_000_byte_message_gets_a_short_letter_with_its_digest() {
        let ones = vec![1u8; 200_000];
        let body = letter_body("sensors/a/b", "not JSON", &ones, 65_536).expect("fits");
        assert!(body.len() <= 65_536, "{}", body.len());
        let v = parse(&body);
        assert_eq!(v["truncated"], true);
        assert_eq!(v["payload_bytes"], 200_000);
        use sha2::Digest;
        assert_eq!(
            v["payload_sha256"],
            hex::encode(sha2::Sha256::digest(&ones))
        );
        assert_eq!(v["payload_base64"].as_str().expect("base64").len(), 1368);
    }

    proptest! {
        #[test]
        fn no_letter_passes_its_bound(
            payload in proptest::collection::vec(any::<u8>(), 0..6000),
            topic_len in 0usize..3000,
            max in 1024usize..8192,
        ) {
            let topic = "t".repeat(topic_len);
            if let Some(body) = letter_body(&topic, "reason", &payload, max) {
                prop_assert!(body.len() <= max);
                let v = parse(&body);
                prop_assert_eq!(v["topic"].as_str(), Some(topic.as_str()));
            } else {
                // Only a topic that leaves no room for the excerpt's letter.
                prop_assert!(topic_len + 1024 * 2 > max / 3);
            }
        }
    }
}
