//! The connection: client options, and the event-loop task that polls
//! rumqttc without ever blocking, reconnects with backoff and jitter,
//! subscribes again when the broker lost the session, and retries a
//! subscription the broker refused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use backon::BackoffBuilder;
use rumqttc::{Publish, QoS};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::error::MqttError;
use super::protocol::{self, Client, Connection, Incoming, Version};
use super::queue;
use super::settings::{PACKET_OVERHEAD, Settings};
use super::shared::{RateLog, Shared};
use super::topics::{shared_filter, subscription};
use super::version::{self, Choice};
use crate::batcher::driver::retry_policy;

/// Requests rumqttc may queue from the client handles (acks, subscribes).
pub(super) const REQUEST_CAPACITY: usize = 4096;
/// The largest message a connection is ever raised to take once, to
/// dead-letter it (see [`oversized_incoming`]): past this the broker's copy
/// is left to it (its own max_packet_size should refuse such publishes).
const MAX_TAKEN_ONCE: usize = 64 * 1024 * 1024;
/// How long the last DISCONNECT (and acks before it) may take to go out.
const DISCONNECT_GRACE: Duration = Duration::from_millis(500);
/// How long a connection must hold for the reconnect backoff to start over.
const STABLE: Duration = Duration::from_secs(10);
/// How often the connection looks for messages left for the broker.
const RENEWAL_CHECK: Duration = Duration::from_secs(1);

/// A Sparkplug primary host's STATE payload (the Will says offline, with
/// the timestamp of the connection's birth).
pub(super) fn state_payload(online: bool, timestamp_ms: u64) -> Vec<u8> {
    serde_json::json!({ "online": online, "timestamp": timestamp_ms })
        .to_string()
        .into_bytes()
}

/// A Sparkplug primary host's Will: offline, stamped `state_ms`.
pub(super) fn will(settings: &Settings, state_ms: u64) -> Option<(String, Vec<u8>)> {
    settings
        .sparkplug
        .state_topic()
        .map(|topic| (topic, state_payload(false, state_ms)))
}

