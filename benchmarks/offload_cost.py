"""What state in host memory costs per step on this machine: each offload row against the same
layout with its state on the device, at 2 ranks, interleaved (plain, offload, plain, ...), the
measured steps' median and fastest step of each, and the memory each reports by location (the
record's model_state device_bytes / host_bytes, rank 0). On a CPU run host and device memory are
one: what it shows is the cost of offload's extra copies and host-side optimizer bookkeeping, not
a PCIe transfer. Read the load averages beside the ratios (+-15% noise here).

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/offload_cost.py [pairs]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from tests.trainer.conftest import run_trainer

ARGS = ["--model", "tiny", "--seq-len", "64", "--micro-batch", "4", "--grad-accum", "1", "--steps", "15",
        "--warmup-steps", "3", "--precision", "fp32", "--device", "cpu", "--seed", "7"]
ROWS = [("zero2", "optimizer"), ("zero3", "optimizer"), ("zero3", "params"), ("fsdp", "params")]


def main(pairs: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    print(f"load average at start: {os.getloadavg()}")
    print("| layout | plain p50 s | offload p50 s | p50 ratio | min ratio | device MB (plain -> offload) | host MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for strategy, offload in ROWS:
        times: dict[str, list[dict]] = {"none": [], offload: []}
        state = {}
        for _ in range(pairs):
            for placed in ("none", offload):
                r = run_trainer(["--strategy", strategy, "--offload", placed, *ARGS], tmp, launcher="torchrun",
                                nproc=2).record
                times[placed].append(r["step_time_s"])
                state[placed] = r["model_state"][0]
        p50 = {k: statistics.median(s["p50"] for s in v) for k, v in times.items()}
        fastest = {k: min(min(s["all"]) for s in v) for k, v in times.items()}
        mb = {k: (v["device_bytes"] / 1e6, v["host_bytes"] / 1e6) for k, v in state.items()}
        print(f"| {strategy} --offload {offload} | {p50['none']:.3f} | {p50[offload]:.3f} | "
              f"{p50[offload] / p50['none']:.2f} | {fastest[offload] / fastest['none']:.2f} | "
              f"{mb['none'][0]:.1f} -> {mb[offload][0]:.1f} | {mb[offload][1]:.1f} |")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
