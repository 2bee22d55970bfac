//! The tokio runtime the service runs on, sized by `[runtime]`.
//!
//! Tokio's default is one worker thread per core. The service mostly waits
//! on MongoDB, and its tasks hand work to each other (a request to the
//! batcher, an operation to the driver's pool and topology tasks): with
//! two workers, each hand-off may wake the other thread. On a small
//! machine one worker can save that CPU (see the README's "Measuring" for
//! what it did here), at the cost of a long query holding up ingest while
//! it computes; the default stays tokio's.

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

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
        builder.enable_all().thread_name("hourglass-worker");
        if self.worker_threads > 0 {
            builder.worker_threads(self.worker_threads);
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
