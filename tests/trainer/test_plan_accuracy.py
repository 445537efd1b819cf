"""The planner against real runs (CPU, gloo): model state within 2%, the total tensor peak of
a step within 10%, collective bytes within 1% (every op carrying >= 1% of the step's bytes).
Two runs keep it cheap: ZeRO-3 at 2 ranks (closed-form state + traced activations) and FSDP at
2 ranks with grad-accum 2 (traced under the fake process group). The full matrix (5 strategies
x world sizes 1, 2, 4 x grad-accum 1, 4 x 2 models) is benchmarks/plan_measure.py +
plan_accuracy.py; its table is in docs/planner.md."""
from __future__ import annotations

import pytest

from tests.trainer.conftest import run_trainer
from shardbench.trainer.plan.accuracy import errors
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.plan.predict import predict

pytestmark = pytest.mark.slow

COMMON = ["--model", "tiny", "--seq-len", "64", "--micro-batch", "2", "--steps", "3", "--warmup-steps", "2",
          "--precision", "fp32", "--device", "cpu", "--seed", "7"]


@pytest.mark.parametrize("strategy,accum", [("zero3", 1), ("fsdp", 2)])
def test_prediction_matches_the_run(tmp_path, strategy, accum):
    # ZeRO-3 keeps gathered parameters here: its closed forms model DeepSpeed's keep-all regime;
    # the re-sharded default's extra all-gathers are not modeled yet (docs/planner.md).
    keep = ["--no-reshard-after-forward"] if strategy == "zero3" else []
    run = run_trainer(["--strategy", strategy, "--grad-accum", str(accum), *keep, *COMMON], tmp_path,
                      launcher="mpirun", nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    assert r["tensor_peak_bytes"] and r["tensor_peak_bytes"] > r["model_state_bytes_per_rank"] * 0.5
    e = errors(predict(PlanInput.from_record(r)), r)
    assert abs(e["state"]) <= 0.02, e
    assert abs(e["peak"]) <= 0.10, e
    assert abs(e["comm"]) <= 0.01, e
