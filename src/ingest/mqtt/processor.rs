//! The processor: decodes each message and submits its readings to the
//! journal, or to the batcher when the journal is off (waiting for room when
//! either is full: MQTT pauses, the broker keeps the backlog), and hands
//! unusable ones to the dead-letter topic.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rumqttc::{Publish, QoS};
use tokio::sync::mpsc;
use tracing::warn;

use super::acks::Pending;
use super::intake::{FULL_RETRY, Submit, Submitted, check_size};
use super::letters::{self, Letter};
use super::queue;
use super::shared::{RateLog, Shared, Unusable};
use super::sparkplug;
use super::topics::parse_topic;
use bumpalo::Bump;

use crate::domain::{Reading, SensorId, SensorLabels};
use crate::ingest::decode::{DecodeContext, DecodeError, decode_payload};
use crate::ingest::line_protocol::{Precision, decode};
use crate::ingest::routes::{Mapped, Route, map};
use crate::journal::{IntakeError, Wait};
use crate::telemetry::metrics::Rejection;
use crate::telemetry::metrics::Source;

pub(super) async fn process(
    shared: Arc<Shared>,
    mut publishes: queue::Receiver,
    acks: mpsc::Sender<Pending>,
) {
    // Long: the processor's loop: a message's way from decoding to its settlement.
    let mut drops = RateLog::new("Acknowledged and dropped an unusable MQTT message.");
    let flush_at = (shared.settings.max_unacked / 2).max(1);
    let shutdown = shared.shutdown.clone();
    let mut host = sparkplug::host(&shared).await;
    let mut ticks = tokio::time::interval(sparkplug::TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Timers before messages: a backlog of messages must not starve
        // the gap checks (whose state grows until they run).
        let (epoch, publish) = tokio::select! {
            biased;
            _ = shutdown.triggered() => break,
            _ = ticks.tick(), if host.is_some() => {
                if let Some(host) = host.as_mut() {
                    sparkplug::tick(&shared, host);
                }
                continue;
            }
            next = publishes.recv() => match next {
                Some(next) => next,
                None => break,
            },
        };
        let mut letter = Letter::None;
        let stored = if publish.retain && !shared.settings.ingest_retained {
            // Delivered because we subscribed, not because it was published
            // now: its reading was delivered before.
            shared.metrics.mqtt_skipped_retained.inc();
            None
        } else {
            let submitted = match host.as_mut() {
                Some(host) if publish.topic.starts_with("spBv1.0/") => {
                    sparkplug::submit(&shared, host, &publish).await
                }
                _ => submit(&shared, &publish).await,
            };
            match submitted {
                Ok((stored, None)) => stored,
                // Line protocol: the valid lines are stored, the message
                // (with the refused lines' numbers) dead-lettered.
                Ok((stored, Some(u))) | Err(Submit::Unusable(u, stored)) => {
                    shared.stats.unusable.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.rejected(Source::Mqtt, u.kind, u.readings);
                    drops.log(&publish.topic, &u.reason);
                    letter = letters::letter(
                        &shared,
                        (&publish.topic, &publish.payload, publish.qos),
                        &u.reason,
                    );
                    stored
                }
                // Shutting down: leave this message (and the rest) to the broker.
                Err(Submit::Stopped) => break,
            }
        };
        // The letter before the acknowledgement: a QoS 1 message's waits
        // for room on the letters' connection (which waits on no one).
        let mut leave = false;
        match letter {
            Letter::None => {}
            Letter::Offer(to, body) => letters::offer(&shared, to, body),
            Letter::Send(to, body) => {
                tokio::select! {
                    sent = letters::send(&shared, to, body) => leave = !sent,
                    _ = shutdown.triggered() => break,
                }
            }
        }
        if publish.qos == QoS::AtMostOnce {
            continue;
        }
        let pending = Pending {
            pkid: publish.pkid,
            epoch,
            stored,
            leave,
        };
        drop(publish);
        shared.unacked.fetch_add(1, Ordering::AcqRel);
        // Bounded: with the acker behind, this waits, and so does the broker.
        // The acker never waits on this task or the event loop.
        if acks.send(pending).await.is_err() {
            break;
        }
        // Acks wait for the flush: with much of the broker's window waiting,
        // flush now instead of letting the window cap throughput.
        if shared.unacked.load(Ordering::Acquire) >= flush_at {
            shared.intake.flush_soon();
        }
    }
}

