//! Hourglass: an IoT time-series ingestion service on MongoDB buckets.
//!
//! A reading comes in over HTTP (`api::ingest`) or MQTT (`ingest::mqtt`), is
//! decoded and validated (`ingest::decode`, `domain`), and coalesced in memory
//! by the `batcher`: a pure core that turns readings into one update per
//! bucket per flush, run by an async driver. The `store` writes each flush as
//! pipeline upserts into one document per sensor, metric and minute (or hour),
//! whose pre-aggregates stay exact under duplicates, overwrites and late
//! readings. The `api` answers averages and series, planned by `query` so that
//! only edge buckets are read value by value.
//!
//! The modules, bottom to top; each uses only those before it:
//! - `settings`: the error naming an invalid key; every component owns its
//!   own settings type next to its code.
//! - `runtime`: the tokio runtime, sized by `[runtime]`, and the MongoDB
//!   driver's own one-thread runtime. `telemetry`: logging and Prometheus
//!   metrics. `shutdown`: one trigger and one deadline that every stage
//!   follows.
//! - `domain`: readings, validated names, buckets, aggregates, read plans.
//! - `batcher`: the pure core (`now` passed in) and its async driver, which
//!   settles every bucket by its own outcome. It decides when a bucket is
//!   written: with the open batch, or (journaled readings) once its window
//!   has ended.
//! - `cardinality`: the guard on new series per hour, a pure core the
//!   intake consults.
//! - `journal`: the append-only, checksummed log on local disk that
//!   acknowledgements wait for (group commit), replayed at start; `Intake`
//!   is the ingestors' way in.
//! - `store`: the bucket document format, commands cut to the server's
//!   limits (`store::command`), errors classed as outage or poison
//!   (`store::errors`), the rollups in one folder (`store::rollup`: compute,
//!   encode, write, read, late marks, schedule), and the MongoDB store with
//!   its dead-letter collection (its rollup side in `store::mongo::rollup`).
//! - `query`: the pure planner over buckets and rollups, the engine that
//!   reads through it (with the results cache), PromQL, and uptime's fold
//!   of windows into coverage (`query::uptime`).
//! - `auth`: bearer tokens, scopes and per-device sensor patterns.
//! - `ingest`: the shared JSON decoder, InfluxDB line protocol (a parser
//!   that borrows everything, the mapping onto sensors, metrics and labels,
//!   and the background writer of labels), MQTT (connection, topics,
//!   processor, the Sparkplug driver, both submitting through one narrow
//!   `intake`, and acknowledgements as a pure state machine), and the
//!   Sparkplug B host (payloads, and the host as a pure state machine).
//! - `api`: everything HTTP: routes, limits, auth middleware, the write and
//!   query handlers (JSON, silence and uptime, InfluxDB's write API, the
//!   Prometheus query API), the console, health and metrics.
//! - `config`: assembles, loads and validates the settings tree.
//! - `startup`: `Application` wires it all, serves, and shuts down in order.
//! - `transfer`: `hourglass import` and `hourglass export`, clients of a
//!   running instance's HTTP API.

// Modules are private: the service's API is what is re-exported below.
// Dependencies point one way, top to bottom of this list (the layering test
// in `conventions.rs` keeps it so): a module uses only those above it,
// and no two files of a module import each other.
mod api;
mod auth;
mod batcher;
mod cardinality;
mod config;
mod domain;
mod ingest;
mod journal;
mod query;
mod runtime;
mod settings;
mod shutdown;
mod startup;
mod store;
mod telemetry;
mod transfer;

/// The service: what the binary and the integration tests use.
pub use auth::{Scope, TokenSettings, hash_token};
pub use config::{ConfigError, Settings};
pub use domain::{Agg, Granularity};
pub use ingest::mqtt::{MqttStats, Protocol as MqttProtocol};
pub use ingest::routes::RouteSettings;
pub use journal::REGISTER_WAIT;
pub use runtime::install_crypto_provider;
pub use shutdown::signal;
pub use startup::{
    Application, forget_instance, instances, long_version, rebuild_rollups, redrive, short_version,
};
pub use store::{BlockCompressor, InstanceInfo, Keep, Redriven};
pub use telemetry::{LogFormat, init as init_logging};
pub use transfer::export::{ExportOptions, ExportSummary, run as export};
pub use transfer::import::{
    Format as ImportFormat, ImportOptions, ImportSummary, TsUnit, run as import,
};
pub use transfer::{TransferError, delete};

