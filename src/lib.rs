//! Hourglass: an IoT time-series ingestion service on MongoDB buckets.
//!
//! Readings come in over HTTP ([`ingest::http`]), are decoded and validated
//! ([`ingest::decode`], [`domain`]), and are coalesced in memory by the
//! [`batcher`]: a pure core that turns readings into one update per bucket per
//! flush, run by an async driver. The [`store`] writes each flush as bulk
//! pipeline upserts into one document per sensor, metric and minute (or hour),
//! whose pre-aggregates (count, sum, min, max) stay exact under duplicates,
//! overwrites and late readings. The [`api`] answers averages and series,
//! planned by [`query`] so that only edge buckets are read value by value.
//!
//! - [`auth`]: bearer tokens, scopes and per-device sensor patterns.
//! - [`config`]: the typed settings tree (TOML + `HOURGLASS__SECTION__KEY`).
//! - [`startup`]: [`startup::Application`] wires it all and serves.
//! - [`telemetry`]: logging and metrics. [`shutdown`]: one trigger and one
//!   deadline that every stage (HTTP, MQTT, the batcher driver) follows.
//!
//! Storage failures are classed in [`store::errors`] as outages (retried for
//! as long as they last) or poison (that bucket's readings go to the
//! dead-letter collection); every flush is cut by [`store::command`] to the
//! server's own size limits. MQTT lives in [`ingest::mqtt`], whose
//! acknowledgement bookkeeping is a pure state machine.

pub mod api;
pub mod auth;
pub mod batcher;
pub mod config;
pub mod domain;
pub mod ingest;
pub mod query;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod telemetry;
