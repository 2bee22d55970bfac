// Publish a few readings to Hourglass through an MQTT broker, at QoS 1.
// Node.js 18 or later, with the mqtt package (npm install mqtt).
//
//   MQTT_URL   the broker Hourglass subscribes to (default mqtt://localhost:1883;
//              mqtt://user:password@host:port when it wants a login)
//   sensor     the first argument, else HOURGLASS_SENSOR (default demo-1)
//
// Prints each topic and payload once the broker acknowledged it; exits 1 on
// any error.

import mqtt from "mqtt";

const brokerUrl = process.env.MQTT_URL ?? "mqtt://localhost:1883";
const sensor = process.argv[2] ?? process.env.HOURGLASS_SENSOR ?? "demo-1";
const metric = "temp";
// sensors/{sensor}/{metric} takes a bare number (stamped on receipt) or
// {"value": …, "ts": …}; sensors/{sensor} takes reading objects as over HTTP.
const topic = `sensors/${sensor}/${metric}`;

let client;
try {
  // Resolves once the broker accepted the connection; rejects when it is
  // unreachable or refuses (false: no retries for this first connection; a
  // connection lost later is made again and the unacknowledged sent again).
  client = await mqtt.connectAsync(brokerUrl, { connectTimeout: 10_000 }, false);

  // Three readings ten seconds apart, the last one now, in whole seconds.
  const now = Math.floor(Date.now() / 1000) * 1000;
  for (const [i, value] of [17.5, 17.75, 18.0].entries()) {
    const ts = new Date(now - 10_000 * (2 - i)).toISOString().replace(/\.\d+Z$/, "Z");
    const payload = JSON.stringify({ value, ts });
    // QoS 1: resolves once the broker acknowledged the message (PUBACK), and
    // Hourglass's own session receives it at least once (stored once).
    await client.publishAsync(topic, payload, { qos: 1 });
    console.log("published", topic, payload);
  }
  await client.endAsync(); // a clean DISCONNECT
} catch (error) {
  console.error(`MQTT (${brokerUrl}): ${error.message}`);
  client?.end(true);
  process.exit(1);
}
