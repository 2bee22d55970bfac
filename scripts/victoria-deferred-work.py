#!/usr/bin/env python3
"""How much of VictoriaMetrics' ingest CPU falls after its last answer.

Loads peers' dataset shape (SENSORS sensors x 2 metrics x 600 s, an hour ago,
as line protocol in bodies of 5000 lines, 4 at a time) into a fresh
VictoriaMetrics ROUNDS times, and prints its CPU per reading (µs) at the last
answer and 1, 3, 7 and 15 s later, less its idle rate (measured for 2 s before
the load). `loadtest peers` stops a peer's clock once it settles; this shows
why: VictoriaMetrics turns acknowledged rows into parts about a second later,
and a load shorter than that second leaves most of its work outside the
window. Double SENSORS and the CPU at the last answer rises per reading while
the settled figure stays. Needs victoria-metrics on PATH (`make test` installs
it). Usage: python3 scripts/victoria-deferred-work.py [ROUNDS] [SENSORS]
"""
import concurrent.futures as cf
import glob
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def cpu(pid):
    """CPU seconds of the process's threads (the scheduler's run time)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def bodies(sensors):
    random.seed(7)
    end = int(time.time()) - 3600
    rows = [
        (t, f"m{j},sensor=lt-{i:05} value={random.randint(0, 800) / 8} {t}\n")
        for i in range(sensors)
        for j in range(2)
        for t in range(end - 600, end)
    ]
    rows.sort(key=lambda r: r[0])
    lines = [r[1] for r in rows]
    return len(lines), ["".join(lines[k : k + 5000]).encode() for k in range(0, len(lines), 5000)]


def one(n, chunks):
    with tempfile.TemporaryDirectory() as data:
        measure(n, chunks, data)


def measure(n, chunks, data):
    port = free_port()
    vm = subprocess.Popen(
        ["victoria-metrics", f"-storageDataPath={data}/data", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health")
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1)
        c = cpu(vm.pid)
        time.sleep(2)
        idle = (cpu(vm.pid) - c) / 2
        c0 = cpu(vm.pid)
        post = lambda b: urllib.request.urlopen(urllib.request.Request(url + "/write?precision=s", data=b)).read()
        with cf.ThreadPoolExecutor(4) as ex:
            list(ex.map(post, chunks))
        answered = cpu(vm.pid)
        marks, waited = [], 0
        for w in (1, 3, 7, 15):
            time.sleep(w - waited)
            waited = w
            marks.append((w, cpu(vm.pid)))
    finally:
        vm.terminate()
        vm.wait()
    per = n / 1e6
    after = "  ".join(f"+{w}s {(c - c0 - w * idle) / per:.3f}" for w, c in marks)
    print(f"idle {idle * 1e3:.2f} ms/s  at the last answer {(answered - c0) / per:.3f}  {after}", flush=True)


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n, chunks = bodies(int(sys.argv[2]) if len(sys.argv) > 2 else 300)
    print(f"{n} readings; µs of VictoriaMetrics CPU per reading, less its idle rate")
    for _ in range(rounds):
        one(n, chunks)
