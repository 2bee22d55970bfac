//! Which MQTT version to speak with `mqtt.protocol = "auto"`: a pure core
//! that weighs what each failed attempt said of the broker, and the probe
//! that asks a broker directly.
//!
//! Only an answer falls back to 3.1.1: a CONNACK refusing MQTT 5, or one in
//! 3.1.1's form. A connection closed without an answer says nothing (a
//! broker at its connection limit, a proxy, a restart): anyone able to open
//! connections to the broker could otherwise pin Hourglass to 3.1.1.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::protocol::{ConnError, Verdict, Version};
use super::settings::{Protocol, Settings};

/// The choice under way: the version of the next attempt.
#[derive(Debug)]
pub(super) struct Choice {
    version: Version,
    /// `auto`, until a connection was accepted.
    deciding: bool,
    /// Unanswered MQTT 5 attempts in a row, over TLS (where no probe is
    /// made).
    unanswered: u32,
}

impl Choice {
    pub(super) fn new(protocol: Protocol) -> Self {
        Self {
            version: match protocol {
                Protocol::Auto | Protocol::V5 => Version::V5,
                Protocol::V311 => Version::V311,
            },
            deciding: protocol == Protocol::Auto,
            unanswered: 0,
        }
    }

    pub(super) fn version(&self) -> Version {
        self.version
    }

    /// Whether a failed MQTT 5 attempt is worth a verdict (and its probe).
    pub(super) fn weighs_failures(&self) -> bool {
        self.deciding && self.version == Version::V5
    }

    /// A connection was accepted: its version holds from now on. True when
    /// this settled an `auto` choice.
    pub(super) fn accepted(&mut self) -> bool {
        std::mem::replace(&mut self.deciding, false)
    }

    /// An attempt failed, and `verdict` is what it said (`None` when not
    /// weighed); over `tls` no probe is made, so two unanswered MQTT 5
    /// attempts in a row count as a refusal. Returns the next attempt's
    /// version.
    pub(super) fn failed(&mut self, verdict: Option<Verdict>, tls: bool) -> Version {
        if !self.deciding {
            return self.version;
        }
        match (self.version, verdict) {
            // A 3.1.1 attempt that failed proves nothing either way: MQTT 5
            // is asked again.
            (Version::V311, _) => {
                self.version = Version::V5;
                self.unanswered = 0;
            }
            (Version::V5, Some(Verdict::Speaks311)) => self.version = Version::V311,
            (Version::V5, Some(Verdict::Unanswered)) if tls => {
                self.unanswered += 1;
                if self.unanswered >= 2 {
                    self.version = Version::V311;
                    self.unanswered = 0;
                }
            }
            (Version::V5, _) => self.unanswered = 0,
        }
        self.version
    }
}

/// How long the probe waits to connect and for the answer.
const PROBE_WAIT: Duration = Duration::from_secs(3);

/// What the broker says of MQTT 5 after the attempt failed with `e`.
pub(super) async fn verdict(settings: &Settings, e: &ConnError) -> Verdict {
    if let Some(v) = e.answered() {
        return v;
    }
    if settings.uses_tls() {
        return if e.unreachable() {
            Verdict::Unreachable
        } else {
            Verdict::Unanswered
        };
    }
    probe(settings).await
}

