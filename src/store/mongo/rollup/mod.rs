//! The rollups on MongoDB (the pure side is `store::rollup`), methods of
//! [`MongoStore`](super::MongoStore):
//! - [`run`]: one roll-up: the hours' buckets read, every level computed,
//!   the slots written;
//! - [`reads`]: what a roll-up reads (buckets whole or by touched minute,
//!   stored rollup documents);
//! - [`outbox`]: its statements cut into `update` commands within the limits;
//! - [`late`]: late markers written by a flush, read by queries, rolled up
//!   and removed;
//! - [`priority`]: the marked hours queries met, rolled up first;
//! - [`task`]: the background task that rolls up ended and late hours;
//! - [`rebuild`]: `hourglass rebuild-rollups` over whole 30-day periods.

mod late;
mod outbox;
pub(in crate::store::mongo) mod priority;
mod reads;
mod rebuild;
mod run;
mod task;
