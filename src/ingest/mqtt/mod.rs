//! MQTT ingestion with at-least-once delivery.
//!
//! Three tasks, so the rumqttc event loop is polled continuously:
//! - `connection`: the **event loop** polls the connection, re-subscribes
//!   when the broker lost the session or refused the subscription, backs off
//!   after errors, and forwards publishes;
//! - `processor`: decodes each message (JSON, where `topics` names its sensor,
//!   or line protocol on `mqtt.line_protocol_topic`) and
//!   submits its readings (to the journal, or the batcher when it is off), dead-lettering unusable ones;
//! - `sparkplug` drives the Sparkplug B host on the processor's task; both
//!   submit through `intake` (size check, offering readings), so neither
//!   imports the other's internals;
//! - `acks`: sends each PUBACK, in arrival order, only once the message's
//!   readings are settled; its bookkeeping is a pure state machine.
//!
//! A crash before the PUBACK means the broker delivers again; last-write-wins
//! buckets make that harmless.

mod acks;
mod connection;
mod intake;
mod processor;
mod settings;
mod sparkplug;
mod topics;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use rumqttc::AsyncClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use settings::Settings;
pub use topics::parse_topic;

use crate::ingest::line_protocol::LabelSync;
use crate::journal::Intake;
use crate::settings::Invalid;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::{Metrics, Rejection};

/// Publishes between the event loop and the processor. The broker's in-flight
/// window bounds how many can be outstanding, so this rarely fills.
const PUBLISH_QUEUE: usize = 16_384;

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("invalid configuration: {0}")]
    Config(#[from] Invalid),
    #[error("reading {what} {path}: {source}")]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

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
    fn new(kind: Rejection, reason: impl Into<String>) -> Self {
        Unusable {
            reason: reason.into(),
            kind,
            readings: 1,
        }
    }
}

struct Shared {
    settings: Settings,
    ingest: crate::ingest::Settings,
    line_protocol: LineProtocol,
    intake: Intake,
    client: AsyncClient,
    stats: Arc<MqttStats>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
    /// The acker has sent everything it will: the connection may close.
    acker_done: CancellationToken,
    epoch: AtomicU64,
    unacked: AtomicUsize,
    /// The Sparkplug STATE timestamp of this run (Will and birth share it).
    state_ms: u64,
    births: Option<Arc<dyn crate::ingest::sparkplug::BirthBook>>,
}

/// The running ingestor.
pub struct MqttIngest {
    tasks: Vec<JoinHandle<()>>,
    acker_done: CancellationToken,
}

impl MqttIngest {
    /// Connects (in the background: the event loop dials and redials) and
    /// starts consuming until `shutdown`.
    // Each argument is a distinct collaborator the tasks share; a wrapper
    // struct would only rename the list.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        settings: &Settings,
        ingest: &crate::ingest::Settings,
        line_protocol: LineProtocol,
        intake: Intake,
        births: Option<Arc<dyn crate::ingest::sparkplug::BirthBook>>,
        stats: Arc<MqttStats>,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
    ) -> Result<Self, MqttError> {
        let state_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let options = connection::mqtt_options(settings, state_ms)?;
        let (client, eventloop) = AsyncClient::new(options, connection::REQUEST_CAPACITY);
        let acker_done = CancellationToken::new();
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            ingest: ingest.clone(),
            line_protocol,
            intake,
            client,
            stats,
            metrics,
            shutdown,
            acker_done: acker_done.clone(),
            epoch: AtomicU64::new(0),
            unacked: AtomicUsize::new(0),
            state_ms,
            births,
        });
        let (publish_tx, publish_rx) = mpsc::channel(PUBLISH_QUEUE);
        // Bounded by the broker's window: a full channel pauses the processor.
        let (ack_tx, ack_rx) = mpsc::channel(settings.max_unacked.max(1));
        let tasks = vec![
            tokio::spawn(connection::event_loop(
                shared.clone(),
                eventloop,
                publish_tx,
            )),
            tokio::spawn(processor::process(shared.clone(), publish_rx, ack_tx)),
            tokio::spawn(acks::acknowledge(shared, ack_rx)),
        ];
        Ok(Self { tasks, acker_done })
    }

    /// After the shutdown started and the batcher drained: sends the
    /// outstanding acknowledgements, disconnects and waits for the tasks, all
    /// within the shutdown deadline.
    pub async fn finish(self) {
        let [event_loop, processor, acker]: [JoinHandle<()>; 3] = match self.tasks.try_into() {
            Ok(tasks) => tasks,
            Err(_) => return,
        };
        let _ = processor.await;
        // The acker ends once every pending message is settled and acked, or
        // at the deadline.
        let _ = acker.await;
        self.acker_done.cancel();
        let _ = event_loop.await;
    }
}
