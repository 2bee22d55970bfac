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
mod letters;
mod processor;
mod protocol;
mod queue;
mod settings;
mod shared;
mod sparkplug;
mod topics;
mod version;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rumqttc::AsyncClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub use error::MqttError;
pub use settings::{Protocol, Settings};
use shared::Shared;
pub use shared::{LineProtocol, MqttStats};
pub use topics::parse_topic;

use crate::journal::Intake;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// How long past the shutdown deadline MQTT's tasks may take to end.
const FINISH_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// The running ingestor.
pub struct MqttIngest {
    tasks: Vec<JoinHandle<()>>,
    acker_done: CancellationToken,
    shutdown: Shutdown,
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
        // Long: the receiving connection, the letters' own, what the tasks
        // share, each route's series at zero, then the four tasks.
        let state_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let normal_limit = settings.max_payload_bytes + settings::PACKET_OVERHEAD;
        let (client, eventloop) = connection::open(
            settings,
            state_ms,
            version::Choice::new(settings.protocol).version(),
            normal_limit,
        )?;
        // Dead letters go over a connection of their own (no session state
        // shared with the one that receives; no Will), in 3.1.1, which
        // every broker speaks: it only publishes.
        let mut own = settings.clone();
        own.client_id = format!("{}-letters", settings.client_id);
        let (letters, post) = AsyncClient::new(
            protocol::options_311(&own, None, connection::REQUEST_CAPACITY, normal_limit)?,
            letters::capacity(settings),
        );
        let acker_done = CancellationToken::new();
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            ingest: ingest.clone(),
            line_protocol,
            intake,
            client: std::sync::RwLock::new(client),
            stats,
            metrics,
            shutdown: shutdown.clone(),
            acker_done: acker_done.clone(),
            epoch: AtomicU64::new(0),
            unacked: AtomicUsize::new(0),
            letters: letters.clone(),
            left_on: AtomicU64::new(0),
            state_ms,
            births,
            routes: crate::ingest::routes::compile(&settings.routes).map_err(|e| {
                crate::settings::invalid_at(format!("mqtt.routes[{}].{}", e.index, e.key), e.reason)
            })?,
        });
        // Each route's series from the start, at zero.
        for route in &shared.routes {
            for outcome in ["stored", "ignored", "dead_lettered"] {
                shared
                    .metrics
                    .mqtt_route_messages
                    .with_label_values(&[route.name.as_str(), outcome]);
            }
        }
        shared
            .stats
            .keep_alive_ms
            .store(settings.keep_alive.as_millis() as u64, Ordering::Release);
        shared.stats.heard();
        let (publish_tx, publish_rx) = queue::queue(settings.max_queued_bytes);
        // Bounded by the broker's window: a full channel pauses the processor.
        let (ack_tx, ack_rx) = mpsc::channel(settings.max_unacked.max(1));
        let tasks = vec![
            tokio::spawn(connection::event_loop(
                shared.clone(),
                eventloop,
                publish_tx,
            )),
            tokio::spawn(processor::process(shared.clone(), publish_rx, ack_tx)),
            tokio::spawn(acks::acknowledge(shared.clone(), ack_rx)),
            tokio::spawn(letters::post_office(shared, post, letters)),
        ];
        Ok(Self {
            tasks,
            acker_done,
            shutdown,
        })
    }

    /// After the shutdown started and the batcher drained: sends the
    /// outstanding acknowledgements, disconnects and waits for the tasks, all
    /// within the shutdown deadline (a task still running a moment after it
    /// is stopped where it is: whatever it holds is not acknowledged, so
    /// the broker delivers it again).
    pub async fn finish(self) {
        let aborts: Vec<_> = self.tasks.iter().map(JoinHandle::abort_handle).collect();
        let [event_loop, processor, acker, post_office]: [JoinHandle<()>; 4] =
            match self.tasks.try_into() {
                Ok(tasks) => tasks,
                Err(_) => return,
            };
        let acker_done = self.acker_done;
        let ordered = async move {
            let _ = processor.await;
            // The acker ends once every pending message is settled and
            // acked, or at the deadline.
            let _ = acker.await;
            acker_done.cancel();
            let _ = event_loop.await;
            let _ = post_office.await;
        };
        tokio::select! {
            _ = ordered => {}
            _ = async {
                self.shutdown.deadline_passed().await;
                tokio::time::sleep(FINISH_GRACE).await;
            } => {
                warn!("MQTT ingestion was still busy at the shutdown deadline; it is stopped where it is, and the broker delivers what was not acknowledged again.");
                for task in aborts {
                    task.abort();
                }
            }
        }
    }
}
