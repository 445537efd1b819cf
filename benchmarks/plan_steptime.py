"""Step time at world size 2 predicted from a world-size-1 calibration (the planner's timing
model, trainer/plan/timing.py), on this machine: for each strategy, world size 1 and 2 runs
interleaved (1, 2, 1, 2, ...), the compute rate calibrated on the world-size-1 run just before,
links from values/cpu.yaml. Prints predicted / measured - 1 per pair and the load averages
(timing on a shared machine: read them with that in mind).

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
from shardbench.suite.plan_cmd import shape_context

ARGS = ["--model", "tiny", "--n-layer", "4", "--n-embd", "192", "--n-head", "4", "--seq-len", "128",
        "--micro-batch", "4", "--grad-accum", "1", "--steps", "8", "--warmup-steps", "3", "--precision", "fp32",
        "--device", "cpu", "--seed", "7"]


def main(strategies: list[str], pairs: int) -> None:
    _, _, links = shape_context("cpu")
    tmp = Path(tempfile.mkdtemp())
    for strategy in strategies:
        errors = []
        for _ in range(pairs):
            one = run_trainer(["--strategy", strategy, *ARGS], tmp).record
            two = run_trainer(["--strategy", strategy, *ARGS], tmp, launcher="mpirun", nproc=2).record
            cal = {"achieved_flops": one["tokens_per_s"] * one["flops_per_token"], "source": "w1"}
            p = predict(PlanInput.from_record(two), links=links, calibration=cal)["step_time"]
            measured = two["step_time_s"]["p50"]
            errors.append(p["seconds"] / measured - 1)
            print(f"{strategy}: w1 {one['step_time_s']['p50']:.3f} s, w2 measured {measured:.3f} s, predicted "
                  f"{p['seconds']:.3f} s (compute {p['compute_s']:.3f}, comm {p['comm_s']:.3f}, exposed "
                  f"{p['exposed_comm_s']:.3f}): {errors[-1]:+.1%}; load {one['load_avg_1m_start']:.1f} / "
                  f"{two['load_avg_1m_start']:.1f}", flush=True)
        print(f"{strategy}: median error {statistics.median(errors):+.1%} over {pairs} pair(s)", flush=True)


if __name__ == "__main__":
    main((sys.argv[1] if len(sys.argv) > 1 else "ddp,fsdp,zero2").split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 2)
