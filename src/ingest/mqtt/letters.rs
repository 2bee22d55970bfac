//! Dead letters: each unusable message republished on
//! `mqtt.dead_letter_topic`, and the outbox that hands them to rumqttc
//! without ever waiting on its request queue (the event loop that drains
//! that queue may be waiting for the processor: see [`super::queue`]).
//!
//! Letters wait in the outbox, bounded in bytes, and go to rumqttc a few at
//! a time, as many as it has sent on (the event loop counts what leaves).
//! When the outbox is full, a QoS 0 message's letter is dropped and counted
//! (nothing was acknowledged); a QoS 1 message is left unacknowledged
//! instead, so the broker delivers it again and nothing is lost.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use rumqttc::QoS;
use serde::Serialize;
use tracing::warn;

use super::shared::Shared;

/// Letters handed to rumqttc and not yet seen leaving by the event loop:
/// what its request queue holds of ours, at most this many.
pub(super) const MAX_HANDED: usize = 32;

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

/// What became of a message's letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Posted {
    /// In the outbox (or no dead-letter topic is configured).
    Kept,
    /// No room: the message must not be acknowledged.
    NoRoom,
}

/// Letters waiting for rumqttc, at most `max_bytes` of them.
pub(super) struct Outbox {
    letters: VecDeque<(String, Vec<u8>)>,
    bytes: usize,
    max_bytes: usize,
}

impl Outbox {
    pub(super) fn new(max_bytes: usize) -> Self {
        Self {
            letters: VecDeque::new(),
            bytes: 0,
            max_bytes,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }

    /// The letter for a message on `topic` with `payload`, unusable for
    /// `reason`, kept to be published (then handed on at once if rumqttc
    /// has room).
    pub(super) fn post(
        &mut self,
        shared: &Shared,
        (topic, payload, qos): (&str, &[u8], QoS),
        reason: &str,
    ) -> Posted {
        let Some(to) = shared.settings.dead_letters() else {
            return Posted::Kept;
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
            return Posted::Kept;
        };
        let n = body.len().saturating_add(to.len());
        if !self.letters.is_empty() && self.bytes.saturating_add(n) > self.max_bytes {
            if qos == QoS::AtMostOnce {
                shared.metrics.mqtt_dropped("dead_letter_backlog");
                return Posted::Kept;
            }
            return Posted::NoRoom;
        }
        self.bytes += n;
        self.letters.push_back((to.to_owned(), body));
        self.hand_on(shared);
        Posted::Kept
    }

    /// Hands letters to rumqttc while it has room for them: never waits.
    pub(super) fn hand_on(&mut self, shared: &Shared) {
        while shared.letters_handed.load(Ordering::Acquire) < MAX_HANDED {
            let Some((to, body)) = self.letters.pop_front() else {
                return;
            };
            let n = body.len().saturating_add(to.len());
            match shared
                .client
                .try_publish(to.as_str(), QoS::AtLeastOnce, false, body)
            {
                Ok(()) => {
                    self.bytes = self.bytes.saturating_sub(n);
                    shared.letters_handed.fetch_add(1, Ordering::AcqRel);
                }
                Err(rumqttc::ClientError::TryRequest(rumqttc::Request::Publish(p))) => {
                    // Full (or closed at shutdown): it waits here.
                    self.letters.push_front((to, p.payload.to_vec()));
                    return;
                }
                Err(e) => {
                    self.bytes = self.bytes.saturating_sub(n);
                    warn!(error = %e, "Could not queue a dead letter.");
                }
            }
        }
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
