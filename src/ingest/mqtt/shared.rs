//! What the ingestor's tasks share: the settings and collaborators, the
//! counters, and how an unusable message counts.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rumqttc::AsyncClient;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::protocol::{Client, Version};
use super::settings::Settings;
use crate::ingest::line_protocol::LabelSync;
use crate::journal::Intake;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::{Metrics, Rejection};

/// Counters an operator (and the tests) can read.
#[derive(Debug, Default)]
pub struct MqttStats {
    pub connected: AtomicBool,
    /// The broker holds our subscription (acknowledged, or kept in the session).
    pub subscribed: AtomicBool,
    pub connections: AtomicU64,
    pub received: AtomicU64,
    pub acked: AtomicU64,
    pub unusable: AtomicU64,
    /// When the event loop last heard from its connection (ms since the
    /// UNIX epoch): a connection whose loop has not been polled for two
    /// keep-alive periods is gone, whatever `connected` says.
    pub last_event_ms: AtomicU64,
    /// `mqtt.keep_alive`, in ms.
    pub keep_alive_ms: AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl MqttStats {
    /// The event loop heard from its connection now.
    pub fn heard(&self) {
        self.last_event_ms.store(now_ms(), Ordering::Release);
    }

    /// Connected, subscribed, and heard from within two keep-alive periods.
    pub fn is_up(&self) -> bool {
        self.connected.load(Ordering::Acquire)
            && self.subscribed.load(Ordering::Acquire)
            && !self.is_silent()
    }

    /// Whether the connection has been silent for over two keep-alive
    /// periods (the broker has dropped it by then).
    pub fn is_silent(&self) -> bool {
        let silent = now_ms().saturating_sub(self.last_event_ms.load(Ordering::Acquire));
        silent > self.keep_alive_ms.load(Ordering::Acquire).saturating_mul(2)
    }
}

/// Logs at most once per second, counting what it left out.
pub(super) struct RateLog {
    message: &'static str,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLog {
    pub(super) fn new(message: &'static str) -> Self {
        Self {
            message,
            last: None,
            suppressed: 0,
        }
    }

    pub(super) fn log(&mut self, topic: &str, reason: &str) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        warn!(
            topic,
            reason,
            suppressed = self.suppressed,
            "{}",
            self.message
        );
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// What line-protocol messages (on `mqtt.line_protocol_topic`) need.
pub struct LineProtocol {
    pub settings: crate::ingest::line_protocol::Settings,
    pub labels: Arc<LabelSync>,
}

/// Why a message could not be used, and how it counts.
#[derive(Debug, Clone)]
pub struct Unusable {
    pub(super) reason: String,
    pub(super) kind: Rejection,
    pub(super) readings: usize,
}

impl Unusable {
    pub(super) fn new(kind: Rejection, reason: impl Into<String>) -> Self {
        Unusable {
            reason: reason.into(),
            kind,
            readings: 1,
        }
    }
}

/// What the three tasks share.
pub(super) struct Shared {
    pub(super) settings: Settings,
    pub(super) ingest: crate::ingest::Settings,
    pub(super) line_protocol: LineProtocol,
    pub(super) intake: Intake,
    /// The receiving connection's client: replaced when `auto` falls back
    /// to 3.1.1 (see [`Shared::client`]).
    pub(super) client: RwLock<Client>,
    pub(super) stats: Arc<MqttStats>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: Shutdown,
    /// The acker has sent everything it will: the connection may close.
    pub(super) acker_done: CancellationToken,
    pub(super) epoch: AtomicU64,
    pub(super) unacked: AtomicUsize,
    /// The dead letters' own connection ([`super::letters`]).
    pub(super) letters: AsyncClient,
    /// The connection (epoch) on which a QoS 1 message was last left
    /// unacknowledged for the broker to deliver again; 0 for none. A broker
    /// delivers it again only on a new connection, so the connection is
    /// renewed ([`super::connection`]): left alone, such messages fill the
    /// broker's in-flight window and delivery stops.
    pub(super) left_on: AtomicU64,
    /// The Sparkplug STATE timestamp of this run (Will and birth share it).
    pub(super) state_ms: u64,
    pub(super) births: Option<Arc<dyn crate::ingest::sparkplug::BirthBook>>,
    /// `[[mqtt.routes]]`, checked, in order.
    pub(super) routes: Vec<crate::ingest::routes::Route>,
}

impl Shared {
    /// The receiving connection's client, as it is now.
    pub(super) fn client(&self) -> Client {
        self.client
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts the client of a new connection in place.
    pub(super) fn set_client(&self, client: Client) {
        *self
            .client
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = client;
    }

    /// The version the connection speaks, for `hourglass_mqtt_protocol`.
    pub(super) fn set_protocol(&self, version: Version) {
        for v in [Version::V5, Version::V311] {
            self.metrics
                .mqtt_protocol
                .with_label_values(&[v.label()])
                .set(i64::from(v == version));
        }
    }
}
