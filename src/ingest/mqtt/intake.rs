//! The narrow interface both message paths (plain MQTT in `processor`,
//! Sparkplug B in `sparkplug`) submit through: a size check and offering
//! readings to the intake until it takes them.

use std::time::Duration;

use rumqttc::Publish;

use super::shared::{Shared, Unusable};
use crate::domain::Reading;
use crate::journal::{Ack, IntakeError, Wait};
use crate::telemetry::metrics::{Rejection, Source};

/// How long a message path waits before offering to a full journal or batcher again.
pub(super) const FULL_RETRY: Duration = Duration::from_millis(50);

pub(super) enum Submit {
    /// Nothing of the message was taken (the second part is always `None`
    /// here; it lets one match arm settle both cases).
    Unusable(Unusable, Option<Ack>),
    Stopped,
}

/// A message's readings, submitted, and what of it was refused.
pub(super) type Submitted = (Option<Ack>, Option<Unusable>);

/// A message whose new series pass `[cardinality]`'s bounds: dead-lettered
/// whole, as over HTTP (where it is a 429).
pub(super) fn new_series(refused: crate::cardinality::Refused, readings: usize) -> Submit {
    let mut unusable = Unusable::new(Rejection::NewSeries, refused.to_string());
    unusable.readings = readings;
    Submit::Unusable(unusable, None)
}

/// A payload over `mqtt.max_payload_bytes` is unusable.
pub(super) fn check_size(shared: &Shared, publish: &Publish) -> Result<(), Submit> {
    let max = shared.settings.max_payload_bytes;
    if publish.payload.len() > max {
        return Err(Submit::Unusable(
            Unusable::new(
                Rejection::TooLarge,
                format!(
                    "payload of {} bytes is over mqtt.max_payload_bytes ({max})",
                    publish.payload.len(),
                ),
            ),
            None,
        ));
    }
    Ok(())
}

/// Offers `readings` to the intake until it takes them, pausing while it
/// is full (unacknowledged messages hold the broker's window meanwhile).
pub(super) async fn offer<'a>(
    shared: &Shared,
    mut readings: impl FnMut() -> Vec<Reading<'a>>,
) -> Result<Option<Ack>, Submit> {
    loop {
        let batch = readings();
        let n = batch.len();
        match shared.intake.submit(batch, Wait::Safe, None) {
            Ok(ack) => {
                shared.metrics.received(Source::Mqtt, n);
                return Ok(Some(ack));
            }
            Err(IntakeError::Closed) => return Err(Submit::Stopped),
            Err(IntakeError::NewSeries(refused)) => return Err(new_series(refused, n)),
            Err(IntakeError::Full(_) | IntakeError::JournalFull { .. } | IntakeError::Busy) => {
                tokio::select! {
                    _ = tokio::time::sleep(FULL_RETRY) => {}
                    _ = shared.shutdown.triggered() => return Err(Submit::Stopped),
                }
            }
        }
    }
}
