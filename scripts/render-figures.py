#!/usr/bin/env python3
"""The book's measured figures, rendered from the load test's reports.

    python3 scripts/render-figures.py           # rewrite the generated tables
    python3 scripts/render-figures.py --check   # exit 1 if a page differs

Each `hourglass-loadtest` run leaves `loadtest/results/<name>/report.json`
with its date, commit, command line and figures (`data`). A table row here
names the scenario it needs as a command (`storage`, `history
--long-history 1000`, …) and takes its figures from the latest report of
that scenario by the report's own date. A scenario is the report's command
without the options that do not change what is measured (`--name`,
`--quiet`, `--json`, `--no-files`, `--results-dir`, and `--hourglass-bin`
when it is the default binary). A report without a date or a command is
never used: its figures cannot be dated. A run that changed the service's
environment (a `HOURGLASS__…` variable) looks like any other run of its
command, so give it `--results-dir` outside `loadtest/results/`.

The tables are written between marker comments in the pages,
`<!-- figures:<table> begin … -->` and `<!-- figures:<table> end -->`;
each row, or each table, carries its report's date and command. `--check`
(run by scripts/check-docs.py, so by `make docs` and `make test`) exits 1
if a page differs from what this renders, or if a row of a generated table
names a report (date and command) that is not in loadtest/results/.

A figure is left out, and named under its table, when no dated report of
its scenario exists; a peer's figure is marked, not shown, when it is
below what the data needs (see `FLOOR`).
"""

import argparse
import difflib
import json
import math
import re
import shlex
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
RESULTS = ROOT / "loadtest" / "results"
REGENERATE = "run `python3 scripts/render-figures.py` to regenerate"

# Global options of hourglass-loadtest (loadtest/src/ctx.rs `Global`) that
# change where a report goes or how it prints, not what it measures.
IGNORED_WITH_VALUE = {"--name", "--results-dir"}
IGNORED_FLAGS = {"--quiet", "--json", "--no-files"}
DEFAULT_BINARIES = {"target/release/hourglass"}

# `storage` stores a random walk whose every step is one of 7 equally likely
# values (loadtest/src/storage.rs `walk`): no store holds a reading in fewer
# than log2(7) bits on average. A peer's size below that did not hold every
# reading when it was sized.
FLOOR = math.log2(7) / 8


class Missing(Exception):
    """A figure with no report behind it."""


# ---------------------------------------------------------------- reports


class Report:
    def __init__(self, path):
        raw = json.loads(path.read_text())
        parent = path.parent
        self.dir = (parent.relative_to(ROOT) if parent.is_relative_to(ROOT) else parent).as_posix()
        self.title = raw.get("title", "")
        self.machine = raw.get("machine", "")
        self.commit = raw.get("commit") or ""
        self.command = raw.get("command") or ""
        self.date_text = raw.get("date") or ""
        self.notes = raw.get("notes", [])
        self.sections = raw.get("sections", [])
        self.data = raw.get("data", {})
        self.date = None
        if self.date_text:
            try:
                self.date = datetime.strptime(self.date_text, "%Y-%m-%d %H:%M UTC").replace(
                    tzinfo=timezone.utc
                )
            except ValueError:
                pass
        self.scenario = scenario(self.command) if self.command else None

    def get(self, *path):
        value = self.data
        for key in path:
            if not isinstance(value, dict) or key not in value or value[key] is None:
                raise Missing(f"{self.dir}/report.json has no data.{'.'.join(path)}")
            value = value[key]
        return value

    def source(self):
        return f"{self.date_text}, `{self.command}`"


def scenario(command):
    """The command without its program and the options that do not change
    what is measured, as one string."""
    words = shlex.split(command)
    if words and words[0].endswith("hourglass-loadtest"):
        words = words[1:]
    kept = []
    i = 0
    while i < len(words):
        word, value = words[i], None
        if "=" in word and word.startswith("--"):
            word, value = word.split("=", 1)
        takes_value = word in IGNORED_WITH_VALUE or word == "--hourglass-bin"
        if takes_value and value is None:
            value = words[i + 1] if i + 1 < len(words) else ""
            i += 1
        i += 1
        if word in IGNORED_WITH_VALUE or word in IGNORED_FLAGS:
            continue
        if word == "--hourglass-bin" and value in DEFAULT_BINARIES:
            continue
        kept.append(word if value is None else f"{word} {value}")
    return " ".join(kept)


