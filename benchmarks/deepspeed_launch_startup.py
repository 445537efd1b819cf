"""DeepSpeed's launcher_startup_s with and without its autotuner's mlflow import, side by side.

The local backend runs DeepSpeed's runner under trainer/deepspeed_runner.py (mlflow hidden); this
runs the same zero2 2-rank spec through the local backend alternately that way and as the plain
`deepspeed` command, and prints each run's launcher_startup_s and both means with a 95% interval.
    python benchmarks/deepspeed_launch_startup.py --pairs 5
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
from pathlib import Path

from shardbench.suite.backends.local import LocalBackend
from shardbench.suite.matrix.expand import MatrixSpec, expand


class PlainDeepSpeed(LocalBackend):
    """The local backend as it was: the `deepspeed` command itself."""

    def command(self, spec, run_dir, port):
        cmd = super().command(spec, run_dir, port)
        return ["deepspeed", *cmd[3:]] if cmd[2] == "shardbench.trainer.deepspeed_runner" else cmd


def interval(xs: list[float]) -> str:
    mean = statistics.mean(xs)
    half = 1.96 * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
    return f"{mean:.2f} s +- {half:.2f} (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    specs, errors = expand(MatrixSpec(strategies=["zero2"], world_sizes=[2], seq_lens=[32], steps=3, warmup_steps=1,
                                      launcher="deepspeed", shape=None, device="cpu", precision="fp32"))
    assert not errors, errors
    times: dict[str, list[float]] = {"deepspeed command": [], "deepspeed_runner": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            for name, backend in (("deepspeed command", PlainDeepSpeed()), ("deepspeed_runner", LocalBackend())):
                run_dir = Path(tmp) / f"{k}-{name.split()[0]}-{len(times[name])}"
                run_dir.mkdir()
                rec = backend.run(specs[0], run_dir, lambda e: None, threading.Event(), timeout_s=300)
                assert rec["status"] == "ok", rec["error"]
                times[name].append(rec["launcher_startup_s"])
                print(f"pair {k + 1}: {name:18s} launcher_startup_s {rec['launcher_startup_s']:.2f}", flush=True)
    for name, xs in times.items():
        print(f"{name:18s} {interval(xs)}")


if __name__ == "__main__":
    main()