async fn submit(shared: &Shared, publish: &Publish) -> Result<Submitted, Submit> {
    let settings = &shared.settings;
    let unusable = |u| Submit::Unusable(u, None);
    // A dead letter delivered back (a subscription an older configuration
    // left in the session): taken and dropped, never dead-lettered again.
    if settings.dead_letters() == Some(publish.topic.as_str()) {
        return Ok((None, None));
    }
    check_size(shared, publish)?;
    let mut caps = Vec::new();
    for route in routes_for(shared, &publish.topic) {
        match route.takes(&publish.topic, &mut caps) {
            None => continue,
            // A topic the route holds no readings on, by design.
            Some(false) => {
                counted(shared, route, "ignored");
                return Ok((None, None));
            }
            Some(true) => return routed(shared, route, &caps, publish).await,
        }
    }
    let line_protocol = settings
        .line_protocol()
        .is_some_and(|filter| rumqttc::matches(&publish.topic, filter));
    let implied = if line_protocol {
        None
    } else {
        Some(parse_topic(&settings.topic_prefix, &publish.topic).map_err(unusable)?)
    };
    loop {
        let ctx = shared
            .ingest
            .decode_context(jiff::Timestamp::now().as_second());
        let arena = Bump::new();
        let (readings, refused, labels) = match implied {
            Some(implied) => {
                let readings = decode_payload(&publish.payload, implied, &ctx).map_err(|e| {
                    let (kind, readings) = e.rejection();
                    unusable(Unusable {
                        reason: describe(&e),
                        kind,
                        readings,
                    })
                })?;
                (readings, None, Vec::new())
            }
            None => line_protocol_readings(shared, &publish.payload, &ctx, &arena)?,
        };
        if readings.is_empty() {
            return match refused {
                Some(u) => Err(unusable(u)),
                None => Ok((None, None)),
            };
        }
        let n = readings.len();
        match shared.intake.submit(readings, Wait::Safe, None) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                // The taken lines' tags, now that their readings passed the
                // guard (MQTT has no tokens: the broker's ACLs are the gate).
                if settings.labels_from_messages {
                    shared.line_protocol.labels.offer(&labels);
                }
                return Ok((Some(ack), refused));
            }
            Err(IntakeError::Closed) => return Err(Submit::Stopped),
            Err(IntakeError::NewSeries(over)) => return Err(super::intake::new_series(over, n)),
            Err(IntakeError::Full(_) | IntakeError::JournalFull { .. } | IntakeError::Busy) => {
                // Pause consuming: unacknowledged messages hold the broker's
                // window, so it stops sending and keeps the backlog.
                tokio::select! {
                    _ = tokio::time::sleep(FULL_RETRY) => {}
                    _ = shared.shutdown.triggered() => return Err(Submit::Stopped),
                }
            }
        }
    }
}

fn counted(shared: &Shared, route: &Route, outcome: &str) {
    shared
        .metrics
        .mqtt_route_messages
        .with_label_values(&[route.name.as_str(), outcome])
        .inc();
}

/// The routes that may take `topic`: none for the default topics, which
/// keep their meaning (under topic_prefix, the line-protocol filter,
/// Sparkplug's namespace).
fn routes_for<'s>(shared: &'s Shared, topic: &str) -> &'s [Route] {
    let settings = &shared.settings;
    let own = topic
        .strip_prefix(settings.topic_prefix.as_str())
        .is_some_and(|rest| rest.starts_with('/'))
        || settings
            .line_protocol()
            .is_some_and(|filter| rumqttc::matches(topic, filter))
        || topic.starts_with("spBv1.0/");
    if own { &[] } else { &shared.routes }
}

