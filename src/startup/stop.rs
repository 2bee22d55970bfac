//! The stop, in order: the batcher drained, the upkeep's last roll-up,
//! MQTT's outstanding acknowledgements, the floor's farewell and the
//! journal's last commit, all within the shutdown's deadline.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tracing::{error, info, warn};

use crate::batcher::driver::{self, BatcherHandle};
use crate::ingest::mqtt::MqttIngest;
use crate::journal::{Journal, JournalTask};
use crate::shutdown::Shutdown;
use crate::store::MongoStore;

/// How long after the shutdown deadline a write still under way may take
/// before the process gives up on it: the deadline plus this is the longest
/// a shutdown lasts.
pub(super) const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a stopping instance tries to leave its floor (see `store::floor`).
const FLOOR_FAREWELL: std::time::Duration = std::time::Duration::from_secs(10);

/// What is left to stop once HTTP is done.
pub(super) struct Stopping {
    pub(super) shutdown: Shutdown,
    pub(super) batcher: BatcherHandle,
    pub(super) driver: tokio::task::JoinHandle<driver::Drained>,
    pub(super) upkeep: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    pub(super) floor: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    pub(super) mqtt: Option<MqttIngest>,
    pub(super) journal: Option<(Journal, tokio::task::JoinHandle<JournalTask>)>,
    /// Where a loss is recorded for the next start: the database, else
    /// beside the journal (`startup::losses`).
    pub(super) losses: (Arc<MongoStore>, PathBuf),
}

/// The batcher drained, the upkeep's last roll-up, MQTT's outstanding
/// acknowledgements, the floor's farewell and the journal's last commit,
/// all within the shutdown's deadline. Fails if accepted readings were not
/// stored.
pub(super) async fn stop(stopping: Stopping) -> anyhow::Result<()> {
    // Long: the stop's steps in their order, each bounded by the deadline; apart they would only pass the same handles along.
    let Stopping {
        shutdown,
        batcher,
        driver,
        upkeep,
        floor,
        mqtt,
        journal,
        losses,
    } = stopping;
    // Serving can end without a signal only by failing; either way, stop.
    shutdown.trigger();
    let grace = async {
        shutdown.deadline_passed().await;
        tokio::time::sleep(DEADLINE_GRACE).await;
    };
    let unstored = tokio::select! {
        drained = driver => drained.context("the batcher driver panicked")?.unstored_readings,
        // A write still under way at the deadline: what it holds counts as
        // unstored, but for readings the journal keeps for the next start.
        _ = grace => batcher.unjournaled(),
    };
    let (end_upkeep, upkeep) = upkeep;
    let (end_floor, mut floor_task) = floor;
    let _ = end_upkeep.send(());
    let _ = end_floor.send(());
    tokio::select! {
        _ = upkeep => {}
        _ = shutdown.deadline_passed() => {
            info!("The rollup upkeep was still running at the shutdown deadline; queries read the buckets of what it did not roll up.");
        }
    }
    if let Some(mqtt) = mqtt {
        // Everything stored has its acknowledgement sent before we disconnect.
        mqtt.finish().await;
    }
    // Its last write says whether this instance still owes readings;
    // bounded, since the database may be gone. Cut short, the floor it
    // published last stays: never later than what it owes.
    let left = tokio::select! {
        done = tokio::time::timeout(FLOOR_FAREWELL, &mut floor_task) => done.is_ok(),
        _ = async {
            shutdown.deadline_passed().await;
            tokio::time::sleep(DEADLINE_GRACE).await;
        } => false,
    };
    if !left {
        floor_task.abort();
        warn!(
            "Could not update this instance's floor on the way out; the last one published stands."
        );
    }
    // Whether the journal keeps readings for the next start.
    let mut journal_keeps = false;
    if let Some((_, task)) = journal {
        // Appends already queued are committed; stored segments deleted.
        match task.await {
            Ok(task) => journal_keeps = task.finish().await,
            Err(e) => {
                error!(error = %e, "The journal task failed; the next start replays what it holds.")
            }
        }
    }
    if unstored > 0 {
        error!(
            readings = unstored,
            "Stopped with accepted readings that were not stored."
        );
        // The listener is closed: no scrape sees this stop's count. The
        // next start reports it.
        super::losses::record(&losses.0, &losses.1, unstored as u64).await;
        anyhow::bail!("{unstored} accepted readings were not stored");
    }
    if journal_keeps {
        info!(
            "Hourglass stopped; accepted readings not stored yet are in the journal for the next start."
        );
    } else {
        info!("Hourglass stopped; every accepted reading was stored.");
    }
    Ok(())
}