/// The receiving client and its connection, speaking `version`;
/// `incoming_limit` raises a 3.1.1 connection's packet limit.
pub(super) fn open(
    settings: &Settings,
    state_ms: u64,
    version: Version,
    incoming_limit: usize,
) -> Result<(Client, Connection), MqttError> {
    protocol::open(
        settings,
        will(settings, state_ms),
        REQUEST_CAPACITY,
        version,
        incoming_limit,
    )
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn subscribe(shared: &Shared) {
    let settings = &shared.settings;
    let group = settings.shared_group.as_deref();
    let mut topics: Vec<String> = shared
        .routes
        .iter()
        .map(|r| shared_filter(&r.pattern.filter(), group))
        .collect();
    topics.push(subscription(&settings.topic_prefix, group));
    if let Some(filter) = settings.line_protocol() {
        topics.push(shared_filter(filter, group));
    }
    if settings.sparkplug.enabled {
        // Per-node `seq` needs every message of a node at one instance: see
        // docs/src/sending/sparkplug.md before sharing a Sparkplug subscription.
        topics.extend(
            settings
                .sparkplug
                .filters()
                .iter()
                .map(|f| shared_filter(f, group)),
        );
    }
    if let Err(e) = shared.client().try_subscribe(&topics) {
        error!(error = %e, ?topics, "Could not queue the MQTT subscription.");
    }
}

/// Hands a received message to the processor. Never waits for a QoS 0
/// message (dropped and counted when the queue is full); a QoS 1 or 2
/// message waits for room, which the processor always makes (it never
/// waits on this task). `false` once shutting down.
async fn forward(
    shared: &Shared,
    publishes: &queue::Sender,
    (epoch, publish): (u64, Publish),
    drops: &mut RateLog,
) -> bool {
    let publish = match publishes.try_send(epoch, publish) {
        Ok(()) => return true,
        Err(publish) => publish,
    };
    if publish.qos == QoS::AtMostOnce {
        shared.metrics.mqtt_dropped("queue_full");
        drops.log(
            &publish.topic,
            "mqtt.max_queued_bytes are waiting to be decoded",
        );
        return true;
    }
    tokio::select! {
        sent = publishes.send(epoch, publish) => {
            if sent.is_err() {
                debug!("The MQTT processor has stopped; leaving the message to the broker.");
            }
            true
        }
        _ = shared.acker_done.cancelled() => false,
        _ = shared.shutdown.deadline_passed() => false,
    }
}

pub(super) async fn event_loop(
    shared: Arc<Shared>,
    mut eventloop: Connection,
    publishes: queue::Sender,
) {
    // Long: the connection's loop: one arm per event rumqttc reports.
    let settings = &shared.settings;
    let mut drops = RateLog::new("Dropped a QoS 0 MQTT message: the queue to the decoder is full.");
    let policy = || retry_policy(settings.reconnect_min, settings.reconnect_max).build();
    let mut reconnects = policy();
    let mut resubscribes = policy();
    let mut resubscribe_at: Option<Instant> = None;
    let acked = shared.shutdown.clone();
    let normal_limit = settings.max_payload_bytes + PACKET_OVERHEAD;
    // The next connection's packet limit: raised to take one oversized
    // message once (3.1.1).
    let mut next_limit = normal_limit;
    let mut choice = Choice::new(settings.protocol);
    // When the connection was accepted: the reconnect backoff starts over
    // only after one that held (a broker that drops each at once, say with
    // a Server Keep Alive of 0, is not redialled at full speed).
    let mut accepted_at: Option<Instant> = None;
    // Messages left for the broker come again only on a new connection:
    // renewed at most this often while it keeps happening (the journal
    // full), with the reconnect backoff's growth. Looked
    // at between events: `poll` is not cancelled for it (cancelled during
    // the handshake, it would open a session it never subscribes).
    let mut redeliveries = policy();
    let mut renew_after = Instant::now();
    let mut look_at = Instant::now() + RENEWAL_CHECK;
    loop {
        if Instant::now() >= look_at {
            look_at = Instant::now() + RENEWAL_CHECK;
            let current = shared.epoch.load(Ordering::Acquire);
            let left = shared.left_on.load(Ordering::Acquire);
            if left == 0 || left != current {
                // Nothing left on this connection: the backoff starts over.
                redeliveries = policy();
            } else if Instant::now() >= renew_after
                && shared.stats.connected.load(Ordering::Acquire)
            {
                shared.left_on.store(0, Ordering::Release);
                shared.metrics.mqtt_renewals.inc();
                info!(
                    "QoS 1 messages were left unacknowledged for the broker to deliver again; renewing the connection so that it does."
                );
                let _ = shared.client().try_disconnect();
                let wait = redeliveries.next().unwrap_or(settings.reconnect_max);
                renew_after = Instant::now() + wait;
            }
        }
        let event = tokio::select! {
            event = eventloop.poll() => event,
            _ = sleep_until(resubscribe_at) => {
                resubscribe_at = None;
                subscribe(&shared);
                continue;
            }
            // Acknowledgements go out until the acker is done (or the deadline).
            _ = shared.acker_done.cancelled() => break,
            _ = acked.deadline_passed() => break,
        };
        if event.is_ok() {
            shared.stats.heard();
        }
        match event {
            Ok(Incoming::ConnAck {
                accepted: true,
                session_present,
                ..
            }) => {
                accepted_at = Some(Instant::now());
                if choice.accepted() {
                    info!(
                        protocol = eventloop.version().label(),
                        "The MQTT broker accepted this version; it is kept until the process restarts."
                    );
                }
                let epoch = shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
                shared.stats.connected.store(true, Ordering::Release);
                shared.stats.connections.fetch_add(1, Ordering::Relaxed);
                shared.metrics.mqtt_connections.inc();
                shared.set_protocol(eventloop.version());
                info!(
                    session_present,
                    epoch,
                    protocol = eventloop.version().label(),
                    "Connected to the MQTT broker."
                );
                // Subscribed again on every connection, kept session or not:
                // the configuration may name filters the session lacks (a
                // route added), and a connection lost before its SUBACK left
                // a session without them. Subscribing is idempotent.
                shared.stats.subscribed.store(false, Ordering::Release);
                subscribe(&shared);
                if let Some(topic) = settings.sparkplug.state_topic() {
                    // Edge nodes hold their data while the primary host is
                    // away and send it as history once it is back.
                    let state = state_payload(true, shared.state_ms);
                    if let Err(e) =
                        shared
                            .client()
                            .try_publish(topic, QoS::AtLeastOnce, true, state)
                    {
                        error!(error = %e, "Could not queue the Sparkplug STATE birth; edge nodes see this host as offline.");
                    }
                }
            }
            Ok(Incoming::ConnAck { code, .. }) => {
                warn!(code, "The MQTT broker refused the connection.");
            }
            Ok(Incoming::Publish(publish)) => {
                shared.stats.received.fetch_add(1, Ordering::Relaxed);
                let epoch = shared.epoch.load(Ordering::Acquire);
                if !forward(&shared, &publishes, (epoch, publish), &mut drops).await {
                    break;
                }
            }
            Ok(Incoming::SubAck {
                refused: true,
                codes,
            }) => {
                shared.stats.subscribed.store(false, Ordering::Release);
                let delay = resubscribes.next().unwrap_or(settings.reconnect_max);
                error!(
                    return_codes = codes,
                    retry_in_ms = delay.as_millis() as u64,
                    "The MQTT broker refused the subscription; nothing is received until it accepts it."
                );
                resubscribe_at = Some(Instant::now() + delay);
            }
            Ok(Incoming::SubAck { codes, .. }) => {
                resubscribes = policy();
                shared.stats.subscribed.store(true, Ordering::Release);
                info!(return_codes = codes, "Subscribed to MQTT topics.");
            }
            Ok(Incoming::Disconnect { reason }) => {
                warn!(reason, "The MQTT broker closed the connection.");
            }
            Ok(Incoming::Other) => {}
            Err(e) => {
                // A new epoch at once: an acknowledgement of this
                // connection's messages queued from now on is dropped, not
                // sent on the next connection.
                shared.epoch.fetch_add(1, Ordering::AcqRel);
                shared.stats.connected.store(false, Ordering::Release);
                shared.stats.subscribed.store(false, Ordering::Release);
                if accepted_at.take().is_some_and(|at| at.elapsed() >= STABLE) {
                    reconnects = policy();
                }
                if let Some(size) = e.oversized() {
                    let limit = size.saturating_add(PACKET_OVERHEAD);
                    if limit <= MAX_TAKEN_ONCE.max(normal_limit) {
                        // Its payload is over mqtt.max_payload_bytes, so the
                        // processor dead-letters and acknowledges it.
                        warn!(
                            bytes = size,
                            "The broker delivered a message larger than mqtt.max_payload_bytes; the next connection takes it once, to dead-letter and acknowledge it."
                        );
                        next_limit = limit;
                    } else {
                        error!(
                            bytes = size,
                            "The broker holds a message too large to take even once; the connection fails until it is removed from the session (lower the broker's max_packet_size)."
                        );
                    }
                }
                let verdict = if choice.weighs_failures() {
                    Some(version::verdict(settings, &e).await)
                } else {
                    None
                };
                let before = choice.version();
                let next = choice.failed(verdict, settings.uses_tls());
                if next != before {
                    info!(error = %e, from = before.label(), to = next.label(), ?verdict,
                        "Changing the MQTT version of the next attempt.");
                }
                // A new client and connection each time: nothing of the
                // failed one's rumqttc state (requests queued for it, the
                // PUBACKs of its messages, topic aliases a broker set) is
                // carried over.
                match open(settings, shared.state_ms, next, next_limit) {
                    Ok((client, connection)) => {
                        shared.set_client(client);
                        eventloop = connection;
                        next_limit = normal_limit;
                    }
                    Err(open_error) => {
                        error!(error = %open_error, "Could not set up the next MQTT connection; the failed one is tried again.");
                    }
                }
                let delay = reconnects.next().unwrap_or(settings.reconnect_max);
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "The MQTT connection failed; reconnecting.");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shared.acker_done.cancelled() => break,
                    _ = acked.deadline_passed() => break,
                }
            }
        }
    }
    if shared.stats.connected.load(Ordering::Acquire) {
        let _ = shared.client().try_disconnect();
        // Let the DISCONNECT (and any last acks) go out.
        let _ = tokio::time::timeout(DISCONNECT_GRACE, async {
            while eventloop.poll().await.is_ok() {}
        })
        .await;
    }
    shared.stats.connected.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_backoff_grows_and_stays_capped() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let delays: Vec<Duration> = retry_policy(min, max).build().take(40).collect();
        assert_eq!(delays.len(), 40, "it never gives up");
        for d in &delays {
            // Jitter adds at most the delay itself.
            assert!(*d >= min && *d <= max * 2, "{d:?}");
        }
        assert!(delays[30] >= max, "it reaches the cap");
    }
}
