//! Rollups, MongoDB's computed pattern: one document per (sensor, metric,
//! period) for hours (minute buckets only), days and thirty days, each
//! holding a [`Slot`] per sub-period that has readings (minutes of an hour,
//! hours of a day, days of thirty), so a range of any length is answered
//! from a few documents.
//!
//! **Upkeep follows the work.** An hour is rolled up once it has ended: its
//! buckets are read, every level's slots computed here from their values
//! (`domain::Summary`), and each touched document updated by one pipeline
//! statement. A flush that stores a bucket of an hour that has ended marks
//! that hour late before the batch counts as stored (late readings, a
//! backfill, the held buckets written just after their window), and the
//! hour is rolled up once writes into it pause ([`late`]); the hours
//! still open are remembered ([`schedule`]) and rolled up once they
//! end. So a live series costs one hour document and one day document a
//! hour, plus a 30-day document a day, and a flush of `k` buckets does
//! `O(k)` upkeep work whatever the fleet's size.
//!
//! **Completeness.** Each document's `complete` is a bitmask of the slots
//! that hold every reading of their span (or none, if the slot has no
//! entry): a slot becomes complete when its span is rolled up after it
//! ended, and every later write into it is marked late before it counts as
//! stored. Queries use only complete slots over buckets not marked late and
//! read one level down for the rest (`query::plan`), so an answer is exact
//! whatever the upkeep has done so far; the upkeep only decides how few
//! documents it takes.
//!
//! **Many writers.** Every slot carries `w`, the write count of the sources
//! it was computed from (buckets count their writes in `n`), and a slot is
//! replaced only by one computed from at least as many writes. A rollup
//! computed from an older read never overwrites a newer one, whichever
//! instance (or rebuild) lands last.
//!
//! The files, pure (the MongoDB side is `store::mongo::rollup`):
//! - [`compute`]: an hour's buckets read back per series, and the slots of
//!   the hour, its day and its thirty days computed from them;
//! - [`codec`]: one slot's bytes (its readings or its summary);
//! - [`write`]: the update statement that writes a document's slots;
//! - [`read`]: a rollup document read back, slot by slot;
//! - [`late`]: the markers a write into an ended hour leaves;
//! - [`schedule`]: when each hour of each series is rolled up.

pub mod codec;
pub mod compute;
pub mod late;
mod read;
pub mod schedule;
mod write;

pub use read::read_rollup;
pub use write::{ROLLUP_SCHEMA_VERSION, all_slots, write_statement};
