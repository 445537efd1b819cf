"""Where a 2-rank CPU step's time goes (the planner's timing model, trainer/plan/timing.py): per
strategy, interleaved, (a) one rank alone, (b) two one-rank runs at once, each on its own core
(`taskset`, as pin_cpu pins ranks: the same compute and memory-bandwidth contention as two ranks,
no communication), (c) two ranks. b / a is what sharing the machine costs compute; c - b is
communication and waiting for the other rank. Prints p50 step times and 1-minute load averages.
benchmarks/plan_steptime.py's configuration.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/steptime_breakdown.py [strategies] [rounds]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.plan_steptime import ARGS
from tests.trainer.conftest import Run, command, cpu_env, run_trainer


def concurrent_singles(strategy: str, tmp: Path) -> list[dict]:
    """Two world-size-1 runs started together, on cores 0 and 1."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    procs = [subprocess.Popen(["taskset", "-c", str(c), *command(["--strategy", strategy, *ARGS], None, 1, tmp)],
                              env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cores]
    return [Run(p.returncode, *p.communicate()).record for p in procs]


def main(strategies: list[str], rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    out = []
    for strategy in strategies:
        for _ in range(rounds):
            one = run_trainer(["--strategy", strategy, *ARGS], tmp).record
            both = concurrent_singles(strategy, tmp)
            two = run_trainer(["--strategy", strategy, *ARGS], tmp, launcher="mpirun", nproc=2).record
            a, c = one["step_time_s"]["p50"], two["step_time_s"]["p50"]
            b = max(r["step_time_s"]["p50"] for r in both)
            row = {"strategy": strategy, "w1": a, "w1_pair": b, "w2": c, "comm": two["comm_per_step"],
                   "load": [one["load_avg_1m_start"], both[0]["load_avg_1m_start"], two["load_avg_1m_start"]]}
            out.append(row)
            print(f"{strategy}: w1 {a:.3f} s, two w1 at once {b:.3f} s (x{b / a:.2f}), w2 {c:.3f} s (x{c / a:.2f}; "
                  f"w2 - pair {c - b:+.3f} s); load {' / '.join(f'{x:.1f}' for x in row['load'])}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main((sys.argv[1] if len(sys.argv) > 1 else "ddp,fsdp,zero1,zero2,zero3").split(","),
         int(sys.argv[2]) if len(sys.argv) > 2 else 1)