/// A message a route took: its readings submitted, or why it has none.
async fn routed(
    shared: &Shared,
    route: &Route,
    caps: &[(&str, &str)],
    publish: &Publish,
) -> Result<Submitted, Submit> {
    loop {
        let ctx = shared
            .ingest
            .decode_context(jiff::Timestamp::now().as_second());
        let arena = Bump::new();
        let (readings, labels) = match map(route, caps, &publish.payload, &ctx, &arena) {
            Ok(Mapped::Readings(readings, labels)) => (readings, labels),
            Ok(Mapped::Nothing) => {
                counted(shared, route, "ignored");
                return Ok((None, None));
            }
            Err(reason) => {
                counted(shared, route, "dead_lettered");
                return Err(Submit::Unusable(
                    Unusable {
                        reason: format!("route {:?}: {reason}", route.name),
                        kind: Rejection::Invalid,
                        readings: 1,
                    },
                    None,
                ));
            }
        };
        let n = readings.len();
        // One sensor a message: its labels go once its readings are taken.
        let labelled = readings
            .first()
            .filter(|_| shared.settings.labels_from_messages && !labels.is_empty())
            .map(|r| r.sensor.clone().into_owned());
        match shared.intake.submit(readings, Wait::Safe, None) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                counted(shared, route, "stored");
                if let Some(sensor) = labelled {
                    offer_labels(shared, route, sensor, &labels);
                }
                return Ok((Some(ack), None));
            }
            Err(IntakeError::Closed) => return Err(Submit::Stopped),
            Err(IntakeError::NewSeries(over)) => {
                counted(shared, route, "dead_lettered");
                return Err(super::intake::new_series(over, n));
            }
            Err(IntakeError::Full(_) | IntakeError::JournalFull { .. } | IntakeError::Busy) => {
                tokio::select! {
                    _ = tokio::time::sleep(FULL_RETRY) => {}
                    _ = shared.shutdown.triggered() => return Err(Submit::Stopped),
                }
            }
        }
    }
}

/// A route's labels for a sensor whose readings were just taken.
fn offer_labels(
    shared: &Shared,
    route: &Route,
    sensor: SensorId<'static>,
    labels: &[(String, String)],
) {
    let pairs = labels
        .iter()
        .map(|(k, v)| (Cow::Borrowed(k.as_str()), Cow::Borrowed(v.as_str())))
        .collect();
    match SensorLabels::new(sensor, pairs) {
        Ok(set) => shared.line_protocol.labels.offer(&[set]),
        // Each value was checked; only a repeated name could fail, and
        // the route's names are a map's keys.
        Err(e) => warn!(route = route.name, reason = %e, "A route's labels were not recorded."),
    }
}

/// A message's readings, what of it was refused, and the labels its taken
/// lines carry.
type Taken<'a> = (Vec<Reading<'a>>, Option<Unusable>, Vec<SensorLabels<'a>>);

/// A line-protocol payload's readings (timestamps in nanoseconds, as
/// Telegraf sends them), its refused lines, and the labels its taken lines
/// carry.
fn line_protocol_readings<'a>(
    shared: &Shared,
    payload: &'a [u8],
    ctx: &DecodeContext,
    arena: &'a Bump,
) -> Result<Taken<'a>, Submit> {
    let lp = &shared.line_protocol;
    let mut decoded = decode(
        payload,
        Precision::Nanoseconds,
        ctx,
        &lp.settings.sensor_tags,
        arena,
    )
    .map_err(|e| Submit::Unusable(Unusable::new(Rejection::TooLarge, e.to_string()), None))?;
    shared
        .metrics
        .line_protocol_strings
        .inc_by(decoded.strings as u64);
    let refused = (decoded.refused > 0).then(|| Unusable {
        reason: decoded.partial_write_message(),
        kind: Rejection::Invalid,
        readings: decoded.refused,
    });
    let labels = std::mem::take(&mut decoded.labels);
    Ok((decoded.take_grouped(), refused, labels))
}

fn describe(e: &DecodeError) -> String {
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
