//! MQTT ingestion with at-least-once delivery.
//!
//! Three tasks, so the rumqttc event loop is polled continuously:
//! - the **event loop** task polls the connection, re-subscribes when the
//!   broker lost the session, backs off after errors, and forwards publishes;
//! - the **processor** decodes each message and submits its readings to the
//!   batcher (waiting for room when the batcher is full: MQTT pauses, the
//!   broker keeps the backlog), and hands unusable ones to the dead-letter path;
//! - the **acker** sends each PUBACK, in arrival order, only once the message's
//!   readings are stored.
//!
//! A crash before the PUBACK means the broker delivers again; last-write-wins
//! buckets make that harmless.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Packet, Publish, QoS,
};
use serde::Serialize;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::decode::{DecodeContext, Implied, decode_payload};
use crate::batcher::driver::{BatcherHandle, FlushResult, NotStored, SubmitError};
use crate::config::{ConfigError, IngestSettings, MqttSettings};
use crate::domain::{MetricName, SensorId, TimeWindow};
use crate::telemetry::metrics::{Metrics, Rejection, Source};

/// Requests rumqttc may queue from the client handles (acks, subscribes).
const REQUEST_CAPACITY: usize = 4096;
/// Publishes between the event loop and the processor. The broker's in-flight
/// window bounds how many can be outstanding, so this rarely fills.
const PUBLISH_QUEUE: usize = 16_384;
/// How long the processor waits before offering to a full batcher again.
const FULL_RETRY: Duration = Duration::from_millis(50);
/// Slack over the payload limit for the topic and packet header.
const PACKET_OVERHEAD: usize = 64 * 1024;
/// At most one "unusable message" warning per this interval; the rest are counted.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("reading {what} {path}: {source}")]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, MqttError> {
    std::fs::read(path).map_err(|source| MqttError::File {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The client options for `settings`: persistent session, manual acks, TLS
/// and credentials as configured.
pub fn mqtt_options(settings: &MqttSettings) -> Result<MqttOptions, MqttError> {
    let (host, port) = settings.host_port()?;
    let mut options = MqttOptions::new(settings.client_id.clone(), host, port);
    options
        .set_keep_alive(settings.keep_alive)
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_max_packet_size(
            settings.max_payload_bytes + PACKET_OVERHEAD,
            settings.max_payload_bytes + PACKET_OVERHEAD,
        )
        .set_request_channel_capacity(REQUEST_CAPACITY);
    if let Some(user) = &settings.username {
        use secrecy::ExposeSecret;
        let password = settings
            .password
            .as_ref()
            .map(|p| p.expose_secret().to_owned())
            .unwrap_or_default();
        options.set_credentials(user.clone(), password);
    }
    if settings.uses_tls() {
        // rustls needs a process-wide crypto provider; ring is the one we ship.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = &settings.tls;
        let ca = match &tls.ca_file {
            Some(path) => read("mqtt.tls.ca_file", path)?,
            None => Vec::new(),
        };
        let client_auth = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => Some((
                read("mqtt.tls.client_cert_file", cert)?,
                read("mqtt.tls.client_key_file", key)?,
            )),
            _ => None,
        };
        options.set_transport(rumqttc::Transport::tls(ca, client_auth, None));
    }
    Ok(options)
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

/// Why a message could not be used, and how it counts.
#[derive(Debug, Clone)]
pub struct Unusable {
    reason: String,
    kind: Rejection,
    readings: usize,
}

fn unusable(kind: Rejection, reason: impl Into<String>) -> Unusable {
    Unusable {
        reason: reason.into(),
        kind,
        readings: 1,
    }
}

/// Splits `{prefix}/{sensor}` or `{prefix}/{sensor}/{metric}`.
pub fn parse_topic<'a>(prefix: &str, topic: &'a str) -> Result<Implied<'a>, Unusable> {
    let rest = topic
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| unusable(Rejection::Topic, format!("topic is not under {prefix}/")))?;
    let mut parts = rest.split('/');
    let sensor = parts.next().unwrap_or_default();
    let metric = parts.next();
    if parts.next().is_some() {
        return Err(unusable(
            Rejection::Topic,
            "topic must be {prefix}/{sensor} or {prefix}/{sensor}/{metric}",
        ));
    }
    SensorId::parse(sensor).map_err(|e| unusable(Rejection::Topic, format!("topic: {e}")))?;
    if let Some(m) = metric {
        MetricName::parse(m).map_err(|e| unusable(Rejection::Topic, format!("topic: {e}")))?;
    }
    Ok(Implied {
        sensor: Some(sensor),
        metric,
    })
}

