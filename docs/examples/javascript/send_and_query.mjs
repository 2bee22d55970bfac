// Send a few readings to Hourglass over its JSON API, then read them back.
// Node.js 18 or later (its built-in fetch); no packages.
//
//   HOURGLASS_URL     the service (default http://localhost:8080)
//   HOURGLASS_TOKEN   a bearer token with the ingest and query scopes, when
//                     auth is on (optional)
//   sensor            the first argument, else HOURGLASS_SENSOR (default demo-1)
//
// Prints each reading it sent, then the average and the series of the range,
// as JSON; exits 1 on any error.

const url = (process.env.HOURGLASS_URL ?? "http://localhost:8080").replace(/\/+$/, "");
const sensor = process.argv[2] ?? process.env.HOURGLASS_SENSOR ?? "demo-1";
const metric = "temp";
const headers = { "content-type": "application/json" };
if (process.env.HOURGLASS_TOKEN) headers.authorization = `Bearer ${process.env.HOURGLASS_TOKEN}`;

// The JSON body of a 2xx answer; otherwise an error showing Hourglass's.
async function call(method, path, params, body) {
  const target = `${url}${path}?${new URLSearchParams(params)}`;
  const response = await fetch(target, { method, headers, body: body && JSON.stringify(body) });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${target}: ${response.status} ${text}`);
  return JSON.parse(text);
}

// RFC 3339 in whole seconds: Hourglass keeps one value per (sensor, metric, second).
const rfc3339 = (ms) => new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");

try {
  // Three readings ten seconds apart, the last one now.
  const now = Math.floor(Date.now() / 1000) * 1000;
  const readings = [20.5, 20.75, 21.25].map((value, i) => ({
    sensor, metric, ts: rfc3339(now - 10_000 * (2 - i)), value,
  }));

  // One request for all of them, all or nothing. A 200 means they are safe
  // (in the journal) and queries see them; wait=stored answers once they are
  // in the database too. A 503 is always safe to retry.
  await call("POST", "/api/v1/readings", { wait: "stored" }, readings);
  for (const reading of readings) console.log("sent", JSON.stringify(reading));

  // `from` is inclusive and `to` exclusive: the range holds the three seconds.
  const range = { metric, from: readings[0].ts, to: rfc3339(now + 1000) };
  const path = `/api/v1/sensors/${encodeURIComponent(sensor)}`;
  const average = await call("GET", `${path}/average`, range);
  console.log("average", JSON.stringify(average));
  const series = await call("GET", `${path}/series`, { ...range, step: "1m" });
  console.log("series", JSON.stringify(series));
} catch (error) {
  // fetch's own failures (a refused connection) say why in their cause.
  console.error(error.message, error.cause?.message ?? "");
  process.exit(1);
}
