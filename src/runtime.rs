//! The tokio runtime the service runs on, sized by `[runtime]`.
//!
//! Tokio's default is one worker thread per core. The service mostly waits
//! on MongoDB, and its tasks hand work to each other (a request to the
//! batcher, an operation to the driver's pool and topology tasks): with
//! two workers, each hand-off may wake the other thread. On a small
//! machine one worker can save that CPU (see docs/src/measuring.md for
//! what it did here), at the cost of a long query holding up ingest while
//! it computes; the default stays tokio's.
//!
//! The MongoDB driver's own background work (server monitoring, the
//! connection pool's worker, dialing connections and the readiness of their
//! sockets) runs on one more thread, `hourglass-mongodb`, a runtime of its
//! own ([`driver`]): it wakes on the driver's timers, not the service's
//! workers, and its CPU is measured apart ([`driver_thread_cpu_seconds`]).
//! The driver's calls still run in the tasks that await them.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

/// A worker thread's stack: tokio's default, set here so that the tests
/// proving deep queries safe (`query::promql::limits`) run on the same.
pub const WORKER_STACK_BYTES: usize = 2 * 1024 * 1024;

/// More worker threads than this is a typo, not a machine.
const MAX_WORKER_THREADS: usize = 1024;

/// `[runtime]`: the threads that run the service's tasks.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Worker threads; 0 is one per core.
    pub worker_threads: usize,
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(invalid(
                "runtime.worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0 is one per core)"),
            ));
        }
        Ok(())
    }

    /// The runtime these settings describe.
    pub fn build(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder
            .enable_all()
            .thread_name("hourglass-worker")
            .thread_stack_size(WORKER_STACK_BYTES);
        if self.worker_threads > 0 {
            builder.worker_threads(self.worker_threads);
        }
        builder.build()
    }
}

/// The driver's runtime, built on first use; `None` (the driver then runs
/// on the caller's runtime) if the system would not give it a thread. It
/// lives as long as the process: a client made on it, in any runtime's
/// tasks, keeps working.
pub fn driver() -> Option<&'static tokio::runtime::Runtime> {
    static DRIVER: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let built = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .thread_name("hourglass-mongodb")
                .on_thread_park(count_driver_thread)
                .build();
            match built {
                Ok(rt) => Some(rt),
                Err(e) => {
                    tracing::warn!(error = %e, "Could not start the MongoDB driver's own thread: the driver runs on the service's workers, and its background CPU counts as the service's.");
                    None
                }
            }
        })
        .as_ref()
}

/// The driver's thread's CPU up to its last park, in nanoseconds.
static DRIVER_THREAD_NANOS: AtomicU64 = AtomicU64::new(0);

/// On the driver's thread, before it parks: adds its CPU since the last park.
fn count_driver_thread() {
    thread_local! {
        static LAST: Cell<u64> = const { Cell::new(0) };
    }
    let Some(now) = thread_cpu_seconds() else {
        return;
    };
    let now = (now * 1e9) as u64;
    let last = LAST.replace(now);
    DRIVER_THREAD_NANOS.fetch_add(now.saturating_sub(last), Ordering::Relaxed);
}

/// CPU seconds the driver's thread has spent, up to its last park (a thread
/// busy since then is counted when it parks). One thread serves every client
/// in the process.
pub fn driver_thread_cpu_seconds() -> f64 {
    DRIVER_THREAD_NANOS.load(Ordering::Relaxed) as f64 * 1e-9
}

/// This thread's CPU time in seconds, where the system has such a clock.
#[cfg(unix)]
pub fn thread_cpu_seconds() -> Option<f64> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

#[cfg(not(unix))]
pub fn thread_cpu_seconds() -> Option<f64> {
    None
}

/// Installs ring as the process's TLS crypto provider (rustls needs one,
/// and several are compiled in: the HTTP client's https, MQTT's TLS). Call
/// before building an HTTP client; later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_s_work_runs_on_its_own_thread_and_its_cpu_is_counted() {
        let rt = driver().expect("a driver runtime");
        let before = driver_thread_cpu_seconds();
        let (name, burnt) = rt.block_on(async {
            tokio::spawn(async {
                let name = std::thread::current().name().map(str::to_owned);
                let start = thread_cpu_seconds().expect("a thread clock");
                let mut x = 1u64;
                while thread_cpu_seconds().expect("a thread clock") - start < 0.03 {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005));
                    }
                }
                (name, thread_cpu_seconds().expect("a thread clock") - start)
            })
            .await
            .expect("the task ran")
        });
        assert_eq!(name.as_deref(), Some("hourglass-mongodb"));
        // Counted once the thread parks, which it does with nothing to run.
        let mut counted = 0.0;
        for _ in 0..200 {
            counted = driver_thread_cpu_seconds() - before;
            if counted >= burnt {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(counted >= burnt, "{counted} < {burnt}");
    }

    #[test]
    fn a_runtime_runs_on_the_threads_asked_for() {
        let rt = Settings { worker_threads: 1 }.build().expect("a runtime");
        assert_eq!(rt.metrics().num_workers(), 1);
        let rt = Settings { worker_threads: 3 }.build().expect("a runtime");
        assert_eq!(rt.metrics().num_workers(), 3);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rt = Settings::default().build().expect("a runtime");
        assert_eq!(rt.metrics().num_workers(), cores);
    }

    #[test]
    fn absurd_thread_counts_are_refused_by_name() {
        let e = Settings {
            worker_threads: 100_000,
        }
        .validate()
        .expect_err("refused");
        assert_eq!(e.key, "runtime.worker_threads");
        assert!(Settings::default().validate().is_ok());
    }
}