/// A message on its way to its acknowledgement.
struct Pending {
    publish: Publish,
    /// The connection it arrived on: a PUBACK only means something there.
    epoch: u64,
    /// Resolves when its readings are stored; `None` for a message that is
    /// acknowledged without storing anything (unusable, or no readings).
    stored: Option<oneshot::Receiver<FlushResult>>,
}

struct Shared {
    settings: MqttSettings,
    ingest: IngestSettings,
    batcher: BatcherHandle,
    client: AsyncClient,
    stats: Arc<MqttStats>,
    metrics: Arc<Metrics>,
    epoch: AtomicU64,
    unacked: AtomicUsize,
}

/// The running ingestor.
pub struct MqttIngest {
    stop: CancellationToken,
    finish: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl MqttIngest {
    /// Connects (in the background: the event loop dials and redials) and
    /// starts consuming.
    pub fn start(
        settings: &MqttSettings,
        ingest: &IngestSettings,
        batcher: BatcherHandle,
        stats: Arc<MqttStats>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, MqttError> {
        let options = mqtt_options(settings)?;
        let (client, eventloop) = AsyncClient::new(options, REQUEST_CAPACITY);
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            ingest: ingest.clone(),
            batcher,
            client,
            stats: stats.clone(),
            metrics,
            epoch: AtomicU64::new(0),
            unacked: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        let finish = CancellationToken::new();
        let (publish_tx, publish_rx) = mpsc::channel(PUBLISH_QUEUE);
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let tasks = vec![
            tokio::spawn(event_loop(
                shared.clone(),
                eventloop,
                publish_tx,
                finish.clone(),
            )),
            tokio::spawn(process(shared.clone(), publish_rx, ack_tx, stop.clone())),
            tokio::spawn(acknowledge(shared, ack_rx)),
        ];
        Ok(Self {
            stop,
            finish,
            tasks,
        })
    }

    /// Cancelling it stops reading new messages. Those received but not yet
    /// submitted stay unacknowledged and come again after a restart.
    pub fn stop_handle(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// After the batcher has drained: sends the outstanding acknowledgements,
    /// disconnects and waits for the tasks, for at most `timeout`.
    pub async fn finish(self, timeout: Duration) {
        self.stop.cancel();
        let [event_loop, processor, acker]: [JoinHandle<()>; 3] = match self.tasks.try_into() {
            Ok(tasks) => tasks,
            Err(_) => return,
        };
        let _ = processor.await;
        // The acker ends once every pending message is resolved and acked.
        if tokio::time::timeout(timeout, acker).await.is_err() {
            warn!(
                "Not every MQTT acknowledgement was sent before the shutdown deadline; the broker will deliver those messages again."
            );
        }
        self.finish.cancel();
        let _ = tokio::time::timeout(timeout, event_loop).await;
    }
}

fn subscription(settings: &MqttSettings) -> String {
    let topic = format!("{}/#", settings.topic_prefix);
    match &settings.shared_group {
        Some(group) => format!("$share/{group}/{topic}"),
        None => topic,
    }
}

async fn event_loop(
    shared: Arc<Shared>,
    mut eventloop: EventLoop,
    publishes: mpsc::Sender<(u64, Publish)>,
    finish: CancellationToken,
) {
    let settings = &shared.settings;
    let mut failures: u32 = 0;
    loop {
        let event = tokio::select! {
            event = eventloop.poll() => event,
            _ = finish.cancelled() => break,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) if ack.code == ConnectReturnCode::Success => {
                failures = 0;
                let epoch = shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
                shared.stats.connected.store(true, Ordering::Release);
                shared.stats.connections.fetch_add(1, Ordering::Relaxed);
                shared.metrics.mqtt_connections.inc();
                info!(
                    session_present = ack.session_present,
                    epoch, "Connected to the MQTT broker."
                );
                shared
                    .stats
                    .subscribed
                    .store(ack.session_present, Ordering::Release);
                if !ack.session_present {
                    // A new session has no subscriptions: the broker forgot ours.
                    let topic = subscription(settings);
                    if let Err(e) = shared.client.try_subscribe(topic.clone(), QoS::AtLeastOnce) {
                        error!(error = %e, topic, "Could not queue the MQTT subscription.");
                    }
                }
            }
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                warn!(code = ?ack.code, "The MQTT broker refused the connection.");
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                shared.stats.received.fetch_add(1, Ordering::Relaxed);
                let epoch = shared.epoch.load(Ordering::Acquire);
                // Only blocks if the processor is far behind; the broker's
                // in-flight window normally keeps this queue short.
                if publishes.send((epoch, publish)).await.is_err() {
                    debug!("The MQTT processor has stopped; leaving the message to the broker.");
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                shared.stats.subscribed.store(true, Ordering::Release);
                info!(return_codes = ?ack.return_codes, "Subscribed to MQTT topics.");
            }
            Ok(_) => {}
            Err(e) => {
                shared.stats.connected.store(false, Ordering::Release);
                shared.stats.subscribed.store(false, Ordering::Release);
                failures = failures.saturating_add(1);
                let delay = backoff(settings.reconnect_min, settings.reconnect_max, failures);
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "The MQTT connection failed; reconnecting.");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = finish.cancelled() => break,
                }
            }
        }
    }
    if shared.stats.connected.load(Ordering::Acquire) {
        let _ = shared.client.try_disconnect();
        // Let the DISCONNECT (and any last acks) go out.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while eventloop.poll().await.is_ok() {}
        })
        .await;
    }
    shared.stats.connected.store(false, Ordering::Release);
}

