//! The Sparkplug host's driver: feeds messages and the clock to the pure
//! [`Host`], and carries out what it asks (readings to the intake, rebirth
//! commands to the broker, presence and labels to the registry).

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rumqttc::{Publish, QoS};
use tracing::{info, warn};

use super::intake::{Submit, Submitted, check_size, offer};
use super::shared::{Shared, Unusable};
use crate::domain::{MetricName, Reading, SensorId, SensorLabels, TimeWindow};
use crate::ingest::sparkplug::payload::{self, Parsed};
use crate::ingest::sparkplug::{Effects, Host};
use crate::telemetry::metrics::Rejection;

/// How often open sequence gaps are checked against the reorder timeout.
pub(super) const TICK: Duration = Duration::from_millis(250);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The host, when Sparkplug is enabled, with the births kept before.
pub(super) async fn host(shared: &Shared) -> Option<Host> {
    let s = &shared.settings.sparkplug;
    if !s.enabled {
        return None;
    }
    let mut host = Host::new(s.rules(TimeWindow {
        max_age: shared.ingest.max_age,
        max_future: shared.ingest.max_future,
    }));
    if let Some(book) = &shared.births {
        match book.load().await {
            Ok(births) => {
                info!(
                    births = births.len(),
                    "Read the Sparkplug birth certificates kept before."
                );
                host.restore(births);
            }
            Err(e) => warn!(error = %e,
                "Could not read the Sparkplug birth certificates kept before; edge nodes are asked to rebirth as their data arrives."),
        }
    }
    Some(host)
}

pub(super) fn tick(shared: &Shared, host: &mut Host) {
    if host.next_deadline().is_some() {
        let fx = host.tick(now_ms());
        apply(shared, &fx);
    }
}

/// One Sparkplug message: judged by the host, its readings submitted.
pub(super) async fn submit(
    shared: &Shared,
    host: &mut Host,
    publish: &Publish,
) -> Result<Submitted, Submit> {
    check_size(shared, publish)?;
    let unusable = |kind, reason: String| Submit::Unusable(Unusable::new(kind, reason), None);
    let topic = match payload::parse_topic(&publish.topic) {
        Ok(Parsed::Message(t)) => t,
        // Primary hosts' state (ours included): not data.
        Ok(Parsed::State) => return Ok((None, None)),
        Err(reason) => return Err(unusable(Rejection::Topic, reason)),
    };
    let decoded =
        payload::decode(&publish.payload).map_err(|r| unusable(Rejection::Malformed, r))?;
    let fx = host.handle(&topic, &decoded, now_ms());
    apply(shared, &fx);
    if let Some(reason) = fx.dead_letter {
        return Err(Submit::Unusable(
            Unusable {
                reason,
                kind: Rejection::Invalid,
                readings: decoded.metrics.len().max(1),
            },
            None,
        ));
    }
    if fx.readings.is_empty() {
        return Ok((None, None));
    }
    let ack = offer(shared, || {
        fx.readings
            .iter()
            .map(|o| Reading {
                sensor: SensorId::trusted(&o.sensor),
                metric: MetricName::trusted(&o.metric),
                ts: o.ts,
                value: o.value,
            })
            .collect()
    })
    .await?;
    Ok((ack, None))
}

/// Carries out the host's requests other than readings and dead letters.
fn apply(shared: &Shared, fx: &Effects) {
    let m = &shared.metrics;
    if let Some(book) = &shared.births {
        for b in &fx.births {
            book.save(b.clone());
        }
    }
    for (reason, n) in [
        ("not_numeric", fx.skipped.not_numeric),
        ("null", fx.skipped.null),
        ("transient", fx.skipped.transient),
        ("control", fx.skipped.control),
        ("rounded", fx.skipped.rounded),
    ] {
        if n > 0 {
            m.sparkplug_metrics.with_label_values(&[reason]).inc_by(n);
        }
    }
    if fx.stale_death {
        m.sparkplug_stale_deaths.inc();
    }
    if fx.rebirths_held > 0 {
        m.sparkplug_rebirths
            .with_label_values(&["held"])
            .inc_by(fx.rebirths_held);
    }
    for (group, node) in &fx.rebirth {
        let topic = format!("{}/{group}/NCMD/{node}", payload::NAMESPACE);
        match shared.client().try_publish(
            topic,
            QoS::AtMostOnce,
            false,
            payload::rebirth_command(now_ms()),
        ) {
            Ok(()) => {
                m.sparkplug_rebirths.with_label_values(&["sent"]).inc();
                info!(
                    group,
                    edge_node = node,
                    "Asked a Sparkplug edge node to rebirth."
                );
            }
            Err(e) => warn!(group, edge_node = node, error = %e,
                "Could not queue a Sparkplug rebirth request; the next unusable message asks again."),
        }
    }
    registry_labels(shared, fx);
}

/// The registry's part: the Sparkplug ids as labels, and presence with its
/// time, each set validated as any label write is ([`SensorLabels`]) and
/// its sensors admitted by the new-series guard (a birth's sensor may have
/// no readings yet: its registry entry counts as one new series). Not at
/// all with `mqtt.labels_from_messages = false`.
fn registry_labels(shared: &Shared, fx: &Effects) {
    if !shared.settings.labels_from_messages || (fx.labels.is_empty() && fx.presence.is_empty()) {
        return;
    }
    let at = jiff::Timestamp::now().to_string();
    let presence: Vec<(&str, Vec<(String, String)>)> = fx
        .presence
        .iter()
        .map(|(sensor, online)| {
            (
                sensor.as_str(),
                vec![
                    (
                        "sparkplug_state".to_owned(),
                        if *online { "online" } else { "offline" }.to_owned(),
                    ),
                    ("sparkplug_state_at".to_owned(), at.clone()),
                ],
            )
        })
        .collect();
    let mut sets: Vec<SensorLabels<'_>> = Vec::new();
    for (sensor, labels) in fx
        .labels
        .iter()
        .map(|(s, l)| (s.as_str(), l))
        .chain(presence.iter().map(|(s, l)| (*s, l)))
    {
        match SensorId::parse(sensor)
            .map_err(|e| e.to_string())
            .and_then(|id| SensorLabels::new(id, borrowed(labels)).map_err(|e| e.to_string()))
        {
            Ok(set) => sets.push(set),
            Err(reason) => warn!(sensor, reason, "Sparkplug labels not recorded."),
        }
    }
    let sensors: Vec<&SensorId<'_>> = sets.iter().map(SensorLabels::sensor).collect();
    if let Err(refused) = shared.intake.admit_sensors(&sensors, None) {
        warn!(reason = %refused, "Sparkplug labels not recorded: their sensors are new series past the guard's bound.");
        return;
    }
    shared.line_protocol.labels.offer(&sets);
}

fn borrowed(pairs: &[(String, String)]) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    pairs
        .iter()
        .map(|(k, v)| (Cow::Borrowed(k.as_str()), Cow::Borrowed(v.as_str())))
        .collect()
}