/// jemalloc's options for the binaries that run on it (the service and the
/// benchmarks, each exporting them as `_rjem_malloc_conf`; `_RJEM_MALLOC_CONF`
/// in the environment overrides them). Freed pages go back to the kernel
/// over two minutes instead of jemalloc's ten seconds: a flush every second
/// or two frees and reallocates the same megabytes of commands and readings,
/// and returning them in between cost page faults and purges of ~10% of the
/// service's CPU under load. Idle, the memory still goes back.
pub const MALLOC_CONF: &[u8; 44] = b"dirty_decay_ms:120000,muzzy_decay_ms:120000\0";

/// The pure cores behind the service (no I/O, no clock): for the benchmarks,
/// the fuzz targets, and the load test's direct writes. Not the service's API.
pub mod pure {
    pub use crate::api::query::{Step, check_group_params, parse_instant, parse_step};
    pub use crate::batcher::{
        Batch, Batcher, BatcherLimits, Hold, Item, Settings as BatcherSettings, Settled,
    };
    pub use crate::domain::{
        BucketKey, BucketUpdate, METRIC_MAX_LEN, MetricName, Reading, SENSOR_MAX_LEN, Sample,
        SensorId, Sketch, SketchError, Slot, TimeWindow, format_ms, parse_timestamp_ms,
        parse_timestamp_str,
    };
    pub use crate::ingest::decode::csv::{CsvFormat, decode_csv};
    pub use crate::ingest::decode::{
        DecodeContext, decode_ndjson, decode_payload, decode_readings,
    };
    pub use crate::ingest::line_protocol::parse::{
        FieldValue, Kind, Line, Lines, ParseError, Text, parse_line,
    };
    pub use crate::ingest::line_protocol::{
        Decoded as LineProtocolDecoded, Precision, decode as decode_line_protocol,
    };
    pub use crate::ingest::mqtt::parse_topic;
    pub use crate::ingest::sparkplug::payload::{
        Kind as SparkplugKind, Parsed as SparkplugParsed, Topic as SparkplugTopic,
        decode as sparkplug_decode, parse_topic as sparkplug_topic,
    };
    pub use crate::ingest::sparkplug::{Host as SparkplugHost, Rules as SparkplugRules};
    pub use crate::journal::{decode_frame as journal_decode, encode_frame as journal_encode};
    pub use crate::query::promql::memory::{Budget as PromBudget, Memory as PromMemory};
    pub use crate::query::promql::{
        LabelSet as PromLabels, Limits as PromLimits, Steps as PromSteps, Value as PromValue,
    };
    pub use crate::query::{Calendar, Grid, Need, Plan};
    pub use crate::runtime::WORKER_STACK_BYTES;
    pub use crate::store::command::{Chunk, Commands, Limits, Target};
    pub use crate::store::document::{Form, Versioning, update_statement};
    pub use crate::store::rollup::codec::{
        decode as rollup_slot_decode, encode as rollup_slot_encode,
    };
    pub use crate::store::rollup::compute::{ReadBack, roll_hours_of};
    pub use crate::transfer::import::formats::{
        Converter as ImportConverter, Format as ImportFormat,
    };
}

#[cfg(test)]
mod conventions;

#[cfg(test)]
mod allocator {
    #[test]
    fn the_allocator_options_are_one_c_string() {
        let options = std::ffi::CStr::from_bytes_with_nul(super::MALLOC_CONF)
            .expect("jemalloc reads a NUL-terminated string");
        assert!(options.to_str().is_ok_and(|s| s.contains("dirty_decay_ms")));
    }
}