def load_reports(results):
    return [Report(p) for p in sorted(results.rglob("report.json"))]


def latest(reports, wanted):
    dated = [r for r in reports if r.date and r.command and r.scenario == wanted]
    return max(dated, key=lambda r: (r.date, r.dir)) if dated else None


# ---------------------------------------------------------------- numbers


def n(x, sig=3):
    """`x` to `sig` significant digits (a whole number as it is), without
    trailing zeros; thousands grouped by spaces."""
    x = float(x)
    if x == 0:
        return "0"
    if x == round(x) and abs(x) >= 1:
        return f"{round(x):,}".replace(",", " ")
    digits = max(0, sig - 1 - int(math.floor(math.log10(abs(x)))))
    if digits == 0:
        return f"{round(x):,}".replace(",", " ")
    return f"{x:.{digits}f}".rstrip("0").rstrip(".")


def spread(values, sig=3):
    lo, hi = min(values), max(values)
    return n(lo, sig) if n(lo, sig) == n(hi, sig) else f"{n(lo, sig)}–{n(hi, sig)}"


def ratio(x):
    return f"{x:.2f}×"


def by(values, sig=3):
    return " / ".join(n(v, sig) for v in values)


# ---------------------------------------------------------------- rows


class Row:
    """One row of a table: what it shows, the scenario it needs, and how
    its cells are read from that scenario's latest report."""

    def __init__(self, what, scenario, cells, optional=False):
        self.what = what
        self.scenario = scenario
        self.cells = cells
        # Left out, and named under the table, while no dated report of its
        # scenario exists (a required row's absence is a fault).
        self.optional = optional


PANELS = [
    "avg_over_time(m0[1h]), 1 h step",
    "max_over_time(m0[1h]), 1 h step",
    "fleet avg(avg_over_time(m0[1h])), 1 h step",
    "fleet 1 d mean, 1 d step",
]
HISTORY = "history --long-history 1000"
HISTORY_CATCH_UP = "history --catch-up-only"
BACKFILL = "backfill --sensors 1 --metrics 1 --seconds 5184000 --interval 60"
RANGES = "ranges --days 60 --interval 600 --repeats 10"
STORAGE = "storage"
PEERS = "peers --sensors 300 --seconds 600"


def history_write(r):
    # The short series holds 200 buckets (loadtest/src/history.rs `write_costs`).
    return [
        f"A bucket write into a series with {n(r.get('write_cost', 'long_history'))} "
        "buckets of history, against one with 200, on the stand-in",
        ratio(r.get("write_cost", "ratio")),
        f"{n(r.get('write_cost', 'long_examined'))} document examined",
    ]


def history_panels(r):
    panels = [r.get("history", p) for p in PANELS]
    series = r.get("history", "json_hourly_series")
    return [
        "Fleet PromQL panels, 72 sensors × 8 days, on the stand-in, settled",
        f"{spread([p['cold_ms'] for p in panels])} ms cold, "
        f"{spread([p['refresh_ms'] for p in panels])} ms refreshed; the JSON hourly series "
        f"{n(series['cold_ms'])} ms cold, {n(series['refresh_ms'])} ms refreshed; "
        f"VictoriaMetrics {spread([p['victoriametrics_ms'] for p in panels])} ms",
        f"{spread([p['documents'] for p in panels])} documents in "
        f"{spread([p['round_trips'] for p in panels])} round trips cold, "
        f"{spread([p['refresh_documents'] for p in panels])} refreshed",
    ]


def history_after_stored(r):
    panels = [r.get("history", p, "after_stored") for p in PANELS]
    c = r.get("history", "catch_up")
    late = r.get("history", "catch_up", "marked_late_5s_after_stored")
    marked = (
        f"none marked late {n(c['seconds_after_stored'], 2)} s after stored"
        if late == 0
        else f"{n(late)} series-hours still marked late 5 s after stored"
    )
    return [
        "Fleet panels 5 s after a backfill of the same 72 sensors × 8 days is stored, "
        "with the journal on (the default), on the stand-in",
        f"{spread([p['cold_ms'] for p in panels])} ms cold, "
        f"{spread([p['refresh_ms'] for p in panels])} ms refreshed; {marked}; "
        f"{n(c['series_hours_per_s'])} series-hours rolled up a second",
        f"{spread([p['documents'] for p in panels])} documents cold",
    ]


