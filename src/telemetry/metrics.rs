//! Prometheus metrics: one [`Metrics`] per application, on its own registry
//! (so several applications in one process, as in the tests, do not collide).
//!
//! Labels stay low-cardinality: sources, reasons, kinds, route patterns and
//! status codes; never a sensor or a metric name.

use prometheus::{
    Counter, Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry, TextEncoder,
};

use super::register::{
    DRIVER_CPU, DRIVER_CPU_HELP, DURATION_BUCKETS, DriverCpu, READINGS_PER_FLUSH_BUCKETS, counter,
    counter_vec, gauge, gauge_vec, histogram, histogram_vec, histogram_vec_with,
};

pub use super::labels::{Rejection, Source};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    readings_received: IntCounterVec,
    readings_rejected: IntCounterVec,
    pub readings_stored: IntCounter,
    readings_unstored: IntCounter,
    readings_unstored_last: IntGauge,
    pub readings_dead_lettered: IntCounter,
    pub mqtt_skipped_retained: IntCounter,
    pub line_protocol_strings: IntCounter,
    /// Sparkplug metrics not stored, by `reason` (and rounded ones, stored).
    pub sparkplug_metrics: IntCounterVec,
    /// Sparkplug rebirth requests, by `outcome` (`sent` or `held` by the cooldown).
    pub sparkplug_rebirths: IntCounterVec,
    pub sparkplug_stale_deaths: IntCounter,
    pub bucket_updates: IntCounter,
    pub write_round_trips: IntCounter,
    pub flush_duration: Histogram,
    pub flush_readings: Histogram,
    pub pending_readings: IntGauge,
    storage_errors: IntCounterVec,
    pub storage_retries: IntCounter,
    pub mqtt_connected: IntGauge,
    pub mqtt_connections: IntCounter,
    pub mqtt_renewals: IntCounter,
    pub mqtt_acks: IntCounter,
    mqtt_dropped: IntCounterVec,
    /// Messages each MQTT route took, by `route` (its configured name) and
    /// `outcome` (`stored`, `ignored`, `dead_lettered`).
    pub mqtt_route_messages: IntCounterVec,
    /// 1 for the MQTT version the connection speaks (`version`: 5, 3.1.1).
    pub mqtt_protocol: IntGaugeVec,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub query_duration: HistogramVec,
    pub query_documents: HistogramVec,
    pub journal_bytes: IntGauge,
    pub query_cache_hits: IntCounter,
    pub query_cache_misses: IntCounter,
    pub query_cache_bytes: IntGauge,
    pub query_memory_bytes: IntGauge,
    pub unreadable_documents: IntCounter,
    /// -1 until the first count.
    pub sensors_silent: IntGauge,
    pub store_read_shape: IntGaugeVec,
    /// Reads of a query level, by the shape they were sent in.
    pub store_level_reads: IntCounterVec,
    pub journal_segments: IntGauge,
    pub journal_behind_seconds: IntGauge,
    pub journal_oldest_unstored_seconds: IntGauge,
    pub journal_fsyncs: IntCounter,
    pub journal_appended_bytes: IntCounter,
    pub journal_fsync_duration: Histogram,
    pub journal_replayed_readings: IntCounter,
    journal_damaged_ranges: IntCounter,
    journal_damaged_last: IntGauge,
    pub new_series: IntCounter,
    pub new_series_refused: IntCounter,
    pub new_series_guard_seeded: IntGauge,
    /// Token reloads, by `outcome` (`applied`, `refused`).
    pub auth_reloads: IntCounterVec,
    db_read: IntCounterVec,
    db_written: IntCounterVec,
    pub query_round_trips: HistogramVec,
    pub rollup_jobs: IntCounter,
    pub rollup_pending: IntGauge,
    pub rollup_late: IntGauge,
    pub query_waits_for_rollups: IntCounter,
    pub query_catch_up_refusals: IntCounter,
    pub runtime_workers: IntGauge,
    /// CPU seconds spent inside the driver's calls (see `store::mongo::driver_cpu`);
    /// the metric adds the driver's own thread when gathered.
    pub driver_cpu: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric. Names are constants, so a failure here is a bug
    /// found at startup, not a runtime condition.
    pub fn new() -> Self {
        // Long: one registration per metric, in the order of the metrics reference; a split would scatter the list.
        let r = Registry::new();
        let m = Self {
            readings_received: counter_vec(
                &r,
                "hourglass_readings_received_total",
                "Readings accepted for storage, by source.",
                &["source"],
            ),
            readings_rejected: counter_vec(
                &r,
                "hourglass_readings_rejected_total",
                "Readings refused, by source and reason (a body or message that cannot be parsed counts once).",
                &["source", "reason"],
            ),
            readings_stored: counter(
                &r,
                "hourglass_readings_stored_total",
                "Readings written to storage.",
            ),
            readings_unstored: counter(
                &r,
                "hourglass_readings_unstored_total",
                "Accepted readings stored nowhere: refused by storage and the dead letters, or left by a stop at its deadline (counted by the next start that finds the stop's record).",
            ),
            readings_unstored_last: gauge(
                &r,
                "hourglass_readings_unstored_last_timestamp_seconds",
                "When this process last counted acknowledged readings stored nowhere (epoch seconds; 0 if never).",
            ),
            bucket_updates: counter(
                &r,
                "hourglass_bucket_updates_total",
                "Bucket updates applied to storage (one per bucket per flush).",
            ),
            write_round_trips: counter(
                &r,
                "hourglass_write_round_trips_total",
                "Write commands sent to storage.",
            ),
            flush_duration: histogram(
                &r,
                "hourglass_flush_duration_seconds",
                "Time to store one batch, retries included.",
                DURATION_BUCKETS,
            ),
            flush_readings: histogram(
                &r,
                "hourglass_flush_readings",
                "Readings per stored batch.",
                READINGS_PER_FLUSH_BUCKETS,
            ),
            pending_readings: gauge(
                &r,
                "hourglass_pending_readings",
                "Values held in memory: waiting for a flush or being written.",
            ),
            storage_errors: counter_vec(
                &r,
                "hourglass_storage_errors_total",
                "Failed storage operations, by kind (outage: retried; poison: dead-lettered; unknown: unclassed, retried a few times then dead-lettered; unreadable: a bucket read failed).",
                &["kind"],
            ),
            storage_retries: counter(
                &r,
                "hourglass_storage_retries_total",
                "Write rounds retried after an outage.",
            ),
            readings_dead_lettered: counter(
                &r,
                "hourglass_readings_dead_lettered_total",
                "Accepted readings storage can never apply, written to the dead-letter collection instead.",
            ),
            mqtt_skipped_retained: counter(
                &r,
                "hourglass_mqtt_retained_skipped_total",
                "Retained MQTT messages not ingested (mqtt.ingest_retained = false).",
            ),
            sparkplug_metrics: counter_vec(
                &r,
                "hourglass_sparkplug_metrics_total",
                "Sparkplug metrics not stored as readings (reason: not_numeric, null, transient, control) or stored rounded (reason: rounded).",
                &["reason"],
            ),
            sparkplug_rebirths: counter_vec(
                &r,
                "hourglass_sparkplug_rebirth_requests_total",
                "Node Control/Rebirth requests: sent, or held back by mqtt.sparkplug.rebirth_cooldown.",
                &["outcome"],
            ),
            sparkplug_stale_deaths: counter(
                &r,
                "hourglass_sparkplug_stale_deaths_total",
                "NDEATH messages ignored because their bdSeq is not the current birth's.",
            ),
            line_protocol_strings: counter(
                &r,
                "hourglass_line_protocol_string_fields_skipped_total",
                "String fields of line protocol, which carry no reading and are skipped.",
            ),
            mqtt_connected: gauge(
                &r,
                "hourglass_mqtt_connected",
                "1 while connected to the MQTT broker and subscribed.",
            ),
            mqtt_connections: counter(
                &r,
                "hourglass_mqtt_connections_total",
                "Successful MQTT connections; more than one means reconnects.",
            ),
            mqtt_renewals: counter(
                &r,
                "hourglass_mqtt_renewals_total",
                "MQTT connections renewed so that the broker delivers again the QoS 1 messages left unacknowledged (the journal full).",
            ),
            mqtt_acks: counter(
                &r,
                "hourglass_mqtt_acks_total",
                "MQTT messages acknowledged after their readings were stored (or found unusable).",
            ),
            mqtt_dropped: counter_vec(
                &r,
                "hourglass_mqtt_dropped_total",
                "QoS 0 MQTT messages dropped because mqtt.max_queued_bytes were waiting (reason: queue_full), and dead letters of QoS 0 messages dropped because the letters waiting to be published were at their bound (reason: dead_letter_backlog).",
                &["reason"],
            ),
            mqtt_route_messages: counter_vec(
                &r,
                "hourglass_mqtt_route_messages_total",
                "Messages each [[mqtt.routes]] route took, by route and outcome: stored (readings submitted), ignored (an ignored topic, a skipped word, fields all left out) or dead_lettered.",
                &["route", "outcome"],
            ),
            mqtt_protocol: gauge_vec(
                &r,
                "hourglass_mqtt_protocol",
                "1 for the MQTT version the connection to the broker speaks (version: 5 or 3.1.1), 0 for the other.",
                &["version"],
            ),
            unreadable_documents: counter(
                &r,
                "hourglass_unreadable_documents_total",
                "Sensor registry and metadata documents skipped because they do not decode (each is logged at WARN).",
            ),
            query_memory_bytes: gauge(
                &r,
                "hourglass_query_memory_bytes",
                "Bytes the PromQL evaluations running now hold (bounded by query.max_memory).",
            ),
            http_requests: counter_vec(
                &r,
                "hourglass_http_requests_total",
                "HTTP requests, by route pattern, method and status.",
                &["route", "method", "status"],
            ),
            http_duration: histogram_vec(
                &r,
                "hourglass_http_request_duration_seconds",
                "HTTP request latency, by route pattern and method.",
                &["route", "method"],
            ),
            query_duration: histogram_vec(
                &r,
                "hourglass_query_duration_seconds",
                "Query latency, by endpoint (average, series, group_average, group_series, latest, sensors).",
                &["endpoint"],
            ),
            query_documents: histogram_vec_with(
                &r,
                "hourglass_query_documents_read",
                "Documents (buckets and rollups) one query read, by endpoint.",
                &["endpoint"],
                (0..18).map(|i| f64::from(1u32 << i)).collect(),
            ),
            journal_bytes: gauge(
                &r,
                "hourglass_journal_bytes",
                "Bytes of journal segments on disk.",
            ),
            query_cache_hits: counter(
                &r,
                "hourglass_query_cache_hits_total",
                "Cells of query answers taken from the results cache of closed periods.",
            ),
            query_cache_misses: counter(
                &r,
                "hourglass_query_cache_misses_total",
                "Closed cells of query answers the results cache did not hold (read, then kept).",
            ),
            query_cache_bytes: gauge(
                &r,
                "hourglass_query_cache_bytes",
                "Bytes the results cache of closed periods holds (query.cache_bytes bounds it).",
            ),
            sensors_silent: {
                let g = gauge(
                    &r,
                    "hourglass_sensors_silent",
                    "Registered sensors without a reading within their expected interval (query.expected_interval, or their expected_interval label), counted every expected interval; -1 until the first count, an interval after the start.",
                );
                g.set(-1);
                g
            },
            store_read_shape: gauge_vec(
                &r,
                "hourglass_store_read_shape",
                "1 for how reads of many series are sent, chosen by a probe of the storage server at startup: in_list (one $in) or per_series (concurrent finds).",
                &["shape"],
            ),
            store_level_reads: counter_vec(
                &r,
                "hourglass_store_level_reads_total",
                "Reads of one level of a query, by shape: in_list (one $in of sensors), per_series (a find per series), time_first (one find of the metric's series by time, where that takes few documents beyond those asked).",
                &["shape"],
            ),
            journal_segments: gauge(
                &r,
                "hourglass_journal_segments",
                "Journal segment files on disk.",
            ),
            journal_behind_seconds: gauge(
                &r,
                "hourglass_journal_behind_seconds",
                "While journaled readings wait on disk for room in memory (an outage, or memory at its bound): how long the oldest has waited. 0 when caught up.",
            ),
            journal_oldest_unstored_seconds: gauge(
                &r,
                "hourglass_journal_oldest_unstored_seconds",
                "Age of the oldest acknowledged reading not yet stored in MongoDB (held in memory or waiting on disk).",
            ),
            journal_fsyncs: counter(
                &r,
                "hourglass_journal_fsyncs_total",
                "Journal commits: one write and one fsync shared by every append queued at the time.",
            ),
            journal_appended_bytes: counter(
                &r,
                "hourglass_journal_appended_bytes_total",
                "Bytes appended to the journal.",
            ),
            journal_fsync_duration: histogram(
                &r,
                "hourglass_journal_fsync_duration_seconds",
                "Time to write and fsync one journal commit.",
                DURATION_BUCKETS,
            ),
            journal_replayed_readings: counter(
                &r,
                "hourglass_journal_replayed_readings_total",
                "Readings replayed from journal segments left by an earlier run.",
            ),
            new_series: counter(
                &r,
                "hourglass_new_series_total",
                "Series (sensor and metric) accepted for the first time by this instance, counted by the cardinality guard.",
            ),
            new_series_refused: counter(
                &r,
                "hourglass_new_series_refused_total",
                "New series refused past cardinality.max_new_series_per_hour or its per-token bound.",
            ),
            new_series_guard_seeded: gauge(
                &r,
                "hourglass_new_series_guard_seeded",
                "1 once the cardinality guard has learnt the registry's series and counts new ones.",
            ),
            auth_reloads: counter_vec(
                &r,
                "hourglass_auth_reloads_total",
                "Reloads of the tokens (the tokens file changed, or SIGHUP), by outcome: applied, or refused (the tokens in force stay).",
                &["outcome"],
            ),
            journal_damaged_ranges: counter(
                &r,
                "hourglass_journal_damaged_ranges_total",
                "Damaged journal ranges skipped at recovery; each lost at least one acknowledged record (kept in .corrupt files).",
            ),
            journal_damaged_last: gauge(
                &r,
                "hourglass_journal_damaged_last_timestamp_seconds",
                "When this process last found damaged journal ranges (epoch seconds; 0 if never).",
            ),
            db_read: counter_vec(
                &r,
                "hourglass_db_documents_read_total",
                "Documents the service read from the database, by collection and kind (query, rollup_upkeep).",
                &["collection", "kind"],
            ),
            db_written: counter_vec(
                &r,
                "hourglass_db_documents_written_total",
                "Documents the service wrote (each statement applied counts one), by collection and kind (bucket_update, late_marker, rollup_upkeep, registry_update, labels, dead_letter, delete, version_prune, instance_floor, tombstone, sparkplug_birth, format).",
                &["collection", "kind"],
            ),
            query_round_trips: histogram_vec_with(
                &r,
                "hourglass_query_round_trips",
                "Database round trips (finds and their getMores) one query took, by endpoint.",
                &["endpoint"],
                (0..12).map(|i| f64::from(1u32 << i)).collect(),
            ),
            rollup_jobs: counter(
                &r,
                "hourglass_rollup_hours_total",
                "Series-hours rolled up (hour, day and 30-day slots): open ones after they end, ones written after they ended once those writes pause.",
            ),
            rollup_pending: gauge(
                &r,
                "hourglass_rollup_pending_hours",
                "Series-hours this instance wrote into while open, not rolled up yet.",
            ),
            rollup_late: gauge(
                &r,
                "hourglass_rollup_late_hours",
                "Series-hours written after they ended (late readings, a backfill) whose reads go to their buckets until the upkeep rolls them up; counted over every instance by the one that rolls them up (0 on the others).",
            ),
            query_waits_for_rollups: counter(
                &r,
                "hourglass_query_rollup_waits_total",
                "Waits of queries for the upkeep's step rolling up the marked hours they met, instead of reading those hours' buckets (when it was due to end sooner), each batch of series counted.",
            ),
            query_catch_up_refusals: counter(
                &r,
                "hourglass_query_catch_up_refusals_total",
                "Queries refused at once (503 with Retry-After) over hours marked late: reading their buckets at the measured pace would outlast the query's time, or, during a catch-up, the queries' share of the server's time (half) could not cover it within their timeout.",
            ),
            runtime_workers: gauge(
                &r,
                "hourglass_runtime_worker_threads",
                "Worker threads of the runtime the service runs on (runtime.worker_threads).",
            ),
            driver_cpu: {
                let c = Counter::new(DRIVER_CPU, DRIVER_CPU_HELP)
                    .unwrap_or_else(|e| panic!("metric {DRIVER_CPU}: {e}"));
                r.register(Box::new(DriverCpu { calls: c.clone() }))
                    .unwrap_or_else(|e| panic!("metric {DRIVER_CPU}: {e}"));
                c
            },
            registry: r,
        };
        // Every (source, reason) series exists from the start, at zero, so
        // dashboards and alerts see 0 rather than nothing.
        for source in [Source::Http, Source::Mqtt] {
            m.readings_received.with_label_values(&[source.label()]);
            for reason in Rejection::ALL {
                m.readings_rejected
                    .with_label_values(&[source.label(), reason.label()]);
            }
        }
        for reason in ["queue_full", "dead_letter_backlog"] {
            m.mqtt_dropped.with_label_values(&[reason]);
        }
        for kind in ["outage", "poison", "unreadable"] {
            m.storage_errors.with_label_values(&[kind]);
        }
        for outcome in ["applied", "refused"] {
            m.auth_reloads.with_label_values(&[outcome]);
        }
        for (collection, kind) in [
            ("buckets", "bucket_update"),
            ("rollups", "rollup_upkeep"),
            ("sensors", "registry_update"),
            ("rejected", "dead_letter"),
        ] {
            m.db_written.with_label_values(&[collection, kind]);
        }
        for shape in ["in_list", "per_series", "time_first"] {
            m.store_level_reads.with_label_values(&[shape]);
        }
        for (collection, kind) in [
            ("buckets", "query"),
            ("rollups", "query"),
            ("buckets", "rollup_upkeep"),
            ("rollups", "rollup_upkeep"),
        ] {
            m.db_read.with_label_values(&[collection, kind]);
        }
        m
    }

    /// Acknowledged readings stored nowhere: counted, and the time kept, so
    /// an alert sees it even when the count was raised before the first
    /// scrape (a loss reported at start).
    pub fn unstored(&self, readings: u64) {
        if readings > 0 {
            self.readings_unstored.inc_by(readings);
            self.readings_unstored_last.set(now_seconds());
        }
    }

    /// Damaged journal ranges found at recovery (see [`Self::unstored`]).
    pub fn journal_damaged(&self, ranges: u64) {
        if ranges > 0 {
            self.journal_damaged_ranges.inc_by(ranges);
            self.journal_damaged_last.set(now_seconds());
        }
    }

    /// Counts `n` documents read or written (`direction`) in a collection
    /// (its role, not its configured name) for a kind of work.
    pub fn db_documents(&self, direction: &str, collection: &str, kind: &str, n: u64) {
        let v = if direction == "read" {
            &self.db_read
        } else {
            &self.db_written
        };
        v.with_label_values(&[collection, kind]).inc_by(n);
    }

    /// An MQTT message (or its dead letter) dropped, for `reason`.
    pub fn mqtt_dropped(&self, reason: &str) {
        self.mqtt_dropped.with_label_values(&[reason]).inc();
    }

    pub fn received(&self, source: Source, readings: usize) {
        self.readings_received
            .with_label_values(&[source.label()])
            .inc_by(readings as u64);
    }

    pub fn rejected(&self, source: Source, reason: Rejection, readings: usize) {
        self.readings_rejected
            .with_label_values(&[source.label(), reason.label()])
            .inc_by(readings.max(1) as u64);
    }

    pub fn storage_error(&self, kind: &'static str) {
        self.storage_errors.with_label_values(&[kind]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
