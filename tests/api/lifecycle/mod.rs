//! Data lifecycle against real processes: export and import, deletes,
//! retention.

mod common;
mod delete;
mod retention;
mod transfer;