def history_catch_up(r):
    c = r.get("history", "catch_up_refreshed")
    a, d, p = c["alone"], c["refreshed"], c["panels"]
    return [
        "The rollup catch-up of that backfill with a dashboard of 5 panels refreshing "
        "every 5 s from its first request, on the stand-in",
        f"{ratio(c['rate_ratio'])} its rate alone ({n(d['series_hours_per_s'])} against "
        f"{n(a['series_hours_per_s'])} series-hours a second); none marked late "
        f"{n(d['seconds_after_stored'], 2)} s after stored ({n(a['seconds_after_stored'], 2)} s alone); "
        f"panels {n(p['ok'])} answered, {n(p['unavailable'])} refused at once with Retry-After, "
        f"median {n(p['latency_ms']['p50'])} ms",
        "–",
    ]


def history_group(r):
    g = r.get("history", "group_average")
    return [
        "A 150-sensor group average over four days, on the stand-in",
        f"{n(g['cold_ms'])} ms cold, {n(g['refresh_ms'])} ms refreshed",
        f"{n(g['documents'])} documents in {n(g['round_trips'])} round trips cold, "
        f"{n(g['refresh_documents'])} refreshed",
    ]


def backfill(r):
    b = r.get("backfill")
    c = r.get("backfill_catch_up")
    spans = ["1d", "7d", "60d"]
    after = [r.get("backfill_averages", s, "after_stored") for s in spans]
    settled = [r.get("backfill_averages", s, "settled") for s in spans]
    marked = (
        f"none marked late {n(c['seconds_after_stored'], 2)} s after stored"
        if c.get("marked_late_5s_after_stored") == 0
        else f"{n(c['marked_late_5s_after_stored'])} series-hours still marked late 5 s after stored"
    )
    exact = "verified exact" if r.get("verify", "exact") else "NOT exact"
    return [
        "60 days of one sensor at a reading a minute, backfilled, on the stand-in",
        f"stored in {n(b['seconds'])} s, rolled up in {n(r.get('backfill_rolled_up', 'seconds'))} s, "
        f"{exact}; {marked}; the 1 / 7 / 60-day averages 5 s after stored "
        f"{by([a['cold_ms'] for a in after])} ms, settled {by([s['cold_ms'] for s in settled])} ms",
        f"{n(b['writes_per_reading'])} bucket update per reading, {n(b['round_trips'])} write round trips; "
        f"the averages read {by([a['documents'] for a in after])} documents 5 s after stored, "
        f"{by([s['documents'] for s in settled])} settled",
    ]


def ranges_averages(r):
    mean = [r.get("ranges", f"average_{d}") for d in ("1d", "7d", "60d")]
    weighted = [r.get("ranges", f"time_weighted_{d}") for d in ("1d", "7d", "60d")]
    vm = [r.get("ranges", "peers", f"average_{d}", "victoria_metrics") for d in ("1d", "7d", "60d")]
    ifx = [r.get("ranges", "peers", f"average_{d}", "influxdb") for d in ("1d", "7d", "60d")]
    exact = all(q.get("exact") for q in mean + weighted)
    agree = all(p.get("agrees") for p in vm + ifx)
    return [
        "One sensor at a reading every 10 minutes: the mean and the time-weighted average "
        "(`weighting=time`) over 1 / 7 / 60 days, on the stand-in",
        f"{by([q['p50_ms'] for q in mean])} ms and {by([q['p50_ms'] for q in weighted])} ms "
        f"(p50){', every answer exact' if exact else ', NOT every answer exact'}; "
        f"VictoriaMetrics {spread([p['p50_ms'] for p in vm])} ms, "
        f"InfluxDB 1.x {spread([p['p50_ms'] for p in ifx])} ms"
        f"{'' if agree else ' (not every answer agreed)'}",
        f"{by([q['documents'] for q in mean])} documents and {by([q['documents'] for q in weighted])}",
    ]


