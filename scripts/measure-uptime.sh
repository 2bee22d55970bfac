#!/usr/bin/env bash
# Uptime's latency by interval against the average, on one sensor with 30
# days at a reading a minute and an hour without readings every seven hours
# (docs/src/measuring.md, "Uptime over a long history"). Against a running
# instance started with HOURGLASS__INGEST__MAX_AGE=40d on an empty database:
#   scripts/measure-uptime.sh http://127.0.0.1:8080
set -euo pipefail
U=${1:-http://127.0.0.1:8080}
python3 - "$U" <<'PY'
import json, sys, time, urllib.error, urllib.request
url = sys.argv[1]
now = int(time.time())
start = now - 30 * 86400
start -= start % 60
readings = [{"sensor": "up-1", "metric": "level", "ts": t * 1000, "value": (t // 60) % 17}
            for t in range(start, now - 3600, 60) if (t // 3600) % 7 != 3]
def metric(name):
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))
# Sent once: a second run on the same instance only measures (sending the
# readings again would mark every hour late and roll it up again).
if metric("hourglass_readings_stored_total") < len(readings):
    for i in range(0, len(readings), 1000):
        body = json.dumps(readings[i:i + 1000]).encode()
        while True:
            req = urllib.request.Request(url + "/api/v1/readings", data=body,
                                         headers={"content-type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=600).read()
                break
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
                time.sleep(2)
# Stored, then rolled up: the hours rolled up stop moving for 30 s.
while metric("hourglass_readings_stored_total") < len(readings):
    time.sleep(5)
rolled, still = -1.0, 0
while still < 3:
    time.sleep(10)
    now_rolled = metric("hourglass_rollup_hours_total")
    still = still + 1 if now_rolled == rolled else 0
    rolled = now_rolled
print(f"{len(readings)} readings stored", file=sys.stderr)
PY
FROM30=$(date -u -d '-30 days +2 hours' +%Y-%m-%dT%H:%M:%SZ)
FROM1=$(date -u -d '-1 day -2 hours' +%Y-%m-%dT%H:%M:%SZ)
TO=$(date -u -d '-2 hours' +%Y-%m-%dT%H:%M:%SZ)
sums() {
  curl -s "$U/metrics" | grep -E "hourglass_query_(documents_read|round_trips)_sum\{endpoint=\"$1\"\}" | awk '{print $2}' | tr '\n' ' '
}
for F in "$FROM1" "$FROM30"; do
  for q in "uptime?metric=level&interval=30s" "uptime?metric=level&interval=5m" \
           "uptime?metric=level&interval=1h" "uptime?metric=level&interval=1d" "average?metric=level"; do
    ep=${q%%\?*}
    read -r d0 r0 <<< "$(sums "$ep")"
    d0=${d0:-0} r0=${r0:-0}   # no such query yet: no line
    times=()
    for _ in 1 2 3 4 5; do
      times+=("$(curl -s -o /dev/null -w '%{time_total}' -H 'Cache-Control: no-cache' "$U/api/v1/sensors/up-1/$q&from=$F&to=$TO")")
    done
    read -r d1 r1 <<< "$(sums "$ep")"
    median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
    echo "from $F $q: median ${median} s, $(( (${d1%.*} - ${d0%.*}) / 5 )) documents, $(( (${r1%.*} - ${r0%.*}) / 5 )) round trips a request"
  done
done
