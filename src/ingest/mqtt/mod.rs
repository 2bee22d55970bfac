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
mod error;
mod intake;
mod processor;
mod settings;
mod shared;
mod sparkplug;
mod topics;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use rumqttc::AsyncClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use error::MqttError;
pub use settings::Settings;
use shared::Shared;
pub use shared::{LineProtocol, MqttStats};
pub use topics::parse_topic;

use crate::journal::Intake;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// Publishes between the event loop and the processor. The broker's in-flight
/// window bounds how many can be outstanding, so this rarely fills.
const PUBLISH_QUEUE: usize = 16_384;

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
