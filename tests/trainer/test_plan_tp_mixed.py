"""The planner models tensor parallelism in bf16 and with activation checkpointing (issue 28):
TP's collectives per step on the tp dimension equal the counts of real runs call for call and
byte for byte (the closed form trainer/plan/mesh_forms.py tp_comm), and a real 2-rank tp run in
bf16 with activation checkpointing is planned within the acceptance (state 2%, peak 10%, bytes
1%, calls exact). TP in fp16 (it needs a GPU to be measured) stays one 'not modelled' line."""
from __future__ import annotations

import pytest

from shardbench.trainer.plan import mesh_forms
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.plan.planned_layout import NotModelled
from tests.trainer.conftest import run_trainer
from tests.trainer.test_strategies import COMMON

# Rank 0's tp collectives per step, counted on real CPU runs (gloo, torch 2.13; tiny, seq 64,
# micro-batch 2, global batch 8): (strategy, world, precision, recompute) -> ((calls, bytes) of
# all_gather, all_reduce, reduce_scatter).
# fsdp at 4 ranks is FSDP2's mixed-precision policy (every op bf16); the others run autocast.
MEASURED = {
    ("ddp", 2, "bf16", False): ((44, 2228224), (85, 2123784), (28, 1179648)),
    ("ddp", 2, "fp32", True): ((60, 3801088), (85, 2123784), (36, 2228224)),
    ("fsdp", 2, "bf16", True): ((60, 3276800), (85, 2123784), (36, 1441792)),
    ("ddp", 4, "bf16", False): ((22, 1114112), (43, 1061896), (14, 589824)),
    ("fsdp", 4, "bf16", False): ((22, 688128), (43, 532488), (14, 425984)),
    ("fsdp", 4, "bf16", True): ((30, 950272), (43, 532488), (18, 557056)),
    ("fsdp", 4, "fp32", True): ((30, 1900544), (43, 1061896), (18, 1114112)),
}


def _input(strategy: str, world: int, precision: str, recompute: bool) -> PlanInput:
    return PlanInput(strategy=strategy, world_size=world, model="tiny", seq_len=64, micro_batch=2,
                     grad_accum=8 // (world // 2) // 2, precision=precision, activation_checkpointing=recompute, tp=2)


@pytest.mark.parametrize("case", list(MEASURED), ids=lambda c: f"{c[0]}-w{c[1]}-{c[2]}{'-ac' if c[3] else ''}")
def test_tp_collectives_in_bf16_and_with_recompute_equal_the_counted(case):
    inp = _input(*case)
    inp.layout  # modelled: no NotModelled
    got = mesh_forms.tp_comm(inp)
    assert tuple((got[op]["calls"], got[op]["bytes"]) for op in ("all_gather", "all_reduce", "reduce_scatter")) \
        == MEASURED[case]


def test_tp_in_fp16_is_one_not_modelled_line():
    with pytest.raises(NotModelled) as err:
        _input("ddp", 2, "fp16", False).layout
    assert "\n" not in str(err.value) and "fp16" in str(err.value)


@pytest.mark.slow
def test_a_bf16_tp_run_with_recompute_is_planned(tmp_path):
    """One real 2-rank run, tp 2 (ddp engine, autocast) in bf16 with activation checkpointing."""
    from shardbench.trainer.plan.accuracy import errors
    from shardbench.trainer.plan.predict import predict

    args = [a if a != "fp32" else "bf16" for a in COMMON]
    steps = args.index("--steps") + 1
    args[steps] = "2"  # the plan is per step: two steps measure it (one warm-up)
    run = run_trainer(["--strategy", "ddp", "--tp", "2", "--micro-batch", "2", "--activation-checkpointing", *args],
                      tmp_path, launcher="torchrun", nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    assert r["precision"] == "bf16" and r["activation_checkpointing"] and r["layout"]["tp"] == 2
    p = predict(PlanInput.from_record(r))
    assert p["comm_per_step_by_dim"] == r["comm_per_step_by_dim"]
    e = errors(p, r)
    assert abs(e["state"]) <= 0.02 and abs(e["peak"]) <= 0.10 and abs(e["comm"]) <= 0.01, e
    print(f"PLAN tp-2 bf16 recompute: state {e['state']:+.3%} peak {e['peak']:+.3%} bytes {e['comm']:+.3%}")
