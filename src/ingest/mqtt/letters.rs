//! Dead letters: each unusable message republished on
//! `mqtt.dead_letter_topic`, over a connection of their own (the client id
//! with `-letters`), so no letter waits on the request queue of the event
//! loop that receives messages: that loop may be waiting for the processor
//! (see [`super::queue`]), and the letters' loop waits on no one.
//!
//! A QoS 0 message's letter is offered without waiting, and dropped and
//! counted when the letters' queue is full (nothing was acknowledged); a
//! QoS 1 message's letter waits for room, and the message is acknowledged
//! only after, so nothing is lost and the broker's in-flight window bounds
//! what waits.

use std::time::Duration;

use backon::BackoffBuilder;
use rumqttc::{AsyncClient, ClientError, EventLoop, QoS};
use serde::Serialize;
use tracing::warn;

use super::shared::Shared;
use crate::batcher::driver::retry_policy;

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

/// A letter to publish, or why there is none.
pub(super) enum Letter {
    /// Nothing to publish (no topic, or no letter could be small enough).
    None,
    /// A QoS 0 message's letter: offered without waiting.
    Offer(String, Vec<u8>),
    /// A QoS 1 message's letter: waits for room before the message is
    /// acknowledged.
    Send(String, Vec<u8>),
}

/// The letter for a message on `topic` with `payload`, unusable for
/// `reason`.
pub(super) fn letter(
    shared: &Shared,
    (topic, payload, qos): (&str, &[u8], QoS),
    reason: &str,
) -> Letter {
    let Some(to) = shared.settings.dead_letters() else {
        return Letter::None;
    };
    let Some(body) = letter_body(
        topic,
        reason,
        payload,
        shared.settings.max_dead_letter_bytes,
    ) else {
        warn!(
            topic_bytes = topic.len(),
            "A dead letter would pass mqtt.max_dead_letter_bytes even without its payload; it is not published."
        );
        return Letter::None;
    };
    match qos {
        QoS::AtMostOnce => Letter::Offer(to.to_owned(), body),
        _ => Letter::Send(to.to_owned(), body),
    }
}

/// Offers a QoS 0 message's letter: dropped and counted if the letters'
/// queue is full.
pub(super) fn offer(shared: &Shared, to: String, body: Vec<u8>) {
    match shared
        .letters
        .try_publish(to, QoS::AtLeastOnce, false, body)
    {
        Ok(()) => {}
        Err(ClientError::TryRequest(_)) => shared.metrics.mqtt_dropped("dead_letter_backlog"),
        Err(e) => warn!(error = %e, "Could not queue a dead letter."),
    }
}

/// How long a QoS 1 message's letter may wait for room: the letters'
/// connection may be down while the receiving one is up (a broker that
/// refuses it), and ingestion must not wait on it for ever.
const SEND_WAIT: Duration = Duration::from_secs(5);

/// Sends a QoS 1 message's letter, waiting for room (the letters' loop
/// never waits on the caller) up to [`SEND_WAIT`]. False if it could not be
/// queued: the message is then left for the broker, delivered again later.
pub(super) async fn send(shared: &Shared, to: String, body: Vec<u8>) -> bool {
    let queued = tokio::time::timeout(
        SEND_WAIT,
        shared.letters.publish(to, QoS::AtLeastOnce, false, body),
    )
    .await;
    match queued {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            warn!(error = %e, "Could not queue a dead letter; its message is left for the broker.");
            false
        }
        Err(_) => {
            warn!(
                "The dead letters' connection takes no letters (is the broker refusing it?); a QoS 1 message is left for the broker to deliver again."
            );
            false
        }
    }
}

/// Letters the letters' queue holds: with each at most
/// `mqtt.max_dead_letter_bytes`, about `dead_letter_backlog` bytes.
pub(super) fn capacity(settings: &super::Settings) -> usize {
    (settings.dead_letter_backlog() / settings.max_dead_letter_bytes.max(1)).clamp(16, 4096)
}

/// The letters' connection: publishes what is queued, reconnecting with
/// backoff, until `done` (the acker finished) and the queue is sent, or
/// the shutdown deadline.
pub(super) async fn post_office(
    shared: std::sync::Arc<Shared>,
    mut eventloop: EventLoop,
    client: AsyncClient,
) {
    let settings = &shared.settings;
    let policy = || retry_policy(settings.reconnect_min, settings.reconnect_max).build();
    let mut reconnects = policy();
    loop {
        let event = tokio::select! {
            event = eventloop.poll() => event,
            _ = shared.acker_done.cancelled() => break,
            _ = shared.shutdown.deadline_passed() => return,
        };
        match event {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => reconnects = policy(),
            Ok(_) => {}
            Err(e) => {
                let delay = reconnects.next().unwrap_or(settings.reconnect_max);
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "The dead letters' MQTT connection failed; reconnecting.");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shared.acker_done.cancelled() => break,
                    _ = shared.shutdown.deadline_passed() => return,
                }
            }
        }
    }
    // What is queued goes out, then the DISCONNECT, within a moment.
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while eventloop.poll().await.is_ok() {}
    })
    .await;
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