def ranges_percentiles(r):
    q = [r.get("ranges", f"quantiles_{d}") for d in ("1d", "30d")]
    e = [r.get("ranges", f"exception_quantiles_{d}") for d in ("1d", "30d")]
    within = all(x.get("within_accuracy") for x in q + e)
    return [
        "Percentiles (`quantiles=0.5,0.95,0.99`) from the rollups' sketches over 1 / 30 days, "
        "the same sensor and one reporting by exception, on the stand-in",
        f"{by([x['p50_ms'] for x in q])} ms and {by([x['p50_ms'] for x in e])} ms (p50); "
        + ("every percentile within 1 % of the exact one" if within else "NOT every percentile within 1 %"),
        f"{by([x['documents'] for x in q])} documents and {by([x['documents'] for x in e])}",
    ]


def ranges_exception(r):
    spans = ("1d", "30d")
    mean = [r.get("ranges", f"exception_mean_{d}") for d in spans]
    day = [r.get("ranges", f"exception_time_weighted_{d}_1d") for d in spans]
    hour = [r.get("ranges", f"exception_time_weighted_{d}_1h") for d in spans]
    exact = all(x.get("exact") for x in mean + day + hour)
    return [
        "One sensor reporting by exception, time-weighted over 1 / 30 days with a 1-day "
        "and a 1-hour staleness limit, against the mean, on the stand-in",
        f"{by([x['p50_ms'] for x in day])} ms and {by([x['p50_ms'] for x in hour])} ms "
        f"against {by([x['p50_ms'] for x in mean])} ms (p50)"
        f"{', every answer exact' if exact else ', NOT every answer exact'}",
        f"{by([x['documents'] for x in day])} and {by([x['documents'] for x in hour])} documents "
        f"against {by([x['documents'] for x in mean])}",
    ]


def ranges_group(r):
    g = r.get("ranges", "group average 6h over the fleet")
    vm = r.get("ranges", "peers", "group_average_6h_over_the_fleet", "victoria_metrics")
    ifx = r.get("ranges", "peers", "group_average_6h_over_the_fleet", "influxdb")
    return [
        "A group average over 100 sensors and 6 hours, on the stand-in",
        f"{n(g['p50_ms'])} ms (p50){', exact' if g.get('exact') else ', NOT exact'}; "
        f"VictoriaMetrics {n(vm['p50_ms'])} ms, InfluxDB 1.x {n(ifx['p50_ms'])} ms",
        f"{n(g['documents'])} documents",
    ]


def intervals(r):
    """The intervals (seconds) a storage report holds, in order."""
    found = {int(m.group(1)) for k in r.data if (m := re.fullmatch(r"storage_(\d+)s_peers", k))}
    if not found:
        raise Missing(f"{r.dir}/report.json has no data.storage_<interval>s_peers")
    return sorted(found)


def storage_current(r):
    steps = intervals(r)
    minute = [r.get(f"storage_{i}s_minute") for i in steps]
    hour = [r.get(f"storage_{i}s_hour") for i in steps]
    peers = [r.get(f"storage_{i}s_peers") for i in steps]
    shown = " / ".join(f"{i} s" for i in steps)
    vm = " / ".join(
        "–" if p["victoria_metrics_per_reading"] < FLOOR else n(p["victoria_metrics_per_reading"])
        for p in peers
    )
    return [
        f"Bytes per reading, 20 sensors × 1 day at a reading every {shown}, everything rolled up "
        "(the table below)",
        f"minute buckets {by([m['bson_per_reading'] for m in minute])} as BSON, "
        f"{by([m['zstd_per_reading'] for m in minute])} in zstd pages; hour buckets "
        f"{by([h['bson_per_reading'] for h in hour])} and {by([h['zstd_per_reading'] for h in hour])}; "
        f"InfluxDB 1.x {by([p['influxdb_per_reading'] for p in peers], 2)}, "
        f"VictoriaMetrics {vm}"
        + (" (– under what the data needs, see below)" if "–" in vm else ""),
        "minute buckets "
        + by([m["documents"] * 1000 / m["readings"] for m in minute])
        + " documents per 1 000 readings, hour buckets "
        + by([h["documents"] * 1000 / h["readings"] for h in hour]),
    ]


def peers_ratios(r):
    ratios = r.get("cpu_ratios_to_victoria_metrics_settled")
    rounds = len(r.get("victoria_metrics_cpu_s_per_million_by_round"))
    names = ratios.get("rows") or []

    def median(kind, row):
        if row not in names:
            raise Missing(f"{r.dir}/report.json has no settled ratio for {row}")
        return ratio(statistics.median(ratios[kind][names.index(row)]))

    return [
        "Service CPU per reading against VictoriaMetrics, line protocol over HTTP, each until "
        f"settled (the median of {rounds} interleaved rounds)",
        f"{median('with_driver', 'line_protocol_journaled')} with the journal (the default), "
        f"{median('with_driver', 'line_protocol')} without "
        f"({median('without_driver', 'line_protocol_journaled')} and "
        f"{median('without_driver', 'line_protocol')} without the MongoDB driver); "
        f"JSON {median('with_driver', 'json')}",
        "–",
    ]


