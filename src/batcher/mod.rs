//! The in-memory batcher between the ingestors and storage.
//!
//! [`Batcher`] is the pure, synchronous core: readings in, one [`BucketUpdate`]
//! per touched bucket out, with `now` passed in by the caller. The async
//! [`driver`] owns the timer, the store and shutdown, and answers the writers
//! waiting for their readings to be stored.
//!
//! Readings come in two kinds. *Prompt* readings (the journal is off, or a
//! writer waits for storage) go out with the open batch at the flush interval.
//! *Held* readings are already safe in the journal, so their bucket is written
//! once its window has ended (plus a grace for stragglers), after
//! `max_hold` at the latest, or earlier when memory runs short: one bucket
//! write per window instead of one per flush.
//!
//! The core's jobs are split by file: taking readings in (`coalesce`),
//! deciding what is due and settling it (`flush`), and answering what is
//! pending to queries (`pending`); `batch` and `limits` hold what they share.

mod batch;
pub mod clock;
mod coalesce;
pub mod driver;
mod flush;
mod limits;
mod owed;
mod pending;
mod settings;
mod sink;

pub use batch::{
    Batch, FlushResult, Full, Item, NotStored, Settled, Unstored, UnstoredValue, with_acks,
};
pub use coalesce::Batcher;
pub use limits::{BatcherLimits, Hold};
pub use owed::OwedHours;
pub use settings::Settings;
pub use sink::{DeadLetter, Outcome, Sink, UNKNOWN_ERROR_ATTEMPTS, Written};
