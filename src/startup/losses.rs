//! Acknowledged readings a stop could not store, told to the next start.
//!
//! A stop that passes its deadline with readings in memory (the journal
//! off) has already closed its listener: no scrape sees its count. It
//! writes a record beside the journal (`UNSTORED-<id>`, synced), then the
//! same record, by the same id, to the database, and removes the file once
//! the database took it. The next start reports each record once: the
//! files at once (removing the database's copy of the same id when it
//! answers), then the database's records, each claimed by one instance. A
//! report raises `hourglass_readings_unstored_total` and
//! `hourglass_readings_unstored_last_timestamp_seconds` (which the alert
//! watches) and logs a WARN.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use crate::shutdown::Shutdown;
use crate::store::MongoStore;
use crate::store::mongo::Loss;
use crate::telemetry::metrics::Metrics;

/// The records beside the journal: `UNSTORED-<id>`.
const FILE_PREFIX: &str = "UNSTORED-";

/// How long a stop tries to record its loss in the database.
const RECORD_WITHIN: Duration = Duration::from_secs(2);

/// How often a start retries reading the records while the database is out.
const RETRY_EVERY: Duration = Duration::from_secs(10);

/// No count is larger (a damaged record must not wrap the counter).
const MAX_READINGS: u64 = 1 << 53;

/// Leaves a record of `readings` lost by this stop (see the module doc).
pub(super) async fn record(store: &MongoStore, dir: &Path, readings: u64) {
    let loss = Loss {
        id: uuid::Uuid::new_v4().simple().to_string(),
        readings,
        at: now_ms(),
    };
    let file = dir.join(format!("{FILE_PREFIX}{}", loss.id));
    let on_disk = match write_synced(dir, &file, readings) {
        Ok(()) => true,
        Err(e) => {
            warn!(path = %file.display(), error = %e, "Could not record the unstored readings beside the journal.");
            false
        }
    };
    match tokio::time::timeout(RECORD_WITHIN, store.record_loss(&loss)).await {
        Ok(Ok(())) => {
            info!(
                readings,
                "Recorded the unstored readings in the database for the next start to report."
            );
            if on_disk && let Err(e) = std::fs::remove_file(&file) {
                // Its id is the database's: the next start counts it once.
                warn!(path = %file.display(), error = %e, "Could not remove the record beside the journal.");
            }
        }
        outcome => {
            let reason = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer in time".to_owned(),
            };
            if on_disk {
                info!(path = %file.display(), readings, %reason, "Recorded the unstored readings beside the journal (not in the database) for the next start to report.");
            } else {
                error!(readings, %reason, "Could not record the unstored readings anywhere; no start will report them.");
            }
        }
    }
}

/// `readings` into `file`, whole: a temporary file, synced, renamed.
fn write_synced(dir: &Path, file: &Path, readings: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = file.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{readings}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reports what earlier stops recorded (see the module doc).
pub(super) async fn report(
    store: Arc<MongoStore>,
    dir: PathBuf,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let mut reported = Vec::new();
    for (path, id, readings) in files(&dir) {
        announce(&metrics, readings, None);
        match std::fs::remove_file(&path) {
            Ok(()) => reported.push(id),
            // Reported again at the next start: better twice than never.
            Err(e) => {
                warn!(path = %path.display(), error = %e, "Could not remove the record of unstored readings.")
            }
        }
    }
    loop {
        let mut forgotten = 0;
        for id in &reported {
            if store.forget_loss(id).await.is_err() {
                break;
            }
            forgotten += 1;
        }
        reported.drain(..forgotten);
        if reported.is_empty() {
            match store
                .claim_losses(|loss| announce(&metrics, loss.readings, Some(loss.at)))
                .await
            {
                Ok(()) => return,
                Err(e) => {
                    info!(error = %e, "Could not read the records of unstored readings yet; retrying.")
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_EVERY) => {}
            _ = shutdown.triggered() => return,
        }
    }
}

/// The records beside the journal: path, id and count, unreadable ones
/// logged and removed.
fn files(dir: &Path) -> Vec<(PathBuf, String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(FILE_PREFIX))
            .filter(|id| !id.ends_with(".tmp"))
            .map(str::to_owned)
        else {
            continue;
        };
        // A regular file only: never block on a FIFO put in its place.
        let count = entry
            .file_type()
            .ok()
            .filter(std::fs::FileType::is_file)
            .and_then(|_| std::fs::read_to_string(&path).ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        match count {
            Some(readings) => out.push((path, id, readings.min(MAX_READINGS))),
            None => {
                warn!(path = %path.display(), "A record of unstored readings is unreadable; removing it uncounted.");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out
}

fn announce(metrics: &Metrics, readings: u64, at: Option<i64>) {
    if readings == 0 {
        return;
    }
    metrics.unstored(readings.min(MAX_READINGS));
    warn!(
        readings,
        stopped_at_ms = at,
        "An earlier stop left acknowledged readings stored nowhere (the journal off and the shutdown deadline passed)."
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