CURRENT = [
    Row(
        "service CPU per reading against VictoriaMetrics and InfluxDB 1.x",
        PEERS,
        peers_ratios,
        optional=True,
    ),
    Row("history write", HISTORY, history_write),
    Row("history panels", HISTORY, history_panels),
    Row("history group", HISTORY, history_group),
    Row("history after stored", HISTORY, history_after_stored),
    Row("history catch-up", HISTORY_CATCH_UP, history_catch_up),
    Row("backfill", BACKFILL, backfill),
    Row("ranges averages", RANGES, ranges_averages),
    Row("ranges exception", RANGES, ranges_exception),
    Row("ranges percentiles", RANGES, ranges_percentiles),
    Row("ranges group", RANGES, ranges_group),
    Row("storage", STORAGE, storage_current),
]

# Figures the book once quoted whose reports carry no date or command, and
# no row here reads yet: named under the table.
UNDATED = [
    ("`hourglass import` against the HTTP path", "transfer --sensors 600 --rounds 7"),
    (
        "averages, time-weighted averages and percentiles over 400 days",
        "ranges --days 400 --interval 3600 --repeats 10",
    ),
]


# ---------------------------------------------------------------- tables


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def machines(used):
    by_machine = {}
    for r in used:
        by_machine.setdefault(r.machine, []).append(f"`{r.scenario}`")
    if len(by_machine) == 1:
        return [f"Run on {next(iter(by_machine))}."]
    return [
        "The reports ran on: "
        + "; ".join(f"{m} ({', '.join(sorted(set(s)))})" for m, s in by_machine.items())
        + "."
    ]


def not_shown(reports, pending):
    missing = [f"{what} (`hourglass-loadtest {s}`)" for what, s in pending if not latest(reports, s)]
    for what, s in [(what, s) for what, s in pending if latest(reports, s)]:
        print(f"figures: a dated report of `{s}` exists, but no row reads it ({what})", file=sys.stderr)
    if not missing:
        return []
    return ["", "Not shown until a dated report of their run exists: " + "; ".join(missing) + "."]


def render_current(reports, used):
    rows, seen, absent = [], [], []
    for row in CURRENT:
        r = latest(reports, row.scenario)
        if r is None and row.optional:
            absent.append((row.what, row.scenario))
            continue
        if r is None:
            raise Missing(f"no dated report of `hourglass-loadtest {row.scenario}` for {row.what}")
        rows.append([*row.cells(r), r.source()])
        if r not in seen:
            seen.append(r)
    used.extend(seen)
    return (
        table(["what", "figure", "what MongoDB would do", "report (date, command)"], rows)
        + [""]
        + machines(seen)
        + not_shown(reports, absent + UNDATED)
    )


def render_storage(reports, used):
    r = latest(reports, STORAGE)
    if r is None:
        raise Missing("no dated report of `hourglass-loadtest storage`")
    used.append(r)
    rows, untrusted = [], []
    for i in intervals(r):
        p = r.get(f"storage_{i}s_peers")
        for g in ("minute", "hour"):
            key = f"storage_{i}s_{g}"
            if key not in r.data:
                continue
            s = r.get(key)
            first = g == "minute" or f"storage_{i}s_minute" not in r.data
            vm = p["victoria_metrics_per_reading"]
            if first and vm < FLOOR:
                untrusted.append(f"{i} s: {n(vm, 1)}")
            rows.append(
                [
                    f"{i} s",
                    g,
                    n(s["buckets_bson_per_reading"]),
                    n(s["rollups_bson_per_reading"]),
                    n(s["bson_per_reading"]),
                    n(s["snappy_per_reading"]),
                    n(s["zstd_per_reading"]),
                    n(s["documents"] * 1000 / s["readings"]),
                    by(
                        [
                            p["per_event_bson_per_reading"],
                            p["per_event_snappy_per_reading"],
                            p["per_event_zstd_per_reading"],
                        ]
                    )
                    if first
                    else "",
                    ("–" if vm < FLOOR else n(vm)) if first else "",
                    n(p["influxdb_per_reading"]) if first else "",
                ]
            )
    lines = [f"From {r.source()}, bytes per reading:", ""]
    lines += table(
        [
            "interval",
            "buckets",
            "buckets",
            "rollups",
            "all, BSON",
            "snappy pages",
            "zstd pages",
            "documents per 1 000 readings",
            "one document per reading (BSON / snappy / zstd)",
            "VictoriaMetrics",
            "InfluxDB 1.x",
        ],
        rows,
    )
    if untrusted:
        lines += [
            "",
            "VictoriaMetrics is not shown where its directory held fewer bytes than the "
            f"readings need ({n(FLOOR, 2)} a reading: each step of the walk is one of 7): "
            + "; ".join(untrusted)
            + " bytes per reading, so not every reading was on disk when it was sized.",
        ]
    return lines + [""] + machines([r])


