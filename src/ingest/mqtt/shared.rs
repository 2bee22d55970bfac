//! What the ingestor's tasks share: the settings and collaborators, the
//! counters, and how an unusable message counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use rumqttc::AsyncClient;
use tokio_util::sync::CancellationToken;

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
    pub(super) client: AsyncClient,
    pub(super) stats: Arc<MqttStats>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: Shutdown,
    /// The acker has sent everything it will: the connection may close.
    pub(super) acker_done: CancellationToken,
    pub(super) epoch: AtomicU64,
    pub(super) unacked: AtomicUsize,
    /// The Sparkplug STATE timestamp of this run (Will and birth share it).
    pub(super) state_ms: u64,
    pub(super) births: Option<Arc<dyn crate::ingest::sparkplug::BirthBook>>,
}
