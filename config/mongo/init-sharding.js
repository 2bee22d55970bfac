// Run by the `sharding-init` service of the "sharded" profile, against
// mongos, after the config server and shard replica sets are initiated.
// Each key is the collection's unique index (see docs/src/operating/scaling-out.md): every
// upsert filter and `$merge` `on` carries the full key (required on a
// sharded collection), and a query for one series over a time range
// targets the chunks of that range only.
//   buckets  { sensor: 1, metric: 1, start: 1 }
//   rollups  { sensor: 1, metric: 1, period: 1, start: 1 }
//   sensors  { _id: "hashed" }  (the registry: one document per sensor)
// The dead letters, late markers, change log and metadata stay on the
// primary shard.
sh.addShard("shard1/shard1:27018");
sh.addShard("shard2/shard2:27018");
sh.enableSharding("hourglass");
// The three sharded collections are created here, before the service
// starts, the way the service creates its collections (`create` with
// mongodb.block_compressor, zstd by default; src/store/mongo/indexes.rs):
// one that createIndex or shardCollection creates gets the server's
// default compressor (snappy unless configured otherwise), and an existing
// one keeps its own. As in the service, a collection that exists is left as
// it is, so the script may run again on a cluster that has them. The
// service creates the other collections itself, zstd-compressed, at its
// first start.
const hourglass = db.getSiblingDB("hourglass");
const existing = hourglass.getCollectionNames();
for (const name of ["buckets", "rollups", "sensors"]) {
  if (!existing.includes(name)) {
    hourglass.createCollection(name, {
      storageEngine: { wiredTiger: { configString: "block_compressor=zstd" } },
    });
  }
}
db.getSiblingDB("hourglass").buckets.createIndex(
  { sensor: 1, metric: 1, start: 1 },
  { unique: true, name: "sensor_metric_start" }
);
sh.shardCollection("hourglass.buckets", { sensor: 1, metric: 1, start: 1 }, true);
db.getSiblingDB("hourglass").rollups.createIndex(
  { sensor: 1, metric: 1, period: 1, start: 1 },
  { unique: true, name: "sensor_metric_period_start" }
);
sh.shardCollection("hourglass.rollups", { sensor: 1, metric: 1, period: 1, start: 1 }, true);
sh.shardCollection("hourglass.sensors", { _id: "hashed" });
