"""The spread between strategies that the loss check's tolerances are set above (suite/analyze/losscheck.py).

Runs tiny (seq 64, global batch 4, 6 steps) with ddp at 1 rank and ddp, fsdp, zero1, zero2, zero3
at 2 ranks, in each precision given, plus ddp at 2 ranks whose learning rate is off by a factor
(injected: the recorded settings stay the same, so it lands in the same loss group). Prints, per
precision, the largest relative difference from the group's per-step median of the loss and of
the gradient norm over the good runs (the spread), and that of the lr-off run.

    .venv/bin/python benchmarks/losscheck_spread.py --precisions fp32 bf16 --lr-factor 1.1
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.trainer.conftest import BIN, Run, cpu_env, free_port, run_trainer  # noqa: E402
from shardbench.suite.analyze import losscheck  # noqa: E402

COMMON = ["--model", "tiny", "--seq-len", "64", "--global-batch", "4", "--steps", "6", "--warmup-steps", "1",
          "--lr", "1e-3", "--lr-warmup-steps", "1", "--seed", "3"]

LR_OFF = '''
import sys
from shardbench.trainer.strategies import base, ddp, zero
factor = float(sys.argv.pop(1))
def off(cfg, _orig=base.lr_lambda):  # the bug: a learning rate off by `factor`, settings unchanged
    f = _orig(cfg)
    return lambda step: factor * f(step)
base.lr_lambda = ddp.lr_lambda = zero.lr_lambda = off
from shardbench.trainer.cli import main
sys.exit(main())
'''


def lr_off_run(precision: str, factor: float, tmp: Path) -> dict:
    script = tmp / "lr_off.py"
    script.write_text(LR_OFF)
    proc = subprocess.run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                           str(script), str(factor), "--strategy", "ddp", "--micro-batch", "2",
                           "--precision", precision, *COMMON],
                          cwd=REPO, env=dict(cpu_env(), PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Run(0, proc.stdout, "").record


def good_runs(precision: str, tmp: Path) -> dict[str, dict]:
    out = {}
    one = run_trainer(["--strategy", "ddp", "--micro-batch", "4", "--precision", precision, *COMMON], tmp)
    out["ddp w1"] = one.record
    for strategy in ("ddp", "fsdp", "zero1", "zero2", "zero3"):
        run = run_trainer(["--strategy", strategy, "--micro-batch", "2", "--precision", precision, *COMMON], tmp,
                          launcher="torchrun", nproc=2, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        out[f"{strategy} w2"] = run.record
    return out


def spread(curves: list[tuple[float, ...]], against: list[tuple[float, ...]]) -> list[float]:
    ref = losscheck._reference(against)
    return [losscheck._max_rel(c[:len(ref)], ref)[0] for c in curves]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--lr-factor", type=float, default=1.1)
    ap.add_argument("--save", type=Path, help="write the records here (JSON)")
    args = ap.parse_args()
    saved = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for precision in args.precisions:
            good = good_runs(precision, tmp)
            bad = lr_off_run(precision, args.lr_factor, tmp)
            saved[precision] = {"good": good, "lr_off": bad}
            losses = [losscheck.curve(r["loss_per_step"]) for r in good.values()]
            norms = [losscheck.curve(r["grad_norm_per_step"]) for r in good.values()]
            loss_spread, norm_spread = max(spread(losses, losses)), max(spread(norms, norms))
            # the lr-off run judged against the group it would join (its own curve in the median)
            bad_l, bad_n = losscheck.curve(bad["loss_per_step"]), losscheck.curve(bad["grad_norm_per_step"])
            bad_loss = spread([bad_l], [*losses, bad_l])[0]
            bad_norm = spread([bad_n], [*norms, bad_n])[0]
            print(f"{precision}: spread over {len(good)} strategies/layouts: loss {loss_spread:.2e}, grad norm "
                  f"{norm_spread:.2e}; lr x{args.lr_factor:g}: loss {bad_loss:.2e}, grad norm {bad_norm:.2e}",
                  flush=True)
            for name, r in good.items():
                print(f"  {name}: loss {r['loss_per_step']}\n    norm {r['grad_norm_per_step']}")
            print(f"  lr x{args.lr_factor:g}: loss {bad['loss_per_step']}\n    norm {bad['grad_norm_per_step']}",
                  flush=True)
    if args.save:
        args.save.write_text(json.dumps(saved))


if __name__ == "__main__":
    main()