/// An MQTT 5 CONNECT of a throw-away client (clean start, no Will) on a
/// connection of its own; the answer's form tells the version.
async fn probe(settings: &Settings) -> Verdict {
    let Ok((host, port)) = settings.host_port() else {
        return Verdict::Unreachable;
    };
    let dial = tokio::net::TcpStream::connect((host.as_str(), port));
    let Ok(Ok(mut socket)) = tokio::time::timeout(PROBE_WAIT, dial).await else {
        return Verdict::Unreachable;
    };
    // Short, so the packet's length takes one byte.
    let id = format!("hourglass-probe-{}", std::process::id());
    let id = id.as_bytes();
    let mut body: Vec<u8> = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 10, 0];
    body.extend_from_slice(&(id.len() as u16).to_be_bytes());
    body.extend_from_slice(id);
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    let answer = async {
        socket.write_all(&packet).await?;
        let mut buf = [0u8; 4];
        socket.read_exact(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let verdict = match tokio::time::timeout(PROBE_WAIT, answer).await {
        Ok(Ok(head)) => read_connack(head),
        _ => Verdict::Unanswered,
    };
    let _ = socket.shutdown().await;
    verdict
}

/// A CONNACK's first four bytes: 3.1.1's has two bytes after its length,
/// MQTT 5's at least three (its properties' length); an MQTT 5 broker
/// refusing the version says 0x84.
fn read_connack(head: [u8; 4]) -> Verdict {
    match head {
        [0x20, 2, _, _] => Verdict::Speaks311,
        [0x20, _, _, 0x84 | 0x01] => Verdict::Speaks311,
        [0x20, len, _, _] if len >= 3 => Verdict::SpeaksV5,
        _ => Verdict::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_falls_back_and_a_fallback_holds_once_accepted() {
        let mut c = Choice::new(Protocol::Auto);
        assert_eq!(c.version(), Version::V5);
        // Closed without an answer (a broker at its connection limit),
        // unreachable, or answered in MQTT 5: MQTT 5 again, however often.
        for v in [Verdict::Unanswered, Verdict::Unreachable, Verdict::SpeaksV5] {
            for _ in 0..5 {
                assert_eq!(c.failed(Some(v), false), Version::V5);
            }
        }
        assert_eq!(c.failed(Some(Verdict::Speaks311), false), Version::V311);
        // Not yet accepted: a failed 3.1.1 attempt asks MQTT 5 again.
        assert_eq!(c.failed(None, false), Version::V5);
        assert_eq!(c.failed(Some(Verdict::Speaks311), false), Version::V311);
        assert!(c.accepted(), "this settles it");
        assert!(!c.accepted());
        for v in [Verdict::SpeaksV5, Verdict::Unanswered, Verdict::Speaks311] {
            assert_eq!(c.failed(Some(v), false), Version::V311, "held");
        }
    }

    #[test]
    fn over_tls_two_unanswered_attempts_in_a_row_fall_back() {
        let mut c = Choice::new(Protocol::Auto);
        assert_eq!(c.failed(Some(Verdict::Unanswered), true), Version::V5);
        assert_eq!(c.failed(Some(Verdict::Unreachable), true), Version::V5);
        assert_eq!(c.failed(Some(Verdict::Unanswered), true), Version::V5);
        assert_eq!(c.failed(Some(Verdict::Unanswered), true), Version::V311);
    }

    #[test]
    fn an_insisted_version_never_changes() {
        for (p, v) in [(Protocol::V5, Version::V5), (Protocol::V311, Version::V311)] {
            let mut c = Choice::new(p);
            assert!(!c.weighs_failures());
            for verdict in [Verdict::Speaks311, Verdict::SpeaksV5, Verdict::Unanswered] {
                assert_eq!(c.failed(Some(verdict), true), v);
            }
        }
    }

    #[test]
    fn a_connack_tells_its_version_by_its_form() {
        assert_eq!(read_connack([0x20, 2, 0, 1]), Verdict::Speaks311);
        assert_eq!(read_connack([0x20, 2, 0, 0]), Verdict::Speaks311);
        assert_eq!(read_connack([0x20, 3, 0, 0x84]), Verdict::Speaks311);
        assert_eq!(read_connack([0x20, 3, 0, 0x00]), Verdict::SpeaksV5);
        assert_eq!(read_connack([0x20, 9, 0, 0x87]), Verdict::SpeaksV5);
        assert_eq!(read_connack([0x30, 9, 0, 0]), Verdict::Unanswered);
    }
}
