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
// at the end of this file keeps it so): a module uses only those above it,
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
pub use ingest::mqtt::MqttStats;
pub use journal::REGISTER_WAIT;
pub use shutdown::signal;
pub use startup::{Application, forget_instance, instances, rebuild_rollups, redrive};
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
        SensorId, Sketch, SketchError, Slot, TimeWindow, parse_timestamp_ms, parse_timestamp_str,
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
mod layering {
    use std::path::{Path, PathBuf};

    /// The modules, bottom to top, as declared above.
    const LAYERS: &[&str] = &[
        "settings",
        "runtime",
        "telemetry",
        "shutdown",
        "domain",
        "batcher",
        "cardinality",
        "journal",
        "store",
        "query",
        "auth",
        "ingest",
        "api",
        "config",
        "startup",
        "transfer",
    ];

    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The top-level module a source file belongs to.
    fn module_of(src: &Path, file: &Path) -> Option<&'static str> {
        let first = file.strip_prefix(src).ok()?.components().next()?;
        let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
        LAYERS.iter().copied().find(|l| *l == name)
    }

    /// `crate::<module>` paths in the code of `text` (comments left out).
    fn uses(text: &str) -> Vec<&'static str> {
        let mut found = Vec::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if let Some(l) = LAYERS.iter().copied().find(|l| *l == name) {
                    found.push(l);
                }
            }
            // `use crate::{a, b}` names several at once.
            if let Some(group) = code.split("crate::{").nth(1) {
                for part in group.split([',', '}']) {
                    let name = part.trim().split("::").next().unwrap_or_default();
                    if let Some(l) = LAYERS.iter().copied().find(|l| *l == name) {
                        found.push(l);
                    }
                }
            }
        }
        found
    }

    fn rank(module: &str) -> usize {
        LAYERS
            .iter()
            .position(|l| *l == module)
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn no_module_uses_a_module_above_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let mut upward = Vec::new();
        for file in &all {
            let Some(module) = module_of(&src, file) else {
                continue;
            };
            let text = std::fs::read_to_string(file).expect("readable");
            for used in uses(&text) {
                if rank(used) > rank(module) {
                    upward.push(format!("{} uses crate::{used}", file.display()));
                }
            }
        }
        assert!(upward.is_empty(), "imports that point up: {upward:#?}");
        assert!(all.len() > 20, "the scan found the sources");
    }

    /// `super::<name>` paths in the code of `text`: the siblings a file of a
    /// module uses.
    fn sibling_uses(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        let ident = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or_default();
            for (i, _) in code.match_indices("super::") {
                let rest = &code[i + "super::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    for part in group.split([',', '}']) {
                        found.push(ident(part.trim()));
                    }
                } else {
                    found.push(ident(rest));
                }
            }
        }
        found.retain(|n| !n.is_empty());
        found
    }

    #[test]
    fn no_two_files_of_a_module_import_each_other() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let stem = |p: &Path| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
        // (directory, file) -> the sibling files or folders it uses.
        let mut edges = std::collections::BTreeSet::new();
        for file in &all {
            let (Some(dir), Some(name)) = (file.parent(), stem(file)) else {
                continue;
            };
            if dir == src || name == "mod" {
                continue;
            }
            let siblings: Vec<String> = std::fs::read_dir(dir)
                .expect("readable")
                .filter_map(|e| stem(&e.ok()?.path()))
                .filter(|n| *n != "mod" && *n != name)
                .collect();
            let text = std::fs::read_to_string(file).expect("readable");
            for used in sibling_uses(&text) {
                if siblings.contains(&used) {
                    edges.insert((dir.to_path_buf(), name.clone(), used));
                }
            }
        }
        let circles: Vec<String> = edges
            .iter()
            .filter(|(dir, a, b)| a < b && edges.contains(&(dir.clone(), b.clone(), a.clone())))
            .map(|(dir, a, b)| format!("{}: {a} and {b}", dir.display()))
            .collect();
        assert!(
            circles.is_empty(),
            "files that import each other: {circles:#?}"
        );
        assert!(!edges.is_empty(), "the scan found sibling imports");
    }

    /// The code of a file up to its unit tests, comments left out.
    fn code_of(text: &str) -> String {
        let mut out = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with("mod tests") {
                break;
            }
            out.push_str(line.split("//").next().unwrap_or_default());
            out.push('\n');
        }
        out
    }

    /// The items `code` (a `mod.rs`) defines itself at its top level, not
    /// those it re-exports.
    fn defined_items(code: &str) -> std::collections::BTreeSet<String> {
        let item = regex::Regex::new(
            r"(?m)^(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|const\s+(?:fn)|unsafe\s+)*(?:fn|struct|enum|const|static|type|trait)\s+([A-Za-z_][A-Za-z0-9_]*)",
        )
        .expect("a valid pattern");
        item.captures_iter(code)
            .filter_map(|c| c.get(1))
            .map(|m| m.as_str().to_owned())
            .collect()
    }

    /// The first names of every path `code` takes from `prefix` (`super` or
    /// `crate::a::b`), groups over several lines included.
    fn names_from(code: &str, prefix: &str) -> Vec<String> {
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut found = Vec::new();
        let needle = format!("{prefix}::");
        for (i, _) in code.match_indices(&needle) {
            let before = code[..i].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[i + needle.len()..];
            let Some(group) = rest.strip_prefix('{') else {
                found.push(ident(rest));
                continue;
            };
            // The group's top-level parts: `a::{b, c}` names `a`.
            let (mut depth, mut part) = (0usize, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(ident(&part));
                        part.clear();
                        continue;
                    }
                    _ => {}
                }
                part.push(c);
            }
            found.push(ident(&part));
        }
        found.retain(|n| !n.is_empty());
        found
    }

    #[test]
    fn no_file_takes_from_its_folders_mod_rs_anything_but_a_re_export() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let mut taken = Vec::new();
        let mut folders = 0;
        for hub in all.iter().filter(|f| f.ends_with("mod.rs")) {
            let Some(dir) = hub.parent() else { continue };
            let defined = defined_items(&code_of(&std::fs::read_to_string(hub).expect("readable")));
            let path = dir
                .strip_prefix(&src)
                .expect("under src")
                .components()
                .filter_map(|c| c.as_os_str().to_str())
                .collect::<Vec<_>>()
                .join("::");
            let own = format!("crate::{path}");
            // The folder's files, and its sub-folders' `mod.rs`.
            let members = all.iter().filter(|f| {
                (f.parent() == Some(dir) && !f.ends_with("mod.rs"))
                    || (f.ends_with("mod.rs") && f.parent().and_then(Path::parent) == Some(dir))
            });
            folders += 1;
            for file in members {
                let code = code_of(&std::fs::read_to_string(file).expect("readable"));
                for name in names_from(&code, "super")
                    .into_iter()
                    .chain(names_from(&code, &own))
                {
                    if defined.contains(&name) {
                        taken.push(format!(
                            "{} takes {name} from {}",
                            file.display(),
                            hub.display()
                        ));
                    }
                }
            }
        }
        taken.sort();
        taken.dedup();
        assert!(
            taken.is_empty(),
            "a mod.rs holds its modules and re-exports; move these into a file of their own: {taken:#?}"
        );
        assert!(folders > 10, "the scan found the folders");
    }

    #[test]
    fn the_hub_scan_sees_definitions_and_imports_over_several_lines() {
        let hub = "pub use a::B;\npub(crate) struct Shared {\n    x: u8,\n}\nfn helper() {}\npub async fn run() {}\n";
        let defined = defined_items(hub);
        assert_eq!(
            defined.into_iter().collect::<Vec<_>>(),
            vec!["Shared", "helper", "run"]
        );
        let file = "use super::{\n    Shared, helper,\n    a::{B, C},\n};\nuse crate::x::y::Z;\nlet v = super::super::w;\n";
        assert_eq!(
            names_from(file, "super"),
            vec!["Shared", "helper", "a", "super"]
        );
        assert_eq!(names_from(file, "crate::x::y"), vec!["Z"]);
        assert!(
            code_of("use super::A;\n// super::B\nmod tests {\n use super::C;\n}").contains("A")
        );
        assert!(
            !code_of("use super::A;\n// super::B\nmod tests {\n use super::C;\n}").contains('B')
        );
    }

    #[test]
    fn the_sibling_scan_sees_single_and_grouped_imports() {
        let text = "use super::acks::Pending;\nuse super::{Shared, intake::offer};\n// super::x\n";
        assert_eq!(sibling_uses(text), vec!["acks", "Shared", "intake"]);
    }

    #[test]
    fn the_scan_sees_single_and_grouped_imports_and_skips_comments() {
        let text = "use crate::store::X;\nuse crate::{api, domain::Y};\n// crate::startup\n";
        assert_eq!(uses(text), vec!["store", "api", "domain"]);
    }
}

#[cfg(test)]
mod allocator {
    #[test]
    fn the_allocator_options_are_one_c_string() {
        let options = std::ffi::CStr::from_bytes_with_nul(super::MALLOC_CONF)
            .expect("jemalloc reads a NUL-terminated string");
        assert!(options.to_str().is_ok_and(|s| s.contains("dirty_decay_ms")));
    }
}
