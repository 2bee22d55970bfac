//! Acknowledged readings a stop could not store, told to the next start.
//!
//! A stop that passes its deadline with readings in memory (the journal
//! off) has already closed its listener: no scrape sees its count. It
//! records the loss in the database, or beside the journal when the
//! database is the reason it could not store; the next start counts each
//! record once in `hourglass_readings_unstored_total` (and the time in
//! `hourglass_readings_unstored_last_timestamp_seconds`, which the alert
//! watches) and logs it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::shutdown::Shutdown;
use crate::store::MongoStore;
use crate::store::mongo::Loss;
use crate::telemetry::metrics::Metrics;

/// The record left beside the journal when the database took none.
const FILE: &str = "UNSTORED";

/// How long a stop tries to record its loss in the database.
const RECORD_WITHIN: Duration = Duration::from_secs(2);

/// How often a start retries reading the records while the database is out.
const RETRY_EVERY: Duration = Duration::from_secs(10);

/// Leaves a record of `readings` lost by this stop (see the module doc).
pub(super) async fn record(store: &MongoStore, dir: &Path, readings: u64) {
    let loss = Loss {
        readings,
        at: now_ms(),
    };
    match tokio::time::timeout(RECORD_WITHIN, store.record_loss(&loss)).await {
        Ok(Ok(())) => {
            info!(
                readings,
                "Recorded the unstored readings in the database for the next start to report."
            );
            return;
        }
        Ok(Err(e)) => warn!(error = %e, "Could not record the unstored readings in the database."),
        Err(_) => warn!("The database did not take the record of unstored readings in time."),
    }
    let path = dir.join(FILE);
    let before = read_file(&path).unwrap_or(0);
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, format!("{}\n", before.saturating_add(readings))));
    match written {
        Ok(()) => info!(
            path = %path.display(),
            readings,
            "Recorded the unstored readings beside the journal for the next start to report."
        ),
        Err(e) => error!(
            path = %path.display(),
            error = %e,
            readings,
            "Could not record the unstored readings anywhere; no start will report them."
        ),
    }
}

/// Reports what earlier stops recorded: the file beside the journal at
/// once, the database's records as soon as it answers.
pub(super) async fn report(
    store: Arc<MongoStore>,
    dir: PathBuf,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let path = dir.join(FILE);
    if let Some(readings) = read_file(&path) {
        announce(&metrics, readings, None);
        if let Err(e) = std::fs::remove_file(&path) {
            // Reported again at the next start: better twice than never.
            warn!(path = %path.display(), error = %e, "Could not remove the record of unstored readings.");
        }
    }
    loop {
        match store.claim_losses().await {
            Ok(losses) => {
                for loss in losses {
                    announce(&metrics, loss.readings, Some(loss.at));
                }
                return;
            }
            Err(e) => {
                info!(error = %e, "Could not read the records of unstored readings yet; retrying.")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_EVERY) => {}
            _ = shutdown.triggered() => return,
        }
    }
}

fn announce(metrics: &Metrics, readings: u64, at: Option<i64>) {
    metrics.unstored(readings);
    warn!(
        readings,
        stopped_at_ms = at,
        "An earlier stop left acknowledged readings stored nowhere (the journal off and the shutdown deadline passed)."
    );
}

/// The count in the file at `path`, if there is one.
fn read_file(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    match text.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            warn!(path = %path.display(), "The record of unstored readings is unreadable; counting it as one.");
            Some(1)
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
