"""The spread that the loss check's float8 tolerance is set above (suite/analyze/losscheck.py
FLOAT8_LOSS_TOLERANCE; docs/verdicts.md "Loss-check tolerances").

Runs the same configuration in bf16 and with --float8 tensorwise and rowwise (bf16 autocast around
the float8 matmuls), ddp at 1 rank and fsdp at 2 ranks (fsdp tensorwise all-gathers in float8),
and prints the largest relative per-step difference of each float8 run from the bf16 run of the
same layout (loss and gradient norm), and the spread between layouts inside each float8 recipe.
CPU float8 matmuls are torch's reference kernel (about 1 s for 4 M multiply-adds here), so the
default model is tiny narrowed to 64 wide with a 2,048-token vocabulary.

    .venv/bin/python benchmarks/float8_spread.py [--model-args "--n-embd 64 ..."] [--seed 3] [--save out.json]
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.trainer.conftest import run_trainer  # noqa: E402

MODEL = "--model tiny --n-embd 64 --vocab-size 2048 --seq-len 32"
COMMON = ["--global-batch", "2", "--steps", "6", "--warmup-steps", "1", "--lr", "1e-3", "--lr-warmup-steps", "1",
          "--precision", "bf16", "--device", "cpu"]
RECIPES = ("off", "tensorwise", "rowwise")
LAYOUTS = {"ddp w1": ("ddp", 1, "2"), "fsdp w2": ("fsdp", 2, "1")}  # strategy, ranks, micro-batch


def max_rel(a: list, b: list) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b) if x is not None and y is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-args", default=MODEL)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--save", type=Path, help="write the records here (JSON)")
    args = ap.parse_args()
    runs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as d:
        for name, (strategy, ranks, mb) in LAYOUTS.items():
            for recipe in RECIPES:
                argv = ["--strategy", strategy, "--micro-batch", mb, "--float8", recipe,
                        *shlex.split(args.model_args), *COMMON, "--seed", str(args.seed)]
                run = run_trainer(argv, Path(d), launcher="torchrun" if ranks > 1 else None, nproc=ranks, timeout=900)
                assert run.returncode == 0, run.stderr[-3000:]
                runs.setdefault(name, {})[recipe] = run.record
                print(f"{name} {recipe}: loss {run.record['loss_per_step']}", flush=True)
    print(f"model: {args.model_args}; {' '.join(COMMON)} --seed {args.seed}")
    worst = 0.0
    for name, by in runs.items():
        for recipe in RECIPES[1:]:
            loss = max_rel(by[recipe]["loss_per_step"], by["off"]["loss_per_step"])
            norm = max_rel(by[recipe]["grad_norm_per_step"], by["off"]["grad_norm_per_step"])
            worst = max(worst, loss)
            print(f"{name} {recipe} vs bf16: loss {loss:.2e}, grad norm {norm:.2e}")
    for recipe in RECIPES:
        a, b = (runs[n][recipe] for n in LAYOUTS)
        print(f"{recipe}: ddp w1 vs fsdp w2: loss {max_rel(a['loss_per_step'], b['loss_per_step']):.2e}, "
              f"grad norm {max_rel(a['grad_norm_per_step'], b['grad_norm_per_step']):.2e}")
    print(f"largest float8 vs bf16 loss difference: {worst:.2e}")
    if args.save:
        args.save.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
