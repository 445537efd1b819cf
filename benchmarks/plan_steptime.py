"""Step time at world size 2 predicted from a world-size-1 calibration (the planner's timing
model, trainer/plan/timing.py), on this machine: for each strategy, world size 1 and 2 runs
interleaved (1, 2, 1, 2, ...), the compute rate calibrated on the world-size-1 run just before.
Two link sets: values/cpu.yaml as it is (gloo measured by benchmarks/gloo_links.py, the shared-
machine slowdown by benchmarks/steptime_breakdown.py) and the assumptions it held before they
were measured (1 GB/s, alpha 100 us, no slowdown). Two statistics of the measured steps: the
median, and the fastest step (the least disturbed by other work on a shared machine). Prints
predicted / measured - 1 per pair and the load averages (read them with the timing).

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/plan_steptime.py [strategies] [pairs]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from tests.trainer.conftest import run_trainer
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.plan.predict import predict
from shardbench.suite.cli.plan_cmd import shape_context

ARGS = ["--model", "tiny", "--n-layer", "4", "--n-embd", "192", "--n-head", "4", "--seq-len", "128",
        "--micro-batch", "4", "--grad-accum", "1", "--steps", "8", "--warmup-steps", "3", "--precision", "fp32",
        "--device", "cpu", "--seed", "7"]
ASSUMED = {"gpus_per_node": 2, "intra_node_GBps": 1, "inter_node_GBps": 1, "alpha_us": 100}
STATS = {"p50": lambda s: s["p50"], "min": lambda s: min(s["all"])}


def main(strategies: list[str], pairs: int) -> None:
    _, _, links = shape_context("cpu")
    tmp = Path(tempfile.mkdtemp())
    for strategy in strategies:
        errors: dict[str, list[float]] = {}
        for _ in range(pairs):
            one = run_trainer(["--strategy", strategy, *ARGS], tmp).record
            two = run_trainer(["--strategy", strategy, *ARGS], tmp, launcher="mpirun", nproc=2).record
            parts = []
            for stat, of in STATS.items():
                cal = {"achieved_flops": one["tokens_per_step"] * one["flops_per_token"] / of(one["step_time_s"])}
                measured = of(two["step_time_s"])
                for name, link in (("assumed", ASSUMED), ("measured", links)):
                    p = predict(PlanInput.from_record(two), links=link, calibration=cal)["step_time"]
                    errors.setdefault(f"{stat} {name}", []).append(p["seconds"] / measured - 1)
                    parts.append(f"{stat} {name}: {p['seconds']:.3f} s ({errors[f'{stat} {name}'][-1]:+.0%})")
                parts.insert(len(parts) - 2, f"{stat}: w1 {of(one['step_time_s']):.3f} s, w2 {measured:.3f} s")
            print(f"{strategy}: " + "; ".join(parts) + f"; load {one['load_avg_1m_start']:.1f} / "
                  f"{two['load_avg_1m_start']:.1f}", flush=True)
        print(f"{strategy}: median error over {pairs} pair(s): " +
              ", ".join(f"{k} {statistics.median(v):+.0%}" for k, v in errors.items()), flush=True)


if __name__ == "__main__":
    main((sys.argv[1] if len(sys.argv) > 1 else "ddp,fsdp,zero1,zero2,zero3").split(","),
         int(sys.argv[2]) if len(sys.argv) > 2 else 2)