fn backoff(min: Duration, max: Duration, failures: u32) -> Duration {
    let exp = min
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(max);
    // Full jitter between half and all of it, so restarted fleets spread out.
    exp / 2 + (exp / 2).mul_f64(rand::random::<f64>())
}

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

#[derive(Serialize)]
struct DeadLetter<'a> {
    topic: &'a str,
    reason: &'a str,
    payload: std::borrow::Cow<'a, str>,
}

async fn process(
    shared: Arc<Shared>,
    mut publishes: mpsc::Receiver<(u64, Publish)>,
    acks: mpsc::UnboundedSender<Pending>,
    stop: CancellationToken,
) {
    let mut drops = DropLog {
        last: None,
        suppressed: 0,
    };
    let flush_at = (shared.settings.max_unacked / 2).max(1);
    loop {
        let (epoch, publish) = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            next = publishes.recv() => match next {
                Some(next) => next,
                None => break,
            },
        };
        let stored = match submit(&shared, &publish, &stop).await {
            Ok(stored) => stored,
            Err(Submit::Unusable(u)) => {
                shared.stats.unusable.fetch_add(1, Ordering::Relaxed);
                shared.metrics.rejected(Source::Mqtt, u.kind, u.readings);
                drops.log(&publish.topic, &u.reason);
                dead_letter(&shared, &publish, &u.reason).await;
                None
            }
            // Shutting down: leave this message (and the rest) to the broker.
            Err(Submit::Stopped) => break,
        };
        shared.unacked.fetch_add(1, Ordering::AcqRel);
        if acks
            .send(Pending {
                publish,
                epoch,
                stored,
            })
            .is_err()
        {
            break;
        }
        // Acks wait for the flush: with much of the broker's window waiting,
        // flush now instead of letting the window cap throughput.
        if shared.unacked.load(Ordering::Acquire) >= flush_at {
            shared.batcher.flush_soon();
        }
    }
}

enum Submit {
    Unusable(Unusable),
    Stopped,
}

async fn submit(
    shared: &Shared,
    publish: &Publish,
    stop: &CancellationToken,
) -> Result<Option<oneshot::Receiver<FlushResult>>, Submit> {
    let settings = &shared.settings;
    if publish.payload.len() > settings.max_payload_bytes {
        return Err(Submit::Unusable(unusable(
            Rejection::TooLarge,
            format!(
                "payload of {} bytes is over mqtt.max_payload_bytes ({})",
                publish.payload.len(),
                settings.max_payload_bytes
            ),
        )));
    }
    let implied = parse_topic(&settings.topic_prefix, &publish.topic).map_err(Submit::Unusable)?;
    let ctx = DecodeContext {
        now: OffsetDateTime::now_utc().unix_timestamp(),
        window: TimeWindow {
            max_age: shared.ingest.max_age,
            max_future: shared.ingest.max_future,
        },
        max_readings: shared.ingest.max_readings_per_request,
    };
    loop {
        let readings = decode_payload(&publish.payload, implied, &ctx).map_err(|e| {
            let (kind, readings) = e.rejection();
            Submit::Unusable(Unusable {
                reason: describe(&e),
                kind,
                readings,
            })
        })?;
        if readings.is_empty() {
            return Ok(None);
        }
        let n = readings.len();
        match shared.batcher.submit(readings, true) {
            Ok(stored) => {
                shared.metrics.received(Source::Mqtt, n);
                return Ok(stored);
            }
            Err(SubmitError::Closed) => return Err(Submit::Stopped),
            Err(SubmitError::Full(_)) => {
                // Pause consuming: unacknowledged messages hold the broker's
                // window, so it stops sending and keeps the backlog.
                tokio::select! {
                    _ = tokio::time::sleep(FULL_RETRY) => {}
                    _ = stop.cancelled() => return Err(Submit::Stopped),
                }
            }
        }
    }
}

