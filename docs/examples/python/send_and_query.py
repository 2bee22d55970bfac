#!/usr/bin/env python3
"""Send a few readings to Hourglass over its JSON API, then read them back.

    HOURGLASS_URL     the service (default http://localhost:8080)
    HOURGLASS_TOKEN   a bearer token with the ingest and query scopes, when
                      auth is on (optional)
    sensor            the first argument, else HOURGLASS_SENSOR (default demo-1)

Needs requests (pip install requests). Prints each reading it sent, then the
average and the series of the range, as JSON; exits 1 on any error.
"""

import json
import os
import sys
from datetime import datetime, timedelta, timezone

import requests

URL = os.environ.get("HOURGLASS_URL", "http://localhost:8080").rstrip("/")
TOKEN = os.environ.get("HOURGLASS_TOKEN")
SENSOR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HOURGLASS_SENSOR", "demo-1")
METRIC = "temp"

http = requests.Session()
if TOKEN:
    http.headers["Authorization"] = f"Bearer {TOKEN}"


def answer(response):
    """The JSON body of a 2xx answer; otherwise exit, showing Hourglass's error."""
    if not response.ok:
        sys.exit(f"{response.request.method} {response.url}: {response.status_code} {response.text}")
    return response.json()


def rfc3339(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# Three readings ten seconds apart, the last one now. Hourglass keeps whole
# seconds, one value per (sensor, metric, second): sending one again is harmless.
now = datetime.now(timezone.utc).replace(microsecond=0)
readings = [
    {"sensor": SENSOR, "metric": METRIC, "ts": rfc3339(now - timedelta(seconds=10 * (2 - i))), "value": value}
    for i, value in enumerate([21.5, 21.75, 22.5])
]

# One request for all of them, all or nothing. A 200 means they are safe (in
# the journal) and queries see them; wait=stored answers once they are in the
# database too. A 503 is always safe to retry.
answer(http.post(f"{URL}/api/v1/readings", params={"wait": "stored"}, json=readings, timeout=60))
for reading in readings:
    print("sent", json.dumps(reading))

# `from` is inclusive and `to` exclusive: the range holds the three seconds.
window = {"metric": METRIC, "from": readings[0]["ts"], "to": rfc3339(now + timedelta(seconds=1))}
average = answer(http.get(f"{URL}/api/v1/sensors/{SENSOR}/average", params=window, timeout=60))
print("average", json.dumps(average))
series = answer(http.get(f"{URL}/api/v1/sensors/{SENSOR}/series", params={**window, "step": "1m"}, timeout=60))
print("series", json.dumps(series))