def render_comparison(reports, used):
    lines = []
    rows = []
    s = latest(reports, STORAGE)
    if s is None:
        raise Missing("no dated report of `hourglass-loadtest storage`")
    used.append(s)
    untrusted = False
    for i in intervals(s):
        m, h, p = (s.get(f"storage_{i}s_{k}") for k in ("minute", "hour", "peers"))
        vm = p["victoria_metrics_per_reading"]
        untrusted |= vm < FLOOR
        rows.append(
            [
                f"Bytes per reading, a reading every {i} s",
                f"{n(m['bson_per_reading'])} as BSON, {n(m['zstd_per_reading'])} in zstd pages "
                f"(minute buckets); {n(h['bson_per_reading'])} and {n(h['zstd_per_reading'])} "
                "in hour buckets",
                "–",
                f"{n(p['per_event_bson_per_reading'])} as BSON, "
                f"{n(p['per_event_zstd_per_reading'])} in zstd pages",
                f"{n(p['influxdb_per_reading'])} (compacted)",
                "not shown¹" if vm < FLOOR else n(vm),
                s.source(),
            ]
        )
    peers = latest(reports, PEERS)
    if peers is not None:
        used.append(peers)
        rows.insert(0, peers_row(peers))
    lines += table(
        [
            "",
            "Hourglass",
            "MongoDB time-series collections",
            "Telegraf or EMQX into MongoDB (a document per reading)",
            "InfluxDB 1.x",
            "VictoriaMetrics",
            "report (date, command)",
        ],
        rows,
    )
    lines += ["", "– not measured."]
    if untrusted:
        lines += [
            "",
            "¹ Its directory held fewer bytes than the readings need "
            f"({n(FLOOR, 2)} a reading), so not every reading was on disk when it was sized.",
        ]
    if peers is None:
        lines += [
            "",
            "Service CPU per reading is not shown until a dated report of "
            f"`hourglass-loadtest {PEERS}` exists.",
        ]
    return lines + [""] + machines(used)


def peers_row(r):
    """Service CPU per reading, line protocol, from a `peers` report."""
    rows = {p["system"]: p for p in r.get("peers")}
    rounds = len(r.get("victoria_metrics_cpu_s_per_million_by_round"))

    def system(name):
        if name not in rows:
            raise Missing(f"{r.dir}/report.json has no peers row {name!r}")
        return rows[name]

    lp = system("Hourglass, line protocol (service only)")
    lpj = system("Hourglass, line protocol, journal on (service only)")
    vm = system("VictoriaMetrics")
    ifx = system("InfluxDB 1.x")
    ended_day = any(note.startswith("This run's data lies in a UTC day that had ended") for note in r.notes)
    own = lambda p: p["cpu_s_per_million"] - p["driver_cpu_s_per_million"]  # noqa: E731
    return [
        f"Service CPU per reading, line protocol (µs; each system's median of {rounds} interleaved rounds)"
        + (", Hourglass rolling up a whole ended day" if ended_day else ""),
        f"{n(lpj['cpu_s_per_million'])} with the journal (the default), "
        f"{n(lp['cpu_s_per_million'])} without; {n(own(lpj))} and {n(own(lp))} "
        "without the MongoDB driver",
        "–",
        "–",
        f"{n(ifx['settled_cpu_s_per_million'])}",
        f"{n(vm['cpu_s_per_million'])} at its answer, "
        f"{n(vm['settled_cpu_s_per_million'])} until settled",
        r.source(),
    ]