fn describe(e: &super::decode::DecodeError) -> String {
    use super::decode::DecodeError;
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
    let Some(topic) = &shared.settings.dead_letter_topic else {
        return;
    };
    let letter = DeadLetter {
        topic: &publish.topic,
        reason,
        payload: String::from_utf8_lossy(&publish.payload),
    };
    let Ok(body) = serde_json::to_vec(&letter) else {
        return;
    };
    if let Err(e) = shared
        .client
        .publish(topic.clone(), QoS::AtLeastOnce, false, body)
        .await
    {
        warn!(error = %e, "Could not queue a dead letter.");
    }
}

async fn acknowledge(shared: Arc<Shared>, mut pending: mpsc::UnboundedReceiver<Pending>) {
    // In arrival order, as MQTT 3.1.1 asks of QoS 1 acknowledgements; batches
    // complete in order, so waiting on the oldest first costs nothing.
    while let Some(p) = pending.recv().await {
        let outcome = match p.stored {
            Some(stored) => stored.await.unwrap_or(Err(NotStored::Shutdown)),
            None => Ok(()),
        };
        shared.unacked.fetch_sub(1, Ordering::AcqRel);
        match outcome {
            Ok(()) | Err(NotStored::Rejected) => {
                // A refused batch was logged at ERROR by the driver; holding the
                // message would only block the broker's window for good.
                if p.epoch != shared.epoch.load(Ordering::Acquire) {
                    // Its connection is gone: the broker delivers it again on
                    // this one, and that copy gets the acknowledgement.
                    continue;
                }
                if let Err(e) = shared.client.ack(&p.publish).await {
                    warn!(error = %e, "Could not queue an MQTT acknowledgement; the broker will deliver the message again.");
                } else {
                    shared.stats.acked.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.mqtt_acks.inc();
                }
            }
            // Not stored: no acknowledgement, so the broker delivers it again.
            Err(NotStored::Shutdown) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_the_sensor_and_maybe_the_metric() {
        let t = parse_topic("sensors", "sensors/s1/temp").expect("valid");
        assert_eq!((t.sensor, t.metric), (Some("s1"), Some("temp")));
        let t = parse_topic("a/b", "a/b/s1").expect("valid");
        assert_eq!((t.sensor, t.metric), (Some("s1"), None));
        for bad in [
            "sensors",
            "sensors/",
            "other/s1",
            "sensors/s1/temp/x",
            "sensors/s$/t",
            "sensors/s1/a.b",
            "sensorss1",
        ] {
            assert!(parse_topic("sensors", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_carry_the_session_tls_and_credentials() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, b"ca-bytes").expect("write");
        let mut s = MqttSettings {
            url: "mqtt://broker:1883".into(),
            ..MqttSettings::default()
        };
        let o = mqtt_options(&s).expect("options");
        assert!(!o.clean_session() && o.manual_acks());
        assert!(matches!(o.transport(), rumqttc::Transport::Tcp));
        s.url = "mqtts://broker:8883".into();
        s.tls.ca_file = Some(ca.clone());
        s.username = Some("hg".into());
        s.password = Some("pw".into());
        let o = mqtt_options(&s).expect("options");
        assert!(matches!(o.transport(), rumqttc::Transport::Tls(_)));
        let login = o.credentials().expect("credentials");
        assert_eq!(
            (login.username.as_str(), login.password.as_str()),
            ("hg", "pw")
        );
        s.tls.ca_file = Some(dir.path().join("missing.pem"));
        let err = mqtt_options(&s).expect_err("missing CA").to_string();
        assert!(err.contains("mqtt.tls.ca_file"), "{err}");
    }

    #[test]
    fn shared_groups_subscribe_through_share() {
        let mut s = MqttSettings::default();
        assert_eq!(subscription(&s), "sensors/#");
        s.shared_group = Some("hg".into());
        assert_eq!(subscription(&s), "$share/hg/sensors/#");
    }

    #[test]
    fn reconnect_backoff_grows_and_stays_capped() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(5));
        for failures in 1..40 {
            let d = backoff(min, max, failures);
            assert!(d >= min / 2 && d <= max, "{failures}: {d:?}");
        }
        assert!(backoff(min, max, 30) >= max / 2);
    }
}
