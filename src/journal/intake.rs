//! [`Intake`]: where ingestors put readings, through the journal when it is
//! on, and the [`Ack`] that resolves once they are as safe as asked.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::errors::IntakeError;
use super::handle::Journal;
use super::task::JournalError;
use crate::batcher::driver::BatcherHandle;
use crate::batcher::{FlushResult, NotStored};
use crate::domain::{BucketKey, Reading, SensorId};

/// How long a writer waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the readings are queued (`?async=true`).
    Queued,
    /// Until they are safe: in the journal, or stored when it is off.
    Safe,
    /// Until they are stored in MongoDB (`?wait=stored`).
    Stored,
}

/// Told of the series of accepted readings, so that listings and series
/// selections show a series from its first accepted reading rather than its
/// first stored one (held readings may wait a minute or more for storage).
pub trait Registrar: Send + Sync {
    /// The series of `readings` not known to be registered (a cache: cheap).
    fn unseen(&self, readings: &[Reading<'_>]) -> Vec<(String, String)>;
    /// Registers them, in the background; the receiver resolves once the
    /// registry has them (or the attempt failed: storage registers them
    /// again when it stores their readings).
    fn register(&self, series: Vec<(String, String)>) -> Option<oneshot::Receiver<()>>;
}

/// Where ingestors put readings: through the journal when it is on.
#[derive(Clone)]
pub struct Intake {
    batcher: BatcherHandle,
    journal: Option<Journal>,
    registrar: Option<Arc<dyn Registrar>>,
    /// New series per hour (`[cardinality]`), checked against the series
    /// the registrar does not know.
    guard: Option<Arc<crate::cardinality::Shared>>,
}

/// What an accepted submission resolves to: safe as asked, with its new
/// series registered.
pub struct Ack(AckInner, Option<oneshot::Receiver<()>>);

enum AckInner {
    Now,
    Stored(oneshot::Receiver<FlushResult>),
    Journaled(oneshot::Receiver<Result<(), JournalError>>),
}

/// Why accepted readings were not made safe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotSafe {
    /// Storage can never apply these buckets; their readings are dead-lettered.
    #[error("storage refused {} bucket(s); their readings are in the dead-letter collection", .0.len())]
    DeadLettered(Vec<BucketKey>),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("the service stopped before the readings were safe")]
    Stopped,
}

/// How long an acknowledgement waits for its new series to be registered.
/// Registration takes milliseconds when storage answers; when it does not,
/// the attempt lasts the driver's server selection (30 s by default) and
/// attempts queue behind each other, which held every first write of a new
/// series past `http.write_timeout` during an outage the journal otherwise
/// rides out. Past this the write is answered anyway: the flush that stores
/// its readings registers the series.
pub const REGISTER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Ack {
    /// Resolves once the readings are as safe as the writer asked, and
    /// their new series are registered so a query finds them (waited for
    /// [`REGISTER_WAIT`] at most).
    pub async fn safe(self) -> Result<(), NotSafe> {
        let safe = match self.0 {
            AckInner::Now => Ok(()),
            AckInner::Stored(rx) => match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(NotStored::DeadLettered(keys))) => Err(NotSafe::DeadLettered(keys)),
                Ok(Err(NotStored::Shutdown)) | Err(_) => Err(NotSafe::Stopped),
            },
            AckInner::Journaled(rx) => match rx.await {
                Ok(result) => result.map_err(NotSafe::from),
                Err(_) => Err(NotSafe::Stopped),
            },
        };
        if let Some(registered) = self.1 {
            let _ = tokio::time::timeout(REGISTER_WAIT, registered).await;
        }
        safe
    }
}

impl Intake {
    pub fn new(
        batcher: BatcherHandle,
        journal: Option<Journal>,
        registrar: Option<Arc<dyn Registrar>>,
        guard: Option<Arc<crate::cardinality::Shared>>,
    ) -> Self {
        Self {
            batcher,
            journal,
            registrar,
            guard: guard.filter(|g| g.enabled()),
        }
    }

    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// Takes all of `readings` or none; registers their new series once
    /// taken. `token` names who sent them, for the per-token bound on new
    /// series (`None` with auth off).
    pub fn submit(
        &self,
        readings: Vec<Reading<'_>>,
        wait: Wait,
        token: Option<&str>,
    ) -> Result<Ack, IntakeError> {
        let unseen = self
            .registrar
            .as_ref()
            .map(|r| r.unseen(&readings))
            .unwrap_or_default();
        if let Some(guard) = &self.guard
            && !unseen.is_empty()
        {
            guard.admit(token, &unseen)?;
        }
        let inner = match (&self.journal, wait) {
            (Some(journal), Wait::Queued | Wait::Safe) => {
                let rx = journal.append(&readings, wait == Wait::Safe)?;
                rx.map_or(AckInner::Now, AckInner::Journaled)
            }
            _ => {
                let rx = self.batcher.submit(readings, wait != Wait::Queued)?;
                rx.map_or(AckInner::Now, AckInner::Stored)
            }
        };
        let registered = match &self.registrar {
            Some(r) if !unseen.is_empty() => r.register(unseen),
            _ => None,
        };
        Ok(Ack(inner, registered))
    }

    /// Admits registry entries for `sensors` that a label write would
    /// create (a `PUT …/labels`, a Sparkplug birth) through the new-series
    /// guard: a sensor the guard does not know counts as one new series,
    /// from `token` (`None` with auth off, or over MQTT).
    pub fn admit_sensors(
        &self,
        sensors: &[&SensorId<'_>],
        token: Option<&str>,
    ) -> Result<(), crate::cardinality::Refused> {
        let Some(guard) = &self.guard else {
            return Ok(());
        };
        let entries: Vec<(String, String)> = sensors
            .iter()
            .map(|s| {
                (
                    s.as_str().to_owned(),
                    crate::cardinality::SENSOR_ENTRY.to_owned(),
                )
            })
            .collect();
        guard.admit(token, &entries)
    }

    /// See [`BatcherHandle::flush_soon`]: only prompt readings wait for a flush.
    pub fn flush_soon(&self) {
        if self.journal.is_none() {
            self.batcher.flush_soon();
        }
    }
}
