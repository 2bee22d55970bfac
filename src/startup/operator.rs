//! The operator commands' side of startup: a store connected and checked
//! for one command (rebuild, instances, re-drive), no service around it.

use anyhow::Context;

use crate::config::Settings;
use crate::store::MongoStore;

/// `sensor` as the operator commands take it: an id, or a prefix ending in
/// `*` (all sensors when absent). Answers the prefix and whether it is exact.
fn sensor_selection(sensor: Option<&str>) -> (&str, bool) {
    let sensor = sensor.unwrap_or("*");
    match sensor.strip_suffix('*') {
        Some(prefix) => (prefix, false),
        None => (sensor, true),
    }
}

/// The store for an operator command: connected, the database's format
/// checked, the server's limits read.
async fn operator_store(settings: &Settings) -> anyhow::Result<MongoStore> {
    let mut store = MongoStore::connect(&settings.mongodb, &settings.buckets)
        .await
        .context("connecting to MongoDB")?;
    store
        .check_format()
        .await
        .context("checking the database's format")?;
    store
        .read_limits()
        .await
        .context("reading the storage server's limits")?;
    Ok(store)
}

/// `hourglass instances`: every instance recorded on this database, as it
/// last published its floor.
pub async fn instances(settings: &Settings) -> anyhow::Result<Vec<crate::store::InstanceInfo>> {
    operator_store(settings)
        .await?
        .instances()
        .await
        .context("reading the instances' floors")
}

/// `hourglass instances --forget ID`: removes the record of an instance
/// that is gone for good (its journal lost), so that versions are pruned
/// again. Refuses one that published within the last 30 s.
pub async fn forget_instance(settings: &Settings, id: &str) -> anyhow::Result<()> {
    operator_store(settings)
        .await?
        .forget_stopped_instance(id, crate::batcher::clock::unix_ms())
        .await
        .with_context(|| format!("forgetting instance {id:?}"))
}

/// `hourglass redrive`: writes the dead letters of `sensor` (an id, or a
/// prefix ending in `*`; all when absent) into their buckets and deletes
/// them, or (`dry_run`) counts them.
pub async fn redrive(
    settings: &Settings,
    sensor: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<crate::store::Redriven> {
    let (prefix, exact) = sensor_selection(sensor);
    operator_store(settings)
        .await?
        .redrive(prefix, exact, dry_run)
        .await
        .context("re-driving the dead letters")
}

/// `hourglass rebuild-rollups`: recomputes the rollups and registry entries
/// of the buckets in `[from, to)` (epoch seconds; all when not given) for
/// sensor `sensor` or, ending in `*`, the sensors with that id prefix. The
/// migration for data written before rollups, and the repair after a rollup
/// could not be written.
pub async fn rebuild_rollups(
    settings: &Settings,
    sensor: Option<&str>,
    from: Option<i64>,
    to: Option<i64>,
) -> anyhow::Result<i64> {
    let (prefix, exact) = sensor_selection(sensor);
    let store = operator_store(settings).await?;
    store
        .ensure_indexes(&settings.retention())
        .await
        .context("creating the indexes (is MongoDB reachable at mongodb.uri?)")?;
    let days = store
        .rebuild_rollups(prefix, exact, from, to, jiff::Timestamp::now().as_second())
        .await
        .context("rebuilding the rollups")?;
    // All of them: now of this version's layout.
    if sensor.is_none() && from.is_none() && to.is_none() {
        store
            .raise_rollup_version()
            .await
            .context("recording the rollups' layout")?;
    }
    Ok(days)
}
