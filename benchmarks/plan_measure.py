"""Measure the runs the planner's accuracy table compares against (CPU, gloo): every strategy at
world sizes 1, 2, 4, grad-accum 1 and 4, two model sizes. One record per configuration, kept
under OUT/<name>.json (an existing one is reused: the matrix can be resumed).

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/plan_measure.py /tmp/plan-runs
Then `benchmarks/plan_accuracy.py /tmp/plan-runs` prints the predicted-vs-measured table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.trainer.conftest import run_trainer

STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
MODELS = {"tiny": ["--model", "tiny"],
          "tiny-4x192": ["--model", "tiny", "--n-layer", "4", "--n-embd", "192", "--n-head", "4"]}
COMMON = ["--seq-len", "64", "--micro-batch", "2", "--steps", "2", "--warmup-steps", "1",
          "--precision", "fp32", "--device", "cpu", "--seed", "7"]


def configs():
    for model, margs in MODELS.items():
        for world in (1, 2, 4):
            for accum in (1, 4):
                for strategy in STRATEGIES:
                    yield (f"{strategy}-{model}-w{world}-ga{accum}", strategy, world,
                           ["--strategy", strategy, *margs, "--grad-accum", str(accum), *COMMON])


def main(out: Path, only: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, strategy, world, args in configs():
        path = out / f"{name}.json"
        if path.exists() or only not in name:
            continue
        run = run_trainer(args, out, launcher="mpirun" if world > 1 else None, nproc=world, timeout=600)
        if run.returncode != 0:
            print(name, "FAILED", run.stderr[-500:], flush=True)
            continue
        path.write_text(json.dumps(run.record))
        print(name, "ok", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
