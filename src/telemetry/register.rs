//! Registering the metrics' families on a [`Registry`] (a family that does
//! not register is a programming error: startup panics naming it), their
//! bucket bounds, and the driver's CPU collector.

use prometheus::{
    Counter, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Seconds: from a fast in-memory flush to a slow storage round trip.
pub(super) const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
pub(super) const DRIVER_CPU: &str = "hourglass_mongodb_driver_cpu_seconds_total";
pub(super) const DRIVER_CPU_HELP: &str = "CPU seconds the MongoDB driver spent: inside its calls on the write path and the rollup upkeep (encoding commands, socket I/O, decoding replies) and on its own thread (server monitoring, the connection pool, socket readiness; one thread for the whole process). The rest of the process's CPU is the service's.";

/// `hourglass_mongodb_driver_cpu_seconds_total`: the driver's calls, which
/// the store counts into `calls`, plus its own thread, read when gathered.
pub(super) struct DriverCpu {
    pub(super) calls: Counter,
}

impl prometheus::core::Collector for DriverCpu {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.calls.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Ok(total) = Counter::new(DRIVER_CPU, DRIVER_CPU_HELP) else {
            return Vec::new();
        };
        total.inc_by(self.calls.get() + crate::runtime::driver_thread_cpu_seconds());
        total.collect()
    }
}

pub(super) const READINGS_PER_FLUSH_BUCKETS: &[f64] = &[
    1.0, 10.0, 100.0, 1_000.0, 5_000.0, 10_000.0, 20_000.0, 50_000.0, 100_000.0, 500_000.0,
];

pub(super) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(c.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    c
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(c.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    c
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(g.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    g
}

pub(super) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(g.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    g
}

pub(super) fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(h.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    h
}

pub(super) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> HistogramVec {
    histogram_vec_with(registry, name, help, labels, DURATION_BUCKETS.to_vec())
}

pub(super) fn histogram_vec_with(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(h.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    h
}
