"""Measure the packaged build: folder size and cold start of the window.

    python tests/packaging/measure.py [--dist dist/headroom] [--runs 5] [--drop-caches]

Cold start is process start to the window shown and painted: the app's HEADROOM_STARTUP_PROBE
prints the wall-clock time at which its first event-loop turn after show() runs, then quits.
Before each run every file of the folder is evicted from the page cache (posix_fadvise
DONTNEED, no root needed), so the bundle is read from disk as on a first start; with
--drop-caches (root) the whole page cache is dropped too, system libraries included.
A warm start (the same, without eviction) is printed for comparison.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def folder_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.lstat(p).st_blocks * 512  # what du counts
    return total


def evict(path: str, drop_all: bool = False) -> None:
    if drop_all:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def start_once(exe: str, home: str) -> tuple[float, float]:
    """Seconds from spawning the app to its window shown, and to its first plots painted
    (HEADROOM_STARTUP_PROBE prints `shown T in-process S torch_loaded 0 plots T2`)."""
    env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
               HEADROOM_STARTUP_PROBE="1", HEADROOM_SETTINGS=os.path.join(home, "settings.ini"),
               HEADROOM_LOG=os.path.join(home, "headroom.log"), HEADROOM_RUNS=os.path.join(home, "runs"),
               XDG_DATA_HOME=os.path.join(home, "data"))
    t0 = time.time()
    out = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("shown "):
            words = line.split()
            marks = {k: float(v) for k, v in zip(words[::2], words[1::2])}
            return marks["shown"] - t0, marks.get("plots", marks["shown"]) - t0
    raise RuntimeError(f"no 'shown' line (exit {out.returncode}): {out.stderr[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist", "headroom"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--drop-caches", action="store_true", help="drop the whole page cache (root)")
    ns = ap.parse_args()
    exe = os.path.join(ns.dist, "headroom")
    size = folder_bytes(ns.dist)
    print(f"folder {ns.dist}: {size / 2**20:.0f} MiB ({size / 1e6:.0f} MB)")
    with tempfile.TemporaryDirectory() as home:
        start_once(exe, home)  # first start writes the app's settings; not counted
        cold, warm = [], []
        for _ in range(ns.runs):
            evict(ns.dist, ns.drop_caches)
            cold.append(start_once(exe, home))
            warm.append(start_once(exe, home))
    label = "whole page cache dropped" if ns.drop_caches else "bundle evicted from page cache"
    for what, i in (("window shown", 0), ("first plots painted", 1)):
        c, w = [x[i] for x in cold], [x[i] for x in warm]
        print(f"{what}: cold ({label}) median {statistics.median(c):.2f} s, max {max(c):.2f} s "
              f"[{' '.join(f'{x:.2f}' for x in c)}]; warm median {statistics.median(w):.2f} s, max {max(w):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
