// Run once by the `sharding-init` service of the "sharded" profile, against
// mongos, after the config server and shard replica sets are initiated.
// Shard key: { sensor: 1, metric: 1, start: 1 } (see README, "Sharding").
// It is the unique bucket index itself: every upsert filter carries the full
// key (required for upserts on a sharded collection), and a query for one
// sensor and metric over a time range targets the chunks of that range only.
sh.addShard("shard1/shard1:27018");
sh.addShard("shard2/shard2:27018");
sh.enableSharding("hourglass");
db.getSiblingDB("hourglass").buckets.createIndex(
  { sensor: 1, metric: 1, start: 1 },
  { unique: true, name: "sensor_metric_start" }
);
sh.shardCollection("hourglass.buckets", { sensor: 1, metric: 1, start: 1 }, true);
