// Run once by the `sharding-init` service of the "sharded" profile, against
// mongos, after the config server and shard replica sets are initiated.
// Each key is the collection's unique index (see docs/src/operating/scaling-out.md): every
// upsert filter and `$merge` `on` carries the full key (required on a
// sharded collection), and a query for one series over a time range
// targets the chunks of that range only.
//   buckets  { sensor: 1, metric: 1, start: 1 }
//   rollups  { sensor: 1, metric: 1, period: 1, start: 1 }
//   sensors  { _id: "hashed" }  (the registry: one document per sensor)
// The dead letters and the metadata document stay on the primary shard.
sh.addShard("shard1/shard1:27018");
sh.addShard("shard2/shard2:27018");
sh.enableSharding("hourglass");
// Created here, before the service starts, so with the compressor the
// service would give them (mongodb.block_compressor, zstd by default):
// a collection created by createIndex gets the server's default.
for (const name of ["buckets", "rollups"]) {
  db.getSiblingDB("hourglass").createCollection(name, {
    storageEngine: { wiredTiger: { configString: "block_compressor=zstd" } },
  });
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