TABLES = {
    "comparison": (BOOK / "comparison.md", render_comparison),
    "current": (BOOK / "measuring.md", render_current),
    "storage": (BOOK / "measuring.md", render_storage),
}
BLOCK = re.compile(
    r"(<!-- figures:(?P<name>[\w-]+) begin[^>]*-->\n)(?P<body>.*?)(<!-- figures:(?P=name) end -->)",
    re.S,
)


def render_pages(reports):
    """Every page with its generated blocks rendered, and the reports each
    block read."""
    pages, sources, faults = {}, {}, []
    for name, (page, render) in TABLES.items():
        text = pages.get(page) or page.read_text()
        blocks = [m for m in BLOCK.finditer(text) if m.group("name") == name]
        if len(blocks) != 1:
            faults.append(f"{page.relative_to(ROOT)}: {len(blocks)} `figures:{name}` blocks, not 1")
            pages[page] = text
            continue
        used = []
        try:
            body = "\n".join(["", *render(reports, used), ""]) + "\n"
        except Missing as e:
            faults.append(f"{page.relative_to(ROOT)}, figures:{name}: {e}")
            pages[page] = text
            continue
        except (KeyError, TypeError, ValueError) as e:
            # A report whose data is not shaped as the row reads it.
            faults.append(f"{page.relative_to(ROOT)}, figures:{name}: a figure with no report behind it ({e!r})")
            pages[page] = text
            continue
        m = blocks[0]
        text = text[: m.start("body")] + body + text[m.end("body") :]
        pages[page] = text
        sources[name] = list(dict.fromkeys(used))
    return pages, sources, faults


def cited_reports(text, reports):
    """Rows of the page's generated tables without a report behind them: a
    row that cites no report, or one (date and command) not in the results."""
    known = {r.source() for r in reports if r.date and r.command}
    faults = []
    for m in BLOCK.finditer(text):
        name = m.group("name")
        lines = m.group("body").splitlines()
        for line in lines:
            for cited in re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC, `[^`]+`", line):
                if cited not in known:
                    faults.append(f"figures:{name}: cites {cited}, which is no report in loadtest/results/")
        if name == "storage":
            # One report for the whole table, cited above it.
            if not any(re.search(r"UTC, `[^`]+`", line) for line in lines):
                faults.append("figures:storage: the table cites no report")
            continue
        for i, line in enumerate(lines):
            header = i + 1 < len(lines) and lines[i + 1].startswith("|---")
            if line.startswith("|") and not line.startswith("|---") and not header:
                if not re.search(r"UTC, `[^`]+` \|$", line):
                    faults.append(f"figures:{name}: a row without its report: {line[:70]}…")
    return faults


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from its reports")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the reports' directory")
    args = parser.parse_args()
    reports = load_reports(args.results.resolve())
    pages, sources, faults = render_pages(reports)
    for page in pages if args.check else []:
        faults += [f"{page.relative_to(ROOT)}: {f}" for f in cited_reports(page.read_text(), reports)]
    changed = [p for p, t in pages.items() if p.read_text() != t]
    if args.check:
        for page in changed:
            diff = difflib.unified_diff(
                page.read_text().splitlines(),
                pages[page].splitlines(),
                f"{page.relative_to(ROOT)} (committed)",
                f"{page.relative_to(ROOT)} (from the reports)",
                lineterm="",
                n=0,
            )
            faults.append(
                f"{page.relative_to(ROOT)}: its figures differ from the reports':\n"
                + "\n".join(list(diff)[:20])
            )
        for fault in faults:
            print(fault, file=sys.stderr)
        if faults:
            print(f"figures: {REGENERATE}", file=sys.stderr)
            return 1
        print("figures: every generated table matches its reports")
        return 0
    if faults:
        for fault in faults:
            print(fault, file=sys.stderr)
        return 1
    for page in changed:
        page.write_text(pages[page])
    for name, used in sources.items():
        for r in used:
            print(f"figures:{name}: {r.dir} ({r.date_text})")
    undated = [r.dir for r in reports if not (r.date and r.command)]
    if undated:
        print(f"undated reports, not used: {', '.join(undated)}")
    print(f"rewrote {', '.join(str(p.relative_to(ROOT)) for p in changed) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
