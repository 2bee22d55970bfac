//! Integration tests: the real service on port 0 against the MongoDB-compatible
//! server at `MONGODB_URI` (started by `make test`), over real sockets.

mod alerts;
mod auth;
mod buckets;
mod cache;
mod clients;
mod conformance;
mod console;
mod deployment;
mod docs;
mod engine;
mod faults;
mod fleet;
mod hostile;
mod hostile_edges;
mod hostile_families;
mod hostile_surfaces;
mod influx;
mod ingest;
mod instants;
mod journal;
mod lifecycle;
mod mqtt;
mod mqtt_versions;
mod operations;
mod prom;
mod quantiles;
mod query;
mod routes;
mod scale;
mod self_alerts;
mod silence;
mod sparkplug;
mod support;
mod weighting;
mod write_path;

// The suites name the support modules from the crate's root.
use support::{broker, database, helpers, plans, python, rollup_checks};
