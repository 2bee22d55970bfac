#!/usr/bin/env python3
"""Prints one table from criterion's estimates (target/criterion/<group>/<bench>/new)."""
import json, pathlib, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
rows = []
for est in sorted(root.glob("*/*/new/estimates.json")):
    bench = json.loads((est.parent / "benchmark.json").read_text())
    mean_ns = json.loads(est.read_text())["mean"]["point_estimate"]
    elements = (bench.get("throughput") or {}).get("Elements")
    per = mean_ns / elements if elements else None
    rows.append((bench["function_id"], mean_ns / 1e6, per, 1e3 / per if per else None))
if not rows:
    sys.exit("no criterion results under " + str(root))
print(f"{'benchmark':<34} {'ms / 10k':>10} {'ns / reading':>13} {'M readings/s':>13}")
for name, ms, per, mps in rows:
    if per is None:
        print(f"{name:<34} {ms:>10.3f} {'-':>13} {'-':>13}")
    else:
        print(f"{name:<34} {ms:>10.3f} {per:>13.1f} {mps:>13.2f}")
