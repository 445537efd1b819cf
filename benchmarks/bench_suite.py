"""Suite timings: the default matrix's wall time on this machine, and the collector's and the
report's time on 1,000 synthetic result records.

Usage: python benchmarks/bench_suite.py [--skip-matrix] [--records 1000]
The matrix runs `shardbench run` on suite/matrices/default.yaml into a temp directory
(--force, so nothing is resumed); the synthetic part is in-process.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import synthetic  # noqa: E402
from shardbench.suite.execute.collect import extract  # noqa: E402
from shardbench.suite.report.markdown import report_from_records  # noqa: E402


def bench_matrix(tmp: Path) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    cmd = [sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(tmp / "results"), "--force", "--quiet"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    runs = [line for line in proc.stdout.splitlines() if ": ok" in line or ": failed" in line or ": timeout" in line]
    print(f"default matrix: {len(runs)} runs, wall {wall:.1f} s ({wall / max(len(runs), 1):.1f} s/run), exit {proc.returncode}")
    for line in runs:
        print(f"  {line}")


def bench_collect(records: list[dict], noise: int) -> None:
    logs = [synthetic.log_with(r, noise_lines=noise) for r in records]
    size = sum(len(x) for x in logs)
    t0 = time.perf_counter()
    found = [extract(log, r["run_id"]).record for log, r in zip(logs, records)]
    dt = time.perf_counter() - t0
    assert all(f is not None for f in found)
    print(f"collector: {len(logs)} logs ({size / 1e6:.1f} MB, {noise} noise lines each) in {dt:.3f} s "
          f"({dt / len(logs) * 1e3:.2f} ms/log)")


def bench_report(records: list[dict], tmp: Path) -> None:
    t0 = time.perf_counter()
    rep = report_from_records(records, tmp / "report", tmp / "synthetic-results")
    dt = time.perf_counter() - t0
    print(f"report: {rep.runs} records -> metrics.csv + {len(rep.plots)} plots + BENCHMARK_REPORT.md + report.html "
          f"in {dt:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--noise-lines", type=int, default=200, help="non-record lines per synthetic log")
    p.add_argument("--skip-matrix", action="store_true", help="only the synthetic benchmarks")
    args = p.parse_args()
    records = synthetic.records(args.records)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bench_collect(records, args.noise_lines)
        bench_report(records, tmp)
        if not args.skip_matrix:
            bench_matrix(tmp)


if __name__ == "__main__":
    main()
