"""How long benchtui takes to start: a fresh interpreter, from launch to the first painted screen.

Each sample runs a new Python process (cold imports, as a person launching `benchtui` gets) that
starts the app headless at 150x45 and exits on Textual's Ready event (the Matrix screen composed,
mounted and rendered once). Target: under 2 s on this machine.

    .venv/bin/python benchmarks/bench_tui_startup.py [--samples 5]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 2.0

CHILD = """
import sys, time
spawned = float(sys.argv[2])
t0 = time.perf_counter()
from shardbench.tui.app.app import BenchApp

class Timed(BenchApp):
    def on_ready(self):
        print(f"READY {time.perf_counter() - t0:.3f} {time.time() - spawned:.3f}", flush=True)
        self.exit()

Timed(results_dir=sys.argv[1]).run(headless=True, size=(150, 45))
"""


def sample(results_dir: str) -> tuple[float, float]:
    """(seconds from spawn to Ready, seconds from the app's first import to Ready)."""
    out = subprocess.run([sys.executable, "-c", CHILD, results_dir, repr(time.time())], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    line = next((line.split() for line in out.stdout.splitlines() if line.startswith("READY")), None)
    if line is None:
        raise SystemExit(f"the app did not start:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return float(line[2]), float(line[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--results", default=str(REPO / "results"), help="results dir the app opens")
    args = parser.parse_args()
    sample(args.results)  # warm the OS file cache once; not counted
    walls, readies = zip(*(sample(args.results) for _ in range(args.samples)))
    print(f"benchtui start-up over {args.samples} runs (fresh interpreter each):")
    print(f"  process spawn -> first paint (Ready): median {statistics.median(walls):.2f} s, max {max(walls):.2f} s")
    print(f"  app's first import -> Ready:          median {statistics.median(readies):.2f} s, max {max(readies):.2f} s")
    verdict = "OK" if statistics.median(walls) < TARGET_S else "SLOW"
    print(f"  target < {TARGET_S:.0f} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
